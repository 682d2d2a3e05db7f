"""The operator dashboard at ``/notebookos/``: one HTML page, its script and style, served by the gateway.

The page is for the gateway's admin. A browser without the admin token (no token: 401; a user's: 403) gets a page
that says why and asks for the token (``login.html``), never the API's JSON error. The dashboard polls the JSON API
(``/api/notebookos/cluster`` and ``/api/notebookos/events``) with the admin token and draws what those say; the
numbers it shows come from the API (:func:`cluster_totals` adds the sums), not from arithmetic in the browser.
Open it as ``http://<gateway>/notebookos/?token=<admin token>``: the page keeps the token for its own requests
and takes it out of the address bar.
"""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path
from typing import Any

from enterprise_gateway.mixins import JSONErrorsMixin
from jupyter_server.base.handlers import JupyterHandler
from tornado import web

from jupyter_notebookos.gateway.web.authorization import IdentifiedHandlerMixin

STATIC_DIR = Path(__file__).resolve().parent / "static"
ADMIN_ONLY = "the NotebookOS dashboard is for the gateway's admin: open it with the admin token"

#: Content Security Policy of the page: its own script and style only, requests to its own gateway only.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)


def cluster_totals(view: dict[str, Any], *, unowned: str) -> dict[str, Any]:
    """Sums over ``view`` (the body of ``GET /api/notebookos/cluster``) for the dashboard's headline numbers.

    ``unowned`` names the kernels whose ``owner`` is null in ``view``: the admin's in the admin's view, other
    users' in a user's view (they are anonymous there).
    """
    hosts = view["hosts"]
    gpus = sum(h["gpus"] for h in hosts)
    per_user: Counter[str] = Counter()
    gpus_per_user: Counter[str] = Counter()
    running_per_user: Counter[str] = Counter()
    for kernel in view["kernels"]:
        user = kernel.get("owner") or unowned
        per_user[user] += 1
        gpus_per_user[user] += int(kernel.get("gpus") or 0)
        running_per_user[user] += kernel.get("state") == "running"
    return {
        "hosts": len(hosts),
        "gpus": gpus,
        "gpus_idle": sum(h["gpus_idle"] for h in hosts),
        "gpus_committed": sum(h["gpus_committed"] for h in hosts),
        "gpus_pending": sum(h["gpus_pending"] for h in hosts),
        "replicas": sum(h["replicas"] for h in hosts),
        # The cluster's subscription ratio now (pending / GPUs / replicas per kernel, over all hosts); the
        # view's own "subscription_ratio" is the limit admission enforces.
        "subscription_ratio": round(sum(h["subscription_ratio"] * h["gpus"] for h in hosts) / gpus, 4) if gpus else 0.0,
        "kernels": len(view["kernels"]),
        "kernels_running": sum(running_per_user.values()),
        "queued_cells": len(view["queue"]),
        "migrations_in_flight": len(view["migrations"]),
        "kernels_per_user": [
            {"user": user, "kernels": count, "gpus": gpus_per_user[user], "running": running_per_user[user]}
            for user, count in sorted(per_user.items())
        ],
    }


class DashboardHandler(IdentifiedHandlerMixin, JSONErrorsMixin, JupyterHandler):
    """``GET /notebookos/``: the dashboard page, for the admin only."""

    admin_only = ADMIN_ONLY

    @property
    def content_security_policy(self) -> str:
        return CONTENT_SECURITY_POLICY

    async def get(self) -> None:
        self._page("index.html")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Refused (401, 403): a page that says why and asks for the admin token; other errors as EG's JSON."""
        if status_code not in (401, 403):
            super().write_error(status_code, **kwargs)
            return
        error = kwargs.get("exc_info", (None, None))[1]
        reason = error.log_message if isinstance(error, web.HTTPError) and error.log_message else "refused"
        self._page("login.html", reason=reason[:1].upper() + reason[1:] + ".")

    def _page(self, name: str, reason: str = "") -> None:
        page = (STATIC_DIR / name).read_text(encoding="utf-8")
        base = self.settings.get("base_url", "/")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("Referrer-Policy", "no-referrer")  # the address may still hold ?token= on first load
        page = page.replace("{{reason}}", html.escape(reason)).replace("{{base_url}}", base.rstrip("/") + "/")
        self.finish(page)


class DashboardRedirectHandler(web.RequestHandler):
    """``GET /notebookos``: to ``/notebookos/`` (relative links need the slash), query string kept."""

    def get(self) -> None:
        query = f"?{self.request.query}" if self.request.query else ""
        self.redirect(self.request.path + "/" + query)


def dashboard_handlers() -> list[tuple[str, type, dict[str, Any]] | tuple[str, type]]:
    """The dashboard's URL patterns (relative to ``base_url``) and handlers; its assets need no token."""
    return [
        (r"/notebookos", DashboardRedirectHandler),
        (r"/notebookos/", DashboardHandler),
        (r"/notebookos/static/(.*)", web.StaticFileHandler, {"path": str(STATIC_DIR)}),
    ]


__all__ = ["STATIC_DIR", "DashboardHandler", "cluster_totals", "dashboard_handlers"]
