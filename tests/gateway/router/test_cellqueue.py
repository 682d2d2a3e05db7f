"""CellQueue without a platform: a real CommitLog on a real etcd, with the relay and the planner replaced by
recorders (what reaches the clients and the executor is what a user would see). A cell's way to its executor and
back, a cell interrupted before it reached a replica (waiting for GPUs, or while its decision is committed),
stop-on-error, an executor lost before and after it began a cell, and a rejected cell."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio
from etcd_replicas import KERNEL, register

from jupyter_notebookos.coordination import Coordinator
from jupyter_notebookos.coordination.txn import Compare, Op, TxnResult
from jupyter_notebookos.gateway.router.cellqueue import CellQueue
from jupyter_notebookos.gateway.router.cells import CellGrant, CellRejected, CellRequest
from jupyter_notebookos.gateway.router.commitlog import CommitLog
from jupyter_notebookos.gateway.router.ledger import LedgerReleases
from jupyter_notebookos.gateway.router.replicas import KernelReplicas
from jupyter_notebookos.gateway.router.tasks import RouterTasks
from jupyter_notebookos.gateway.router.wire import Signer, WireMessage
from jupyter_notebookos.replication.protocol import METADATA_KEY, ReplicaRegistration

SIGNER = Signer(b"secret")


class RecordingRelay:
    """The relay as the queue sees it (CellRelay): messages to clients and cells to executors are recorded."""

    def __init__(self) -> None:
        self.to_clients: list[tuple[str, WireMessage]] = []
        self.to_executors: list[tuple[str, WireMessage]] = []
        self.connected: set[str] = set()
        self.routes: dict[str, str] = {}

    # (what the queue calls)

    def is_connected(self, replica_id: str) -> bool:
        return replica_id in self.connected

    def status(self, request: WireMessage, state: str) -> WireMessage:
        return SIGNER.make("status", {"execution_state": state}, request, idents=[b"kernel.status"])

    async def send(self, channel: str, frames: list[bytes]) -> None:
        self.to_clients.append((channel, WireMessage.parse(frames)))

    def send_soon(self, channel: str, messages: list[list[bytes]]) -> asyncio.Task[None]:
        async def send_all() -> None:
            for frames in messages:
                await self.send(channel, frames)

        return asyncio.ensure_future(send_all())

    def client_socket(self, channel: str) -> Any:
        relay = self

        class Socket:
            def send_multipart(self, frames: list[bytes]) -> None:
                relay.to_clients.append((channel, WireMessage.parse(frames)))

        return Socket()

    async def send_cell(self, replica_id: str, request: WireMessage, frames: list[bytes]) -> None:
        self.routes[request.msg_id] = replica_id
        self.to_executors.append((replica_id, WireMessage.parse(frames)))

    def remember_route(self, msg_id: str, replica_id: str) -> None:
        self.routes[msg_id] = replica_id

    async def ask(self, replica_id: str, msg_type: str, content: dict[str, Any], timeout: float) -> dict[str, Any]:
        return {"status": "error", "evalue": "not asked in these tests"}

    # (what the tests read)

    def answers(self, msg_id: str) -> list[tuple[str, str, dict[str, Any]]]:
        """(channel, msg_type, content) of every message to clients parented on ``msg_id``."""
        return [(ch, m.msg_type, m.content()) for ch, m in self.to_clients if m.parent_msg_id == msg_id]

    def reply(self, msg_id: str) -> WireMessage | None:
        return next((m for ch, m in self.to_clients if ch == "shell" and m.parent_msg_id == msg_id), None)


@dataclass
class Planner:
    """The scheduler as the queue sees it (CellPlanner): every cell goes to ``replica_id`` on device 0 at once,
    unless ``hold`` is set (then it waits for GPUs until ``hold`` is resolved) or ``reject`` says why not."""

    replica_id: str = "0"
    hold: asyncio.Future[None] | None = None
    reject: str | None = None
    placed: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    resident: list[tuple[str, list[int]]] = field(default_factory=list)

    def place(self, request: CellRequest) -> CellGrant | Coroutine[Any, Any, CellGrant]:
        self.placed.append(request.cell_id)
        if self.reject is not None:
            raise CellRejected(self.reject)
        grant = CellGrant(self.replica_id, "host-0", (0,), "test")
        if self.hold is None:
            return grant
        hold = self.hold

        async def wait() -> CellGrant:
            await hold
            return grant

        return wait()

    def release(self, kernel_id: str, cell_id: str) -> None:
        self.released.append(cell_id)

    def queue_position(self, kernel_id: str, cell_id: str) -> int | None:
        return 1

    def note_resident(self, kernel_id: str, replica_id: str, host: str, devices: list[int]) -> None:
        self.resident.append((replica_id, devices))


class SlowCommits:
    """The real coordinator, whose transactions wait for ``go`` (a decision being committed, held there)."""

    def __init__(self, real: Coordinator) -> None:
        self.real = real
        self.go = asyncio.Event()
        self.go.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    async def txn(self, compare: Sequence[Compare], success: Sequence[Op], **kwargs: Any) -> TxnResult:
        await self.go.wait()
        return await self.real.txn(compare, success, **kwargs)


@dataclass
class Kernel:
    queue: CellQueue
    relay: RecordingRelay
    planner: Planner
    commit: CommitLog
    coordinator: SlowCommits
    registration: ReplicaRegistration

    async def cell(self, code: str, **content: Any) -> WireMessage:
        """A client's signed execute_request, submitted."""
        parent = WireMessage([], b"", json.dumps({"msg_id": "client", "msg_type": "x"}).encode(), b"{}", b"{}", b"{}")
        request = SIGNER.make("execute_request", {"code": code, **content}, parent, idents=[b"client-1"])
        await self.queue.submit(request)
        return request

    def link(self) -> Any:
        return SimpleNamespace(replica_id=self.registration.replica_id, host=self.registration.host)

    async def reply(self, request: WireMessage, status: str = "ok") -> bool:
        """The executor answers ``request``."""
        content: dict[str, Any] = {"status": status, "execution_count": 1}
        if status == "error":
            content.update(ename="ValueError", evalue="boom", traceback=[])
        answer = SIGNER.make("execute_reply", content, request, idents=[b"client-1"])
        return await self.queue.reply_came(self.link(), answer)


async def until(condition: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


@pytest_asyncio.fixture
async def kernel(coordinator: Coordinator) -> AsyncIterator[Kernel]:
    registration = await register(coordinator, "0")
    slow = SlowCommits(coordinator)
    tasks = RouterTasks(KERNEL)
    relay, planner = RecordingRelay(), Planner()
    relay.connected.add("0")
    replicas = KernelReplicas(KERNEL)
    replicas.expect("0", "host-0")
    replicas.register(registration)
    queue: CellQueue

    commit = CommitLog(
        kernel_id=KERNEL,
        coordinator=slow,  # type: ignore[arg-type]
        ledger=LedgerReleases(coordinator),
        tasks=tasks,
        on_published=lambda seq: queue.published_through(seq),
    )
    commit.cleared()

    async def nobody_registers(replica_ids: set[str], timeout: float) -> set[str]:
        return set(replica_ids)

    queue = CellQueue(
        kernel_id=KERNEL,
        gpus=1,
        signer=SIGNER,
        keys=coordinator.keys,
        planner=planner,
        commit=commit,
        relay=relay,
        replicas=replicas,
        wait_registered=nobody_registers,
    )
    tasks.spawn(queue.run())
    yield Kernel(queue, relay, planner, commit, slow, registration)
    tasks.cancel_all()
    await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_a_cell_reaches_its_executor_once_and_its_reply_carries_where_it_ran(
    kernel: Kernel, coordinator: Coordinator
) -> None:
    request = await kernel.cell("x = 1")
    await until(lambda: kernel.relay.to_executors)

    [(replica, forwarded)] = kernel.relay.to_executors
    assert replica == "0" and forwarded.msg_id == request.msg_id
    SIGNER.verify(forwarded)  # re-signed by the router
    assert forwarded.metadata()[METADATA_KEY] == {
        "seq": 1,
        "fence": kernel.commit.fence,
        "gpus": [0],
        "attempt": 1,
        "interrupted": False,
    }
    assert kernel.queue.running_on("0") is not None and kernel.queue.live_cells() == [request.msg_id]

    assert await kernel.reply(request)
    reply = kernel.relay.reply(request.msg_id)
    assert reply is not None
    ours = reply.metadata()[METADATA_KEY]
    assert ours["replica"] == "0" and ours["host"] == "host-0" and ours["gpus"] == [0] and ours["attempt"] == 1
    assert 0 <= ours["queued_ms"] < 5000
    await until(lambda: kernel.planner.released == [request.msg_id])
    assert kernel.queue.summary()["cells"] == 1 and kernel.queue.running_on("0") is None
    # Its GPU entry goes; its cell record holds its seq until its state record is in the log.
    await kernel.commit.flush_releases()
    assert await coordinator.get(coordinator.keys.gpu("host-0", 0)) is None
    assert kernel.commit.unpublished_cells() == [request.msg_id]


@pytest.mark.asyncio
async def test_a_reply_from_another_replica_or_to_another_request_is_not_the_cells(kernel: Kernel) -> None:
    request = await kernel.cell("x = 1")
    await until(lambda: kernel.relay.to_executors)
    stranger = SIGNER.make("execute_reply", {"status": "ok"}, request, idents=[b"client-1"])
    assert not await kernel.queue.reply_came(SimpleNamespace(replica_id="1", host="host-1"), stranger)
    assert kernel.relay.reply(request.msg_id) is None and kernel.queue.running_on("0") is not None


@pytest.mark.asyncio
async def test_a_cell_interrupted_while_it_waits_for_gpus_never_runs(kernel: Kernel) -> None:
    kernel.planner.hold = asyncio.get_running_loop().create_future()
    request = await kernel.cell("train()")
    await until(lambda: any(t == "status" for _, t, _ in kernel.relay.answers(request.msg_id)))

    assert kernel.queue.interrupt_unsent()

    await until(lambda: kernel.relay.reply(request.msg_id) is not None)
    reply = kernel.relay.reply(request.msg_id)
    assert reply is not None and reply.content()["ename"] == "KeyboardInterrupt"
    assert "did not run" in reply.content()["evalue"]
    states = [c["execution_state"] for _, t, c in kernel.relay.answers(request.msg_id) if t == "status"]
    assert states == ["busy", "idle"]  # clients saw it busy while it waited, then idle
    assert kernel.relay.to_executors == [] and request.msg_id in kernel.planner.released
    assert kernel.commit.log_head == 0  # no seq was handed out

    kernel.planner.hold = None  # the kernel goes on
    nxt = await kernel.cell("1")
    await until(lambda: kernel.relay.to_executors)
    assert kernel.relay.to_executors[0][1].msg_id == nxt.msg_id


@pytest.mark.asyncio
async def test_a_cell_interrupted_while_its_decision_is_committed_is_sent_as_interrupted(kernel: Kernel) -> None:
    kernel.coordinator.go.clear()
    request = await kernel.cell("train()")
    await until(lambda: request.msg_id in kernel.planner.placed)
    await asyncio.sleep(0.05)  # in the commit now

    assert kernel.queue.interrupt_unsent()
    kernel.coordinator.go.set()

    await until(lambda: kernel.relay.to_executors)
    directive = kernel.relay.to_executors[0][1].metadata()[METADATA_KEY]
    # Its seq is taken: the executor answers it as interrupted and publishes an empty record.
    assert directive["interrupted"] is True and directive["seq"] == 1
    assert not kernel.queue.interrupt_unsent()  # it runs now: an interrupt goes to its replica


@pytest.mark.asyncio
async def test_a_failed_cell_aborts_the_cells_queued_behind_it_but_not_later_ones(kernel: Kernel) -> None:
    first = await kernel.cell("1/0")
    await until(lambda: kernel.relay.to_executors)
    second, third = await kernel.cell("a()"), await kernel.cell("b()")

    assert await kernel.reply(first, "error")

    for aborted in (second, third):
        await until(lambda m=aborted: kernel.relay.reply(m.msg_id) is not None)  # type: ignore[misc]
        reply = kernel.relay.reply(aborted.msg_id)
        assert reply is not None and reply.content() == {"status": "aborted"}
        states = [c["execution_state"] for _, t, c in kernel.relay.answers(aborted.msg_id) if t == "status"]
        assert states == ["busy", "idle"]
    assert [m.msg_id for _, m in kernel.relay.to_executors] == [first.msg_id]  # neither reached a replica

    later = await kernel.cell("c()")
    await until(lambda: len(kernel.relay.to_executors) == 2)
    assert kernel.relay.to_executors[1][1].msg_id == later.msg_id


@pytest.mark.asyncio
async def test_a_cell_that_does_not_stop_on_error_aborts_nothing(kernel: Kernel) -> None:
    first = await kernel.cell("1/0", stop_on_error=False)
    await until(lambda: kernel.relay.to_executors)
    second = await kernel.cell("a()")
    assert await kernel.reply(first, "error")
    await until(lambda: len(kernel.relay.to_executors) == 2)
    assert kernel.relay.to_executors[1][1].msg_id == second.msg_id


@pytest.mark.asyncio
async def test_a_cell_whose_executor_died_before_it_began_is_sent_again(kernel: Kernel) -> None:
    request = await kernel.cell("x = 1")
    await until(lambda: kernel.relay.to_executors)
    cell = kernel.queue.running_on("0")
    assert cell is not None

    kernel.queue.fail_running(cell, kernel.registration, "its process exited")

    await until(lambda: len(kernel.relay.to_executors) == 2)
    again = kernel.relay.to_executors[1][1]
    assert again.msg_id == request.msg_id and again.metadata()[METADATA_KEY]["attempt"] == 2
    assert kernel.relay.reply(request.msg_id) is None  # the client saw nothing of the lost attempt


@pytest.mark.asyncio
async def test_a_cell_whose_executor_died_after_it_began_fails_and_is_never_rerun(kernel: Kernel) -> None:
    request = await kernel.cell("x = 1")
    await until(lambda: kernel.relay.to_executors)
    kernel.queue.output_came(request.msg_id)  # the executor said "busy" for it
    cell = kernel.queue.running_on("0")
    assert cell is not None

    kernel.queue.fail_running(cell, kernel.registration, "its process exited")

    await until(lambda: kernel.relay.reply(request.msg_id) is not None)
    reply = kernel.relay.reply(request.msg_id)
    assert reply is not None and reply.content()["ename"] == "ReplicaLost"
    assert "not re-run" in reply.content()["evalue"] and "its process exited" in reply.content()["evalue"]
    await asyncio.sleep(0.1)
    assert len(kernel.relay.to_executors) == 1


@pytest.mark.asyncio
async def test_a_cell_the_planner_rejects_gets_its_reason(kernel: Kernel) -> None:
    kernel.planner.reject = "this kernel asks for 9 GPUs; the largest host has 8"
    request = await kernel.cell("x = 1")
    await until(lambda: kernel.relay.reply(request.msg_id) is not None)
    reply = kernel.relay.reply(request.msg_id)
    assert reply is not None and reply.content()["ename"] == "NotebookOSCellRejected"
    assert reply.content()["evalue"] == kernel.planner.reject and kernel.relay.to_executors == []


@pytest.mark.asyncio
async def test_a_request_with_a_bad_signature_is_refused(kernel: Kernel) -> None:
    parent = WireMessage([], b"", json.dumps({"msg_id": "c", "msg_type": "x"}).encode(), b"{}", b"{}", b"{}")
    forged = Signer(b"not the kernel's key").make("execute_request", {"code": "steal()"}, parent, idents=[b"c"])
    with pytest.raises(Exception, match="signature"):
        await kernel.queue.submit(forged)
    await asyncio.sleep(0.05)
    assert kernel.relay.to_executors == [] and kernel.planner.placed == []
