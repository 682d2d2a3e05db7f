"""``GET /notebookos/kernels/{kernel_id}`` on the Jupyter server: the gateway's view of one kernel.

The browser cannot reach the gateway itself: JupyterLab and Notebook 7 talk to it through the Jupyter server's
gateway client (``--gateway-url``), which holds the gateway's URL and credentials. This handler forwards one
read-only request, ``GET /api/notebookos/kernels/{kernel_id}``, with that client's URL, headers and TLS
settings, so the gateway sees the same identity as for the kernel itself and applies the same ownership rules.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from jupyter_server.base.handlers import APIHandler
from jupyter_server.gateway.gateway_client import GatewayClient, gateway_request
from jupyter_server.utils import url_path_join
from tornado import web

#: Kernel ids are uuids; anything else never reaches the gateway.
KERNEL_ID = r"(?P<kernel_id>[0-9A-Za-z_-]{1,64})"


class NotebookOSKernelHandler(APIHandler):
    """The gateway's ``/api/notebookos/kernels/{kernel_id}`` for the logged-in user of this server."""

    @web.authenticated
    async def get(self, kernel_id: str) -> None:
        client = GatewayClient.instance()
        if not client.gateway_enabled:
            raise web.HTTPError(404, "this Jupyter server does not run its kernels on a NotebookOS gateway")
        url = url_path_join(client.url, "api", "notebookos", "kernels", quote(kernel_id, safe=""))
        # gateway_request adds the gateway client's headers, auth token and TLS options; a gateway error
        # (404: not a NotebookOS kernel, 403: not this user's) comes back as the same status.
        response = await gateway_request(url, method="GET")
        summary: dict[str, Any] = json.loads(response.body)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(summary))


def kernel_handlers(base_url: str) -> list[tuple[str, type[APIHandler]]]:
    """The URL pattern (under the server's ``base_url``) and its handler."""
    return [(url_path_join(base_url, "notebookos", "kernels", KERNEL_ID), NotebookOSKernelHandler)]
