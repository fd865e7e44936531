"""Answers that are copies: of a ``course_utils`` implementation, or of the official answer.

The course's references ship with it, so an answer can be one of them pasted
in. Each function (and, for the official answer, the whole cell) is reduced to
a normalised syntax tree: docstrings, comments and formatting are gone and
every name the code binds or reads is numbered in order of first use, so
renaming variables changes nothing; attribute names (``tl.load``, ``.sum``) and
constants stay. Two functions with the same normalised tree are copies. Only
functions of some size count (:data:`MIN_NODES` tree nodes): a one-line answer
is the same as everyone else's without being copied.

A match is a flag for the instructor to review, never a score.
"""
from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

MIN_NODES = 40


def _python_source(src: str) -> str:
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return TransformerManager().transform_cell(src)
    except Exception:  # noqa: BLE001 - fall back to the raw text
        return src


class _Normalise(ast.NodeTransformer):
    def __init__(self):
        self.names = {}

    def _n(self, name):
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(self._n(node.id), node.ctx), node)

    def visit_arg(self, node):
        return ast.copy_location(ast.arg(self._n(node.arg), None), node)

    def _body(self, node):
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:] or [ast.Pass()]
        node.body = body
        return node

    def visit_FunctionDef(self, node):
        node = self._body(node)
        node.name = self._n(node.name)
        node.returns = None
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        node.args = self.visit(node.args)
        node.body = [self.visit(s) for s in node.body]
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        node = self._body(node)
        node.name = self._n(node.name)
        return self.generic_visit(node)

    def visit_Module(self, node):
        node = self._body(node)
        return self.generic_visit(node)

    def visit_AnnAssign(self, node):
        node.annotation = ast.Constant(None)
        return self.generic_visit(node)


def _fingerprint(node) -> tuple[str, int]:
    tree = _Normalise().visit(ast.parse(ast.unparse(node)))
    dump = ast.dump(tree, annotate_fields=False, include_attributes=False)
    return hashlib.sha256(dump.encode()).hexdigest(), sum(1 for _ in ast.walk(tree))


def functions(src: str):
    """``[(qualname, fingerprint, size)]`` for every function in ``src``."""
    try:
        tree = ast.parse(_python_source(src))
    except SyntaxError:
        return []
    out = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                fp, size = _fingerprint(child)
                out.append((prefix + child.name, fp, size))
                walk(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
    walk(tree, "")
    return out


@functools.lru_cache(maxsize=1024)
def _module_functions(src: str) -> tuple:
    """:func:`functions` of one course module's source, kept by its text: every class a
    process grades fingerprints the same package, and changed text is a new key."""
    return tuple(functions(src))


def cell_fingerprint(src: str):
    try:
        tree = ast.parse(_python_source(src))
    except SyntaxError:
        return None, 0
    return _fingerprint(tree)


class Index:
    """Fingerprints of the course package's functions and of the official answers."""

    def __init__(self):
        self.library = {}        # fingerprint -> "module:qualname"
        self.official = {}       # exercise -> ({fingerprints of its functions}, cell fingerprint)

    @classmethod
    def build(cls, package: Path, exercises_sources: dict) -> "Index":
        idx = cls()
        package = Path(package)
        for path in sorted(package.rglob("*.py")):
            rel = path.relative_to(package.parent)
            if "grading" in rel.parts:
                continue
            mod = ".".join(rel.with_suffix("").parts)
            try:
                src = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            for name, fp, size in _module_functions(src):
                if size >= MIN_NODES:
                    idx.library.setdefault(fp, f"{mod}:{name}")
        for ex, src in exercises_sources.items():
            fps = {fp for _, fp, size in functions(src) if size >= MIN_NODES}
            cell, size = cell_fingerprint(src)
            idx.official[ex] = (fps, cell if size >= MIN_NODES else None)
        return idx

    def flags(self, exercise: str, src: str) -> list[str]:
        """Why an answer looks copied (empty when it does not)."""
        out = []
        fps, cell = self.official.get(exercise, (set(), None))
        whole, _ = cell_fingerprint(src)
        if cell is not None and whole == cell:
            out.append("the answer cell is the official answer")
        for name, fp, size in functions(src):
            if size < MIN_NODES:
                continue
            if fp in self.library:
                out.append(f"{name} is a copy of {self.library[fp]}")
            elif fp in fps and not out:
                out.append(f"{name} is the official answer's")
        return out
