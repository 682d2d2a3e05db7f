"""docs/architecture.md is the map of the code: it names every module of the package, and every module it names
exists (paths relative to ``jupyter_notebookos/``, in backticks)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jupyter_notebookos"
DOC = PACKAGE.parent / "docs" / "architecture.md"

#: A module path the way the document writes one: `gateway/router/relay.py`, or `gateway/web/dashboard/` for a
#: package whose ``__init__.py`` holds code.
NAMED = re.compile(r"`([a-z_]+(?:/[a-z_]+)*(?:\.py|/))`")


def _holds_code(init: Path) -> bool:
    """Whether a package's ``__init__.py`` defines something (a class or function), beyond its docstring and the
    names it re-exports."""
    tree = ast.parse(init.read_text())
    return any(isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) for node in tree.body)


def modules() -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        if path.name != "__init__.py":
            found.add(relative)
        elif _holds_code(path):
            found.add(relative.removesuffix("__init__.py"))
    return found


def test_the_architecture_names_every_module() -> None:
    missing = sorted(modules() - set(NAMED.findall(DOC.read_text())))
    assert not missing, f"docs/architecture.md does not name these modules: {missing}"


def test_every_module_the_architecture_names_exists() -> None:
    packages = {p.relative_to(PACKAGE).as_posix().split("/")[0] for p in PACKAGE.iterdir() if p.is_dir()}
    stale = sorted(
        name
        for name in NAMED.findall(DOC.read_text())
        if name.split("/")[0] in packages and not (PACKAGE / name).exists()
    )
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"
