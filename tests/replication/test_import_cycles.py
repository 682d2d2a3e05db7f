"""No import loop among the modules of ``replication`` and ``kernel``.

Every import counts: at module level, inside a function, and under ``TYPE_CHECKING``. A loop hides one module's job
inside another's (the pickler, fingerprints and state tracking were one tangle: serialization imported state for
a type, state imported serialization inside a method, fingerprint imported serialization) and breaks at import
time as soon as one of its imports moves to module level.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "jupyter_notebookos"
CHECKED = ("replication", "kernel")


def _imports(path: Path, package: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that the module at ``path`` (in ``package``) imports anywhere."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.add(f"{base}.{alias.name}")
                elif base in modules:
                    found.add(base)
    return found


def _graph() -> dict[str, set[str]]:
    paths = {}
    for sub in CHECKED:
        for path in (PACKAGE / sub).glob("*.py"):
            name = f"jupyter_notebookos.{sub}" if path.stem == "__init__" else f"jupyter_notebookos.{sub}.{path.stem}"
            paths[name] = path
    modules = set(paths)
    return {
        name: _imports(path, f"jupyter_notebookos.{path.parent.name}", modules) - {name} for name, path in paths.items()
    }


def _a_loop(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop of ``graph`` (its modules in order, the first again at the end), or None."""
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        for imported in sorted(graph[name]):
            if (loop := visit(imported, [*path, name])) is not None:
                return loop
        done.add(name)
        return None

    for name in sorted(graph):
        if (loop := visit(name, [])) is not None:
            return loop
    return None


def test_the_replication_and_kernel_modules_import_each_other_without_a_loop() -> None:
    graph = _graph()
    assert "jupyter_notebookos.replication.records" in graph["jupyter_notebookos.replication.state"]
    assert _a_loop(graph) is None, " -> ".join(_a_loop(graph) or [])


def test_a_loop_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _a_loop(graph) == ["a", "b", "c", "a"]
    assert _a_loop({"a": {"b"}, "b": set()}) is None
