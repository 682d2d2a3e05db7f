"""Which global names a cell's source binds, deletes or assigns into: rule 1 of a delta (``replication/state.py``
lists the forms), read from the cell's syntax tree alone.

A name bound in a function, class or comprehension of the cell counts only where it is global there (declared
``global``, or a walrus in a comprehension at module level). What syntax cannot see (mutation through called
functions, ``exec``, magics, star imports) the tracker finds by fingerprints.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class CellBindings:
    """What a cell's source says about global names: the names it binds, deletes or assigns into."""

    touched: frozenset[str]
    parsed: bool
    star_import: bool = False


@dataclass
class _Scope:
    """One scope of the cell while it is walked; a name bound in it is global if it is the module's, or declared
    ``global`` there."""

    kind: str  # "module" | "function" | "class" | "comprehension"
    globals: frozenset[str] = frozenset()


def _declared_globals(body: Iterable[ast.AST]) -> frozenset[str]:
    """Names declared ``global`` in one function or class body (not in the scopes nested in it)."""
    found: set[str] = set()
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Global):
            found.update(node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        else:
            stack.extend(ast.iter_child_nodes(node))
    return frozenset(found)


def _root_name(node: ast.expr) -> str | None:
    """The name an attribute/item target assigns into (``a`` of ``a.x[0]``), if it is a plain name."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Starred):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class _BindingVisitor(ast.NodeVisitor):
    """Walks a cell's syntax tree and collects the global names it binds, deletes or assigns into (``touched``),
    and whether it star-imports."""

    def __init__(self) -> None:
        self.scopes = [_Scope("module")]
        self.touched: set[str] = set()
        self.star_import = False

    def _bind(self, name: str, *, walrus: bool = False) -> None:
        scopes = self.scopes
        if walrus:  # a walrus in a comprehension binds in the nearest enclosing non-comprehension scope
            scopes = [s for s in scopes if s.kind != "comprehension"] or scopes[:1]
        scope = scopes[-1]
        if scope.kind == "module" or name in scope.globals:
            self.touched.add(name)

    def _mutate(self, target: ast.expr) -> None:
        root = _root_name(target)
        if root is not None:
            self._bind(root)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store | ast.Del):
            self._bind(node.id)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, ast.Store | ast.Del):
            self._mutate(node)
        self.generic_visit(node)

    visit_Subscript = visit_Attribute  # type: ignore[assignment]

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self._bind(node.target.id, walrus=True)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._bind(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name == "*":
                self.star_import = True
            else:
                self._bind(alias.asname or alias.name)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self._bind(node.name)
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self._bind(node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self._bind(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self._bind(node.rest)
        self.generic_visit(node)

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for expr in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if expr is not None:
                self.visit(expr)
        self._bind(node.name)
        self.scopes.append(_Scope("function", _declared_globals(node.body)))
        for stmt in node.body:
            self.visit(stmt)
        self.scopes.pop()

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for expr in [*node.args.defaults, *node.args.kw_defaults]:
            if expr is not None:
                self.visit(expr)
        self.scopes.append(_Scope("function"))
        self.visit(node.body)
        self.scopes.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(expr)
        self._bind(node.name)
        self.scopes.append(_Scope("class", _declared_globals(node.body)))
        for stmt in node.body:
            self.visit(stmt)
        self.scopes.pop()

    def _visit_comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        self.scopes.append(_Scope("comprehension"))
        self.generic_visit(node)
        self.scopes.pop()

    visit_ListComp = _visit_comprehension
    visit_SetComp = _visit_comprehension
    visit_GeneratorExp = _visit_comprehension
    visit_DictComp = _visit_comprehension


def cell_bindings(source: str | ast.Module) -> CellBindings:
    """The global names ``source`` (plain Python, already transformed from IPython syntax, or its AST) touches."""
    try:
        tree = ast.parse(source) if isinstance(source, str) else source
    except (SyntaxError, ValueError):
        return CellBindings(frozenset(), parsed=False)
    visitor = _BindingVisitor()
    visitor.visit(tree)
    return CellBindings(frozenset(visitor.touched), parsed=True, star_import=visitor.star_import)


def ipython_transform(code: str) -> str:
    """``code`` with its IPython syntax (magics, ``!cmd``, ``x?``) turned into plain Python, as the shell does
    (the tracker's transform when the kernel gives it none)."""
    from IPython.core.inputtransformer2 import TransformerManager

    return str(TransformerManager().transform_cell(code))
