"""Hand-built workloads for the sharing targets (``--scenario``).

``flood``: the contention the sharing issue describes, on a fixed cluster of 4 hosts with 2 GPUs each. User
``alice`` runs ``flood_kernels`` kernels of 2 GPUs, each submitting 4-second cells back to back (10 GPUs wanted
of 8); user ``bob`` runs one 1-GPU kernel whose cells (``x += 1``: 10 ms) come every 3 to 7 seconds (his think
time, drawn with ``seed``). With ``flood_kernels=0`` bob is alone: his delay then is the idle cluster's. Every
kernel is started a minute before the cells begin, so kernel starts are not measured.
"""

from __future__ import annotations

import numpy as np

from jupyter_notebookos.simulator.workload import Session, Task, Workload

SCENARIOS = ("flood",)
#: The cluster the flood scenario is about: fixed, 4 hosts of 2 GPUs.
FLOOD_HOSTS = 4
FLOOD_GPUS_PER_HOST = 2


def flood(
    hours: float = 1.0,
    flood_kernels: int = 5,
    seed: int = 0,
    flood_gpus: int = 2,
    flood_cell_s: float = 4.0,
    light_cell_s: float = 0.01,
    think_s: tuple[float, float] = (3.0, 7.0),
) -> Workload:
    """The flood scenario (see the module) over ``hours`` of cells."""
    if hours <= 0 or flood_kernels < 0:
        raise ValueError("the flood scenario needs hours > 0 and flood kernels >= 0")
    begin = 60.0
    end = begin + hours * 3600.0
    sessions: list[Session] = []
    cells = max(1, int(hours * 3600.0 / flood_cell_s))
    for k in range(flood_kernels):
        tasks = tuple(Task(begin + j * flood_cell_s, flood_cell_s, flood_gpus) for j in range(cells))
        sessions.append(Session(f"alice-{k}", tasks, 0.0, tasks[-1].end_s, life_known=True, user="alice"))
    rng = np.random.default_rng([seed, 3])
    light: list[Task] = []
    clock = begin
    while clock < end:
        light.append(Task(clock, light_cell_s, 1))
        clock += light_cell_s + float(rng.uniform(*think_s))
    sessions.append(Session("bob", tuple(light), 0.0, light[-1].end_s, life_known=True, user="bob"))
    name = f"flood(alice: {flood_kernels} x {flood_gpus} GPUs, bob: 1 GPU, {hours:g} h)"
    return Workload(name=name, sessions=tuple(sessions))
