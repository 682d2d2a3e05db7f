"""How much state a kernel holds: the size each restore reads from the object store.

A restore (the new replica of a migration, a kernel restarted after the idle culler ended it, Batch's fresh
replica before every cell) reads the kernel's state from the object store, so the cost model charges
`CostModel.restore_s` plus the state's size over `CostModel.restore_gb_per_s` (see `costs`).

The sizes come from the model a kernel trains. The job-list trace names one per training event (`model_name`:
nine CNNs; the trace's converter drew it at random per session and switched it with 15 % chance per event, so it
says nothing about the real user, but it gives sizes of the right order). A kernel training a model holds its
FP32 weights, their gradients and Adam's two moments: `BYTES_PER_PARAMETER` (16) bytes per parameter, from
0.41 GB (ResNet-50) to 2.3 GB (VGG-19). Datasets and activations are not counted (a lower bound). The
synthetic workload draws models the way the converter did; `--state-gb` gives every kernel one fixed size
instead (for sensitivity analysis, or for a trace whose model names are not in the table).
"""

from __future__ import annotations

import numpy as np

#: Parameters of each model the trace names (torchvision's, and timm's Inception v4).
MODEL_PARAMETERS = {
    "alexnet": 61_100_840,
    "vgg11": 132_863_336,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "inception3": 27_161_264,
    "inception4": 42_679_816,
}
BYTES_PER_PARAMETER = 16  # FP32 weights + gradients + Adam's first and second moments
MODEL_SWITCH_PROBABILITY = 0.15  # the trace converter's chance of switching models at each event
GB = 1e9


class UnknownModelError(ValueError):
    """A trace names a model the size table does not know."""


def model_state_bytes(model: str) -> int:
    """The state a kernel training ``model`` holds, in bytes."""
    parameters = MODEL_PARAMETERS.get(model.strip().lower())
    if parameters is None:
        known = ", ".join(sorted(MODEL_PARAMETERS))
        raise UnknownModelError(
            f"unknown model {model!r} (known: {known}); give every kernel one state size with --state-gb instead"
        )
    return parameters * BYTES_PER_PARAMETER


def fixed_state_bytes(state_gb: float) -> int:
    """``state_gb`` as bytes (the `--state-gb` option)."""
    if state_gb < 0:
        raise ValueError("--state-gb must be >= 0")
    return round(state_gb * GB)


def draw_models(rng: np.random.Generator, tasks_per_session: list[int]) -> list[list[str]]:
    """Model names per task, drawn as the trace's converter did: one per session, switched with 15 % chance."""
    names = sorted(MODEL_PARAMETERS)
    drawn: list[list[str]] = []
    for count in tasks_per_session:
        current = names[int(rng.integers(len(names)))]
        models: list[str] = []
        for _ in range(count):
            if models and rng.random() < MODEL_SWITCH_PROBABILITY:
                current = names[int(rng.integers(len(names)))]
            models.append(current)
        drawn.append(models)
    return drawn
