"""Run a gateway for the browser tests. Test-only.

``--gateway KIND`` picks the app; every other argument goes to it (``--ip``, ``--port``, ...):

- ``stock``: Enterprise Gateway 3.3 as released (to reproduce the slow first output);
- ``handler``: Enterprise Gateway with only our kernel channels handler installed, through
  ``install_overrides`` (no etcd needed);
- ``notebookos``: our gateway app, ``NotebookOSGatewayApp`` (needs ``NOTEBOOKOS_ETCD_ENDPOINTS``).
"""

from __future__ import annotations

import sys

from enterprise_gateway.enterprisegatewayapp import EnterpriseGatewayApp

KINDS = ("stock", "handler", "notebookos")


class GatewayWithOurChannelsHandler(EnterpriseGatewayApp):
    """Enterprise Gateway whose kernel channels websocket is served by our handler."""

    def _create_request_handlers(self) -> list[tuple]:
        from jupyter_notebookos.gateway.web.websocket import install_overrides

        return install_overrides(super()._create_request_handlers(), self.base_url)


def gateway_class(kind: str) -> type[EnterpriseGatewayApp]:
    """The app class for `kind` (one of KINDS)."""
    if kind == "stock":
        return EnterpriseGatewayApp
    if kind == "handler":
        return GatewayWithOurChannelsHandler
    if kind == "notebookos":
        from jupyter_notebookos.gateway.web.gatewayapp import NotebookOSGatewayApp

        return NotebookOSGatewayApp
    raise SystemExit(f"unknown gateway kind {kind!r}: use one of {', '.join(KINDS)}")


def main(argv: list[str]) -> None:
    """Parse ``--gateway KIND`` and launch that app with the remaining arguments."""
    kind = "notebookos"
    if "--gateway" in argv:
        at = argv.index("--gateway")
        kind = argv[at + 1]
        del argv[at : at + 2]
    gateway_class(kind).launch_instance(argv=argv)


if __name__ == "__main__":
    main(sys.argv[1:])
