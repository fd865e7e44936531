"""tests/wrong_answers/catch_rate.py reports what it measures: a wrong answer the checks catch
on every draw, a "wrong" answer that is in fact right (caught on none), a right answer that
fails, and an answer caught only on some draws (a check that depends on the draw)."""
from tests.wrong_answers import catch_rate

RIGHT = '''# Exercise 9.2
def intensity(q_heads, kv_heads, new_tokens, bytes_per_elem):
    return (4 * q_heads * new_tokens) / (2 * kv_heads * bytes_per_elem)'''
WRONG = '''# Exercise 9.2
def intensity(q_heads, kv_heads, new_tokens, bytes_per_elem):
    return (4 * q_heads * new_tokens) / (kv_heads * bytes_per_elem)'''
# wrong on every other draw: the seed of draw i is 1000 i + 7, so the even draws take 7 mod 2000
SOMETIMES = '''# Exercise 9.2
import torch
def intensity(q_heads, kv_heads, new_tokens, bytes_per_elem):
    wrong = torch.initial_seed() % 2000 == 7
    return (4 * q_heads * new_tokens) / ((1 if wrong else 2) * kv_heads * bytes_per_elem)'''


def _rates(monkeypatch, wrong, honest, draws=4):
    monkeypatch.setattr(catch_rate, "wrong_answers", lambda stem: {"9.2": wrong})
    monkeypatch.setattr(catch_rate, "_honest", lambda stem: {"9.2": honest})
    return {why: (caught, n, detail) for ex, why, right, caught, n, detail
            in catch_rate.catch_rates("09_decoding", draws, only="9.2")}


def test_reports_caught_escaped_and_failing_answers(monkeypatch):
    got = _rates(monkeypatch, {"wrong": WRONG, "right, listed as wrong": RIGHT,
                               "(parenthesised) wrong": WRONG},
                 {"wrong, listed as honest": WRONG, "right": RIGHT})
    assert got["(official)"][:2] == (0, 4)
    assert got["(honest) right"][:2] == (0, 4)
    caught, n, detail = got["(honest) wrong, listed as honest"]
    assert (caught, n) == (4, 4) and "seed 7" in detail and "intensity" in detail
    assert got["wrong"] == (4, 4, None)
    assert got["(parenthesised) wrong"] == (4, 4, None)   # a wrong answer, whatever its name
    assert got["right, listed as wrong"] == (0, 4, 7)    # escaped, with the first seed


def test_an_answer_right_on_some_draws_is_reported_with_a_seed_it_passed(monkeypatch):
    caught, n, seed = _rates(monkeypatch, {"sometimes": SOMETIMES}, {}, draws=6)["sometimes"]
    assert (caught, n, seed) == (3, 6, 1007)


def test_command_line_exit_status(monkeypatch, capsys):
    monkeypatch.setattr(catch_rate, "wrong_answers", lambda stem: {"9.2": {"right": RIGHT}})
    monkeypatch.setattr(catch_rate, "_honest", lambda stem: {})
    assert catch_rate.main(["09", "--draws", "2", "--exercise", "9.2"]) == 1
    out = capsys.readouterr().out
    assert "BAD caught 0/2  right  (escaped with seed 7)" in out
    monkeypatch.setattr(catch_rate, "wrong_answers", lambda stem: {"9.2": {"wrong": WRONG}})
    assert catch_rate.main(["09", "--draws", "2", "--exercise", "9.2"]) == 0


def test_a_kernel_defined_in_a_cell_has_that_cell_as_its_source():
    """Compiled Triton reads a kernel's text through ``inspect``; a cell run by the tool must
    give its own text (as IPython's cells do), not the text of the module running it."""
    import inspect

    cell = ("import triton\n"
            "import triton.language as tl\n\n"
            "@triton.jit\n"
            "def _copy_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):\n"
            "    offs = tl.arange(0, BLOCK)\n"
            "    tl.store(y_ptr + offs, tl.load(x_ptr + offs))\n")
    ns = {"__name__": "__main__"}
    assert catch_rate._run(cell, ns, "answer 6.1") is None
    fn = ns["_copy_kernel"].fn
    assert inspect.getsource(fn) == cell.split("\n\n", 1)[1]
    assert inspect.getsourcelines(fn)[1] == 4
    other = cell.replace("x_ptr + offs", "x_ptr + offs + 0")
    assert catch_rate._run(other, ns, "answer 6.1") is None
    assert "offs + 0" in inspect.getsource(ns["_copy_kernel"].fn)
