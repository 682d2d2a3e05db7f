"""CellIntake: the directed cells a replica took, and those a re-attached gateway gave up."""

from __future__ import annotations

from jupyter_notebookos.kernel.intake import CELLS_REMEMBERED, CellIntake


def test_a_cell_given_up_is_refused_and_a_cell_taken_stays_taken() -> None:
    intake = CellIntake()
    assert intake.take("m1")
    assert intake.taken_else_given_up("m1")  # it reached this replica: the new gateway waits for its record
    assert not intake.taken_else_given_up("m2")  # it had not: given up from now on...
    assert not intake.take("m2")  # ...so it never runs should it still come
    assert not intake.taken_else_given_up("m2")
    for i in range(CELLS_REMEMBERED):
        intake.take(f"later-{i}")
    assert not intake.taken_else_given_up("m1")  # (only the latest cells are remembered)
