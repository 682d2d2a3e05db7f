"""Who owns each session, and which GPU type it asks for: what quotas, fair share and typed pools act on.

The trace has no users. Two readings, chosen by ``--users``:

- ``sessions``: every trace session is a user of its own (its restarts after the idle culler stay that user):
  339 users in the June trace;
- ``N``: N users, ``user0`` ... ``user{N-1}``, the workload's sessions dealt to them in turn (session i to
  ``user{i mod N}``), so every user gets a share of the workload's mix.

``--groups G`` puts user k in ``group{k mod G}``. ``--gpu-type-mix a100=3,h100=1`` gives each session a
wanted GPU type drawn with those weights (seeded by ``--seed``; a session keeps its type through restarts).
Without ``--users`` and ``--gpu-type-mix`` the workload is returned unchanged.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from jupyter_notebookos.scheduler import canonical
from jupyter_notebookos.simulator.workload import Workload


def parse_users(text: str) -> str | int:
    """``"sessions"`` or a user count from the ``--users`` option."""
    if text.strip().lower() == "sessions":
        return "sessions"
    try:
        count = int(text)
    except ValueError:
        raise ValueError(f"--users takes 'sessions' or a number of users, got {text!r}") from None
    if count < 1:
        raise ValueError("--users must be at least 1")
    return count


def parse_type_mix(text: str) -> dict[str, float]:
    """``{"a100": 3.0, "h100": 1.0}`` from ``a100=3,h100=1`` (the ``--gpu-type-mix`` option)."""
    mix: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, _, weight = part.partition("=")
        try:
            value = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"--gpu-type-mix: {part!r} is not TYPE=WEIGHT") from None
        if not name.strip() or value <= 0:
            raise ValueError(f"--gpu-type-mix: {part!r} needs a type and a weight > 0")
        mix[canonical(name)] = mix.get(canonical(name), 0.0) + value
    if not mix:
        raise ValueError("--gpu-type-mix names no type")
    return mix


def assign_users(
    workload: Workload,
    users: str | int | None,
    groups: int = 0,
    type_mix: dict[str, float] | None = None,
    seed: int = 0,
) -> Workload:
    """The workload with owners and wanted GPU types set (see the module); call it before the idle culler."""
    if users is None and not type_mix:
        return workload
    types: list[tuple[str, ...]] = [()] * len(workload.sessions)
    if type_mix:
        names = sorted(type_mix)
        weights = np.array([type_mix[n] for n in names])
        draws = np.random.default_rng([seed, 2]).choice(
            len(names), size=len(workload.sessions), p=weights / weights.sum()
        )
        types = [(names[int(d)],) for d in draws]
    sessions = []
    for index, session in enumerate(workload.sessions):
        user: str | None = None
        member: tuple[str, ...] = ()
        if users == "sessions":
            user = session.session_id
            number = index
        elif isinstance(users, int):
            number = index % users
            user = f"user{number}"
        if user is not None and groups > 0:
            member = (f"group{number % groups}",)
        sessions.append(replace(session, user=user, groups=member, gpu_types=types[index]))
    return Workload(name=workload.name, sessions=tuple(sessions))
