"""Independent description of a namespace, to compare an executor's and a replica's (in different processes).

Deliberately does not use the code under test: values are described structurally, and sharing (two names
reaching the same mutable object) is found by its own walk.
"""

from __future__ import annotations

import hashlib
import re
import types
from typing import Any

_IPYTHON = re.compile(r"^(In|Out|_|__|___|_i|_ii|_iii|_oh|_dh|_ih|exit|quit|get_ipython|_i?\d+|__\w*__)$")


def user_names(ns: dict[str, Any], hidden: dict[str, Any] | None = None) -> list[str]:
    hidden = hidden or {}
    return sorted(n for n, v in ns.items() if not _IPYTHON.match(n) and not (n in hidden and hidden[n] is v))


def canon(value: Any, seen: set[int] | None = None) -> Any:
    seen = set() if seen is None else seen
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        np = None
    if np is not None and isinstance(value, np.ndarray):
        return ("ndarray", str(value.dtype), value.shape, hashlib.sha1(value.tobytes()).hexdigest())
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, types.FunctionType):
        return ("function", value.__qualname__)
    if isinstance(value, type):
        attrs = sorted(k for k in vars(value) if not k.startswith("__"))
        return ("class", value.__qualname__, attrs)
    if id(value) in seen:
        return ("cycle",)
    if isinstance(value, list | tuple | set | frozenset | dict) or hasattr(value, "__dict__"):
        seen = seen | {id(value)}
    if isinstance(value, list | tuple):
        return (type(value).__name__, [canon(v, seen) for v in value])
    if isinstance(value, set | frozenset):
        return (type(value).__name__, sorted(repr(v) for v in value))
    if isinstance(value, dict):
        return ("dict", sorted((repr(k), canon(v, seen)) for k, v in value.items()))
    if hasattr(value, "__dict__") and type(value).__module__ == "__main__":
        return ("instance", type(value).__qualname__, canon(vars(value), seen))
    return ("repr", type(value).__name__, repr(value))


def _reach(value: Any, out: set[int]) -> None:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, types.ModuleType | types.FunctionType | type | str | bytes | int | float | tuple):
            if isinstance(v, tuple):
                stack.extend(v)
            continue
        if id(v) in out:
            continue
        if isinstance(v, list | set | dict) or hasattr(v, "__dict__") or type(v).__name__ == "ndarray":
            out.add(id(v))
        if isinstance(v, list | set):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif hasattr(v, "__dict__") and type(v).__module__ == "__main__":
            stack.extend(vars(v).values())


def describe(ns: dict[str, Any], hidden: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every user name's structural value, and which names reach a common mutable object."""
    names = user_names(ns, hidden)
    owners: dict[int, set[str]] = {}
    for name in names:
        reached: set[int] = set()
        _reach(ns[name], reached)
        for oid in reached:
            owners.setdefault(oid, set()).add(name)
    shared = sorted({tuple(sorted(s)) for s in owners.values() if len(s) > 1})
    return {"values": {n: canon(ns[n]) for n in names}, "shared": shared}
