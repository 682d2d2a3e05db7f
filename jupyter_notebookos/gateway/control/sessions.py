"""A kernel's session record in etcd (``keys.kernel(kernel_id)``): written when the kernel starts, read by a
restarted gateway to re-attach to the kernel's running replicas.

:func:`parse_session` checks a record before anything acts on it: a malformed one (hand-edited, torn, from an
incompatible version) is quarantined by the caller instead of keeping the gateway from starting.
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_notebookos.replication.protocol import MalformedRecord

#: Fields re-attaching needs, with their JSON types.
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "kernel_id": str,
    "kernel_name": str,
    "gpus": int,
    "ip": str,
    "ports": dict,
    "key": str,
    "signature_scheme": str,
}
_PORTS = ("shell", "iopub", "stdin", "control", "hb")


def parse_session(raw: bytes | str) -> dict[str, Any]:
    """The session record ``raw`` as a dict; :class:`MalformedRecord` says what is wrong with a bad one."""
    try:
        session = json.loads(raw)
    except ValueError as err:
        raise MalformedRecord(f"kernel session record is not JSON: {err}") from None
    if not isinstance(session, dict):
        raise MalformedRecord(f"kernel session record must be a JSON object, not {type(session).__name__}")
    for name, kind in _REQUIRED.items():
        value = session.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise MalformedRecord(f"kernel session record: field {name!r} is {value!r}")
    ports = session["ports"]
    if not all(isinstance(ports.get(p), int) and not isinstance(ports.get(p), bool) for p in _PORTS):
        raise MalformedRecord(f"kernel session record: ports {ports!r} must give {', '.join(_PORTS)} as numbers")
    if not isinstance(session.get("env", {}), dict):
        raise MalformedRecord(f"kernel session record: env {session['env']!r} must be an object")
    return session
