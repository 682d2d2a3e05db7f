"""A minimal client of a gateway's kernel REST API and channels websocket, as a notebook front end uses them."""

from __future__ import annotations

import json
import socket
import time
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlparse

import requests
import websocket

from jupyter_notebookos.client import next_message_frame


def start_kernel(url: str, token: str, name: str = "python3") -> str:
    """Start a kernel through the gateway's REST API and return its id."""
    response = requests.post(
        f"{url}/api/kernels", json={"name": name}, headers={"Authorization": f"token {token}"}, timeout=60
    )
    response.raise_for_status()
    return str(response.json()["id"])


def shutdown_kernel(url: str, token: str, kernel_id: str) -> None:
    """Shut a kernel down; a kernel that is already gone is fine."""
    requests.delete(f"{url}/api/kernels/{kernel_id}", headers={"Authorization": f"token {token}"}, timeout=30)


def channels_url(url: str, kernel_id: str, session_id: str) -> str:
    """The websocket URL of a kernel's channels for one client session."""
    return f"ws{url.removeprefix('http')}/api/kernels/{kernel_id}/channels?session_id={session_id}"


def open_handshake_only(url: str, token: str, kernel_id: str, session_id: str) -> socket.socket:
    """Send a websocket upgrade request and never read the answer: a client that went away mid-handshake
    without closing its TCP connection (what the Jupyter server's gateway client leaves behind)."""
    parsed = urlparse(url)
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=10)
    path = f"/api/kernels/{kernel_id}/channels?session_id={session_id}"
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        f"Authorization: token {token}\r\n\r\n"
    )
    sock.sendall(request.encode())
    return sock


class KernelSocket:
    """One client session on a kernel's channels websocket (the legacy JSON protocol)."""

    def __init__(self, url: str, token: str, kernel_id: str, session_id: str | None = None, timeout: float = 60):
        self.session_id = session_id or uuid.uuid4().hex
        started = time.monotonic()
        self.ws = websocket.create_connection(
            channels_url(url, kernel_id, self.session_id),
            header=[f"Authorization: token {token}"],
            timeout=timeout,
        )
        self.handshake_seconds = time.monotonic() - started

    def send(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        """Send a request and return its msg_id."""
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id,
            "msg_type": msg_type,
            "username": "test",
            "session": self.session_id,
            "date": datetime.now(UTC).isoformat(),
            "version": "5.3",
        }
        self.ws.send(
            json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": channel})
        )
        return msg_id

    def execute(self, code: str, timeout: float = 30) -> tuple[list[dict[str, Any]], float]:
        """Run `code`; return the messages of that request (until both reply and idle) and the seconds taken."""
        started = time.monotonic()
        msg_id = self.send("execute_request", {"code": code, "silent": False, "store_history": False})
        return self.collect(msg_id, timeout), time.monotonic() - started

    def receive(self, timeout: float) -> dict[str, Any] | None:
        """The next kernel message, or None if none comes within ``timeout`` seconds."""
        data = next_message_frame(self.ws, timeout)
        return None if data is None else dict(json.loads(data))

    def collect(self, msg_id: str, timeout: float = 30) -> list[dict[str, Any]]:
        """The messages answering request `msg_id` (sent on this or an earlier connection of this session),
        until both its reply and its iopub idle status have arrived; TimeoutError (saying what came) if they do
        not within ``timeout`` seconds."""
        messages: list[dict[str, Any]] = []
        replied = idle = False
        deadline = time.monotonic() + timeout
        while not (replied and idle):
            msg = self.receive(deadline - time.monotonic())
            if msg is None:
                kinds = [m["header"]["msg_type"] for m in messages]
                others = [k for k in kinds if k != "stream"]
                raise TimeoutError(
                    f"no {'idle' if replied else 'reply'} of {msg_id} within {timeout} s; its messages that came: "
                    f"{len(kinds)}, {kinds.count('stream')} of them stream, the others {others}"
                )
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            messages.append(msg)
            msg_type = msg["header"]["msg_type"]
            # iopub's idle may arrive before the shell reply: wait for both, in any order.
            replied = replied or msg_type.endswith("_reply")
            idle = idle or (msg_type == "status" and msg["content"]["execution_state"] == "idle")
        return messages

    def close(self) -> None:
        """Close the websocket."""
        self.ws.close()


def connections(url: str, token: str, kernel_id: str) -> int:
    """How many websocket connections the gateway counts for a kernel."""
    response = requests.get(f"{url}/api/kernels/{kernel_id}", headers={"Authorization": f"token {token}"}, timeout=10)
    response.raise_for_status()
    return int(response.json()["connections"])


def stdout_of(messages: list[dict[str, Any]]) -> str:
    """The text a cell printed, from its iopub stream messages."""
    return "".join(m["content"]["text"] for m in messages if m["header"]["msg_type"] == "stream")
