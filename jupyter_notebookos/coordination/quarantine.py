"""Malformed values in etcd: moved aside, with the reason, instead of stopping whoever reads them.

A value that does not parse (a hand edit, a bug in another version, a torn restore) must not keep the gateway
from starting or end a router's watch. Whoever finds one logs it and skips it; values nobody else would clean up
(a kernel's session record) are moved to ``keys.quarantine(key)`` with why and when, where an operator finds them
(``etcdctl get --prefix <prefix>/quarantine/``).
"""

from __future__ import annotations

import json
import logging
import time

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.errors import CoordinationError
from jupyter_notebookos.coordination.kv import KeyValue
from jupyter_notebookos.coordination.txn import Compare, Op

log = logging.getLogger(__name__)


async def quarantine(coordinator: Coordinator, kv: KeyValue, why: str) -> bool:
    """Move ``kv`` to its quarantine key, unless someone rewrote it since it was read. Returns whether it moved.

    Failures to reach etcd are logged, not raised: the value stays where it is and is found again next time.
    """
    target = coordinator.keys.quarantine(kv.key)
    record = json.dumps(
        {
            "key": kv.key,
            "value": kv.value.decode("utf-8", errors="replace"),
            "why": why,
            "quarantined_at": time.time(),
        }
    )
    try:
        result = await coordinator.txn(
            compare=[Compare.mod_revision(kv.key, "==", kv.mod_revision)],
            success=[Op.put(target, record), Op.delete(kv.key)],
        )
    except CoordinationError as err:
        log.error("malformed value at %s (%s) stays in place: could not quarantine it: %s", kv.key, why, err)
        return False
    if result.succeeded:
        log.error("malformed value at %s moved to %s: %s", kv.key, target, why)
    return result.succeeded
