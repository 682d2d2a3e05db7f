"""Transactions that ride through an etcd leader election.

When etcd's leader dies, a request that reached a follower just before waits for an answer that never comes (the
follower forwarded it to the dead leader), and a request on the dead leader's connection fails with the connection.
Either way etcd may or may not have applied it, so :meth:`Coordinator.txn` cannot resend it by itself: it raises
:class:`QuorumLost` or :class:`EtcdUnavailable` saying the outcome is unknown. A new leader is elected within one or
two election timeouts, so that error is a false alarm: 2 of 3 members are alive.

:func:`txn_once` settles the outcome instead of reporting it: the transaction's caller names one key the
transaction writes and the exact value it writes there (a value no other transaction writes, such as a cell
record with its message id and attempt). After an ambiguous failure it reads that key: holding our value, the
transaction was applied (its revision is the key's ``mod_revision``); otherwise it was not, and it is sent again.
An attempt read as not applied can still be applied after the read (Raft commits it late); the attempt sent again
then fails its compares, and the key is read once more: holding our value, the transaction was applied. Every
attempt is short, and all of them share one deadline, so a true quorum loss still fails within it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from jupyter_notebookos.coordination.client import Coordinator
from jupyter_notebookos.coordination.errors import CoordinationError, EtcdUnavailable, QuorumLost
from jupyter_notebookos.coordination.kv import Value, to_bytes
from jupyter_notebookos.coordination.txn import Compare, Op, TxnResult

log = logging.getLogger(__name__)

#: Seconds one attempt of the transaction may take before its outcome is checked. An answer takes milliseconds
#: with a leader in place; a second is a few of etcd's heartbeats on a loaded machine, and one election timeout
#: at etcd's default.
ATTEMPT_SECONDS = 1.0


async def txn_once(
    coordinator: Coordinator,
    compare: Sequence[Compare],
    success: Sequence[Op],
    *,
    outcome_key: str,
    outcome_value: Value,
    timeout: float | None = None,
) -> TxnResult:
    """Run a transaction exactly once, riding through leader elections within ``timeout`` seconds.

    ``success`` must put ``outcome_value`` at ``outcome_key``, and no other transaction may put that very value
    there. A result read back after an ambiguous failure carries no per-operation ``results``.

    Raises:
        QuorumLost, EtcdUnavailable: no leader for the whole ``timeout`` (default: the coordinator's); the
            transaction was not applied, or its outcome is still unknown (the message says which).
        ValueError: ``success`` does not put ``outcome_value`` at ``outcome_key``.
    """
    expected = to_bytes(outcome_value)
    if not any(op.kind == "put" and op.key == outcome_key and op.value == expected for op in success):
        raise ValueError(f"the transaction does not put its outcome value at {outcome_key}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (coordinator.timeout if timeout is None else timeout)
    unknown = False  # whether an attempt may have been applied without our knowing yet
    doubted = False  # whether any attempt's outcome was ever unknown
    while True:
        remaining = deadline - loop.time()
        try:
            result = await coordinator.txn(compare, success, timeout=max(min(remaining, ATTEMPT_SECONDS), 0.001))
        except (QuorumLost, EtcdUnavailable) as err:
            unknown = unknown or "outcome" in str(err)
            doubted = doubted or unknown
            if deadline - loop.time() <= 0.05:
                raise _final(err, unknown) from err
            log.info("txn on %s: %s; settling its outcome", outcome_key, err)
        else:
            if result.succeeded or not doubted:
                return result
            # An earlier attempt, read as not applied, may have been applied since (Raft committed it late: seen
            # in CI after all members were paused). Then this attempt fails the compares that one changed, and
            # the key holds our value.
            try:
                current = await coordinator.get(outcome_key, timeout=max(deadline - loop.time(), ATTEMPT_SECONDS))
            except (QuorumLost, EtcdUnavailable) as err:
                raise _final(err, True) from err
            if current is not None and current.value == expected:
                log.info("txn on %s: an earlier attempt was applied late; this one found it done", outcome_key)
                return TxnResult(succeeded=True, revision=current.mod_revision, results=[])
            return result
        try:
            current = await coordinator.get(outcome_key, timeout=max(deadline - loop.time(), 0.001))
        except (QuorumLost, EtcdUnavailable) as err:
            raise _final(err, unknown) from err
        if current is not None and current.value == expected:
            return TxnResult(succeeded=True, revision=current.mod_revision, results=[])
        # Not applied as of this read. Raft may still commit an earlier attempt later (it reached the old
        # leader's log): callers fence their transactions (compares on an executor key's revision, on a key's
        # absence), so the resent one then fails its compares (and the key is read again, above), or writes the
        # same values again.
        unknown = False


def _final(err: CoordinationError, unknown: bool) -> CoordinationError:
    """The error to raise once the deadline has passed, saying whether the transaction may have been applied."""
    if unknown and "outcome" not in str(err):
        err.args = (f"{err.args[0]} The outcome of this transaction is unknown: read the keys it writes.",)
    return err
