"""Tables drawn for a terminal (``notebookos status``, ``notebookos simulate``) that rich never has to cut.

Rich shrinks every column of a table wider than the terminal and cuts what no longer fits with an ellipsis
(``own…``), headers and figures alike. :func:`fitted_table` instead makes each column exactly as wide as its widest
value (its header wraps at spaces where it is wider) except the few columns named flexible, which alone wrap their
values to fit; :func:`narrowest` then says truly whether the table fits, so a caller can choose another layout
(shorter ids, a table turned on its side) when it does not.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console, JustifyMethod, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

Cell = str | Text


def narrowest(renderable: RenderableType) -> int:
    """The fewest columns ``renderable`` can be drawn in without cutting anything."""
    wide = Console(width=100_000)
    return Measurement.get(wide, wide.options, renderable).minimum


def header_width(header: str) -> int:
    """The narrowest a column may be for its ``header`` to wrap at spaces but never be cut."""
    return max((len(word) for word in header.split()), default=0)


def fitted_table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Cell]],
    *,
    right: Iterable[str] = (),
    flexible: Iterable[str] = (),
    **options: Any,
) -> Table:
    """A table of ``rows`` under ``headers`` whose columns rich never cuts: each as wide as its widest value (at
    least its header's longest word), the ``flexible`` ones wrapping their values at spaces instead. ``right``:
    the columns aligned right; ``options`` go to :class:`rich.table.Table` (title, caption, box)."""
    rows = [list(row) for row in rows]
    aligned_right, wrapping = set(right), set(flexible)
    table = Table(**options)
    for index, header in enumerate(headers):
        widest = max((cell_len(str(row[index])) for row in rows), default=0)
        justify: JustifyMethod = "right" if header in aligned_right else "left"
        if header in wrapping:
            table.add_column(header, justify=justify, min_width=header_width(header))
        else:
            table.add_column(header, justify=justify, width=max(widest, header_width(header)))
    for row in rows:
        table.add_row(*row)
    return table


__all__ = ["Cell", "fitted_table", "header_width", "narrowest"]


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default, except where there is none or the help says it already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        # `is` for the flags' False: a default of 0 is shown (0 == False).
        nothing = default is None or default is False or default in ("", [], argparse.SUPPRESS)
        if nothing or "default" in text:
            return text
        return super()._get_help_string(action)
