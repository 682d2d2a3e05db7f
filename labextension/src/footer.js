/**
 * The line under each cell of a NotebookOS kernel: while the cell runs, where it runs (from the kernel's summary);
 * once it has run, its execute_reply's metadata.notebookos (GPUs, replica and host, queued time).
 */
import { Widget } from '@lumino/widgets';

import { footerLine, runningLine } from './format';

/** The footer widget of each cell, created when it first has something to say. */
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

/** Empty the footer of `cell` (a new run, or a reply that shows none). */
function clearFooter(cell) {
  const existing = footers.get(cell);
  if (existing && !existing.isDisposed) {
    existing.node.textContent = '';
    delete existing.node.dataset.running;
  }
}

/** Show `info` (execute_reply.metadata.notebookos) under `cell`. */
function showReply(cell, info) {
  const line = footerLine(info);
  if (line === null) {
    clearFooter(cell);
    return;
  }
  const footer = footerOf(cell);
  footer.node.textContent = line;
  footer.node.title =
    info.replica == null
      ? 'NotebookOS: this cell never reached a replica; it waited this long for GPUs'
      : 'NotebookOS: where this cell ran, with which GPU devices, and how long it waited for them';
  delete footer.node.dataset.running;
  footer.node.dataset.ran = String(info.replica != null);
  footer.node.dataset.replica = String(info.replica ?? '');
  footer.node.dataset.host = String(info.host ?? '');
  footer.node.dataset.queuedMs = String(info.queued_ms ?? '');
  footer.node.dataset.gpus = (info.gpus || []).join(',');
}

/** Show that `cell` runs, with where when `summary` (the kernel's) says so. */
function showRunning(cell, summary) {
  const footer = footerOf(cell);
  footer.node.textContent = runningLine(summary);
  footer.node.title = 'NotebookOS: this cell is running';
  footer.node.dataset.running = 'true';
}

/**
 * Watch one notebook's kernel messages: an execute_request carries the cell's id (Lab and Notebook 7 put it in
 * metadata.cellId); its execute_input says the cell started on a replica; its execute_reply carries
 * metadata.notebookos. `item` is the kernel item: asked to refresh when a cell starts or ends (and after a kernel
 * restart), its summaries name the running cell's replica and host.
 */
export function watchPanel(panel, item) {
  const cellOfRequest = new Map();
  let running = null; // {msgId, cell} of the cell that started and has no reply yet
  const findCell = (cellId) => panel.content.widgets.find((cell) => cell.model.id === cellId);
  const cellOf = (msgId) => {
    const cellId = cellOfRequest.get(msgId);
    return cellId ? findCell(cellId) : undefined;
  };
  const onMessage = (_, { msg, direction }) => {
    const type = msg.header.msg_type;
    const parent = msg.parent_header && msg.parent_header.msg_id;
    if (direction === 'send' && type === 'execute_request') {
      const cellId = msg.metadata && msg.metadata.cellId;
      if (cellId) {
        cellOfRequest.set(msg.header.msg_id, cellId);
        const cell = findCell(cellId);
        if (cell) {
          clearFooter(cell);
        }
      }
    } else if (direction === 'recv' && type === 'execute_input') {
      const cell = cellOf(parent);
      if (cell) {
        running = { msgId: parent, cell };
        showRunning(cell, null);
        item.refresh();
      }
    } else if (direction === 'recv' && type === 'execute_reply') {
      const cell = cellOf(parent);
      cellOfRequest.delete(parent);
      if (running && running.msgId === parent) {
        running = null;
      }
      const info = msg.metadata && msg.metadata.notebookos;
      if (cell && info) {
        showReply(cell, info);
        item.refresh();
      } else if (cell) {
        clearFooter(cell);
      }
    }
  };
  const onSummary = (_, summary) => {
    const current = panel.sessionContext.session ? panel.sessionContext.session.kernel : null;
    if (running && summary && current && summary.kernel_id === current.id && summary.state === 'running') {
      showRunning(running.cell, summary);
    }
  };
  // A restarted kernel keeps its id: once it is back, ask for its replicas at once (not at the next poll).
  let lastStatus = '';
  const onStatus = (kernel, status) => {
    if (status === 'idle' && ['restarting', 'autorestarting', 'starting'].includes(lastStatus)) {
      item.refresh();
    }
    lastStatus = status;
  };
  let kernel = null;
  const follow = () => {
    const current = panel.sessionContext.session ? panel.sessionContext.session.kernel : null;
    if (current === kernel) {
      return;
    }
    if (kernel) {
      kernel.anyMessage.disconnect(onMessage);
      kernel.statusChanged.disconnect(onStatus);
    }
    kernel = current;
    if (kernel) {
      kernel.anyMessage.connect(onMessage);
      kernel.statusChanged.connect(onStatus);
    }
    cellOfRequest.clear();
    running = null;
  };
  panel.sessionContext.kernelChanged.connect(follow);
  panel.sessionContext.ready.then(follow, () => undefined);
  item.summaryChanged.connect(onSummary);
  follow();
  panel.disposed.connect(() => {
    item.summaryChanged.disconnect(onSummary);
    if (kernel) {
      kernel.anyMessage.disconnect(onMessage);
      kernel.statusChanged.disconnect(onStatus);
    }
  });
}
