"""The words of the waiting-for-GPUs notice, as every front end without the extension shows them."""

from __future__ import annotations

import pytest

from jupyter_notebookos.gateway.router.waitnotice import ordinal, wait_sentence


@pytest.mark.parametrize(
    ("n", "words"), [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"), (13, "13th"),
                     (21, "21st"), (22, "22nd"), (101, "101st"), (111, "111th")]
)  # fmt: skip
def test_queue_positions_read_as_ordinals(n: int, words: str) -> None:
    assert ordinal(n) == words


def test_the_sentence_names_gpus_place_and_seconds() -> None:
    assert wait_sentence(2, 3, 12.4) == "waiting for 2 GPUs, 3rd in queue, 12 s"
    assert wait_sentence(1, 1, 0.6) == "waiting for 1 GPU, 1st in queue, 1 s"
    # Out of the queue, not yet running (a migration, an eviction of another replica's GPU state, a catch-up).
    assert wait_sentence(1, None, 3) == "waiting for 1 GPU, preparing a replica and its GPUs, 3 s"
