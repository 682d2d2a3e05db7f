/**
 * NotebookOS in JupyterLab 4 and Notebook 7.
 *
 * - Under each cell of a NotebookOS kernel, a footer (./footer): where it runs while it runs; once it has run,
 *   the GPUs it used, its replica and host, and how long it was queued.
 * - A kernel item (./status; the status bar in Lab, the top bar in Notebook 7, which has no status bar): the
 *   kernel's replicas (host, state, up to date), its executor, GPU-seconds used vs what a reservation would have
 *   held.
 */
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';

import { watchPanel } from './footer';
import { KernelStatus } from './status';

const plugin = {
  id: 'jupyter-notebookos-lab:plugin',
  description: 'NotebookOS: cell footers with GPUs, replica, host and queued time; kernel replicas and GPU-seconds',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar],
  activate: (app, tracker, statusBar) => {
    const item = new KernelStatus(() => tracker.currentWidget, app.serviceManager.kernelspecs);
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
    tracker.widgetAdded.connect((_, panel) => watchPanel(panel, item));
  }
};

export default plugin;
