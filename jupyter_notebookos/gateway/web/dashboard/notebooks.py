"""Which notebook a kernel serves, as far as its clients told the gateway.

A gateway learns a notebook's path only when a client sends it:

- a Jupyter server with ``--gateway-url`` (JupyterLab, Notebook 7, a JupyterHub user's server) keeps its
  sessions itself and starts kernels with ``POST /api/kernels``. It always sends the notebook's directory as
  ``KERNEL_WORKING_DIR``; it sends the notebook's own path as ``JPY_SESSION_NAME`` when its
  ``GatewayClient.allowed_envs`` names that variable (``notebookos up`` sets it, and this gateway accepts it: its
  ``client_envs`` default includes it). ipykernel names the notebook's ``__session__`` after it too.
- a client of this gateway's own ``/api/sessions`` (the admin's) gives the session's ``path``.

A path is the one the kernel was started with: a notebook renamed later in JupyterLab keeps its kernel, and the
gateway is not told.
"""

from __future__ import annotations

import contextlib
from typing import Any

from jupyter_server.utils import ensure_async

#: The variable a Jupyter server (jupyter_server >= 2) sets to the notebook's path when it starts its kernel.
ENV_SESSION_NAME = "JPY_SESSION_NAME"
#: The variable a Jupyter server with ``--gateway-url`` sets to the notebook's directory.
ENV_WORKING_DIR = "KERNEL_WORKING_DIR"


def kernel_env(settings: dict[str, Any], kernel_id: str) -> dict[str, str]:
    """The environment kernel ``kernel_id`` was started with (EG's record of it, else the platform's)."""
    km = settings.get("kernel_manager")
    if km is not None and kernel_id in km:
        kernel = km.get_kernel(kernel_id)
        env = (getattr(kernel, "_launch_args", None) or {}).get("env") or getattr(kernel, "user_overrides", {})
        if env:
            return dict(env)
    platform = settings.get("notebookos_platform")
    record = platform.kernels.get(kernel_id) if platform is not None else None
    return dict(record.env) if record is not None else {}


async def session_paths(settings: dict[str, Any]) -> dict[str, str]:
    """The path of every session of this gateway's ``/api/sessions``, by kernel id."""
    sessions = settings.get("session_manager")
    if sessions is None:
        return {}
    paths: dict[str, str] = {}
    with contextlib.suppress(Exception):  # a session store that cannot be read: no paths, the rest still shows
        for session in await ensure_async(sessions.list_sessions()):
            kernel = session.get("kernel") or {}
            if kernel.get("id") and session.get("path"):
                paths[kernel["id"]] = str(session["path"])
    return paths


def notebook_of(env: dict[str, str], session_path: str | None) -> dict[str, str | None]:
    """``{"notebook": path or None, "working_dir": directory or None}`` of a kernel."""
    return {
        "notebook": session_path or env.get(ENV_SESSION_NAME) or None,
        "working_dir": env.get(ENV_WORKING_DIR) or None,
    }


async def add_notebooks(view: dict[str, Any], settings: dict[str, Any]) -> None:
    """Add ``notebook`` and ``working_dir`` to each kernel of ``view`` (the cluster view, before users' views are
    cut from it)."""
    paths = await session_paths(settings)
    for kernel in view["kernels"]:
        kernel_id = kernel["kernel_id"]
        kernel.update(notebook_of(kernel_env(settings, kernel_id), paths.get(kernel_id)))


__all__ = ["ENV_SESSION_NAME", "ENV_WORKING_DIR", "add_notebooks", "kernel_env", "notebook_of", "session_paths"]
