"""A small synchronous client of Enterprise Gateway's REST + websocket API.

It is what a notebook front end does, minus the front end: start a kernel with ``POST /api/kernels``, open
``/api/kernels/{id}/channels`` and exchange Jupyter messages as JSON. The tests, the benchmarks and scripts
use it to drive a gateway exactly as clients do (no shortcut to the kernel's ZMQ sockets).
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import requests
import websocket


class GatewayError(RuntimeError):
    """The gateway answered with an error; the message carries its status and reason."""


def next_message_frame(ws: websocket.WebSocket, timeout: float) -> bytes | str | None:
    """The data of the next text or binary frame on a kernel's websocket; None if none comes within ``timeout``
    seconds; ConnectionError if the gateway closes it. (A plain ``ws.recv()`` with a socket timeout can wait for
    ever: the gateway pings every 30 s, and each frame restarts the timeout.)"""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        ws.settimeout(left)
        try:
            opcode, data = ws.recv_data(control_frame=True)
        except websocket.WebSocketTimeoutException:
            return None
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            raise ConnectionError("the gateway closed the kernel's websocket")
        if opcode in (websocket.ABNF.OPCODE_TEXT, websocket.ABNF.OPCODE_BINARY):
            return data
    return None


@dataclass
class CellResult:
    """What one ``execute_request`` produced, as a client sees it."""

    reply: dict[str, Any]
    outputs: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def status(self) -> str:
        return str(self.reply["content"]["status"])

    @property
    def stdout(self) -> str:
        return "".join(
            o["content"]["text"] for o in self.outputs if o["msg_type"] == "stream" and o["content"]["name"] == "stdout"
        )

    @property
    def stderr(self) -> str:
        return "".join(
            o["content"]["text"] for o in self.outputs if o["msg_type"] == "stream" and o["content"]["name"] == "stderr"
        )

    @property
    def notebookos(self) -> dict[str, Any]:
        return dict(self.reply.get("metadata", {}).get("notebookos") or {})

    def result_text(self) -> str:
        """The ``text/plain`` of the cell's execute_result, or ''."""
        for o in self.outputs:
            if o["msg_type"] == "execute_result":
                return str(o["content"]["data"].get("text/plain", ""))
        return ""


class GatewayClient:
    """REST calls against a gateway, with its token."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.http = requests.Session()
        if token:
            self.http.headers["Authorization"] = f"token {token}"

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.http.request(method, self.url + path, timeout=kwargs.pop("timeout", self.timeout), **kwargs)
        if response.status_code >= 400:
            try:
                detail = response.json().get("message") or response.text
            except ValueError:
                detail = response.text
            raise GatewayError(f"{method} {path}: HTTP {response.status_code}: {detail}")
        return response.json() if response.content else None

    def start_kernel(self, name: str, env: dict[str, str] | None = None) -> str:
        """Start a kernel of kernelspec ``name``; ``env`` carries ``KERNEL_*`` variables."""
        body: dict[str, Any] = {"name": name}
        if env:
            body["env"] = env
        return str(self.request("POST", "/api/kernels", json=body)["id"])

    def shutdown_kernel(self, kernel_id: str) -> None:
        self.request("DELETE", f"/api/kernels/{kernel_id}")

    def interrupt_kernel(self, kernel_id: str) -> None:
        self.request("POST", f"/api/kernels/{kernel_id}/interrupt")

    def notebookos_kernel(self, kernel_id: str) -> dict[str, Any]:
        """``GET /api/notebookos/kernels/{id}``: the kernel's replicas, executor and GPU accounting."""
        return dict(self.request("GET", f"/api/notebookos/kernels/{kernel_id}"))

    def connect(self, kernel_id: str, session_id: str | None = None) -> KernelConnection:
        """Open the kernel's channels websocket."""
        return KernelConnection(self, kernel_id, session_id or uuid.uuid4().hex)


class KernelConnection:
    """One websocket to a kernel's channels, as a notebook tab holds it."""

    def __init__(self, client: GatewayClient, kernel_id: str, session_id: str) -> None:
        self.kernel_id = kernel_id
        self.session_id = session_id
        ws_url = client.url.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels?session_id={session_id}"
        headers = [f"Authorization: token {client.token}"] if client.token else []
        self.ws = websocket.create_connection(ws_url, header=headers, timeout=client.timeout)
        if self.ws.sock is not None:  # small frames, no delayed-ACK wait
            self.ws.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pending: list[dict[str, Any]] = []

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> KernelConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, channel: str, msg_type: str, content: dict[str, Any], metadata: dict[str, Any] | None = None) -> str:
        msg_id = uuid.uuid4().hex
        message = {
            "header": {
                "msg_id": msg_id,
                "msg_type": msg_type,
                "username": "test",
                "session": self.session_id,
                "date": "",
                "version": "5.3",
            },
            "parent_header": {},
            "metadata": metadata or {},
            "content": content,
            "channel": channel,
            "buffers": [],
        }
        self.ws.send(json.dumps(message))
        return msg_id

    def receive(self, timeout: float) -> dict[str, Any]:
        """The next message; TimeoutError when none comes within ``timeout`` seconds."""
        data = next_message_frame(self.ws, timeout)
        if data is None:
            raise TimeoutError(f"no message within {timeout:.1f} s")
        return dict(json.loads(data))

    def request(self, channel: str, msg_type: str, content: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        """Send a request and return its reply (other messages are kept for later)."""
        return self.reply(self.send(channel, msg_type, content), timeout, channel=channel)

    def reply(self, msg_id: str, timeout: float = 60.0, *, channel: str = "shell") -> dict[str, Any]:
        """The reply to request ``msg_id`` on ``channel`` (other messages are kept in ``pending``)."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self._next_of(msg_id, deadline, channel)
            if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["channel"] == channel:
                return msg
            self.pending.append(msg)

    def _next_of(self, msg_id: str, deadline: float, channel: str | None = None) -> dict[str, Any]:
        """The first message kept in ``pending`` for request ``msg_id`` (on ``channel``, if given), taken out; else
        the next one received. (Messages of several requests interleave: a router answers queued cells "aborted"
        at once, while the failed cell's own messages still come.)"""
        for index, msg in enumerate(self.pending):
            if msg.get("parent_header", {}).get("msg_id") == msg_id and channel in (None, msg.get("channel")):
                return self.pending.pop(index)
        return self.receive(deadline - time.monotonic())

    def execute(
        self, code: str, timeout: float = 60.0, *, stdin: list[str] | None = None, allow_stdin: bool = False
    ) -> CellResult:
        """Run ``code`` and collect its reply and iopub output until the kernel is idle again."""
        began = time.perf_counter()
        msg_id = self.send(
            "shell",
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": allow_stdin or bool(stdin),
                "stop_on_error": True,
            },
        )
        return self.collect(msg_id, timeout, stdin=stdin, began=began)

    def collect(
        self, msg_id: str, timeout: float = 60.0, *, stdin: list[str] | None = None, began: float | None = None
    ) -> CellResult:
        """The reply and iopub output of the ``execute_request`` ``msg_id`` already sent, until the kernel is idle
        again (``stdin``: answers to its input requests; ``began``: the ``perf_counter`` its time counts from)."""
        began = time.perf_counter() if began is None else began
        answers = list(stdin or [])
        reply: dict[str, Any] | None = None
        idle = False
        outputs: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while reply is None or not idle:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"cell did not finish within {timeout} s: reply={reply is not None} idle={idle}")
            msg = self._next_of(msg_id, deadline)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                self.pending.append(msg)
                continue
            kind = msg["msg_type"]
            if msg["channel"] == "shell" and kind == "execute_reply":
                reply = msg
            elif msg["channel"] == "stdin" and kind == "input_request":
                self.send("stdin", "input_reply", {"value": answers.pop(0) if answers else ""})
            elif msg["channel"] == "iopub":
                if kind == "status":
                    idle = idle or msg["content"]["execution_state"] == "idle"
                elif kind != "execute_input":
                    outputs.append(msg)
        return CellResult(reply, outputs, time.perf_counter() - began)
