"""Wrong answers to problem set 2 (softmax on the machine)."""

_SAFE_OK = '''    t = ["LOAD x[0], R1"]
    for i in range(1, n):
        t += [f"LOAD x[{i}], R0", "MAX R0, R1, R1"]
    for i in range(n):
        t += [f"LOAD x[{i}], R0", "SUB R0, R1, R0"]
        t += ["EXP R0, R2"] if i == 0 else ["EXP R0, R0", "ADD R2, R0, R2"]
'''

WRONG = {
    "2.1": {
        'course_utils.softmax.exp_overflow_threshold': '''# Exercise 2.1
from course_utils.softmax import exp_overflow_threshold
def overflow_threshold(dtype):
    return exp_overflow_threshold(dtype)
''',
        "log10 instead of the natural log": '''# Exercise 2.1
def overflow_threshold(dtype):
    return math.log10(torch.finfo(dtype).max)
''',
        "the thresholds typed in for the two formats of the text": '''# Exercise 2.1
def overflow_threshold(dtype):
    return 88.7228 if dtype == torch.float32 else 11.0899
''',
        "the log of the smallest normal number": '''# Exercise 2.1
def overflow_threshold(dtype):
    return math.log(torch.finfo(dtype).tiny)
''',
        "log2: the exponent of the largest number": '''# Exercise 2.1
def overflow_threshold(dtype):
    return math.log2(torch.finfo(dtype).max)
''',
    },
    "2.2": {
        'course_utils.attention state_from_scores / merge_states per element': '''# Exercise 2.2
import torch
from course_utils.attention import AttentionState, merge_states, state_from_scores
def online_max_sum(x):
    st = None
    one = torch.ones(1, 1, dtype=x.dtype)
    for xi in x:
        part = state_from_scores(xi.reshape(1), one)
        st = part if st is None else merge_states(st, part)
    return st.m, st.l
''',
        "copies the elements to a Python list, then two passes over the list": '''# Exercise 2.2
def online_max_sum(x):
    vals = [float(xi) for xi in x]        # one read of each element, in order...
    m = max(vals)                         # ...then two passes over the copy
    s = sum(math.exp(v - m) for v in vals)
    return torch.tensor(m, dtype=x.dtype), torch.tensor(s, dtype=x.dtype)''',
        "two passes: the max first, then the sum": '''# Exercise 2.2
def online_max_sum(x):
    m = x.max()
    return m, torch.exp(x - m).sum()
''',
        "two loops over the elements": '''# Exercise 2.2
def online_max_sum(x):
    m = torch.tensor(-math.inf)
    for xi in x:
        m = torch.maximum(m, xi)
    s = torch.tensor(0.0)
    for xi in x:
        s = s + torch.exp(xi - m)
    return m, s
''',
        "no rescale of the old sum": '''# Exercise 2.2
def online_max_sum(x):
    m = torch.tensor(-math.inf, dtype=x.dtype)
    s = torch.tensor(0.0, dtype=x.dtype)
    for xi in x:
        m = torch.maximum(m, xi)
        s = s + torch.exp(xi - m)
    return m, s
''',
        "no max at all: overflows for large logits": '''# Exercise 2.2
def online_max_sum(x):
    m = torch.tensor(-math.inf, dtype=x.dtype)
    s = torch.tensor(0.0, dtype=x.dtype)
    for xi in x:
        m = torch.maximum(m, xi)
        s = s + torch.exp(xi)
    return m, s * torch.exp(-m)
''',
        "the library's logsumexp": '''# Exercise 2.2
def online_max_sum(x):
    m = torch.tensor(-math.inf, dtype=x.dtype)
    for xi in x:
        m = torch.maximum(m, xi)
    return m, torch.exp(torch.logsumexp(x, 0) - m)
''',
        "the running max starts at 0 (right whenever some logit is positive)": '''# Exercise 2.2
def online_max_sum(x):
    m = torch.tensor(0.0, dtype=x.dtype)
    s = torch.tensor(0.0, dtype=x.dtype)
    for xi in x:
        m_new = torch.maximum(m, xi)
        s = s * torch.exp(m - m_new) + torch.exp(xi - m_new)
        m = m_new
    return m, s
''',
        "the running max starts at -1e4 instead of -inf": '''# Exercise 2.2
def online_max_sum(x):
    m = torch.tensor(-1e4, dtype=x.dtype)
    s = torch.tensor(0.0, dtype=x.dtype)
    for xi in x:
        m_new = torch.maximum(m, xi)
        s = s * torch.exp(m - m_new) + torch.exp(xi - m_new)
        m = m_new
    return m, s
''',
    },
    "2.3": {
        'safe_softmax_trace precomputed at cell time (outside the guard)': '''# Exercise 2.3
from course_utils.machine.traces import safe_softmax_trace as _sst
_TRACES = {n: _sst(n) for n in range(1, 65)}
def safe_trace(n):
    return _TRACES[n]
''',
        "the library's safe_softmax_trace": '''# Exercise 2.3
from course_utils.machine import safe_softmax_trace as safe_trace
''',
        "no max pass: exp of the raw inputs": '''# Exercise 2.3
def safe_trace(n):
    t = []
    for i in range(n):
        t += [f"LOAD x[{i}], R0"]
        t += ["EXP R0, R2"] if i == 0 else ["EXP R0, R0", "ADD R2, R0, R2"]
    for i in range(n):
        t += [f"LOAD x[{i}], R0", "EXP R0, R0", "DIV R0, R2, R0", f"STORE R0, out[{i}]"]
    return "\\n".join(t)
''',
        "the max taken as the first element": '''# Exercise 2.3
def safe_trace(n):
    t = ["LOAD x[0], R1"]
    for i in range(n):
        t += [f"LOAD x[{i}], R0", "SUB R0, R1, R0"]
        t += ["EXP R0, R2"] if i == 0 else ["EXP R0, R0", "ADD R2, R0, R2"]
    for i in range(n):
        t += [f"LOAD x[{i}], R0", "SUB R0, R1, R0", "EXP R0, R0", "DIV R0, R2, R0",
              f"STORE R0, out[{i}]"]
    return "\\n".join(t)
''',
        "stores the exponentials and reads them back": '''# Exercise 2.3
def safe_trace(n):
''' + _SAFE_OK + '''        t += [f"STORE R0, out[{i}]"] if i > 0 else ["MOV R2, R0", f"STORE R0, out[{i}]"]
    for i in range(n):
        t += [f"LOAD out[{i}], R0", "DIV R0, R2, R0", f"STORE R0, out[{i}]"]
    return "\\n".join(t)
''',
    },
    "2.4": {
        'online step sliced from a library trace computed at cell time': '''# Exercise 2.4
from course_utils.machine.traces import online_softmax_trace as _ost
_lines = _ost(2).split("\n")
_STEP = "\n".join(_lines[_lines.index("# element 1") + 1:_lines.index("# pass 2: out[i] = exp(x_i - m) / S")])
def online_step(i):
    return _STEP.replace("x[1]", f"x[{i}]")
''',
        "the library's step": '''# Exercise 2.4
from course_utils.machine import _online_step as online_step
''',
        "the old max overwritten before the factor is computed": '''# Exercise 2.4
def online_step(i):
    return "\\n".join([f"LOAD x[{i}], R0", "MAX R1, R0, R1", "MOV R1, R3", "SUB R3, R1, R3",
                      "SUB R0, R1, R0", "EXP R3, R3", "EXP R0, R0", "MUL R2, R3, R2",
                      "ADD R2, R0, R2"])
''',
        "no rescale of s": '''# Exercise 2.4
def online_step(i):
    return "\\n".join([f"LOAD x[{i}], R0", "MAX R1, R0, R1", "SUB R0, R1, R0", "EXP R0, R0",
                      "ADD R2, R0, R2"])
''',
        "the factor inverted: m_new - m_old": '''# Exercise 2.4
def online_step(i):
    return "\\n".join([f"LOAD x[{i}], R0", "MOV R1, R3", "MAX R1, R0, R1", "SUB R1, R3, R3",
                      "SUB R0, R1, R0", "EXP R3, R3", "EXP R0, R0", "MUL R2, R3, R2",
                      "ADD R2, R0, R2"])
''',
    },
    "2.5": {
        'course_utils.attention.merge_states: the l of a unit state': '''# Exercise 2.5
import torch
from course_utils.attention import AttentionState, merge_states
def rescale_factor(m_old, m_new):
    a = AttentionState(m=m_old, l=torch.ones_like(m_old), acc=torch.zeros_like(m_old)[..., None])
    b = AttentionState(m=m_new, l=torch.zeros_like(m_new), acc=torch.zeros_like(m_new)[..., None])
    return merge_states(a, b).l
''',
        "exp of each max on its own": '''# Exercise 2.5
def rescale_factor(m_old, m_new):
    return torch.nan_to_num(torch.exp(m_old) / torch.exp(m_new))
''',
        "NaN when both maxima are -inf": '''# Exercise 2.5
def rescale_factor(m_old, m_new):
    return torch.exp(m_old - m_new)
''',
        "the factor inverted": '''# Exercise 2.5
def rescale_factor(m_old, m_new):
    diff = torch.where(m_old == -math.inf, torch.full_like(m_old, -math.inf), m_new - m_old)
    return torch.exp(diff)
''',
        "1 where nothing was seen yet": '''# Exercise 2.5
def rescale_factor(m_old, m_new):
    return torch.where(m_old == -math.inf, torch.ones_like(m_old), torch.exp(m_old - m_new))
''',
    },
    "2.6": {
        'course_utils.softmax.welford_update': '''# Exercise 2.6 (2 points)
from course_utils.softmax import welford_update
def welford_step(state, x):
    return welford_update(state, x)

m2_increment_is = "b"
''',
        "M2 += (x - old mean)^2: option a": '''# Exercise 2.6 (2 points)
def welford_step(state, x):
    N, mean, m2 = state
    N += 1
    delta = x - mean
    mean = mean + delta / N
    m2 = m2 + delta * delta
    return N, mean, m2

m2_increment_is = "a"
''',
        "running sums of x and x^2: cancellation": '''# Exercise 2.6 (2 points)
def welford_step(state, x):
    N, mean, m2 = state
    s1 = mean * N + x
    s2 = m2 + mean * mean * N + x * x
    N += 1
    mean = s1 / N
    return N, mean, s2 - s1 * s1 / N

m2_increment_is = "b"
''',
        "the right step, the wrong choice": '''# Exercise 2.6 (2 points)
def welford_step(state, x):
    N, mean, m2 = state
    N += 1
    delta = x - mean
    mean = mean + delta / N
    m2 = m2 + delta * (x - mean)
    return N, mean, m2

m2_increment_is = "c"
''',
        "the mean divided by the old count": '''# Exercise 2.6 (2 points)
def welford_step(state, x):
    N, mean, m2 = state
    delta = x - mean
    mean = mean + delta / max(N, 1)
    m2 = m2 + delta * (x - mean)
    return N + 1, mean, m2

m2_increment_is = "b"
''',
    },
}


# Round seven: wrong answers caught on every draw of tests.wrong_answers.catch_rate
from tests.wrong_answers import edit, official  # noqa: E402

# the logarithm taken in the format itself rounds to its few bits (fp16: 11.086, bf16: 88.5)
WRONG["2.1"]["the log computed in the dtype"] = edit(official("2.1"),
    ("    return math.log(torch.finfo(dtype).max)",
     "    return torch.log(torch.tensor(torch.finfo(dtype).max, dtype=dtype)).item()"))
WRONG["2.1"]["a 0-d tensor, not a float"] = edit(official("2.1"),
    ("    return math.log(torch.finfo(dtype).max)",
     "    return torch.tensor(torch.finfo(dtype).max, dtype=torch.float64).log()"))
WRONG["2.1"]["rounded down to an int"] = edit(official("2.1"),
    ("    return math.log(torch.finfo(dtype).max)",
     "    return math.floor(math.log(torch.finfo(dtype).max))"))
# torch.finfo() without an argument describes the default dtype, float32
WRONG["2.1"]["torch.finfo() of the default dtype"] = edit(official("2.1"),
    ("    return math.log(torch.finfo(dtype).max)",
     "    return math.log(torch.finfo().max)"))
# the trace's SUB is "SUB Ra, Rb, Rd": Rd = Ra - Rb
WRONG["2.3"]["SUB operands swapped: exp(max - x)"] = '''# Exercise 2.3
def safe_trace(n):
    t = ["LOAD x[0], R1"]
    for i in range(1, n):
        t += [f"LOAD x[{i}], R0", "MAX R0, R1, R1"]
    for i in range(n):
        t += [f"LOAD x[{i}], R0", "SUB R1, R0, R0"]
        t += ["EXP R0, R2"] if i == 0 else ["EXP R0, R0", "ADD R2, R0, R2"]
    for i in range(n):
        t += [f"LOAD x[{i}], R0", "SUB R1, R0, R0", "EXP R0, R0", "DIV R0, R2, R0",
              f"STORE R0, out[{i}]"]
    return "\\n".join(t)
'''
WRONG["2.3"]["DIV operands swapped: sum / exp"] = edit(official("2.3"),
    ('"DIV R0, R2, R0"', '"DIV R2, R0, R0"'))
# the first pass starts from R1's initial value instead of x[0]
WRONG["2.3"]["the max pass starts from an unset R1"] = '''# Exercise 2.3
def safe_trace(n):
    t = []
    for i in range(n):
        t += [f"LOAD x[{i}], R0", "MAX R0, R1, R1"]
    for i in range(n):
        t += [f"LOAD x[{i}], R0", "SUB R0, R1, R0"]
        t += ["EXP R0, R2"] if i == 0 else ["EXP R0, R0", "ADD R2, R0, R2"]
    for i in range(n):
        t += [f"LOAD x[{i}], R0", "SUB R0, R1, R0", "EXP R0, R0", "DIV R0, R2, R0",
              f"STORE R0, out[{i}]"]
    return "\\n".join(t)
'''
# the new term measured against the old max
WRONG["2.4"]["x_i - m_old for the new term"] = edit(official("2.4"),
    ('        "SUB R0, R1, R0",    # x_i - m_new', '        "SUB R0, R3, R0",    # x_i - m_new'))
WRONG["2.4"]["the rescale after the add: (s + e) * factor"] = edit(official("2.4"),
    ('        "MUL R2, R3, R2",    # rescale s\n        "ADD R2, R0, R2",    # add the new term',
     '        "ADD R2, R0, R2",    # add the new term\n        "MUL R2, R3, R2",    # rescale s'))
# changes the caller's running maxima
WRONG["2.5"]["in place on m_old"] = '''# Exercise 2.5
def rescale_factor(m_old, m_new):
    nothing = m_old == -math.inf
    m_old.sub_(m_new)
    m_old[nothing] = -math.inf
    return m_old.exp_()
'''
# one branch for the whole tensor: zeros everywhere as soon as one entry is -inf
WRONG["2.5"]["a Python if on any -inf"] = '''# Exercise 2.5
def rescale_factor(m_old, m_new):
    if (m_old == -math.inf).any():
        return torch.zeros_like(m_old)
    return torch.exp(m_old - m_new)
'''
# the caller's -inf clamped away: exp(-1e30 - (-1e30)) = 1 when nothing was seen on either side
WRONG["2.5"]["both maxima clamped to -1e30"] = edit(official("2.5"),
    ("    diff = torch.where(m_old == -math.inf, torch.full_like(m_old, -math.inf), m_old - m_new)",
     "    diff = m_old.clamp(min=-1e30) - m_new.clamp(min=-1e30)"))
WRONG["2.6"]["M2 += (x - new mean)^2: option c"] = edit(official("2.6"),
    ("    m2 = m2 + delta * (x - mean)", "    m2 = m2 + (x - mean) ** 2"),
    ('m2_increment_is = "b"', 'm2_increment_is = "c"'))
# the state returned holds the sample variance, not M2
WRONG["2.6"]["the variance kept in place of M2"] = edit(official("2.6"),
    ("    m2 = m2 + delta * (x - mean)\n    return N, mean, m2",
     "    m2 = m2 + delta * (x - mean)\n    return N, mean, m2 / max(N - 1, 1)"))
WRONG["2.6"]["floor division in the mean update"] = edit(official("2.6"),
    ("    mean = mean + delta / N", "    mean = mean + delta // N"))
# e^(x_i - m_old) overflows when the max jumps by more than ~88, and is inf * 0 on the first element
WRONG["2.2"]["the new term added before the rescale, against the old max"] = edit(official("2.2"),
    ("        s = s * torch.exp(m - m_new) + torch.exp(xi - m_new)",
     "        s = (s + torch.exp(xi - m)) * torch.exp(m - m_new)"))
# a debugging history of the running max: the state grows with the input
WRONG["2.2"]["keeps a list of the running maxima"] = edit(official("2.2"),
    ("    for xi in x:\n        m_new = torch.maximum(m, xi)",
     "    history = []\n    for xi in x:\n        m_new = torch.maximum(m, xi)\n        history.append(m_new)"))
# throws the old sum away when the max grows: right only when every earlier term was negligible
WRONG["2.2"]["the sum restarts at 1 whenever the max grows"] = '''# Exercise 2.2
def online_max_sum(x):
    m = torch.tensor(-math.inf, dtype=x.dtype)
    s = torch.tensor(0.0, dtype=x.dtype)
    for xi in x:
        if xi > m:
            m, s = xi, torch.tensor(1.0, dtype=x.dtype)
        else:
            s = s + torch.exp(xi - m)
    return m, s
'''
# MAX Ra, Rb, Rd writes Rd: the running max in R1 never moves from x[0]
WRONG["2.3"]["the max written into R0: R1 stays x[0]"] = edit(official("2.3"),
    ('        t += [f"LOAD x[{i}], R0", "MAX R0, R1, R1"]', '        t += [f"LOAD x[{i}], R0", "MAX R0, R1, R0"]'))


# Round eight: wrong answers caught on every draw of tests.wrong_answers.catch_rate
# a float32 tensor of the largest float64 is inf
WRONG["2.1"]["torch.log of a default-dtype tensor of the max"] = edit(official("2.1"),
    ("    return math.log(torch.finfo(dtype).max)",
     "    return float(torch.log(torch.tensor(torch.finfo(dtype).max)))"))
WRONG["2.1"]["minus the log of eps"] = edit(official("2.1"),
    ("    return math.log(torch.finfo(dtype).max)", "    return -math.log(torch.finfo(dtype).eps)"))
WRONG["2.2"]["the factor inverted: exp(m_new - m)"] = edit(official("2.2"),
    ("        s = s * torch.exp(m - m_new) + torch.exp(xi - m_new)",
     "        s = s * torch.exp(m_new - m) + torch.exp(xi - m_new)"))
# a branch for a new max that moves m before the factor is taken: the factor is always 1
WRONG["2.2"]["the max moved before the factor is taken (branches)"] = '''# Exercise 2.2
def online_max_sum(x):
    m = torch.tensor(-math.inf, dtype=x.dtype)
    s = torch.tensor(0.0, dtype=x.dtype)
    for xi in x:
        if xi > m:
            m = xi
            s = s * torch.exp(m - xi) + 1.0
        else:
            s = s + torch.exp(xi - m)
    return m, s
'''
# the max pass stops one element short: wrong whenever the last element is the largest
WRONG["2.3"]["the max pass misses the last element"] = edit(official("2.3"),
    ("    for i in range(1, n):\n        t += [f\"LOAD x[{i}], R0\", \"MAX R0, R1, R1\"]",
     "    for i in range(1, n - 1):\n        t += [f\"LOAD x[{i}], R0\", \"MAX R0, R1, R1\"]"))
WRONG["2.3"]["outputs stored in reverse order"] = edit(official("2.3"),
    ('              f"STORE R0, out[{i}]"]', '              f"STORE R0, out[{n - 1 - i}]"]'))
# the rescaling factor multiplies the new term instead of the old sum
WRONG["2.4"]["the factor applied to the new term, not to s"] = edit(official("2.4"),
    ('        "MUL R2, R3, R2",    # rescale s', '        "MUL R0, R3, R0",'))
WRONG["2.4"]["the factor added in place of the new term"] = edit(official("2.4"),
    ('        "ADD R2, R0, R2",    # add the new term', '        "ADD R2, R3, R2",'))
WRONG["2.4"]["exp before the subtraction for the new term"] = edit(official("2.4"),
    ('        "SUB R0, R1, R0",    # x_i - m_new\n        "EXP R3, R3",        # rescaling factor in (0, 1]\n'
     '        "EXP R0, R0",        # the new term\n',
     '        "EXP R3, R3",\n        "EXP R0, R0",\n        "SUB R0, R1, R0",\n'))
# x copied in place of the old max: the factor is exp(x_i - m_new)
WRONG["2.4"]["MOV R0, R3: x copied instead of the old max"] = edit(official("2.4"),
    ('        "MOV R1, R3",        # keep the old max', '        "MOV R0, R3",'))
# a 1-D tensor for a 2-D state
WRONG["2.5"]["math.exp over a flattened list (a 1-D result)"] = '''# Exercise 2.5
def rescale_factor(m_old, m_new):
    out = [0.0 if a == -math.inf else math.exp(a - b)
           for a, b in zip(m_old.flatten().tolist(), m_new.flatten().tolist())]
    return torch.tensor(out, dtype=m_old.dtype)
'''
WRONG["2.6"]["the choice in upper case"] = edit(official("2.6"),
    ('m2_increment_is = "b"', 'm2_increment_is = "B"'))
WRONG["2.6"]["the state returned as a list"] = edit(official("2.6"),
    ("    return N, mean, m2", "    return [N, mean, m2]"))
