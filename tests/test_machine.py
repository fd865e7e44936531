"""The register machine: it runs the seed's traces at their stated costs,
rejects every kind of illegal trace with its line number, and the lesson
checks fail with a useful message on wrong or wasteful answers."""
import pytest
from hypothesis import given, strategies as st

from course_utils.checks import CheckFailed
from course_utils.machine import (PROBLEMS, TraceError, check_trace, matmul_dram, matmul_loads,
                                  matmul_schedule, naive_softmax_trace, online_softmax_trace,
                                  plot_loads_vs_registers, plot_softmax_traffic, run_trace,
                                  safe_softmax_trace, softmax_dram, softmax_traffic)

A, B = [[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]
C = [[19.0, 22.0], [43.0, 50.0]]

P1 = """
LOAD a[0][0], R0
LOAD b[0][0], R1
MAC_Z R0, R1, R2      # a00 * b00
LOAD a[0][1], R0
LOAD b[1][0], R1
MAC R0, R1, R2, R2    # + a01 * b10
STORE R2, c[0][0]
"""

# Problem 2 with 3 registers: c00, c01, c11, c10, each reusing one operand
P2 = """
LOAD a[0][0], R0
LOAD b[0][0], R1
MAC_Z R0, R1, R2
LOAD a[0][1], R0
LOAD b[1][0], R1
MAC R0, R1, R2, R2
STORE R2, c[0][0]
LOAD b[1][1], R1      # R0 still holds a01
MAC_Z R0, R1, R2
LOAD a[0][0], R0
LOAD b[0][1], R1
MAC R0, R1, R2, R2
STORE R2, c[0][1]
LOAD a[1][0], R0      # R1 still holds b01
MAC_Z R0, R1, R2
LOAD a[1][1], R0
LOAD b[1][1], R1
MAC R0, R1, R2, R2
STORE R2, c[1][1]
LOAD b[1][0], R1      # R0 still holds a11
MAC_Z R0, R1, R2
LOAD a[1][0], R0
LOAD b[0][0], R1
MAC R0, R1, R2, R2
STORE R2, c[1][0]
"""

# Problem 3, the outer-product trace of the lesson (6 registers)
P3 = """
LOAD a[0][0], R0
LOAD b[0][0], R1
MAC_Z R0, R1, R2
LOAD b[0][1], R1
MAC_Z R0, R1, R3
LOAD a[1][0], R0
MAC_Z R0, R1, R5
LOAD b[0][0], R1
MAC_Z R0, R1, R4
LOAD a[0][1], R0
LOAD b[1][0], R1
MAC R0, R1, R2, R2
LOAD b[1][1], R1
MAC R0, R1, R3, R3
LOAD a[1][1], R0
MAC R0, R1, R5, R5
LOAD b[1][0], R1
MAC R0, R1, R4, R4
STORE R2, c[0][0]
STORE R3, c[0][1]
STORE R4, c[1][0]
STORE R5, c[1][1]
"""

# the quiz: inner product with 6 registers, every input loaded once
QUIZ = """
LOAD a[0][0], R0
LOAD a[0][1], R1
LOAD b[0][0], R2
LOAD b[1][0], R3
MAC_Z R0, R2, R4
MAC R1, R3, R4, R4
STORE R4, c[0][0]
LOAD b[0][1], R4
LOAD b[1][1], R5
MAC_Z R0, R4, R0      # a00 is not needed again: overwrite it
MAC R1, R5, R0, R0
STORE R0, c[0][1]
LOAD a[1][0], R0
LOAD a[1][1], R1
MAC_Z R0, R2, R2
MAC R1, R3, R2, R2
STORE R2, c[1][0]
MAC_Z R0, R4, R4
MAC R1, R5, R4, R4
STORE R4, c[1][1]
"""

NAIVE_2X2 = "\n".join(
    f"LOAD a[{i}][0], R0\nLOAD b[0][{j}], R1\nMAC_Z R0, R1, R2\n"
    f"LOAD a[{i}][1], R0\nLOAD b[1][{j}], R1\nMAC R0, R1, R2, R2\nSTORE R2, c[{i}][{j}]"
    for i in range(2) for j in range(2))


def run(trace, R=3, isa="matmul", **kw):
    return run_trace(trace, matmul_dram(A, B) if isa == "matmul" else kw.pop("dram"),
                     registers=R, isa=isa, **kw)


# ------------------------------------------------------------------ the seed's costs

def test_problem1_costs_7():
    r = run(P1)
    assert r.dram["c[0][0]"] == 19.0
    assert (r.cycles, r.counts["LOAD"], r.counts["MAC_Z"] + r.counts["MAC"], r.counts["STORE"]) \
        == (7, 4, 2, 1)
    assert r.steps[2].registers == (1.0, 5.0, 5.0)          # after MAC_Z
    assert r.steps[5].labels[2] == "a[0][0]·b[0][0] + a[0][1]·b[1][0]"


def test_naive_full_matmul_costs_28_and_reuse_gives_25_with_13_loads():
    naive = run(NAIVE_2X2)
    assert naive.cycles == 28 and naive.array("c", (2, 2)) == C
    r = run(P2)
    assert r.array("c", (2, 2)) == C
    assert (r.cycles, r.counts["LOAD"], r.num_registers) == (25, 13, 3)


def test_outer_product_costs_22_with_6_registers():
    r = run(P3, R=6)
    assert r.array("c", (2, 2)) == C
    assert (r.cycles, r.counts["LOAD"], r.counts["MAC"] + r.counts["MAC_Z"], r.counts["STORE"]) \
        == (22, 10, 8, 4)


def test_inner_product_quiz_costs_20_with_6_registers():
    r = run(QUIZ, R=6)
    assert r.array("c", (2, 2)) == C
    assert (r.cycles, r.counts["LOAD"]) == (20, 8)


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_softmax_traces_reads_writes(n):
    x = [float((3 * i) % 5) - 1.0 for i in range(n)]
    safe = run_trace(safe_softmax_trace(n), softmax_dram(x), registers=3, isa="softmax")
    assert (safe.reads, safe.writes) == (3 * n, n)
    online = run_trace(online_softmax_trace(n), softmax_dram(x), registers=4, isa="softmax")
    assert (online.reads, online.writes) == (2 * n, n)
    naive = run_trace(naive_softmax_trace(n), softmax_dram(x), registers=2, isa="softmax")
    assert (naive.reads, naive.writes) == (2 * n, n)
    import math
    e = [math.exp(v - max(x)) for v in x]
    for res in (safe, online, naive):
        assert res.array("out", (n,)) == pytest.approx([v / sum(e) for v in e], rel=1e-12)


def test_online_step_is_nine_instructions_and_keeps_m_and_s():
    x = [1.0, 3.0, 2.0]
    a = run_trace(online_softmax_trace(2), softmax_dram(x[:2]), registers=4, isa="softmax")
    b = run_trace(online_softmax_trace(3), softmax_dram(x), registers=4, isa="softmax")
    assert b.instructions - a.instructions - 5 == 9
    step_ops = [s.op for s in b.steps[5 + 9:5 + 18]]
    assert sorted(step_ops) == sorted(["LOAD", "MOV", "MAX", "SUB", "SUB", "EXP", "EXP", "MUL", "ADD"])
    # after the online pass (5 init + 2 steps of 9), R1 = m and R2 = S
    regs = b.registers_after(5 + 2 * 9)
    import math
    assert regs[1] == 3.0 and regs[2] == pytest.approx(sum(math.exp(v - 3.0) for v in x))


def test_costs_are_overridable():
    r = run(P1, costs={"LOAD": 10, "store": 5})
    assert r.cycles == 4 * 10 + 2 + 5
    with pytest.raises(ValueError, match="costs: 'EXP' is not an instruction of the matmul"):
        run(P1, costs={"EXP": 2})
    with pytest.raises(ValueError, match="non-negative"):
        run(P1, costs={"LOAD": -1})


def test_register_file_after_every_step_and_table():
    r = run(P1)
    assert len(r.steps) == 7 and r.registers_after(0) == (None, None, None)
    assert [s.line for s in r.steps] == [2, 3, 4, 5, 6, 7, 8]
    assert r.steps[6].written == "c[0][0]" and r.steps[0].read == "a[0][0]"
    assert [s.reads for s in r.steps][-1] == 4 and r.steps[-1].writes == 1
    assert r.steps[2].comment == "a00 * b00"
    assert "MAC_Z R0, R1, R2" in r.table() and "7 cycles" in r.summary()


def test_operands_may_be_separated_by_spaces_and_lowercase():
    r = run("load a[0][0] r0\nload b[0][0], r1\nmac_z r0 r1 r2\nstore r2, c[0][0]")
    assert r.dram["c[0][0]"] == 5.0


# ------------------------------------------------------------------ illegal traces

@pytest.mark.parametrize("trace, line, kind, words", [
    ("LOAD a[0][0], R0\n\nLAOD b[0][0], R1", 3, "unknown-instruction", "unknown instruction 'LAOD'"),
    ("LOAD a[0][0], R0\nEXP R0, R1", 2, "unknown-instruction", "softmax machine"),
    ("LOAD a[0][0], R0\nLOAD b[0][0], R1\nMAC R0, R1, R2", 3, "operand-count", "MAC takes 4"),
    ("LOAD a[0][0]", 1, "operand-count", "LOAD takes 2"),
    ("# comment\nLOAD a[0][0], R3", 2, "register-range", "R0..R2"),
    ("LOAD a[0][0], R0\nMAC_Z R0, R1, R2", 2, "uninitialised-register", "R1"),
    ("LOAD a[2][0], R0", 1, "unknown-address", "no cell a[2][0]"),
    ("LOAD c[0][0], R0", 1, "uninitialised-address", "c[0][0] has not been written"),
    ("LOAD a[0][0], R0\nSTORE R0, d[0]", 2, "unknown-address", "no cell d[0]"),
    ("LOAD R0, a[0][0]", 1, "syntax", "must be a DRAM address"),
    ("LOAD a[0][0], a[0][1]", 1, "syntax", "must be a register"),
])
def test_illegal_traces_name_their_line(trace, line, kind, words):
    with pytest.raises(TraceError) as e:
        run(trace)
    assert e.value.line == line and e.value.kind == kind
    assert str(e.value).startswith(f"line {line}:") and words in str(e.value)


def test_softmax_machine_errors():
    d = softmax_dram([1.0, 2.0])
    with pytest.raises(TraceError, match="MAC_Z is an instruction of the matmul machine"):
        run_trace("MAC_Z R0, R1, R2", d, isa="softmax")
    with pytest.raises(TraceError, match="line 2.*EXP takes 2"):
        run_trace("LOAD x[0], R0\nEXP R0, R0, R1", d, isa="softmax")
    with pytest.raises(TraceError, match="R3 does not exist"):
        run_trace("LOAD x[0], R3", d, registers=3, isa="softmax")


def test_bad_arguments():
    with pytest.raises(ValueError, match="isa"):
        run_trace("", {}, isa="gpu")
    with pytest.raises(ValueError, match="registers"):
        run_trace("", {}, registers=0)
    with pytest.raises(TypeError, match="trace"):
        run_trace(42, {})
    with pytest.raises(TypeError, match="dram"):
        run_trace("", [1, 2])
    with pytest.raises(ValueError, match="square"):
        matmul_dram([[1, 2]], [[1, 2]])
    with pytest.raises(ValueError, match="n: expected a positive int"):
        safe_softmax_trace(0)


# ------------------------------------------------------------------ lesson checks

def test_checks_pass_the_best_answers(capsys):
    check_trace("1", P1)
    check_trace("2", P2)
    check_trace("3", P3)
    check_trace("quiz", QUIZ)
    check_trace("4", safe_softmax_trace)
    check_trace("5", online_softmax_trace)
    assert capsys.readouterr().out.count("ok: ") == 6


def test_rising_inputs_catch_a_max_pass_that_stops_short_and_a_misplaced_factor():
    # rising inputs put the max last and move it at every element: the reference traces pass,
    # a max pass that misses the last element overflows (inputs 800 apart), and an online step
    # that rescales the new term instead of the old sum is wrong once the sum has grown past 1
    check_trace("4", safe_softmax_trace, quiet=True, sizes=(4, 7), scale=300.0, rising=True)
    check_trace("5", online_softmax_trace, quiet=True, sizes=(4, 7), rising=True)

    def short_max_pass(n):
        return safe_softmax_trace(n).replace(f"LOAD x[{n - 1}], R0\nMAX R0, R1, R1\n", "", 1)

    check_trace("4", short_max_pass, quiet=True, sizes=(9, 4), scale=300.0)   # escapes the others
    with pytest.raises(CheckFailed, match="out\\["):
        check_trace("4", short_max_pass, quiet=True, sizes=(4, 7), scale=300.0, rising=True)

    def factor_on_the_term(n):
        return online_softmax_trace(n).replace("MUL R2, R3, R2", "MUL R0, R3, R0")

    check_trace("5", factor_on_the_term, quiet=True)                           # escapes the others
    with pytest.raises(CheckFailed, match="out\\["):
        check_trace("5", factor_on_the_term, quiet=True, sizes=(4, 7), rising=True)


def test_check_explains_wasted_loads():
    with pytest.raises(CheckFailed) as e:
        check_trace("2", NAIVE_2X2, quiet=True)
    msg = str(e.value)
    assert "28 cycles" in msg and "the best is 25" in msg and "loaded more than once" in msg
    wasteful = P1.replace("LOAD a[0][1], R0", "LOAD a[0][0], R0\nLOAD a[0][1], R0")
    with pytest.raises(CheckFailed, match="loads a\\[0\\]\\[0\\] while R0 still holds it"):
        check_trace("1", wasteful, quiet=True)


def test_check_names_the_wrong_cell_and_what_it_holds():
    wrong = P1.replace("LOAD b[1][0], R1", "LOAD b[0][1], R1")
    with pytest.raises(CheckFailed) as e:
        check_trace("1", wrong, quiet=True)
    assert "c[0][0]" in str(e.value) and "a[0][1]·b[0][1]" in str(e.value)
    with pytest.raises(CheckFailed, match="never stores c\\[0\\]\\[0\\]"):
        check_trace("1", P1.replace("STORE R2, c[0][0]", ""), quiet=True)


def test_check_reports_illegal_trace_and_schedule_shape():
    with pytest.raises(CheckFailed, match="line 2"):
        check_trace("1", "LOAD a[0][0], R0\nLOAD b[0][0], R3", quiet=True)
    with pytest.raises(CheckFailed, match="outer product keeps all 4"):
        check_trace("3", QUIZ, quiet=True)
    with pytest.raises(CheckFailed, match="inner-product"):
        check_trace("quiz", P3, quiet=True)
    with pytest.raises(CheckFailed, match="STOREs"):
        check_trace("quiz", QUIZ + "\nSTORE R4, c[1][1]", quiet=True)


def test_softmax_checks_fail_on_extra_traffic_and_wrong_values():
    with pytest.raises(CheckFailed, match="the best with 4 registers is"):
        check_trace("5", safe_softmax_trace, quiet=True)
    with pytest.raises(CheckFailed, match="out\\[0\\]"):
        check_trace("4", lambda n: naive_softmax_trace(n).replace("EXP R0, R0", "MOV R0, R0"),
                    quiet=True)

    def ten_instruction_step(i):
        from course_utils.machine import _online_step
        return _online_step(i) + "\nMOV R2, R2"
    with pytest.raises(CheckFailed, match="10 instructions"):
        check_trace("5", lambda n: online_softmax_trace(n, step=ten_instruction_step), quiet=True)
    with pytest.raises(TypeError, match="function n -> trace"):
        check_trace("4", "LOAD x[0], R0")
    with pytest.raises(ValueError, match="problem"):
        check_trace("9", P1)
    assert set(PROBLEMS) == {"1", "2", "3", "quiz", "4", "5"}


# ------------------------------------------------------------------ schedules and plots

def test_schedule_reaches_the_lesson_optima():
    assert matmul_schedule(2, 3).cycles == 25
    assert matmul_schedule(2, 6).cycles == 20
    assert matmul_loads(2, [3, 4, 5, 6, 7]) == [13, 10, 9, 8, 8]
    with pytest.raises(ValueError, match="registers"):
        matmul_schedule(2, 2)
    with pytest.raises(ValueError, match="outer order needs more than 3"):
        matmul_schedule(2, 3, order="outer")


@given(n=st.integers(1, 4), R=st.integers(3, 20), order=st.sampled_from(["best", "inner"]))
def test_generated_schedules_are_legal_and_correct(n, R, order):
    import random
    rng = random.Random(n * 100 + R)
    A_ = [[rng.randint(-5, 5) for _ in range(n)] for _ in range(n)]
    B_ = [[rng.randint(-5, 5) for _ in range(n)] for _ in range(n)]
    s = matmul_schedule(n, R, order=order)
    r = run_trace(s.trace, matmul_dram(A_, B_), registers=R)
    assert r.array("c", (n, n)) == [[float(sum(A_[i][k] * B_[k][j] for k in range(n)))
                                     for j in range(n)] for i in range(n)]
    assert r.counts["LOAD"] == s.loads and r.cycles == s.cycles
    assert 2 * n * n <= s.loads <= 2 * n ** 3


def test_plots_return_figures():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = plot_loads_vs_registers(3)
    assert fig.axes[0].get_xlabel() == "registers R"
    fig2 = plot_softmax_traffic(range(1, 6))
    assert len(fig2.axes[0].lines) == 3
    plt.close("all")
    t = softmax_traffic([4])
    assert [rows[0][1] for rows in t.values()] == [8, 12, 8]


# ------------------------------------------------------------------ problem-set checks
# (problem set 1's checks are graded against wrong answers in tests/wrong_answers/01_register_machine.py)

def test_check_trace_takes_a_variant_problem():
    from course_utils.machine import Problem
    prob = Problem("v", "c[1][0] with 3 registers", "matmul", 3, 7, 4, 1, "inner", ("c[1][0]",))
    good = P1.replace("a[0][", "a[1][").replace("c[0][0]", "c[1][0]")
    assert check_trace(prob, good, quiet=True).cycles == 7
    with pytest.raises(CheckFailed, match="never stores c.1..0."):
        check_trace(prob, P1, quiet=True)
    overwrite = good + "\nSTORE R2, a[0][0]"
    with pytest.raises(CheckFailed, match="overwrote the input a.0..0."):
        check_trace(prob, overwrite, quiet=True)
    n3 = Problem("n3", "3x3 inner", "matmul", 3, 3 * 27 + 9, 54, 9, "inner",
                 tuple(f"c[{i}][{j}]" for i in range(3) for j in range(3)), n=3)
    naive = "\n".join(f"LOAD a[{i}][{k}], R0\nLOAD b[{k}][{j}], R1\n"
                      + ("MAC_Z R0, R1, R2" if k == 0 else "MAC R0, R1, R2, R2")
                      + ("" if k < 2 else f"\nSTORE R2, c[{i}][{j}]")
                      for i in range(3) for j in range(3) for k in range(3))
    assert check_trace(n3, naive, quiet=True).counts["LOAD"] == 54
    with pytest.raises(ValueError, match="Problem"):
        check_trace("nope", P1)


def test_softmax_check_sizes_and_scale():
    # without the max the exponentials overflow once the inputs pass 709
    no_max = lambda n: naive_softmax_trace(n).replace("R1", "R2")  # noqa: E731
    check_trace("4", safe_softmax_trace, quiet=True, sizes=(9,), scale=300.0)
    with pytest.raises(CheckFailed):
        check_trace("4", no_max, quiet=True, sizes=(9,), scale=300.0)


def test_whitespace_forms_of_operands():
    r = run("LOAD\ta[ 0 ][0] R0\nLOAD b[0][0],R1\nMAC_Z R0 R1,R2\nSTORE R2,c[0][0]  // stored")
    assert r.dram["c[0][0]"] == 5.0 and r.steps[-1].value == 5.0 and r.steps[0].value == 1.0
    assert r.steps[-1].comment == "stored"


def test_one_table_defines_every_instruction():
    from course_utils.machine import INSTRUCTIONS, ISAS, _SYNTAX, instruction_table
    for machine, ops in ISAS.items():
        for op, kinds in ops.items():
            ins = INSTRUCTIONS[op]
            assert machine in ins.machines and ins.operands == kinds
            assert _SYNTAX[op].startswith(op) and ins.effect in _SYNTAX[op]
            if op not in ("LOAD", "STORE"):
                reads = kinds.count("r")
                assert ins.compute(*([2.0] * reads)) is not None
                assert isinstance(ins.label(*(["x"] * reads)), str)
        assert instruction_table(machine).count("\n") == len(ops) + 1
    # every instruction the table lists runs on its machine and does what it says
    x = [0.5, 2.0]
    for op, want in (("MAX", 2.0), ("SUB", -1.5), ("ADD", 2.5), ("MUL", 1.0), ("DIV", 0.25)):
        r = run_trace(f"LOAD x[0], R0\nLOAD x[1], R1\n{op} R0, R1, R2\nSTORE R2, out[0]",
                      softmax_dram(x), registers=3, isa="softmax")
        assert r.dram["out[0]"] == want, op
    with pytest.raises(ValueError, match="machine"):
        instruction_table("gpu")


def test_split_modules_keep_the_public_names():
    import course_utils.machine as m
    from course_utils.machine import checks, interpreter, schedules, traces
    assert m.run_trace is interpreter.run_trace and m.check_trace is checks.check_trace
    assert m.matmul_schedule is schedules.matmul_schedule
    assert m.online_softmax_trace is traces.online_softmax_trace
    for name in m.__all__:
        assert hasattr(m, name), name
