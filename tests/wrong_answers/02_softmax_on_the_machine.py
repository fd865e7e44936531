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
