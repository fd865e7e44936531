"""The official graded template and the notebooks built from it.

The template is the normalised solution notebook (``solutions/NN_*.ipynb``):
its answer cells hold the official answers and its check cells hold every test,
hidden ones included. From it the grader builds, for each run, a notebook of
code cells only (no outputs, metadata or tags):

* ``reference`` / ``student``: the template with the official (reference) or
  the student's answer sources, stripped of nbval markers. Each answer cell is
  followed by ``__course_grade__.export(...)`` for the names the official
  answer defines; every other cell is preceded by ``cell_start``.
* ``verify``: the template with each answer cell replaced by
  ``__course_grade__.bind(...)`` and each check call ``check_x(a, b, ...)``
  routed through ``__course_grade__.verify_call(<exercise>, <site>, check_x, a, b, ...)``;
  each check cell ends with ``end_check``, which fails the cell when one of its
  checks failed, so under ``pytest --nbval`` each check cell is the test item of
  its exercise. No student code is in this notebook.

In every mode a check call that is a statement of its own is guarded
(``try: ... except Exception: ...``): a failed check does not stop its cell,
so the later checks of the cell (hidden tests included) are still run and
reported, and the answer functions get the same calls in both kernels.

A *check call* is a call whose function name starts with ``check_`` (the
``course_utils`` checks and the lesson checks built on them) or is
``assert_close``.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

import nbformat

from course_utils import problems

KERNEL_NAME = "__course_grade__"
_NBVAL_RE = re.compile(r"#\s*NBVAL_[A-Z_]+")
# a template cell that only measures (GPU timings: how often it launches an answer's
# kernel depends on the clock) is left out of every graded notebook
GRADER_SKIP_RE = re.compile(r"^\s*#\s*GRADER_SKIP\b", re.M)


class TemplateError(ValueError):
    """The official template cannot be graded as written; the message says where."""


@dataclass
class Exercise:
    id: str
    points: int
    answer_index: int
    check_index: int
    answer_id: str
    check_id: str
    stub: str                      # the exercise version of the answer cell
    visible_check: str             # the check cell as students see it
    full_check: str                # the check cell with its hidden tests
    hidden_sites: set = field(default_factory=set)


def exercises_of(nb, where="template") -> list[Exercise]:
    """The exercises of a normalised solution notebook, in notebook order."""
    answers, checks = {}, {}
    for i, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("course")
        if not meta or cell.cell_type != "code":
            continue
        role, ex = meta.get("role"), str(meta.get("exercise"))
        if role == "answer":
            answers[ex] = (i, int(meta.get("points", 1)), cell)
        elif role == "check":
            checks[ex] = (i, cell)
    if not answers:
        raise TemplateError(f"{where}: no answer cells with metadata.course; "
                            "run `python -m course_utils.problems build NN` first")
    out = []
    for ex, (i, pts, cell) in answers.items():
        if ex not in checks:
            raise TemplateError(f"{where}: exercise {ex} has no check cell")
        j, ccell = checks[ex]
        out.append(Exercise(ex, pts, i, j, cell.get("id", ""), ccell.get("id", ""),
                            problems.exercise_source(cell.source, ex),
                            problems.check_source(ccell.source), ccell.source))
    return sorted(out, key=lambda e: e.answer_index)


def _python_source(src: str) -> str:
    """Cell source as plain Python (IPython magics turned into calls)."""
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(src)


def _is_check_call(node: ast.Call) -> str | None:
    f = node.func
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    if name and (name.startswith("check_") or name == "assert_close"):
        return name
    return None


def _hook(name: str, *args) -> ast.Call:
    return ast.Call(func=ast.Attribute(value=ast.Name(KERNEL_NAME, ast.Load()), attr=name,
                                       ctx=ast.Load()), args=list(args), keywords=[])


class _Rewriter(ast.NodeTransformer):
    """Rewrites a check cell. ``verify``: each check call goes through
    ``verify_call``. Both modes: a statement that is a check call on its own (at
    the top of the cell or in its loops and branches, not inside a function) is
    guarded, so that a failed check does not stop the cell: every later check,
    hidden tests included, still runs and gets its own verdict."""

    def __init__(self, exercise, hidden_lines, verify=True):
        self.ex, self.hidden, self.verify = exercise, hidden_lines, verify
        self.sites = []          # (site, function name, hidden?)
        self.in_def = 0

    def visit_Call(self, node):
        name = _is_check_call(node)
        if not name:
            return self.generic_visit(node)
        site = len(self.sites)
        self.sites.append((site, name, node.lineno - 1 in self.hidden))
        node = self.generic_visit(node)
        if not self.verify:
            return node
        new = _hook("verify_call", ast.Constant(self.ex), ast.Constant(site), node.func, *node.args)
        new.keywords = node.keywords
        return ast.copy_location(new, node)

    def _scoped(self, node):
        self.in_def += 1
        try:
            return self.generic_visit(node)
        finally:
            self.in_def -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _scoped

    def visit_Expr(self, node):
        if self.in_def or not isinstance(node.value, ast.Call) or not _is_check_call(node.value):
            return self.generic_visit(node)
        site = len(self.sites)
        node = self.generic_visit(node)
        if self.verify:
            err = f"{KERNEL_NAME}_error"
            handler_body = [ast.Expr(_hook("stopped", ast.Constant(self.ex), ast.Constant(site),
                                           ast.Name(err, ast.Load())))]
        else:
            err, handler_body = None, [ast.Pass()]
        guard = ast.Try(body=[node], handlers=[ast.ExceptHandler(
            type=ast.Name("Exception", ast.Load()), name=err, body=handler_body)],
            orelse=[], finalbody=[])
        return ast.copy_location(guard, node)


def _parse_check(src: str, where: str):
    try:
        return ast.parse(_python_source(src))
    except SyntaxError as e:
        raise TemplateError(f"{where}: not valid Python ({e.msg}, line {e.lineno})") from None


def _hidden_lines(src: str, where: str) -> set:
    """The lines (from 0) of a cell's hidden-test regions."""
    hidden = set()
    for a, b in problems._regions(src, problems.HBEGIN, problems.HEND, where):
        hidden.update(range(a, b + 1))
    return hidden


def _forget_hidden(tree, hidden: set):
    """End the cell by deleting the names only its hidden tests bind (their helpers, inputs
    and results): left in the notebook's namespace, a later answer could read them and
    print them through a visible check's message. A name the visible code binds too stays
    (the exercise notebook, which has no hidden tests, defines it as well)."""
    shown, secret = _Names(), _Names()
    for stmt in tree.body:
        (secret if stmt.lineno - 1 in hidden else shown).visit(stmt)
    names = [n for n in secret.names if n not in shown.names]
    for n in names:
        tree.body.append(ast.Try(
            body=[ast.Delete(targets=[ast.Name(n, ast.Del())])],
            handlers=[ast.ExceptHandler(type=ast.Name("NameError", ast.Load()), name=None,
                                        body=[ast.Pass()])],
            orelse=[], finalbody=[]))
    return tree


def rewrite_check(src: str, exercise: str, where: str = "check cell"):
    """Route each check call of a check cell through ``verify_call``.
    Returns ``(source, sites)``; ``sites`` lists ``(site, function, hidden)``."""
    hidden = _hidden_lines(src, where)
    tree = _parse_check(src, where)
    rw = _Rewriter(exercise, hidden)
    tree = _forget_hidden(rw.visit(tree), hidden)
    ast.fix_missing_locations(tree)
    if not rw.sites:
        raise TemplateError(f"{where}: calls no check function (check_... or assert_close), "
                            "so nothing can be verified outside the kernel")
    return ast.unparse(tree), rw.sites


GUARD_FUNCTIONS = ("run_answer", "forbid")


class _GuardCalls(ast.NodeTransformer):
    """``run_answer(...)`` / ``guards.forbid(...)`` -> the grading hooks' copies,
    taken from ``course_utils.guards`` before any answer cell ran, so rebinding
    the notebook's names or the module's attributes does not switch them off."""

    def visit_Call(self, node):
        node = self.generic_visit(node)
        f = node.func
        name = f.id if isinstance(f, ast.Name) else \
            f.attr if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
            and f.value.id == "guards" else None
        if name in GUARD_FUNCTIONS:
            node.func = ast.copy_location(ast.Attribute(ast.Name(KERNEL_NAME, ast.Load()),
                                                        f"guard_{name}", ast.Load()), f)
        return node


def guard_check(src: str, exercise: str, where: str = "check cell") -> str:
    """A check cell for the student's (or the official) kernel: the same calls, with
    each check statement guarded as in the verifier, so that both kernels make the
    same calls to the answer functions whichever checks fail; the course's guards
    are called through the grading hooks' own references."""
    tree = _Rewriter(exercise, set(), verify=False).visit(_parse_check(src, where))
    tree = _forget_hidden(_GuardCalls().visit(tree), _hidden_lines(src, where))
    ast.fix_missing_locations(tree)
    return ast.unparse(tree)


class _Names(ast.NodeVisitor):
    """Names a cell binds at top level (not inside functions, classes or comprehensions)."""

    def __init__(self):
        self.names = []

    def _add(self, name):
        if name not in self.names:
            self.names.append(name)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Store):
            self._add(node.id)

    def visit_FunctionDef(self, node):
        self._add(node.name)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Lambda(self, node):
        pass

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_Lambda

    def visit_Import(self, node):
        pass

    visit_ImportFrom = visit_Import


def answer_names(src: str, where: str = "answer cell") -> list[str]:
    """The names the official answer cell defines: what a student's answer must define too."""
    try:
        tree = ast.parse(_python_source(src))
    except SyntaxError as e:
        raise TemplateError(f"{where}: not valid Python ({e.msg}, line {e.lineno})") from None
    v = _Names()
    v.visit(tree)
    if not v.names:
        raise TemplateError(f"{where}: defines no name, so there is nothing to grade; keep the "
                            "answer in a named variable or function")
    return v.names


def strip_markers(src: str) -> str:
    """Remove nbval markers (``# NBVAL_SKIP`` and friends) from a source."""
    return _NBVAL_RE.sub("#", src)


def _names_used(src: str) -> set:
    """The global names a template cell reads (what it would call or use)."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", src))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def build(template, exercises, mode: str, answers: dict | None = None, *, nonce: str,
          inputs_path: str | None = None):
    """The notebook to execute in ``mode`` ('reference', 'student' or 'verify').
    Returns ``(notebook, cell_roles)`` where ``cell_roles[i]`` is ``(role, exercise)``
    for the i-th cell (role 'setup', 'hook', 'code', 'answer', 'export', 'bind' or 'check')."""
    if mode not in ("reference", "student", "verify"):
        raise ValueError(f"mode must be 'reference', 'student' or 'verify', got {mode!r}")
    by_index = {}
    for e in exercises:
        by_index[e.answer_index] = ("answer", e)
        by_index[e.check_index] = ("check", e)
    cells, roles = [], []
    # for each answer cell: the names the template's later cells read; an answer that
    # rebinds one of them gets the template's object put back after its cell, so that the
    # checks (and the checking kernel, which never runs the answer) use the template's
    used_after, seen = {}, set()
    for i in range(len(template.cells) - 1, -1, -1):
        cell = template.cells[i]
        if cell.cell_type != "code":
            continue
        if by_index.get(i, ("code", None))[0] == "answer":
            used_after[i] = sorted(seen)
        else:
            seen |= _names_used(cell.source)

    def add(src, role, ex=None, cid=None):
        # a check cell stays out of the kernel's input history (In, _ih, _i): an answer it
        # calls could read the cell's hidden tests there
        meta = {"course_grade": {"store_history": False}} if role == "check" else {}
        cells.append(nbformat.v4.new_code_cell(src, id=cid or f"g{len(cells)}", metadata=meta))
        roles.append((role, ex))

    add(f"import course_utils.grading.kernel_side as {KERNEL_NAME}\n"
        f"{KERNEL_NAME}.start({mode!r}, {nonce!r}, {inputs_path!r})", "setup")
    for i, cell in enumerate(template.cells):
        if cell.cell_type != "code":
            continue
        role, e = by_index.get(i, ("code", None))
        ex = e.id if e else None
        if role == "code" and GRADER_SKIP_RE.search(cell.source):
            continue
        if role == "answer":
            names = answer_names(cell.source, f"answer cell of exercise {ex}")
            if mode == "verify":
                add(f"{KERNEL_NAME}.bind({ex!r}, {names!r}, globals())", "bind", ex)
                continue
            src = cell.source
            if mode == "student":
                src = (answers or {}).get(ex)
                src = e.stub if src is None else strip_markers(src)
            add(f"{KERNEL_NAME}.answer_start({ex!r}, globals())", "hook", ex)
            add(src, "answer", ex, cell.get("id"))
            add(f"{KERNEL_NAME}.export({ex!r}, {names!r}, globals(), "
                f"protect={used_after.get(i, [])!r})", "export", ex)
            continue
        add(f"{KERNEL_NAME}.cell_start({i}, globals())", "hook", ex)
        src = cell.source
        if role == "check" and mode == "verify":
            src, _ = rewrite_check(cell.source, ex, f"check cell of exercise {ex}")
            src += f"\n{KERNEL_NAME}.end_check({ex!r})"
        elif role == "check":
            src = guard_check(cell.source, ex, f"check cell of exercise {ex}")
        add(src, role, ex, cell.get("id"))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                  "language": "python"}}
    return nb, roles


def exposed_names(src: str) -> list[str]:
    """Names a check cell assigns in statements of their own and then uses only
    as a check's expected value (not in the student's value). Those statements
    still run in the student's kernel, where an answer could read the result;
    writing the expression inside the check call keeps it out."""
    try:
        tree = ast.parse(_python_source(src))
    except SyntaxError:
        return []
    assigned, first, rest = set(), set(), set()

    def loads(node):
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}

    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            assigned.add(node.id)
        if isinstance(node, ast.Call) and _is_check_call(node) and node.args:
            first |= loads(node.args[0])
            for a in node.args[1:] + [k.value for k in node.keywords]:
                rest |= loads(a)
    return sorted((assigned & rest) - first)


# What answer code has no business touching: the grading hooks, the guards that
# checks run answers under, torch's switches for them, and the process's modules.
_TAMPER_NAMES = {
    "__course_grade__": "the grading hooks", "kernel_side": "the grading hooks",
    "guard_keeper": "the grading hooks", "publish_display_data": "the grading records",
    "guards": "the course's guards", "ForbiddenCall": "the course's guards",
    "run_answer": "the course's guards", "forbid": "the course's guards",
    "DisableTorchFunction": "torch's function modes (which the guards use)",
    "DisableTorchFunctionSubclass": "torch's function modes (which the guards use)",
    "_pop_torch_function_stack": "torch's function modes (which the guards use)",
    "_push_on_torch_function_stack": "torch's function modes (which the guards use)",
    "_pop_mode": "torch's function modes (which the guards use)",
    "_pop_mode_temporarily": "torch's function modes (which the guards use)",
    "_get_current_function_mode_stack": "torch's function modes (which the guards use)",
    "_disabled_torch_function_impl": "torch's function modes (which the guards use)",
}
# the dispatcher's switches: each runs operators past the guards' dispatch mode (a mode
# stack popped or disabled, the Python dispatch keys excluded, an operator sent below them)
_TAMPER_NAMES.update({name: "torch's dispatcher switches (which the guards use)" for name in (
    "_DisableTorchDispatch", "_ExcludeDispatchKeyGuard", "_IncludeDispatchKeyGuard",
    "_ForceDispatchKeyGuard", "_PreserveDispatchKeyGuard", "_DisablePythonDispatcher",
    "_AutoDispatchBelowAutograd", "_AutoDispatchBelowADInplaceOrView", "DispatchKeySet",
    "DispatchKey", "_dispatch_tls_set_dispatch_key_excluded",
    "_dispatch_tls_set_dispatch_key_included", "_dispatch_call_boxed",
    "_pop_torch_dispatch_stack", "_push_on_torch_dispatch_stack", "_set_dispatch_mode",
    "_unset_dispatch_mode", "_disable_current_modes", "_disable_infra_mode",
    "_unset_infra_mode", "_push_mode", "redispatch", "_op_dk")})
# names a string built from pieces could spell ("Disable" + "TorchFunction"): the cell's
# string constants are also read joined together; only names no prose holds
_SPELLED = tuple(n for n in _TAMPER_NAMES if n.startswith("_") or n != n.lower())


def tamper_references(src: str) -> list[str]:
    """What an answer cell's code refers to that no answer needs: the grading hooks,
    the course's guards (``course_utils.guards``), torch's function-mode switches.
    Each as ``"name (what it is)"``; empty for an honest answer."""
    try:
        tree = ast.parse(_python_source(src))
    except SyntaxError:
        return []
    found = []

    def add(name):
        what = _TAMPER_NAMES.get(name)
        if what and f"{name} ({what})" not in found:
            found.append(f"{name} ({what})")

    joined = "".join(n.value for n in ast.walk(tree)
                     if isinstance(n, ast.Constant) and isinstance(n.value, str))
    for name in _SPELLED:
        if name in joined:
            add(name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            add(node.id)
        elif isinstance(node, ast.Attribute):
            add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] + ([node.module] if getattr(node, "module", None)
                                                    else [])
            for m in mods:
                for part in m.split("."):
                    add(part)
                if m.startswith("course_utils.grading"):
                    add("kernel_side")
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                len(node.value) < 200:
            for part in node.value.replace(":", ".").split("."):
                if part in _TAMPER_NAMES and part not in ("forbid", "guards"):
                    add(part)
            if node.value.startswith("course_utils.grading") or \
                    node.value == "course_utils.guards":
                add("kernel_side" if "grading" in node.value else "guards")
    return found
