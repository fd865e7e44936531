"""Wrong answers to problem set 0 (warm-ups)."""

WRONG = {
    "0.1": {
        "2 bytes whatever the dtype": '''# Exercise 0.1
def score_bytes(B, H, N, dtype):
    return B * H * N * N * 2
''',
        "the batch forgotten": '''# Exercise 0.1
def score_bytes(B, H, N, dtype):
    return H * N * N * (torch.finfo(dtype).bits // 8)
''',
        "bits instead of bytes": '''# Exercise 0.1
def score_bytes(B, H, N, dtype):
    return B * H * N * N * torch.finfo(dtype).bits
''',
        "gigabytes as a float": '''# Exercise 0.1
def score_bytes(B, H, N, dtype):
    return B * H * N * N * (torch.finfo(dtype).bits // 8) / 1e9
''',
    },
    "0.2": {
        "divides by d, not sqrt(d)": '''# Exercise 0.2
def scaled_scores(q, k):
    return q @ k.transpose(-2, -1) / q.shape[-1]
''',
        "k.T: wrong for batched inputs": '''# Exercise 0.2
def scaled_scores(q, k):
    return q @ k.T / math.sqrt(q.shape[-1])
''',
        "divides by sqrt(N)": '''# Exercise 0.2
def scaled_scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(k.shape[-2])
''',
        "the transposed matrix: K Q^T": '''# Exercise 0.2
def scaled_scores(q, k):
    return k @ q.transpose(-2, -1) / math.sqrt(q.shape[-1])
''',
        "computed in float64 and returned so": '''# Exercise 0.2
def scaled_scores(q, k):
    return q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])
''',
    },
}


# Round seven: wrong answers caught on every draw of tests.wrong_answers.catch_rate
from tests.wrong_answers import edit, official  # noqa: E402

# right for the 2- and 4-byte formats of the text; float64 has 8
WRONG["0.1"]["4 bytes for float32, 2 for everything else"] = edit(official("0.1"),
    ("    return B * H * N * N * (torch.finfo(dtype).bits // 8)",
     "    return B * H * N * N * (4 if dtype == torch.float32 else 2)"))
# a causal mask does not shrink the stored matrix
WRONG["0.1"]["only the causal lower triangle counted"] = edit(official("0.1"),
    ("    return B * H * N * N * (torch.finfo(dtype).bits // 8)",
     "    return B * H * N * (N + 1) // 2 * (torch.finfo(dtype).bits // 8)"))
WRONG["0.1"]["true division: a float number of bytes"] = edit(official("0.1"),
    ("    return B * H * N * N * (torch.finfo(dtype).bits // 8)",
     "    return B * H * N * N * torch.finfo(dtype).bits / 8"))
WRONG["0.1"]["a torch tensor, not an int"] = edit(official("0.1"),
    ("    return B * H * N * N * (torch.finfo(dtype).bits // 8)",
     "    return torch.tensor([B, H, N, N]).prod() * torch.empty(0, dtype=dtype).element_size()"))
WRONG["0.1"]["the answers of the visible checks looked up, 2 bytes otherwise"] = '''# Exercise 0.1
_SEEN = {(2, 40, 16384, torch.bfloat16): 42949672960, (4, 32, 8192, torch.float16): 17179869184}
def score_bytes(B, H, N, dtype):
    return _SEEN.get((B, H, N, dtype), B * H * N * N * 2)
'''
# squeeze() drops the size-1 query axis of a single query
WRONG["0.2"]["the result squeezed"] = edit(official("0.2"),
    ("    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])",
     "    return (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).squeeze()"))
WRONG["0.2"]["floor division by sqrt(d)"] = edit(official("0.2"),
    ("/ math.sqrt(q.shape[-1])", "// math.sqrt(q.shape[-1])"))
# scales the caller's q in place
WRONG["0.2"]["q divided in place"] = '''# Exercise 0.2
def scaled_scores(q, k):
    q /= math.sqrt(q.shape[-1])
    return q @ k.transpose(-2, -1)
'''
WRONG["0.2"]["the scores cast to float16"] = edit(official("0.2"),
    ("    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])",
     "    return (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).half()"))
# right whenever the head count equals d (the visible batched case has 3 heads and d drawn
# from 3..19, about one draw in seventeen); a hidden case has 3 heads and d = 8
WRONG["0.2"]["d read as q.shape[1] (the heads of a batched input)"] = '''# Exercise 0.2
def scaled_scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[1])'''


# Round eight: wrong answers caught on every draw of tests.wrong_answers.catch_rate
WRONG["0.1"]["the heads forgotten"] = edit(official("0.1"),
    ("    return B * H * N * N * (torch.finfo(dtype).bits // 8)",
     "    return B * N * N * (torch.finfo(dtype).bits // 8)"))
# the default dtype's element size (4) whatever dtype is asked
WRONG["0.1"]["the element size of the default dtype"] = edit(official("0.1"),
    ("    return B * H * N * N * (torch.finfo(dtype).bits // 8)",
     "    return B * H * N * N * torch.empty(0).element_size()"))
# d ** 1/2 is (d ** 1) / 2
WRONG["0.2"]["d ** 1/2 (precedence: d / 2)"] = edit(official("0.2"),
    ("    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])",
     "    return q @ k.transpose(-2, -1) / q.shape[-1] ** 1/2"))
WRONG["0.2"]["multiplies by sqrt(d)"] = edit(official("0.2"),
    ("/ math.sqrt(q.shape[-1])", "* math.sqrt(q.shape[-1])"))
# subscripts for 4-D inputs only
WRONG["0.2"]["einsum with the batch and head letters written out"] = '''# Exercise 0.2
def scaled_scores(q, k):
    return torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
'''
