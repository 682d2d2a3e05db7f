/**
 * The kernel item: the kernel's replicas (host, state, up to date), its executor, GPU-seconds used vs what a
 * reservation would have held. It reads GET /notebookos/kernels/{id} on the Jupyter server, which this package's
 * server extension forwards to the gateway's /api/notebookos/kernels/{id}.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { duration, replicaName } from './format';

/** How often the kernel item asks the server while a NotebookOS kernel is shown (and after each reply). */
const POLL_MS = 2000;

/** The process proxy of NotebookOS kernelspecs (metadata.process_proxy.class_name, Enterprise Gateway's way). */
const PROXY = 'NotebookOSProcessProxy';

/**
 * Whether kernelspec `name` starts NotebookOS kernels, from the kernelspecs the server lists (`specs`); null while
 * they are not known. Decided by the kernelspec, never by an answer about one kernel: a restarting NotebookOS
 * kernel (same id) is briefly unknown to the gateway, and a 404 then says nothing about what the kernel is.
 */
export function isNotebookOSSpec(specs, name) {
  const spec = specs && specs.kernelspecs ? specs.kernelspecs[name] : undefined;
  if (!spec) {
    return null;
  }
  const proxy = spec.metadata && spec.metadata.process_proxy;
  return Boolean(proxy && String(proxy.class_name || '').endsWith(PROXY));
}

/** GET /notebookos/kernels/{id} on the Jupyter server; null when the gateway does not know the kernel now. */
async function fetchKernel(kernelId) {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'notebookos', 'kernels', encodeURIComponent(kernelId));
  const response = await ServerConnection.makeRequest(url, {}, settings);
  if (!response.ok) {
    return null;
  }
  return response.json();
}

/** One replica, compact: "r1 host-2 ✓" (✓ up to date, … behind, ○ starting). */
function replicaChip(replica, executor, newest) {
  const chip = document.createElement('span');
  chip.className = 'jp-nbos-replica';
  const upToDate = replica.state === 'ready' && replica.applied_seq >= newest;
  const mark = replica.state !== 'ready' ? '○' : upToDate ? '✓' : '…';
  chip.textContent = `${replicaName(replica.replica_id)} ${replica.host} ${mark}`;
  chip.dataset.replica = replica.replica_id;
  chip.dataset.host = replica.host;
  chip.dataset.state = replica.state;
  chip.dataset.upToDate = String(upToDate);
  chip.dataset.executor = String(replica.replica_id === executor);
  chip.title =
    `replica ${replica.replica_id} on ${replica.host}: ${replica.state}, ` +
    `state of cell ${replica.applied_seq}${upToDate ? ' (up to date)' : ' (catching up)'}` +
    (replica.replica_id === executor ? ', current executor' : '');
  return chip;
}

/** The kernel item: replicas, executor, GPU-seconds used vs reserved. Empty for other kernels. */
export class KernelStatus extends Widget {
  /** `currentPanel()`: the notebook shown; `kernelspecs`: the service manager's (which kernels are NotebookOS's). */
  constructor(currentPanel, kernelspecs) {
    super();
    this.addClass('jp-nbos-KernelStatus');
    this.currentPanel = currentPanel;
    this.kernelspecs = kernelspecs;
    this.summary = null;
    this.activeChanged = new Signal(this);
    /** Every summary read (null: none), for the cell footers of the running cell. */
    this.summaryChanged = new Signal(this);
    this.timer = window.setInterval(() => this.refresh(), POLL_MS);
    this.refresh();
  }

  dispose() {
    window.clearInterval(this.timer);
    super.dispose();
  }

  /** Ask the server again (on a timer, when the current notebook changes, and after each reply). */
  async refresh() {
    if (document.hidden || this.isDisposed) {
      return;
    }
    const panel = this.currentPanel();
    const kernel = panel && panel.sessionContext.session ? panel.sessionContext.session.kernel : null;
    let summary = null;
    if (kernel && isNotebookOSSpec(this.kernelspecs.specs, kernel.name) !== false) {
      try {
        summary = await fetchKernel(kernel.id);
      } catch (err) {
        summary = null;
      }
    }
    if (!this.isDisposed) {
      this.render(summary);
      this.summaryChanged.emit(summary);
    }
  }

  render(summary) {
    const wasActive = this.summary !== null;
    this.summary = summary;
    if (!summary) {
      this.node.replaceChildren();
      if (wasActive) {
        this.activeChanged.emit(undefined);
      }
      return;
    }
    const newest = Math.max(-1, ...summary.replicas.map((r) => r.applied_seq));
    const title = document.createElement('span');
    title.className = 'jp-nbos-KernelStatus-title';
    title.textContent = 'NotebookOS';
    const replicas = summary.replicas.map((r) => replicaChip(r, summary.executor, newest));
    const executor = document.createElement('span');
    executor.className = 'jp-nbos-executor';
    executor.textContent = `executor ${summary.executor == null ? '–' : replicaName(summary.executor)}`;
    const economy = document.createElement('span');
    economy.className = 'jp-nbos-gpu-seconds';
    const used = summary.gpu_seconds_used;
    const held = summary.gpu_seconds_held_if_reserved;
    economy.textContent = `GPU·s ${used.toFixed(1)} used / ${held.toFixed(0)} if reserved`;
    economy.title =
      `This kernel used its ${summary.gpus} GPU(s) for ${duration(used * 1000)} of GPU time; ` +
      `holding them for its whole life would have taken ${duration(held * 1000)}.`;
    this.node.replaceChildren(title, ...replicas, executor, economy);
    this.node.dataset.kernelId = summary.kernel_id;
    this.node.dataset.state = summary.state;
    this.node.title = `NotebookOS kernel ${summary.kernel_id}: ${summary.state}, ${summary.cells} cells run`;
    if (!wasActive) {
      this.activeChanged.emit(undefined);
    }
  }
}
