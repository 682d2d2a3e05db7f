"""Executor terms and their fencing, the one implementation the router and the replica's log writer share.

One key per kernel, ``keys.executor(kernel_id)``, names the replica that executes its cells. The router opens a
*term* by creating that key (bound to the executor's lease) in the transaction that commits a cell's decision
(:func:`open_term`); the key's ``create_revision`` is the term's **fencing token**. Every later write of that
term (the router's next decisions, the executor's log records and checkpoints) carries :func:`fence` among its
compares, so a stale executor (its lease expired, or the router gave the term to another replica by deleting the
key) cannot commit anything, even before it notices. :func:`term_refusal` says why a fenced write was refused.

(etcd3aio's own Lock and Election do not renew their lease while held, hence leases + transactions here.)
"""

from __future__ import annotations

from collections.abc import Sequence

from jupyter_notebookos.coordination.kv import KeyValue
from jupyter_notebookos.coordination.lease import Lease
from jupyter_notebookos.coordination.txn import Compare, Op


def fence(key: str, token: int) -> Compare:
    """The compare that holds only while the term that got ``token`` is in force."""
    return Compare.create_revision(key, "==", token)


def open_term(key: str, holder: str, lease: Lease | int) -> tuple[Compare, Op]:
    """The compare and the put that start a new term held by ``holder``, bound to its ``lease``.

    The key must be absent: whoever ends a term deletes it first, so that the new term gets a fresh
    ``create_revision`` (its token: the transaction's revision)."""
    return Compare.absent(key), Op.put(key, holder, lease=lease)


def term_refusal(key: str, holders: Sequence[KeyValue], token: int) -> str:
    """Why a write fenced with ``token`` was refused, from what a ``Op.get(key)`` in its failure branch read."""
    if not holders:
        return f"no executor is elected ({key} is absent)"
    current = holders[0]
    return (
        f"the executor key was created at revision {current.create_revision} (value {current.text!r}), "
        f"but this cell's fence is {token}: this replica is no longer the executor"
    )
