"""Jupyter wire messages as the router handles them: frames kept as bytes, parts parsed only when needed.

The router forwards most messages without touching them (the replicas share the kernel's HMAC key), so
parsing is lazy: the header is decoded to learn ``msg_type``/``msg_id``, the parent header to route iopub,
and only an ``execute_request`` and its reply are rebuilt and re-signed.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from jupyter_client.session import Session

DELIM = b"<IDS|MSG>"


class MalformedMessage(ValueError):
    """Frames that are not a Jupyter message (no delimiter, too few parts, bad JSON, bad signature)."""


def _json(frame: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(frame) if frame else {}
    except (ValueError, UnicodeDecodeError) as err:
        raise MalformedMessage(f"{what} is not JSON: {err}") from None
    if not isinstance(value, dict):
        raise MalformedMessage(f"{what} is not a JSON object")
    return value


@dataclass
class WireMessage:
    """One multipart Jupyter message: routing identities, then signature, header, parent, metadata, content."""

    idents: list[bytes]
    signature: bytes
    header_frame: bytes
    parent_frame: bytes
    metadata_frame: bytes
    content_frame: bytes
    buffers: list[bytes] = field(default_factory=list)
    _header: dict[str, Any] | None = None
    _parent: dict[str, Any] | None = None

    @classmethod
    def parse(cls, frames: list[bytes]) -> WireMessage:
        """Split ``frames``; raises :class:`MalformedMessage` when they are not a Jupyter message."""
        try:
            at = frames.index(DELIM)
        except ValueError:
            raise MalformedMessage("no <IDS|MSG> delimiter") from None
        parts = frames[at + 1 :]
        if len(parts) < 5:
            raise MalformedMessage(f"{len(parts)} frames after the delimiter, expected at least 5")
        return cls(list(frames[:at]), parts[0], parts[1], parts[2], parts[3], parts[4], list(parts[5:]))

    @property
    def header(self) -> dict[str, Any]:
        if self._header is None:
            self._header = _json(self.header_frame, "header")
        return self._header

    @property
    def parent(self) -> dict[str, Any]:
        if self._parent is None:
            self._parent = _json(self.parent_frame, "parent header")
        return self._parent

    @property
    def msg_type(self) -> str:
        return str(self.header.get("msg_type", ""))

    @property
    def msg_id(self) -> str:
        return str(self.header.get("msg_id", ""))

    @property
    def parent_msg_id(self) -> str:
        return str(self.parent.get("msg_id", ""))

    def metadata(self) -> dict[str, Any]:
        return _json(self.metadata_frame, "metadata")

    def content(self) -> dict[str, Any]:
        return _json(self.content_frame, "content")

    def frames(self, idents: list[bytes] | None = None) -> list[bytes]:
        """The frames to send, with ``idents`` (default: the message's own) in front."""
        return [
            *(self.idents if idents is None else idents),
            DELIM,
            self.signature,
            self.header_frame,
            self.parent_frame,
            self.metadata_frame,
            self.content_frame,
            *self.buffers,
        ]


class Signer:
    """Checks and makes HMAC signatures with the kernel's key, exactly as ``jupyter_client.Session`` does."""

    def __init__(self, key: bytes, signature_scheme: str = "hmac-sha256") -> None:
        self.session = Session(key=key, signature_scheme=signature_scheme)

    def sign(self, msg: WireMessage) -> bytes:
        return bytes(self.session.sign([msg.header_frame, msg.parent_frame, msg.metadata_frame, msg.content_frame]))

    def verify(self, msg: WireMessage) -> None:
        """Raise :class:`MalformedMessage` unless ``msg`` carries a valid signature."""
        if not self.session.key:
            return
        if not hmac.compare_digest(self.sign(msg), msg.signature):
            raise MalformedMessage("invalid HMAC signature")

    def with_metadata(self, msg: WireMessage, metadata: dict[str, Any]) -> WireMessage:
        """A copy of ``msg`` with new metadata, re-signed."""
        new = WireMessage(
            msg.idents,
            b"",
            msg.header_frame,
            msg.parent_frame,
            json.dumps(metadata, default=str).encode(),
            msg.content_frame,
            msg.buffers,
            msg._header,
            msg._parent,
        )
        new.signature = self.sign(new)
        return new

    def make(
        self,
        msg_type: str,
        content: dict[str, Any],
        parent: WireMessage,
        *,
        idents: list[bytes] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> WireMessage:
        """A new message from the kernel to clients, in reply to ``parent``."""
        header = {
            "msg_id": uuid4().hex,
            "msg_type": msg_type,
            "username": parent.header.get("username", "kernel"),
            "session": self.session.session,
            "date": datetime.now(UTC).isoformat(),
            "version": "5.3",
        }
        msg = WireMessage(
            list(parent.idents if idents is None else idents),
            b"",
            json.dumps(header).encode(),
            parent.header_frame,
            json.dumps(metadata or {}, default=str).encode(),
            json.dumps(content, default=str).encode(),
        )
        msg.signature = self.sign(msg)
        return msg
