"""Which global names a cell can reach: what lets the state tracker fingerprint only those after it.

A cell can change a value in place only through a reference to it, and the notebook's code gets references
to the user's values by name: the cell's own code, and the code of the notebook's functions, methods and
lambdas it calls (their ``__globals__`` is the user namespace). So the names a cell can reach are the names
its code mentions, and, for each of those names, the names mentioned by the notebook code reachable from
its value; and so on. This module reads the names from the code, statically: no tracing, so the user's code
runs at full speed (a namespace that records its reads costs 3x on a recursive function, 6x on a loop calling
builtins, measured here).

:func:`cell_reach` reads the cell's source; :func:`code_reach` a notebook function's code object (the state
tracker collects those while fingerprinting a value, from the same pickler that records use). Both answer None
where code can reach names without spelling them: ``globals()``, ``vars()``, ``eval``, ``exec``,
``__import__``, frames (``sys._getframe().f_globals``), a function's ``__globals__``, IPython's ``user_ns``,
the string ``"__main__"`` (``sys.modules["__main__"]``), ``get_ipython()`` other than through the magics listed
here. An attribute named like one of those globals (``model.eval()``) is not dynamic. The tracker then
fingerprints every name, as it did for every cell before.

What remains out of reach of this analysis (the tracker's idle verification catches it, see state.py):
references that library code keeps to the user's values (a callback registry, a cache) and changes later,
threads, and C extensions that look names up in ``__main__``.
"""

from __future__ import annotations

import ast
import dis
import re
import types
from collections.abc import Iterable

#: Global names through which code can reach global names it does not spell (``locals()`` too, in a cell).
DYNAMIC_NAMES = frozenset({"globals", "vars", "eval", "exec", "__import__", "__builtins__", "__main__", "get_ipython"})

#: Attributes through which code can reach them (``sys._getframe().f_globals``, ``f.__globals__``, IPython's
#: ``user_ns``). Attribute names that happen to equal a dynamic global (``model.eval()``) are not among them.
DYNAMIC_ATTRIBUTES = frozenset({"f_globals", "f_locals", "__globals__", "user_ns", "user_global_ns"})

#: A string constant that names the user's module (``sys.modules["__main__"]``).
MAIN = "__main__"

#: Magics whose argument (line) or body (cell) is Python code run in the namespace: its names count.
CODE_MAGICS = frozenset({"time", "timeit", "prun", "capture"})

#: Magics that change no value of the namespace in place (they may bind or delete names, which the tracker
#: sees anyway by identity), and IPython's shell escapes (``!cmd``, ``x = !cmd``).
SAFE_MAGICS = frozenset(
    {
        "matplotlib",
        "pip",
        "conda",
        "mamba",
        "load_ext",
        "reload_ext",
        "unload_ext",
        "config",
        "env",
        "set_env",
        "cd",
        "pwd",
        "ls",
        "autoreload",
        "aimport",
        "precision",
        "xmode",
        "pinfo",
        "pinfo2",
        "psearch",
        "pdoc",
        "pdef",
        "psource",
        "pfile",
        "who",
        "whos",
        "who_ls",
        "history",
        "writefile",
        "bash",
        "sh",
        "script",
        "html",
        "HTML",
        "javascript",
        "js",
        "markdown",
        "latex",
        "svg",
        "sx",
        "system",
        "lsmagic",
        "magic",
    }
)
_SHELL_METHODS = frozenset({"system", "getoutput"})

_MAX_CACHED_CODES = 100_000
_code_names: dict[types.CodeType, frozenset[str] | None] = {}


_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "STORE_NAME", "DELETE_GLOBAL", "DELETE_NAME"})
_ATTRIBUTE_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "STORE_ATTR", "DELETE_ATTR"})
_UNKNOWN = object()


def code_reach(code: types.CodeType) -> frozenset[str] | None:
    """The global names ``code`` (and the code nested in it) can read; None where it can reach any name.

    Read from its bytecode once (cached per code object): the names its global loads and stores use, and
    whether it uses a dynamic global, a dynamic attribute or the string ``"__main__"``."""
    cached = _code_names.get(code, _UNKNOWN)
    if cached is not _UNKNOWN:
        return cached  # type: ignore[return-value]
    names: set[str] = set()
    answer: frozenset[str] | None = None
    dynamic = MAIN in code.co_consts
    for instruction in dis.get_instructions(code):
        if instruction.opname in _GLOBAL_OPS:
            names.add(instruction.argval)
            dynamic = dynamic or instruction.argval in DYNAMIC_NAMES
        elif instruction.opname in _ATTRIBUTE_OPS:
            dynamic = dynamic or instruction.argval in DYNAMIC_ATTRIBUTES
    if not dynamic:
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                nested = code_reach(const)
                if nested is None:
                    break
                names |= nested
        else:
            answer = frozenset(names)
    if len(_code_names) >= _MAX_CACHED_CODES:
        _code_names.clear()
    _code_names[code] = answer
    return answer


def union(reaches: Iterable[frozenset[str] | None]) -> frozenset[str] | None:
    """The union of several reaches (None if any of them is None)."""
    names: set[str] = set()
    for reach in reaches:
        if reach is None:
            return None
        names |= reach
    return frozenset(names)


def _shell_call(node: ast.Call) -> str | None:
    """``get_ipython().<method>(...)``: the method's name, else None."""
    func = node.func
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Call)
        and isinstance(func.value.func, ast.Name)
        and func.value.func.id == "get_ipython"
        and not func.value.args
        and not func.value.keywords
    ):
        return func.attr
    return None


def _strings(node: ast.Call) -> list[str] | None:
    if node.keywords or not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args):
        return None
    return [a.value for a in node.args]  # type: ignore[attr-defined]


def _magic_reach(node: ast.Call, method: str) -> frozenset[str] | None:
    """The names an IPython magic or shell escape can reach (the transformer turns ``%time f()`` into
    ``get_ipython().run_line_magic('time', 'f()')``)."""
    args = _strings(node)
    if args is None:
        return None
    if method in _SHELL_METHODS:
        return frozenset()  # ``{expr}`` in the command is only formatted into it
    if method == "run_line_magic" and len(args) == 2 and args[0] in SAFE_MAGICS | CODE_MAGICS:
        return frozenset() if args[0] in SAFE_MAGICS else _text_reach(args[1])
    if method == "run_cell_magic" and len(args) == 3 and args[0] in SAFE_MAGICS | CODE_MAGICS:
        return frozenset() if args[0] in SAFE_MAGICS else union([_text_reach(args[1]), _text_reach(args[2])])
    return None


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def _text_reach(text: str) -> frozenset[str] | None:
    """A magic's line or body: as code where it parses; else every identifier in it (a magic's options, such
    as ``-n 10`` of ``%timeit``, make the line no Python; reading them as names only adds names)."""
    try:
        return _tree_reach(ast.parse(text))
    except (SyntaxError, ValueError):
        names = frozenset(_IDENTIFIER.findall(text))
        return None if not names.isdisjoint(DYNAMIC_NAMES | DYNAMIC_ATTRIBUTES) or "locals" in names else names


def _tree_reach(tree: ast.AST) -> frozenset[str] | None:
    names: set[str] = set()
    magics: set[int] = set()  # the ``get_ipython`` names of the magic calls whose reach is known
    nodes = list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Call) and (method := _shell_call(node)) is not None:
            reach = _magic_reach(node, method)
            if reach is None:
                return None
            names |= reach
            magics.add(id(node.func.value.func))  # type: ignore[attr-defined]
    for node in nodes:
        if isinstance(node, ast.Name):
            if (node.id in DYNAMIC_NAMES or node.id == "locals") and id(node) not in magics:
                return None  # (``locals()`` in a cell is the namespace)
            names.add(node.id)
        elif (isinstance(node, ast.Attribute) and node.attr in DYNAMIC_ATTRIBUTES) or (
            isinstance(node, ast.Constant) and node.value == MAIN
        ):
            return None
    return frozenset(names)


def cell_reach(source: str | ast.Module) -> frozenset[str] | None:
    """The global names a cell's code (plain Python, transformed from IPython syntax, or its AST) mentions, with
    the names inside the magics it uses; None where the cell can reach any name (see the module docstring), or
    its source does not parse."""
    try:
        tree = ast.parse(source) if isinstance(source, str) else source
    except (SyntaxError, ValueError):
        return None
    return _tree_reach(tree)


__all__ = ["CODE_MAGICS", "DYNAMIC_ATTRIBUTES", "DYNAMIC_NAMES", "SAFE_MAGICS", "cell_reach", "code_reach", "union"]
