"""Wrong answers to problem set 1 (traces on the register machine)."""

WRONG = {
    "1.1": {
        "always c[0][0], whatever i and j": '''# Exercise 1.1
def dot_trace(i, j):
    return "\\n".join(["LOAD a[0][0], R0", "LOAD b[0][0], R1", "MAC_Z R0, R1, R2",
                      "LOAD a[0][1], R0", "LOAD b[1][0], R1", "MAC R0, R1, R2, R2",
                      "STORE R2, c[0][0]"])
''',
        "row and column swapped: a[k][i], b[j][k]": '''# Exercise 1.1
def dot_trace(i, j):
    return "\\n".join([f"LOAD a[0][{i}], R0", f"LOAD b[{j}][0], R1", "MAC_Z R0, R1, R2",
                      f"LOAD a[1][{i}], R0", f"LOAD b[{j}][1], R1", "MAC R0, R1, R2, R2",
                      f"STORE R2, c[{i}][{j}]"])
''',
        "MAC_Z twice: the first product is lost": '''# Exercise 1.1
def dot_trace(i, j):
    return "\\n".join([f"LOAD a[{i}][0], R0", f"LOAD b[0][{j}], R1", "MAC_Z R0, R1, R2",
                      f"LOAD a[{i}][1], R0", f"LOAD b[1][{j}], R1", "MAC_Z R0, R1, R2",
                      f"STORE R2, c[{i}][{j}]"])
''',
        "a fourth register that the machine does not have": '''# Exercise 1.1
def dot_trace(i, j):
    return "\\n".join([f"LOAD a[{i}][0], R0", f"LOAD b[0][{j}], R1", f"LOAD a[{i}][1], R2",
                      f"LOAD b[1][{j}], R3", "MAC_Z R0, R1, R0", "MAC R2, R3, R0, R0",
                      f"STORE R0, c[{i}][{j}]"])
''',
    },
    "1.2": {
        "the library's schedule": '''# Exercise 1.2
from course_utils.machine import matmul_schedule
trace_full = matmul_schedule(2, 3).trace
''',
        "no reuse: 16 LOADs, 28 cycles": '''# Exercise 1.2
trace_full = "\\n".join(
    f"LOAD a[{i}][{k}], R0\\nLOAD b[{k}][{j}], R1\\n" + ("MAC_Z R0, R1, R2" if k == 0 else "MAC R0, R1, R2, R2")
    + ("" if k == 0 else f"\\nSTORE R2, c[{i}][{j}]")
    for i in range(2) for j in range(2) for k in range(2))
''',
        "c[1][0] and c[1][1] swapped in the tour's stores": '''# Exercise 1.2
trace_full = \'\'\'
LOAD a[0][0], R0
LOAD b[0][0], R1
MAC_Z R0, R1, R2
LOAD a[0][1], R0
LOAD b[1][0], R1
MAC R0, R1, R2, R2
STORE R2, c[0][0]
LOAD b[1][1], R1
MAC_Z R0, R1, R2
LOAD a[0][0], R0
LOAD b[0][1], R1
MAC R0, R1, R2, R2
STORE R2, c[0][1]
LOAD a[1][0], R0
MAC_Z R0, R1, R2
LOAD a[1][1], R0
LOAD b[1][1], R1
MAC R0, R1, R2, R2
STORE R2, c[1][0]
LOAD b[1][0], R1
MAC_Z R0, R1, R2
LOAD a[1][0], R0
LOAD b[0][0], R1
MAC R0, R1, R2, R2
STORE R2, c[1][1]
\'\'\'
''',
        "the library's schedule, fetched by name": '''# Exercise 1.2
import course_utils.machine as machine
trace_full = getattr(machine, "matmul_" + "schedule")(2, 3).trace
''',
    },
    "1.3": {
        "the library's outer-product order": '''# Exercise 1.3
from course_utils.machine import matmul_schedule

def outer_trace(n):
    return matmul_schedule(n, n * n + 2, order="outer").trace
''',
        "no snake: every row reloads all of row k of B": '''# Exercise 1.3
def outer_trace(n):
    lines = []
    for k in range(n):
        for i in range(n):
            lines.append(f"LOAD a[{i}][{k}], R0")
            for j in range(n):
                lines.append(f"LOAD b[{k}][{j}], R1")
                acc = 2 + n * i + j
                lines.append(f"MAC_Z R0, R1, R{acc}" if k == 0 else f"MAC R0, R1, R{acc}, R{acc}")
    lines += [f"STORE R{2 + n * i + j}, c[{i}][{j}]" for i in range(n) for j in range(n)]
    return "\\n".join(lines)
''',
        "inner product instead: one output at a time": '''# Exercise 1.3
def outer_trace(n):
    lines = []
    for i in range(n):
        for j in range(n):
            for k in range(n):
                lines += [f"LOAD a[{i}][{k}], R0", f"LOAD b[{k}][{j}], R1",
                          "MAC_Z R0, R1, R2" if k == 0 else "MAC R0, R1, R2, R2"]
            lines.append(f"STORE R2, c[{i}][{j}]")
    return "\\n".join(lines)
''',
        "the lesson's n = 2 trace for every n": '''# Exercise 1.3
def outer_trace(n):
    return \'\'\'
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
\'\'\'
''',
    },
    "1.4": {
        "the library's inner-product schedule": '''# Exercise 1.4 (2 points)
from course_utils.machine import matmul_schedule
trace_inner6 = matmul_schedule(2, 6, order="inner").trace
inner6_cycles = 20
''',
        "a 3-register trace with the cycle count of the 6-register one": '''# Exercise 1.4 (2 points)
trace_inner6 = "\\n".join(
    f"LOAD a[{i}][{k}], R0\\nLOAD b[{k}][{j}], R1\\n" + ("MAC_Z R0, R1, R2" if k == 0 else "MAC R0, R1, R2, R2")
    + ("" if k == 0 else f"\\nSTORE R2, c[{i}][{j}]")
    for i in range(2) for j in range(2) for k in range(2))
inner6_cycles = 20
''',
        "an outer product (all sums live at once)": '''# Exercise 1.4 (2 points)
trace_inner6 = \'\'\'
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
\'\'\'
inner6_cycles = 22
''',
    },
    "1.5": {
        "two registers: the operands only": '''# Exercise 1.5
min_registers = 2
with_accumulator_in_unit = 2
''',
        "four: one more for safety": '''# Exercise 1.5
min_registers = 4
with_accumulator_in_unit = 3
''',
        "strings instead of ints": '''# Exercise 1.5
min_registers = "3"
with_accumulator_in_unit = "2"
''',
    },
    "1.6": {
        "A B instead of A B^T": '''# Exercise 1.6
def no_reuse_trace_t(n):
    lines = []
    for i in range(n):
        for j in range(n):
            for k in range(n):
                lines += [f"LOAD a[{i}][{k}], R0", f"LOAD b[{k}][{j}], R1",
                          "MAC_Z R0, R1, R2" if k == 0 else "MAC R0, R1, R2, R2"]
            lines.append(f"STORE R2, c[{i}][{j}]")
    return "\\n".join(lines)
''',
        "MAC_Z for every k: only the last product survives": '''# Exercise 1.6
def no_reuse_trace_t(n):
    lines = []
    for i in range(n):
        for j in range(n):
            for k in range(n):
                lines += [f"LOAD a[{i}][{k}], R0", f"LOAD b[{j}][{k}], R1", "MAC_Z R0, R1, R2"]
            lines.append(f"STORE R2, c[{i}][{j}]")
    return "\\n".join(lines)
''',
        "a STORE after every product": '''# Exercise 1.6
def no_reuse_trace_t(n):
    lines = []
    for i in range(n):
        for j in range(n):
            for k in range(n):
                lines += [f"LOAD a[{i}][{k}], R0", f"LOAD b[{j}][{k}], R1",
                          "MAC_Z R0, R1, R2" if k == 0 else "MAC R0, R1, R2, R2",
                          f"STORE R2, c[{i}][{j}]"]
    return "\\n".join(lines)
''',
        "a lookup table of the checked sizes": '''# Exercise 1.6
_known = {}
for _n in (1, 2, 3, 4):
    _known[_n] = "\\n".join(
        f"LOAD a[{i}][{k}], R0\\nLOAD b[{j}][{k}], R1\\n" + ("MAC_Z R0, R1, R2" if k == 0 else "MAC R0, R1, R2, R2")
        + ("" if k < _n - 1 else f"\\nSTORE R2, c[{i}][{j}]")
        for i in range(_n) for j in range(_n) for k in range(_n))

def no_reuse_trace_t(n):
    return _known[n]
''',
    },
}


# Round seven: wrong answers caught on every draw of tests.wrong_answers.catch_rate
from tests.wrong_answers import edit, official  # noqa: E402

# computes c[i][j] but stores it under the transposed name
WRONG["1.1"]["stored to c[j][i]"] = edit(official("1.1"),
    ('        f"STORE R2, c[{i}][{j}]",', '        f"STORE R2, c[{j}][{i}]",'))
WRONG["1.1"]["the MAC adds into R0, the sum in R2 never grows"] = edit(official("1.1"),
    ('        "MAC R0, R1, R2, R2",', '        "MAC R0, R1, R2, R0",'))
# the values are right, but c[i][j] must live in R{2 + n*i + j}
WRONG["1.3"]["the outputs numbered column-major (R{2 + i + n*j})"] = edit(official("1.3"),
    ("                acc = 2 + n * i + j", "                acc = 2 + i + n * j"),
    ('    lines += [f"STORE R{2 + n * i + j}, c[{i}][{j}]" for i in range(n) for j in range(n)]',
     '    lines += [f"STORE R{2 + i + n * j}, c[{i}][{j}]" for i in range(n) for j in range(n)]'))
# i == 1 instead of i % 2 == 1: the snake turns once, right for n <= 3 only
WRONG["1.3"]["the snake turns back at row 1 only"] = edit(official("1.3"),
    ("            cols = range(n) if i % 2 == 0 else range(n - 1, -1, -1)",
     "            cols = range(n) if i != 1 else range(n - 1, -1, -1)"))
# the first row of every k reuses the b left over from the previous k
WRONG["1.3"]["b reused across k (first LOAD of each k skipped)"] = edit(official("1.3"),
    ("                if i == 0 or c > 0:", "                if (i == 0 and k == 0) or c > 0:"))
# c[0][0] and c[0][1] are both live at once: not an inner-product schedule
WRONG["1.4"]["8 LOADs and 20 cycles, two partial sums live at once"] = '''# Exercise 1.4 (2 points)
trace_inner6 = \'\'\'
LOAD a[0][0], R0
LOAD a[0][1], R1
LOAD b[0][0], R2
LOAD b[0][1], R3
MAC_Z R0, R2, R4
MAC_Z R0, R3, R5
LOAD b[1][0], R0
MAC R1, R0, R4, R4
STORE R4, c[0][0]
LOAD b[1][1], R4
MAC R1, R4, R5, R5
STORE R5, c[0][1]
LOAD a[1][0], R1
LOAD a[1][1], R5
MAC_Z R1, R2, R2
MAC R5, R0, R2, R2
STORE R2, c[1][0]
MAC_Z R1, R3, R3
MAC R5, R4, R3, R3
STORE R3, c[1][1]
\'\'\'
inner6_cycles = 20
'''
# no operand overwritten and the b column not kept: b[0][0] and b[1][0] are loaded twice
WRONG["1.4"]["10 LOADs, counted right (22 cycles)"] = '''# Exercise 1.4 (2 points)
trace_inner6 = \'\'\'
LOAD a[0][0], R0
LOAD a[0][1], R1
LOAD b[0][0], R2
LOAD b[1][0], R3
MAC_Z R0, R2, R4
MAC R1, R3, R4, R4
STORE R4, c[0][0]
LOAD b[0][1], R2
LOAD b[1][1], R3
MAC_Z R0, R2, R4
MAC R1, R3, R4, R4
STORE R4, c[0][1]
LOAD a[1][0], R0
LOAD a[1][1], R1
MAC_Z R0, R2, R4
MAC R1, R3, R4, R4
STORE R4, c[1][1]
LOAD b[0][0], R2
LOAD b[1][0], R3
MAC_Z R0, R2, R4
MAC R1, R3, R4, R4
STORE R4, c[1][0]
\'\'\'
inner6_cycles = 22
'''
WRONG["1.5"]["the accumulator still counted in the register file"] = '''# Exercise 1.5
min_registers = 3
with_accumulator_in_unit = 3
'''
WRONG["1.5"]["floats"] = '''# Exercise 1.5
min_registers = 3.0
with_accumulator_in_unit = 2.0
'''
WRONG["1.6"]["stored to c[j][i]"] = edit(official("1.6"),
    ('            lines.append(f"STORE R2, c[{i}][{j}]")', '            lines.append(f"STORE R2, c[{j}][{i}]")'))
# A^T B^T: the first factor's indices swapped as well
WRONG["1.6"]["a[k][i] and b[j][k]"] = edit(official("1.6"),
    ('f"LOAD a[{i}][{k}], R0"', 'f"LOAD a[{k}][{i}], R0"'))
# the triple-quoted trace starts and ends with a newline: two lines too many
WRONG["1.4"]["the cycle count as the number of lines of the string"] = edit(official("1.4"),
    ("inner6_cycles = 20", 'inner6_cycles = len(trace_inner6.split("\\n"))'))


# Round eight: wrong answers caught on every draw of tests.wrong_answers.catch_rate
# B read as if transposed: c[i][j] = a[i][0] b[j][0] + a[i][1] b[j][1]
WRONG["1.1"]["b[j][k] in place of b[k][j]"] = edit(official("1.1"),
    ('        f"LOAD b[0][{j}], R1",', '        f"LOAD b[{j}][0], R1",'),
    ('        f"LOAD b[1][{j}], R1",', '        f"LOAD b[{j}][1], R1",'))
# the second pair both loaded into R0: the MAC multiplies b[1][j] by b[0][j]
WRONG["1.1"]["the second pair both loaded into R0"] = edit(official("1.1"),
    ('        f"LOAD b[1][{j}], R1",', '        f"LOAD b[1][{j}], R0",'))
WRONG["1.1"]["the operand register stored (R0, not the sum)"] = edit(official("1.1"),
    ('        f"STORE R2, c[{i}][{j}]",', '        f"STORE R0, c[{i}][{j}]",'))
# 13 LOADs and 25 cycles, but c[0][1]'s reused product takes b[1][0] (still in R1) for b[1][1]
WRONG["1.2"]["c[0][1]'s first product with b[1][0] (the load of b[1][1] replaced)"] = edit(official("1.2"),
    ("LOAD b[1][1], R1      # R0 = a01 is reused", "LOAD b[1][0], R1      # R0 = a01 is reused"))
# 25 cycles: MAC instead of MAC_Z at the start of c[0][1], so it adds onto c[0][0]
WRONG["1.2"]["c[0][1] starts with MAC: the sum carries c[0][0] over"] = edit(official("1.2"),
    ("LOAD b[1][1], R1      # R0 = a01 is reused\nMAC_Z R0, R1, R2",
     "LOAD b[1][1], R1      # R0 = a01 is reused\nMAC R0, R1, R2, R2"))
# the second product of c[1][1] restarts the sum
WRONG["1.2"]["MAC_Z for the second product of c[1][1]"] = edit(official("1.2"),
    ("LOAD b[1][1], R1\nMAC R0, R1, R2, R2\nSTORE R2, c[1][1]",
     "LOAD b[1][1], R1\nMAC_Z R0, R1, R2\nSTORE R2, c[1][1]"))
# the outputs from R1 on: c[0][0] lives in the operand register R1
WRONG["1.3"]["accumulators from R1 (R{1 + n*i + j})"] = edit(official("1.3"),
    ("                acc = 2 + n * i + j", "                acc = 1 + n * i + j"),
    ('    lines += [f"STORE R{2 + n * i + j}, c[{i}][{j}]" for i in range(n) for j in range(n)]',
     '    lines += [f"STORE R{1 + n * i + j}, c[{i}][{j}]" for i in range(n) for j in range(n)]'))
# MAC_Z for the first row of every k, instead of for every row of the first k
WRONG["1.3"]["MAC_Z when i == 0 instead of k == 0"] = edit(official("1.3"),
    ('f"MAC_Z R0, R1, R{acc}" if k == 0 else', 'f"MAC_Z R0, R1, R{acc}" if i == 0 else'))
# 8 LOADs and 20 cycles, but a01 (R1) is overwritten by c[0][1]'s first product, then read
WRONG["1.4"]["a01 overwritten by c[0][1]'s first product, then read"] = edit(official("1.4"),
    ("MAC_Z R0, R4, R0      # a00 is done: overwrite it\nMAC R1, R5, R0, R0\nSTORE R0, c[0][1]",
     "MAC_Z R0, R4, R1\nMAC R1, R5, R1, R1\nSTORE R1, c[0][1]"))
WRONG["1.4"]["the cycle count as a string"] = edit(official("1.4"),
    ("inner6_cycles = 20", 'inner6_cycles = "20"'))
WRONG["1.5"]["one register with the accumulator in the unit"] = '''# Exercise 1.5
min_registers = 3
with_accumulator_in_unit = 1
'''
WRONG["1.5"]["the quiz's six registers"] = '''# Exercise 1.5
min_registers = 6
with_accumulator_in_unit = 4
'''
# MAC for k = 0 too: every output after the first adds onto the previous one
WRONG["1.6"]["MAC for every k: the sum carries over from the previous output"] = edit(official("1.6"),
    ('"MAC_Z R0, R1, R2" if k == 0 else "MAC R0, R1, R2, R2"',
     '"MAC_Z R0, R1, R2" if i == j == k == 0 else "MAC R0, R1, R2, R2"'))
WRONG["1.6"]["k over range(n - 1)"] = edit(official("1.6"),
    ("            for k in range(n):", "            for k in range(n - 1):"))
