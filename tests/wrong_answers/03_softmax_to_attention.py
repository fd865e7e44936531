"""Wrong answers to problem set 3 (from softmax to attention)."""

from tests.wrong_answers import edit, official

WRONG = {
    "3.1": {
        "no running max: exp of the raw score": '''# Exercise 3.1
def attention_update(state, x, v):
    m, den, num = state
    w = torch.exp(x)
    return torch.maximum(m, x), den + w, num + w * v
''',
        "rescales den but not num": '''# Exercise 3.1
def attention_update(state, x, v):
    m, den, num = state
    m_new = torch.maximum(m, x)
    shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    r = torch.exp(m - shift)
    w = torch.exp(x - shift)
    return m_new, r * den + w, num + w * v
''',
        "the factor inverted: exp(m_new - m_old)": '''# Exercise 3.1
def attention_update(state, x, v):
    m, den, num = state
    m_new = torch.maximum(m, x)
    r = torch.exp(torch.nan_to_num(m_new - m, posinf=0.0))
    w = torch.exp(x - m_new)
    return m_new, r * den + w, r * num + w * v
''',
        "NaN on a masked first score (no safe shift)": '''# Exercise 3.1
def attention_update(state, x, v):
    m, den, num = state
    m_new = torch.maximum(m, x)
    r = torch.exp(m - m_new)
    w = torch.exp(x - m_new)
    return m_new, r * den + w, r * num + w * v
''',
        "updates the state in place": '''# Exercise 3.1
def attention_update(state, x, v):
    m, den, num = state
    m_new = torch.maximum(m, x)
    shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    r = torch.exp(m - shift)
    w = torch.exp(x - shift)
    num.mul_(r).add_(w * v)
    den.mul_(r).add_(w)
    m.copy_(m_new)
    return m, den, num
''',
        "no running max, the state kept in float64": '''# Exercise 3.1
def attention_update(state, x, v):
    m, den, num = state
    w = torch.exp(x.double())
    return torch.maximum(m, x), den.double() + w, num.double() + w * v.double()''',
        "the state returned in float64": '''# Exercise 3.1
def attention_update(state, x, v):
    m, den, num = (t.double() for t in state)
    x, v = x.double(), v.double()
    m_new = torch.maximum(m, x)
    shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    r = torch.exp(m - shift)
    w = torch.exp(x - shift)
    return m_new, r * den + w, r * num + w * v''',
    },
    "3.2": {
        "wraps the library's merge_states": '''# Exercise 3.2
def merge(a, b):
    s = merge_states(AttentionState(*a), AttentionState(*b))
    return s.m, s.l, s.acc
''',
        "no safe shift: NaN for two empty states": '''# Exercise 3.2
def merge(a, b):
    (ma, da, na), (mb, db, nb_) = a, b
    m = torch.maximum(ma, mb)
    ca, cb = torch.exp(ma - m), torch.exp(mb - m)
    return m, ca * da + cb * db, ca[:, None] * na + cb[:, None] * nb_
''',
        "adds the sums without rescaling": '''# Exercise 3.2
def merge(a, b):
    (ma, da, na), (mb, db, nb_) = a, b
    return torch.maximum(ma, mb), da + db, na + nb_
''',
        "exp of each max on its own: overflows": '''# Exercise 3.2
def merge(a, b):
    (ma, da, na), (mb, db, nb_) = a, b
    m = torch.maximum(ma, mb)
    ca, cb = torch.exp(ma) / torch.exp(m), torch.exp(mb) / torch.exp(m)
    ca, cb = torch.nan_to_num(ca), torch.nan_to_num(cb)
    return m, ca * da + cb * db, ca[:, None] * na + cb[:, None] * nb_
''',
    },
    "3.3": {
        "the course's safe_softmax of the whole row": '''# Exercise 3.3
from course_utils.softmax import safe_softmax
def tiled_row_attention(x, vals, B):
    return safe_softmax(x, -1) @ vals
''',
        "the course's online_softmax in blocks of B": '''# Exercise 3.3
from course_utils.softmax import online_softmax
def tiled_row_attention(x, vals, B):
    return online_softmax(x, -1, block_size=B) @ vals
''',
        "a softmax of the whole row": '''# Exercise 3.3
def tiled_row_attention(x, vals, B):
    return torch.softmax(x, -1) @ vals
''',
        "drops the last, shorter tile": '''# Exercise 3.3
def tiled_row_attention(x, vals, B):
    n = x.shape[1] // B * B
    states = [state_from_scores(x[:, lo:lo + B], vals[lo:lo + B]) for lo in range(0, n, B)]
    total = states[-1]
    for st in reversed(states[:-1]):
        total = merge_states(st, total)
    return total.acc / total.l[:, None]
''',
        "never divides by l": '''# Exercise 3.3
def tiled_row_attention(x, vals, B):
    states = [state_from_scores(x[:, lo:lo + B], vals[lo:lo + B])
              for lo in range(0, x.shape[1], B)]
    total = states[-1]
    for st in reversed(states[:-1]):
        total = merge_states(st, total)
    return total.acc
''',
        "averages the tiles' outputs": '''# Exercise 3.3
def tiled_row_attention(x, vals, B):
    outs = [state_from_scores(x[:, lo:lo + B], vals[lo:lo + B]).output
            for lo in range(0, x.shape[1], B)]
    return sum(outs) / len(outs)
''',
        "the course's naive attention on a fake head": '''# Exercise 3.3
from course_utils.attention import naive_attention

def tiled_row_attention(x, vals, B):
    q = x[None, None]
    eye = torch.eye(x.shape[1], dtype=x.dtype)[None, None]
    return naive_attention(q, eye, vals[None, None], scale=1.0)[0, 0]
''',
        "no running max: exp of the raw scores, tile by tile": '''# Exercise 3.3
def tiled_row_attention(x, vals, B):
    l, acc = 0.0, 0.0
    for lo in range(0, x.shape[1], B):
        p = torch.exp(x[:, lo:lo + B])
        l = l + p.sum(-1)
        acc = acc + p @ vals[lo:lo + B]
    return acc / l[:, None]''',
        "the first tile's maximum as the reference for every tile": '''# Exercise 3.3
def tiled_row_attention(x, vals, B):
    m0 = x[:, :B].amax(-1, keepdim=True)
    m0 = torch.where(torch.isinf(m0), torch.zeros_like(m0), m0)
    l, acc = 0.0, 0.0
    for lo in range(0, x.shape[1], B):
        p = torch.exp(x[:, lo:lo + B] - m0)
        l = l + p.sum(-1)
        acc = acc + p @ vals[lo:lo + B]
    return acc / l[:, None]''',
    },
    "3.4": {
        "one call of the library's traffic_formula": '''# Exercise 3.4
from course_utils.attention import traffic_formula

def hbm_traffic(N, d, Br, Bc):
    t2, t1 = traffic_formula("fa2", N, N, d, Br, Bc), traffic_formula("fa1", N, N, d, Br, Bc)
    return (t2["K reads"] + t2["V reads"], t1["K reads"] + t1["V reads"],
            t1["O reads"] + t1["O writes"])
''',
        "forgets the zero-fill write of O": '''# Exercise 3.4
def hbm_traffic(N, d, Br, Bc):
    tr, tc = -(-N // Br), -(-N // Bc)
    return 2 * tr * N * d, 2 * N * d, 2 * tc * N * d
''',
        "floor instead of ceiling for the tile counts": '''# Exercise 3.4
def hbm_traffic(N, d, Br, Bc):
    tr, tc = N // Br, N // Bc
    return 2 * tr * N * d, 2 * N * d, tc * N * d + (tc + 1) * N * d
''',
        "K only, V forgotten": '''# Exercise 3.4
def hbm_traffic(N, d, Br, Bc):
    tr, tc = -(-N // Br), -(-N // Bc)
    return tr * N * d, N * d, tc * N * d + (tc + 1) * N * d
''',
        "the loop orders swapped": '''# Exercise 3.4
def hbm_traffic(N, d, Br, Bc):
    tr, tc = -(-N // Br), -(-N // Bc)
    return 2 * N * d, 2 * tc * N * d, tr * N * d + (tr + 1) * N * d
''',
    },
    "3.5": {
        "one call of the library's traffic_formula": '''# Exercise 3.5
from course_utils.attention import traffic_formula

def fa2_intensity(N, d, Br, Bc, nbytes):
    return 4 * N * N * d / (nbytes * sum(traffic_formula("fa2", N, N, d, Br, Bc).values()))
''',
        "elements instead of bytes": '''# Exercise 3.5
def fa2_intensity(N, d, Br, Bc, nbytes):
    tr = -(-N // Br)
    return 4 * N * N * d / (N * d + 2 * tr * N * d + N * d)
''',
        "counts only K and V": '''# Exercise 3.5
def fa2_intensity(N, d, Br, Bc, nbytes):
    tr = -(-N // Br)
    return 4 * N * N * d / (nbytes * 2 * tr * N * d)
''',
        "Tc in place of Tr": '''# Exercise 3.5
def fa2_intensity(N, d, Br, Bc, nbytes):
    tc = -(-N // Bc)
    return 4 * N * N * d / (nbytes * (N * d + 2 * tc * N * d + N * d))
''',
    },
    "3.6": {
        "every statement swapped": '''# Exercise 3.6
orders = {"o_written_once": "fa1", "kv_loaded_once": "fa2", "lm_in_hbm": "fa2",
          "intensity_grows_with_Br": "fa1", "more_bytes_for_long_rows": "fa2"}
''',
        "FA2 keeps l and m in HBM": '''# Exercise 3.6
orders = {"o_written_once": "fa2", "kv_loaded_once": "fa1", "lm_in_hbm": "fa2",
          "intensity_grows_with_Br": "fa2", "more_bytes_for_long_rows": "fa1"}
''',
        "intensity credited to FA1": '''# Exercise 3.6
orders = {"o_written_once": "fa2", "kv_loaded_once": "fa1", "lm_in_hbm": "fa1",
          "intensity_grows_with_Br": "fa1", "more_bytes_for_long_rows": "fa1"}
''',
        "the O traffic credited to FA2": '''# Exercise 3.6
orders = {"o_written_once": "fa2", "kv_loaded_once": "fa1", "lm_in_hbm": "fa1",
          "intensity_grows_with_Br": "fa2", "more_bytes_for_long_rows": "fa2"}
''',
    },
}


# Round six: wrong answers caught on every draw of tests.wrong_answers.catch_rate
# float32 inside loses float64's digits (the hidden float64 rows need 1e-11)
WRONG['3.1']["the update in float32, cast back to the scores' dtype"] = edit(official('3.1'),
    ('    m, den, num = state',
     '    m, den, num = (t.float() for t in state)\n    x, v = x.float(), v.float()\n    dt = state[1].dtype'), 
    ('    return m_new, r * den + w, r * num + w * v',
     '    return m_new.to(dt), (r * den + w).to(dt), (r * num + w * v).to(dt)'))
# the old sums move to the new maximum but the new term is measured from the old one
WRONG['3.1']['the new term measured from the old maximum'] = edit(official('3.1'),
    ('    shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)',
     '    shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)\n    old = torch.where(torch.isneginf(m), shift, m)'), 
    ('    w = torch.exp(x - shift)',
     '    w = torch.exp(x - old)'))
WRONG['3.2']['rescales num but not den'] = edit(official('3.2'),
    ('    return m, ca * da + cb * db, ca[:, None] * na + cb[:, None] * nb_',
     '    return m, da + db, ca[:, None] * na + cb[:, None] * nb_'))
# (R,) against (R, d) lines up with d: an error, or wrong columns when R == d
WRONG['3.2']['the factors not unsqueezed (ca * na broadcasts along d)'] = edit(official('3.2'),
    ('    return m, ca * da + cb * db, ca[:, None] * na + cb[:, None] * nb_',
     '    return m, ca * da + cb * db, ca * na + cb * nb_'))
# the merged den and num must be measured from the merged maximum m
WRONG['3.2']['the smaller maximum as the reference'] = edit(official('3.2'),
    ('    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)',
     '    ref = torch.where(torch.isinf(ma) | torch.isinf(mb), m, torch.minimum(ma, mb))\n    safe = torch.where(torch.isinf(ref), torch.zeros_like(ref), ref)'))
# den and num of the rows below the overall maximum come out scaled by exp(m_row - top)
WRONG['3.2']['one max over every row (not row by row)'] = edit(official('3.2'),
    ('    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)',
     '    top = m.max()\n    safe = torch.zeros_like(m) if torch.isinf(top) else torch.full_like(m, float(top))'))
WRONG['3.3']['range(0, n - 1, B): a last one-key tile dropped'] = edit(official('3.3'),
    ('              for lo in range(0, x.shape[1], B)]',
     '              for lo in range(0, x.shape[1] - 1, B)]'))
# the check compares float64 rows at 1e-10
WRONG['3.3']['the output rounded to float32'] = edit(official('3.3'),
    ('    return total.acc / total.l[:, None]',
     '    return (total.acc / total.l[:, None]).float()'))
WRONG['3.3']['tiles cut from the rows (x.shape[0]), not the keys'] = edit(official('3.3'),
    ('              for lo in range(0, x.shape[1], B)]',
     '              for lo in range(0, x.shape[0], B)]'))
# the visible cases always end on a partial tile
WRONG['3.3']['the tile count n // B: the short last tile dropped when B does not divide n'] = edit(official('3.3'),
    ('    states = [state_from_scores(x[:, lo:lo + B], vals[lo:lo + B])\n              for lo in range(0, x.shape[1], B)]',
     '    n = x.shape[1]\n    states = [state_from_scores(x[:, t * B:(t + 1) * B], vals[t * B:(t + 1) * B])\n              for t in range(max(1, n // B))]'))
WRONG['3.4']["Tr in place of Tc for FA1's O traffic"] = '''# Exercise 3.4
def hbm_traffic(N, d, Br, Bc):
    tr, tc = -(-N // Br), -(-N // Bc)
    return 2 * tr * N * d, 2 * N * d, tr * N * d + (tr + 1) * N * d'''
# right for ragged N, one tile too many when B divides N (4096 / 128, a visible case)
WRONG['3.4']['N // B + 1 tiles (one too many when B divides N)'] = '''# Exercise 3.4
def hbm_traffic(N, d, Br, Bc):
    tr, tc = N // Br + 1, N // Bc + 1
    return 2 * tr * N * d, 2 * N * d, tc * N * d + (tc + 1) * N * d'''
WRONG['3.4']['FA2 streams K and V once per key tile'] = '''# Exercise 3.4
def hbm_traffic(N, d, Br, Bc):
    tr, tc = -(-N // Br), -(-N // Bc)
    return 2 * tc * N * d, 2 * N * d, tc * N * d + (tc + 1) * N * d'''
WRONG['3.4']['a list, not a tuple'] = '''# Exercise 3.4
def hbm_traffic(N, d, Br, Bc):
    tr, tc = -(-N // Br), -(-N // Bc)
    return [2 * tr * N * d, 2 * N * d, tc * N * d + (tc + 1) * N * d]'''
# fractional tiles: right only when Br divides N
WRONG['3.5']['Tr = N / Br, no ceiling'] = '''# Exercise 3.5
def fa2_intensity(N, d, Br, Bc, nbytes):
    tr = N / Br
    moved = N * d + 2 * tr * N * d + N * d
    return 4 * N * N * d / (nbytes * moved)'''
WRONG['3.5']['O read and written (counted twice)'] = '''# Exercise 3.5
def fa2_intensity(N, d, Br, Bc, nbytes):
    tr = -(-N // Br)
    moved = N * d + 2 * tr * N * d + 2 * N * d
    return 4 * N * N * d / (nbytes * moved)'''
# the limit for N >> Br, not the intensity at the given N
WRONG['3.5']['the long-sequence limit Br / nbytes'] = '''# Exercise 3.5
def fa2_intensity(N, d, Br, Bc, nbytes):
    return Br / nbytes'''
WRONG['3.6']['more_bytes_for_long_rows answered fa2'] = edit(official('3.6'),
    ('          "intensity_grows_with_Br": "fa2", "more_bytes_for_long_rows": "fa1"}',
     '          "intensity_grows_with_Br": "fa2", "more_bytes_for_long_rows": "fa2"}'))
WRONG['3.6']['the fifth statement left out'] = edit(official('3.6'),
    ('          "intensity_grows_with_Br": "fa2", "more_bytes_for_long_rows": "fa1"}',
     '          "intensity_grows_with_Br": "fa2"}'))
WRONG['3.6']['intensity credited to FA1, the rest right'] = edit(official('3.6'),
    ('          "intensity_grows_with_Br": "fa2", "more_bytes_for_long_rows": "fa1"}',
     '          "intensity_grows_with_Br": "fa1", "more_bytes_for_long_rows": "fa1"}'))
# exact while the row's maximum comes before the masked key and beats the later scores by
# far (then exp(m) times a tiny den is what it should be): a hidden case has [1, -inf, 0]
WRONG["3.1"]["the safe shift tested on the score, not on the new maximum"] = edit(official('3.1'),
    ('    shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)',
     '    shift = torch.where(torch.isneginf(x), torch.zeros_like(m_new), m_new)'))
# the first term measured from 0 while m says it is x0: exact when x0 is near 0, and a hidden
# case starts at 40
WRONG["3.1"]["shift by 0 while the old max is -inf (first term unshifted)"] = edit(official('3.1'),
    ('    shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)',
     '    shift = torch.where(torch.isneginf(m), torch.zeros_like(m_new), m_new)'))


# Round eight: wrong answers caught on every draw of tests.wrong_answers.catch_rate
# the old maximum returned: the next step rescales from -inf again
WRONG["3.1"]["the old max returned (m never moves)"] = edit(official("3.1"),
    ("    return m_new, r * den + w, r * num + w * v", "    return m, r * den + w, r * num + w * v"))
WRONG["3.1"]["the old sums divided by the factor"] = edit(official("3.1"),
    ("    return m_new, r * den + w, r * num + w * v", "    return m_new, den / r + w, num / r + w * v"))
# assumes a holds the larger maximum
WRONG["3.2"]["the first state's max kept as the merged max"] = edit(official("3.2"),
    ("    m = torch.maximum(ma, mb)", "    m = ma"))
# the safe shift returned as the max: 0 for rows with no key, not -inf
WRONG["3.2"]["the safe shift returned as the merged max"] = edit(official("3.2"),
    ("    return m, ca * da + cb * db, ca[:, None] * na + cb[:, None] * nb_",
     "    return safe, ca * da + cb * db, ca[:, None] * na + cb[:, None] * nb_"))
WRONG["3.3"]["l not unsqueezed at the end"] = edit(official("3.3"),
    ("    return total.acc / total.l[:, None]", "    return total.acc / total.l"))
WRONG["3.3"]["tiles sliced lo:lo + B - 1 (one key per tile dropped)"] = edit(official("3.3"),
    ("    states = [state_from_scores(x[:, lo:lo + B], vals[lo:lo + B])",
     "    states = [state_from_scores(x[:, lo:lo + B - 1], vals[lo:lo + B - 1])"))
WRONG["3.3"]["the last tile merged twice"] = edit(official("3.3"),
    ("    for st in reversed(states[:-1]):", "    for st in reversed(states):"))
WRONG["3.4"]["np.ceil for the tile counts (numpy floats)"] = '''# Exercise 3.4
import numpy as np
def hbm_traffic(N, d, Br, Bc):
    tr, tc = np.ceil(N / Br), np.ceil(N / Bc)
    return 2 * tr * N * d, 2 * N * d, tc * N * d + (tc + 1) * N * d
'''
WRONG["3.4"]["the head dimension forgotten"] = '''# Exercise 3.4
def hbm_traffic(N, d, Br, Bc):
    tr, tc = -(-N // Br), -(-N // Bc)
    return 2 * tr * N, 2 * N, tc * N + (tc + 1) * N
'''
WRONG["3.5"]["K and V read once (FA1's count)"] = edit(official("3.5"),
    ("    moved = N * d + 2 * tr * N * d + N * d", "    moved = N * d + 2 * N * d + N * d"))
WRONG["3.5"]["2 N^2 d FLOPs"] = edit(official("3.5"),
    ("    return 4 * N * N * d / (nbytes * moved)", "    return 2 * N * N * d / (nbytes * moved)"))
WRONG["3.5"]["floor division"] = edit(official("3.5"),
    ("    return 4 * N * N * d / (nbytes * moved)", "    return 4 * N * N * d // (nbytes * moved)"))
WRONG["3.6"]["the orders in upper case"] = '''# Exercise 3.6
orders = {"o_written_once": "FA2", "kv_loaded_once": "FA1", "lm_in_hbm": "FA1",
          "intensity_grows_with_Br": "FA2", "more_bytes_for_long_rows": "FA1"}
'''
WRONG["3.6"]["kv_loaded_once answered fa2"] = edit(official("3.6"),
    ('"kv_loaded_once": "fa1"', '"kv_loaded_once": "fa2"'))
