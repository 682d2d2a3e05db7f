/**
 * NotebookOS in JupyterLab 4 and Notebook 7.
 *
 * - Under each executed cell, a footer line from execute_reply.metadata.notebookos: GPUs used, replica and
 *   host, queued time.
 * - A kernel item (the status bar in Lab; the top bar in Notebook 7, which has no status bar): the
 *   kernel's replicas (host, state, up to date), its executor, GPU-seconds used vs what a reservation would
 *   have held. It reads GET /notebookos/kernels/{id} on the Jupyter server, which this package's server
 *   extension forwards to the gateway's /api/notebookos/kernels/{id}.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { duration, footerLine, replicaName } from './format';

/** How often the kernel item asks the server while a NotebookOS kernel is shown (and after each reply). */
const POLL_MS = 2000;

/** The footer widget of each cell, created on its first NotebookOS reply. */
const footers = new WeakMap();

function footerOf(cell) {
  let footer = footers.get(cell);
  if (!footer || footer.isDisposed) {
    footer = new Widget();
    footer.addClass('jp-nbos-CellFooter');
    cell.layout.addWidget(footer);
    footers.set(cell, footer);
  }
  return footer;
}

/** Show `info` (execute_reply.metadata.notebookos) under `cell`; no `info`: empty the footer. */
function showFooter(cell, info) {
  const existing = footers.get(cell);
  if (!info) {
    if (existing && !existing.isDisposed) {
      existing.node.textContent = '';
    }
    return;
  }
  const footer = footerOf(cell);
  footer.node.textContent = footerLine(info);
  footer.node.title = 'NotebookOS: where this cell ran and how long it waited for GPUs';
  footer.node.dataset.replica = String(info.replica ?? '');
  footer.node.dataset.host = String(info.host ?? '');
  footer.node.dataset.queuedMs = String(info.queued_ms ?? '');
  footer.node.dataset.gpus = (info.gpus || []).join(',');
}

/**
 * Watch one notebook's kernel messages: an execute_request carries the cell's id (Lab and Notebook 7 put
 * it in metadata.cellId), its execute_reply carries metadata.notebookos.
 */
function watchPanel(panel, onReply) {
  const cellOfRequest = new Map();
  const findCell = (cellId) => panel.content.widgets.find((cell) => cell.model.id === cellId);
  const onMessage = (_, { msg, direction }) => {
    const type = msg.header.msg_type;
    if (direction === 'send' && type === 'execute_request') {
      const cellId = msg.metadata && msg.metadata.cellId;
      if (cellId) {
        cellOfRequest.set(msg.header.msg_id, cellId);
        const cell = findCell(cellId);
        if (cell) {
          showFooter(cell, null);
        }
      }
    } else if (direction === 'recv' && type === 'execute_reply') {
      const parent = msg.parent_header && msg.parent_header.msg_id;
      const cellId = cellOfRequest.get(parent);
      cellOfRequest.delete(parent);
      const info = msg.metadata && msg.metadata.notebookos;
      const cell = cellId && findCell(cellId);
      if (cell && info) {
        showFooter(cell, info);
        onReply();
      }
    }
  };
  let kernel = null;
  const follow = () => {
    const current = panel.sessionContext.session ? panel.sessionContext.session.kernel : null;
    if (current === kernel) {
      return;
    }
    if (kernel) {
      kernel.anyMessage.disconnect(onMessage);
    }
    kernel = current;
    if (kernel) {
      kernel.anyMessage.connect(onMessage);
    }
    cellOfRequest.clear();
  };
  panel.sessionContext.kernelChanged.connect(follow);
  panel.sessionContext.ready.then(follow, () => undefined);
  follow();
  panel.disposed.connect(() => kernel && kernel.anyMessage.disconnect(onMessage));
}

/** Kernels the server said are not NotebookOS kernels (404: a plain kernel, or no gateway): not asked again. */
const notNotebookOS = new Set();

/** GET /notebookos/kernels/{id} on the Jupyter server; null when it is not a NotebookOS kernel. */
async function fetchKernel(kernelId) {
  if (notNotebookOS.has(kernelId)) {
    return null;
  }
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'notebookos', 'kernels', encodeURIComponent(kernelId));
  const response = await ServerConnection.makeRequest(url, {}, settings);
  if (response.status === 404) {
    notNotebookOS.add(kernelId);
  }
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
class KernelStatus extends Widget {
  constructor(currentPanel) {
    super();
    this.addClass('jp-nbos-KernelStatus');
    this.currentPanel = currentPanel;
    this.summary = null;
    this.activeChanged = new Signal(this);
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
    if (kernel) {
      try {
        summary = await fetchKernel(kernel.id);
      } catch (err) {
        summary = null;
      }
    }
    this.render(summary);
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

const plugin = {
  id: 'jupyter-notebookos-lab:plugin',
  description: 'NotebookOS: cell footers with GPUs, replica, host and queued time; kernel replicas and GPU-seconds',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar],
  activate: (app, tracker, statusBar) => {
    const item = new KernelStatus(() => tracker.currentWidget);
    tracker.currentChanged.connect(() => item.refresh());
    if (statusBar) {
      statusBar.registerStatusItem('jupyter-notebookos-lab:kernel', {
        item,
        align: 'left',
        rank: 5,
        isActive: () => item.summary !== null,
        activeStateChanged: item.activeChanged
      });
    } else {
      // Notebook 7 has no status bar: the item goes in its top bar, beside the notebook's name (one notebook
      // per page there, so the tracker's current notebook is the page's).
      app.shell.add(item, 'top', { rank: 1000 });
    }
    tracker.widgetAdded.connect((_, panel) => watchPanel(panel, () => item.refresh()));
  }
};

export default plugin;
