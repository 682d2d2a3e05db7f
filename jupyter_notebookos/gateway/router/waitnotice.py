"""The live "waiting for GPUs" notice of a cell that waits in the router, as ordinary Jupyter iopub messages.

While a cell waits for its GPUs (in the scheduler's queue, or for a migration), its client sees only "busy". The
router therefore shows a notice in the cell's own output area, with three standard messages, all parented on the
cell's ``execute_request`` so every front end puts them in that cell:

1. ``display_data`` with a transient ``display_id`` and two representations: ``application/vnd.notebookos.wait+json``
   (``{"gpus", "position", "waited_s", "reason"}``, rendered by the NotebookOS JupyterLab extension) and a
   ``text/plain`` fallback ("NotebookOS: waiting for 2 GPUs, 3rd in queue, 12 s") that any other front end shows;
2. ``update_display_data`` with the same ``display_id`` once a second (new position, seconds waited);
3. ``clear_output`` (``wait: false``) when the wait ends, before the request reaches its executor: the cell's own
   output starts from an empty area, and a saved notebook keeps no trace of the notice.

A transient display id is never written to a notebook; ``update_display_data`` and ``clear_output`` are handled by
JupyterLab, Notebook 7, nbclient / papermill and every front end that implements the messaging spec. A cell that
gets its GPUs at once never creates a notice (the router creates one only once the cell has waited), and a notice
is first shown after :data:`SHOW_AFTER_S`, so short waits (a replica catching up) do not flicker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import zmq

from jupyter_notebookos.gateway.router.wire import Signer, WireMessage

if TYPE_CHECKING:
    from jupyter_notebookos.gateway.router.sockets import ClientSocket

#: The MIME type of the notice's structured form (the JupyterLab extension renders it).
WAIT_MIME = "application/vnd.notebookos.wait+json"
#: A cell that has waited this long gets the notice.
SHOW_AFTER_S = 0.5
#: How often the notice is updated while the cell waits.
UPDATE_EVERY_S = 1.0
#: What a cell waits for when it is not in the queue: a migration moving one of its replicas to free GPUs, another
#: replica's GPU state leaving the granted GPUs (sticky GPUs), or the chosen replica catching up.
PREPARING = "preparing a replica and its GPUs"


def ordinal(n: int) -> str:
    """1 -> "1st", 2 -> "2nd", 3 -> "3rd", 11 -> "11th", 22 -> "22nd"."""
    if 11 <= n % 100 <= 13:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


def wait_sentence(gpus: int, position: int | None, waited_s: float) -> str:
    """The notice in words: "waiting for 2 GPUs, 3rd in queue, 12 s"."""
    what = "1 GPU" if gpus == 1 else f"{gpus} GPUs"
    where = f"{ordinal(position)} in queue" if position else PREPARING
    return f"waiting for {what}, {where}, {round(waited_s)} s"


class WaitNotice:
    """The notice of one waiting cell: shown after :data:`SHOW_AFTER_S`, updated, cleared by :meth:`clear`.

    ``position`` says where the cell is in the scheduler's queue (1-based), or ``None`` when it is not queued
    (see :data:`PREPARING`).
    """

    def __init__(
        self,
        *,
        signer: Signer,
        iopub: ClientSocket,
        request: WireMessage,
        gpus: int,
        arrived: float,
        position: Callable[[], int | None],
    ) -> None:
        self.signer = signer
        self.iopub = iopub
        self.request = request
        self.gpus = gpus
        self.arrived = arrived
        self.position = position
        self.display_id = f"notebookos-wait-{request.msg_id}"
        self.shown = False
        # A silent request (a front end's or extension's own, e.g. a variable inspector) has no output area.
        silent = bool(request.content().get("silent"))
        self._task: asyncio.Task[None] | None = None if silent else asyncio.ensure_future(self._run())

    def content(self) -> dict[str, object]:
        """The notice as it is now: both representations, and the transient display id."""
        waited = max(0.0, time.monotonic() - self.arrived)
        position = self.position()
        structured: dict[str, object] = {"gpus": self.gpus, "position": position, "waited_s": round(waited, 1)}
        if position is None:
            structured["reason"] = PREPARING
        return {
            "data": {
                WAIT_MIME: structured,
                "text/plain": f"NotebookOS: {wait_sentence(self.gpus, position, waited)}",
            },
            "metadata": {},
            "transient": {"display_id": self.display_id},
        }

    def _send(self, msg_type: str, content: dict[str, object]) -> None:
        # A PUB socket never blocks: the message is queued in order with the router's other iopub traffic.
        msg = self.signer.make(msg_type, content, self.request, idents=[f"kernel.{msg_type}".encode()])
        self.iopub.send_multipart(msg.frames())

    async def _run(self) -> None:
        await asyncio.sleep(max(0.0, self.arrived + SHOW_AFTER_S - time.monotonic()))
        try:
            self._send("display_data", self.content())
            self.shown = True
            while True:
                await asyncio.sleep(UPDATE_EVERY_S)
                self._send("update_display_data", self.content())
        except zmq.ZMQError:
            return  # the router is closing its sockets: no client will see the cell again

    def clear(self) -> None:
        """The wait is over (the cell starts, was interrupted or rejected): stop updating, remove the notice."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self.shown:
            self.shown = False
            with contextlib.suppress(zmq.ZMQError):
                self._send("clear_output", {"wait": False})
