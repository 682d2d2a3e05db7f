"""The JupyterHub authenticator of ``notebookos up --hub``: one generated password per user.

JupyterHub ships no authenticator that gives each user a password of their own without OS accounts (its
``DummyAuthenticator`` and ``SharedPasswordAuthenticator`` share one password among everyone, so any user could
log in as any other). This one reads ``{"<user>": "<password>"}`` from a file that ``notebookos up --hub``
writes with mode 0600 and prints. It runs inside the Hub's process (``.venv-hub``), which is why it imports
nothing of this package but the standard library and JupyterHub.
"""

from __future__ import annotations

import hmac
import json
import os
import stat
from pathlib import Path
from typing import Any

from jupyterhub.auth import Authenticator
from traitlets import Unicode


def read_passwords(path: str) -> dict[str, str]:
    """``{user: password}`` from ``path``; ValueError with a readable reason when the file is unusable."""
    try:
        mode = os.stat(path).st_mode
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"cannot read the passwords file {path}: {err.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"the passwords file {path} is readable by other users; chmod 600 it")
    try:
        passwords = json.loads(text)
    except ValueError as err:
        raise ValueError(f"the passwords file {path} is not JSON: {err}") from None
    if not isinstance(passwords, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in passwords.items()
    ):
        raise ValueError(f"the passwords file {path} must be a JSON object of user names to passwords")
    return passwords


class PasswordFileAuthenticator(Authenticator):
    """Each user logs in with their own password from ``passwords_file`` (re-read at each log-in)."""

    passwords_file = Unicode(
        "",
        config=True,
        help="JSON file {user: password}, mode 0600, written by `notebookos up --hub`. Only its users may log in.",
    )

    async def authenticate(self, handler: Any, data: dict[str, str]) -> str | None:
        """The user's name when the password is theirs; None (JupyterHub shows "Invalid username or
        password") otherwise."""
        username = str(data.get("username", "")).strip()
        password = str(data.get("password", ""))
        try:
            passwords = read_passwords(self.passwords_file)
        except ValueError as err:
            self.log.error("log-in refused: %s", err)
            return None
        expected = passwords.get(username)
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            self.log.warning("failed log-in for %r (unknown user or wrong password)", username)
            return None
        return username
