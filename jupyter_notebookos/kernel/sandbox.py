"""A replica becomes its kernel's own OS user before any of the kernel's code runs (embedded mode, as root).

The local launcher gives every kernel a uid of its own (``NOTEBOOKOS_KERNEL_UID``); the replica process starts
as root, drops to that uid for good, and only then runs user code. Then one kernel's code cannot read another
kernel's files, environment (its etcd password) or memory, nor the gateway's state (DESIGN.md section 8).

The Python the replica runs may live where other users cannot pass, typically a pyenv under ``/root`` (mode
0700). Then, before dropping root, the process takes a private mount namespace in which each such directory is
covered by an empty tmpfs, and only what the replica needs (the Python installation, the virtualenv, this
package) is bind-mounted back at the same path, read-only. Nothing changes on the host, and the rest of
``/root`` is invisible to the kernel.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys
from pathlib import Path

from jupyter_notebookos.replication.protocol import ENV_KERNEL_UID

__all__ = ["ENV_KERNEL_UID", "SandboxError", "become_kernel_user", "check"]

_CLONE_NEWNS = 0x00020000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_PR_SET_DUMPABLE = 4


class SandboxError(RuntimeError):
    """The replica could not take its kernel's user (the message says which step failed)."""


def needed_paths() -> list[str]:
    """What a replica reads after it dropped root: the Python installation, the virtualenv, this package."""
    import jupyter_notebookos

    package_root = Path(jupyter_notebookos.__file__).resolve().parent.parent
    paths = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), str(package_root)}
    return sorted(paths)


def _first_blocked(path: str) -> str | None:
    """The topmost directory above ``path`` that other users cannot pass (no o+x), or None."""
    for parent in reversed(Path(path).parents):
        try:
            if not parent.stat().st_mode & stat.S_IXOTH:
                return str(parent)
        except OSError:
            return str(parent)
    return None


def hidden_paths(paths: list[str]) -> dict[str, list[str]]:
    """``{blocked directory: [needed paths below it]}`` for the needed paths other users cannot reach."""
    hidden: dict[str, list[str]] = {}
    for path in paths:
        blocked = _first_blocked(path)
        if blocked is not None:
            hidden.setdefault(blocked, []).append(path)
    return hidden


def _mount(
    libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    encode = lambda s: s.encode() if s is not None else None  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        errno = ctypes.get_errno()
        raise SandboxError(f"mount {source} on {target} failed: {os.strerror(errno)}")


def expose(hidden: dict[str, list[str]]) -> None:
    """In a private mount namespace of this process, cover each blocked directory with an empty tmpfs and
    bind the needed paths below it back, read-only."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise SandboxError(f"cannot take a private mount namespace: {os.strerror(ctypes.get_errno())}")
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE, None)
    for blocked, paths in hidden.items():
        handles = {path: os.open(path, os.O_PATH) for path in paths}  # reachable until the tmpfs covers them
        _mount(libc, "tmpfs", blocked, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
        for path, handle in handles.items():
            # Mount points and the directories leading to them: passable by the kernel's user, whatever the umask.
            for parent in [*reversed(Path(path).parents), Path(path)]:
                if Path(blocked) in parent.parents:
                    parent.mkdir(exist_ok=True)
                    parent.chmod(0o755)
            _mount(libc, f"/proc/self/fd/{handle}", path, None, _MS_BIND | _MS_REC, None)
            _mount(libc, None, path, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_REC, None)
            os.close(handle)


def become_kernel_user(uid: int) -> None:
    """Take the kernel's uid (and gid, no supplementary groups) for good, exposing the Python first if needed."""
    hidden = hidden_paths(needed_paths())
    if hidden:
        expose(hidden)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SandboxError(f"still running as uid {os.geteuid()} after taking uid {uid}")
    # Changing credentials made the process non-dumpable, which hands its /proc/self files to root: the state
    # tracker's write tracking reads /proc/self/pagemap. Dumpable again, they are the kernel's user's (only
    # processes of this same kernel may then inspect it).
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
        raise SandboxError(f"cannot make the replica dumpable again: {os.strerror(ctypes.get_errno())}")


def check() -> None:
    """Exit 0 when this machine lets a replica take a kernel's user (for the launcher, in a child process)."""
    become_kernel_user(65534)
    for path in needed_paths():
        os.listdir(path)


if __name__ == "__main__":
    try:
        check()
    except (OSError, SandboxError) as err:
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        sys.exit(1)
