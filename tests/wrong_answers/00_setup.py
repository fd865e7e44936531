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
