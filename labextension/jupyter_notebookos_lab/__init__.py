"""NotebookOS in JupyterLab 4 and Notebook 7: the prebuilt front-end extension and its server extension.

The front-end part (``labextension/``, built from ``src/`` with JupyterLab's extension builder) shows where each
cell ran and how long it waited, renders the gateway's waiting-for-GPUs notice, and shows the kernel's replicas.
The server part (:mod:`jupyter_notebookos_lab.proxy`) forwards ``GET /notebookos/kernels/{id}`` from the browser
to the gateway's ``/api/notebookos/kernels/{id}``, through the Jupyter server's own gateway client.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the prebuilt extension is (for ``jupyter labextension develop``)."""
    return [{"src": "labextension", "dest": "jupyter-notebookos-lab"}]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    """This package is a Jupyter server extension too (enabled by the config file it installs)."""
    return [{"module": "jupyter_notebookos_lab"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    """Add the kernel endpoint to the Jupyter server (JupyterLab, Notebook 7, a Hub single-user server)."""
    from jupyter_notebookos_lab.proxy import kernel_handlers

    web_app = server_app.web_app
    web_app.add_handlers(".*$", kernel_handlers(web_app.settings["base_url"]))
    server_app.log.info("jupyter_notebookos_lab: /notebookos/kernels/{id} forwards to the gateway")
