/**
 * The renderer of the router's waiting notice (MIME type application/vnd.notebookos.wait+json).
 *
 * The router sends it as a display_data with a transient display_id while a cell waits for GPUs, updates it
 * with update_display_data, and clears it with clear_output just before the cell starts. Without this
 * extension, front ends show the text/plain fallback of the same message instead.
 */
import { Widget } from '@lumino/widgets';

import { waitSentence } from './format';

export const WAIT_MIME = 'application/vnd.notebookos.wait+json';

/** The notice: a spinner and "waiting for 2 GPUs, 3rd in queue, 12 s". */
class WaitNotice extends Widget {
  constructor() {
    super();
    this.addClass('jp-nbos-WaitNotice');
  }

  /** Render one version of the notice (each update_display_data brings a new one). */
  renderModel(model) {
    const wait = model.data[WAIT_MIME] || {};
    const spinner = document.createElement('span');
    spinner.className = 'jp-nbos-WaitNotice-spinner';
    const text = document.createElement('span');
    text.className = 'jp-nbos-WaitNotice-text';
    text.textContent = waitSentence(wait);
    this.node.replaceChildren(spinner, text);
    this.node.dataset.position = String(wait.position ?? '');
    this.node.dataset.gpus = String(wait.gpus ?? '');
    return Promise.resolve();
  }
}

/** Rank below text/plain's (120), so Lab prefers this rendering when the extension is present. */
const extension = {
  id: 'jupyter-notebookos-lab:wait-notice',
  description: 'Renders the NotebookOS waiting-for-GPUs notice',
  rendererFactory: {
    safe: true,
    mimeTypes: [WAIT_MIME],
    createRenderer: () => new WaitNotice()
  },
  rank: 50,
  dataType: 'json'
};

export default extension;
