"""Wrong answers to problem set 8 (Hopper schedules, FP8, profiles), as learners write them."""

from tests.wrong_answers import edit, official

WRONG = {
    "8.1": {
        "releases before the op that reads the slot": '''# Exercise 8.1
import copy
def add_releases(schedule):
    fixed = copy.deepcopy(schedule)
    for wg in fixed.warpgroups:
        if wg.role != "consumer":
            continue
        program = []
        for ins in wg.program:
            if isinstance(ins, sim.Op):
                for buf in ins.reads:
                    program.append(sim.Arrive(f"{buf[0].lower()}_empty[{buf[2:-1]}]"))
            program.append(ins)
        wg.program = program
    return fixed''',
        "all releases at the end of the program": '''# Exercise 8.1
import copy
def add_releases(schedule):
    fixed = copy.deepcopy(schedule)
    for wg in fixed.warpgroups:
        if wg.role != "consumer":
            continue
        tail = []
        for ins in wg.program:
            if isinstance(ins, sim.Op):
                for buf in ins.reads:
                    tail.append(sim.Arrive(f"{buf[0].lower()}_empty[{buf[2:-1]}]"))
        wg.program = list(wg.program) + tail
    return fixed''',
        "releases K only": '''# Exercise 8.1
import copy
def add_releases(schedule):
    fixed = copy.deepcopy(schedule)
    for wg in fixed.warpgroups:
        if wg.role != "consumer":
            continue
        program = []
        for ins in wg.program:
            program.append(ins)
            if isinstance(ins, sim.Op):
                for buf in ins.reads:
                    if buf.startswith("K"):
                        program.append(sim.Arrive(f"k_empty[{buf[2:-1]}]"))
        wg.program = program
    return fixed''',
        "edits the given schedule in place": '''# Exercise 8.1
def add_releases(schedule):
    for wg in schedule.warpgroups:
        if wg.role != "consumer":
            continue
        program = []
        for ins in wg.program:
            program.append(ins)
            if isinstance(ins, sim.Op):
                for buf in ins.reads:
                    program.append(sim.Arrive(f"{buf[0].lower()}_empty[{buf[2:-1]}]"))
        wg.program = program
    return schedule''',
        "K released after P V (both slots released after the V op)": '''# Exercise 8.1
def add_releases(schedule):
    fixed = copy.deepcopy(schedule)
    for wg in fixed.warpgroups:
        if wg.role != "consumer":
            continue
        program, pending = [], []
        for ins in wg.program:
            program.append(ins)
            if isinstance(ins, sim.Op):
                for buf in ins.reads:
                    kind, slot = buf[0].lower(), buf[2:-1]
                    pending.append(sim.Arrive(f"{kind}_empty[{slot}]"))
                if any(b.startswith("V") for b in ins.reads):
                    program.extend(pending)
                    pending = []
        program.extend(pending)
        wg.program = program
    return fixed''',
        "every release one instruction late (after the next op)": '''# Exercise 8.1
def add_releases(schedule):
    fixed = copy.deepcopy(schedule)
    for wg in fixed.warpgroups:
        if wg.role != "consumer":
            continue
        program, pending = [], []
        for ins in wg.program:
            program.append(ins)
            if isinstance(ins, (sim.Op, sim.Wait)) and pending:
                program.extend(pending); pending = []
            if isinstance(ins, sim.Op):
                for buf in ins.reads:
                    kind, slot = buf[0].lower(), buf[2:-1]
                    pending.append(sim.Arrive(f"{kind}_empty[{slot}]"))
        program.extend(pending)
        wg.program = program
    return fixed''',
        "rebuilds the intended schedule with build_schedule": '''# Exercise 8.1
def add_releases(schedule):
    blocks = sum(1 for i in schedule.warpgroups[1].program
                 if isinstance(i, sim.Op) and i.label.startswith("S"))
    return sim.build_schedule(schedule.name, n_blocks=blocks)''',
    },
    "8.2": {
        "ignores the register budget (a schedule that does not fit)": '''# Exercise 8.2
def choose(D, Bc):
    best, best_t = None, -1.0
    for name in sim.SCHEDULE_NAMES:
        t = sim.simulate(sim.build_schedule(name, D=D, Bc=Bc, n_blocks=8), check_registers=False).tflops
        if t > best_t:
            best, best_t = name, t
    return best''',
        "always FlashAttention-3's schedule": '''# Exercise 8.2
def choose(D, Bc):
    return "fa3"''',
        "the slowest schedule that fits": '''# Exercise 8.2
def choose(D, Bc):
    worst, worst_t = None, float("inf")
    for name in sim.SCHEDULE_NAMES:
        try:
            t = sim.simulate(sim.build_schedule(name, D=D, Bc=Bc, n_blocks=8)).tflops
        except sim.RegisterBudgetError:
            continue
        if t < worst_t:
            worst, worst_t = name, t
    return worst''',
        "the checks' own answer": '''# Exercise 8.2
from course_utils.hopper import checks as _c
def choose(D, Bc):
    return _c.best_feasible_schedule(D, Bc)''',
    },
    "8.3": {
        "max instead of max |x| (a negative outlier)": '''# Exercise 8.3
def quantize_block(x):
    scale = x.max() / fp8.FP8_MAX
    return (x / scale).to(fp8.FP8_DTYPE), scale''',
        "the scale inverted": '''# Exercise 8.3
def quantize_block(x):
    scale = fp8.FP8_MAX / x.abs().max()
    return (x * scale).to(fp8.FP8_DTYPE), scale''',
        "casts without dividing by the scale": '''# Exercise 8.3
def quantize_block(x):
    scale = x.abs().max() / fp8.FP8_MAX
    return x.to(fp8.FP8_DTYPE), scale''',
        "the course's block quantiser": '''# Exercise 8.3
def quantize_block(x):
    x8, s = fp8.quantize_fp8_blocks(x[None, None], x.shape[-2])
    return x8[0, 0], s.reshape(-1)[0]''',
    },
    "8.4": {
        'fp8.prepare_fp8 quantises (and rotates) the blocks instead of quantize_block': '''# Exercise 8.4
def _round_trip_scores(hadamard):
    prep = fp8.prepare_fp8(qb[None, None], kb[None, None], kb[None, None], hadamard=hadamard,
                           block_m=64, block_n=64, kernel="triton")
    q = prep["q8"].float()[0, 0] * prep["qs"][0, 0, 0]
    k = prep["k8"].float()[0, 0] * prep["ks"][0, 0, 0]
    return q @ k.T

rmse_plain = fp8.rmse(_round_trip_scores(False), S)
rmse_hadamard = fp8.rmse(_round_trip_scores(True), S)
ratio_8_4 = rmse_plain / rmse_hadamard
print(f"score RMSE: plain {rmse_plain:.3f}, Hadamard {rmse_hadamard:.3f}, ratio {ratio_8_4:.2f}")
''',
        "rotates Q only": '''# Exercise 8.4
def dq(x):
    x8, s = quantize_block(x)
    return x8.float() * s

rmse_plain = fp8.rmse(dq(qb) @ dq(kb).T, S)
rmse_hadamard = fp8.rmse(dq(qb @ h) @ dq(kb).T, S)
ratio_8_4 = rmse_plain / rmse_hadamard''',
        "error of the blocks, not of the scores": '''# Exercise 8.4
def dq(x):
    x8, s = quantize_block(x)
    return x8.float() * s

rmse_plain = fp8.rmse(dq(qb), qb)
rmse_hadamard = fp8.rmse(dq(qb @ h), qb @ h)
ratio_8_4 = rmse_plain / rmse_hadamard''',
        "ratio inverted": '''# Exercise 8.4
def dq(x):
    x8, s = quantize_block(x)
    return x8.float() * s

rmse_plain = fp8.rmse(dq(qb) @ dq(kb).T, S)
rmse_hadamard = fp8.rmse(dq(qb @ h) @ dq(kb @ h).T, S)
ratio_8_4 = rmse_hadamard / rmse_plain''',
    },
    "8.5": {
        "'selected' taken for a stall, memory-bound": '''# Exercise 8.5
_mine = profile["_attn_fwd_kernel"]
top_stall_8_5 = "selected"
bottleneck_8_5 = "memory"
fix_8_5 = "bigger_tiles"
predicted_ms_8_5 = _mine["ms"] / 2''',
        "tensor-bound, prediction from the ratio of times": '''# Exercise 8.5
_mine = profile["_attn_fwd_kernel"]
top_stall_8_5 = "barrier"
bottleneck_8_5 = "tensor"
fix_8_5 = "pingpong"
predicted_ms_8_5 = profile["_attn_fwd_gluon_pp"]["ms"]''',
        "prediction with the utilisations upside down": '''# Exercise 8.5
_mine = profile["_attn_fwd_kernel"]
top_stall_8_5 = "barrier"
bottleneck_8_5 = "sync"
fix_8_5 = "pingpong"
predicted_ms_8_5 = _mine["ms"] * profile["_attn_fwd_gluon_pp"]["tensor_pct"] / _mine["tensor_pct"] / 2''',
        "right diagnosis, wrong fix": '''# Exercise 8.5
_mine = profile["_attn_fwd_kernel"]
top_stall_8_5 = "barrier"
bottleneck_8_5 = "sync"
fix_8_5 = "fp32_accumulate"
predicted_ms_8_5 = _mine["ms"] * _mine["tensor_pct"] / profile["_attn_fwd_gluon_pp"]["tensor_pct"]''',
    },
    "8.6": {
        "one barrier completion per block of the ring (j + 1)": '''# Exercise 8.6
def full_count(j, stages):
    return j + 1


def empty_count(j, stages, consumers):
    return consumers * (j // stages)


def phase_parity(j, stages):
    return (j // stages) % 2''',
        "full count off by one: reads before the copy lands": '''# Exercise 8.6
def full_count(j, stages):
    return j // stages


def empty_count(j, stages, consumers):
    return consumers * (j // stages)


def phase_parity(j, stages):
    return (j // stages) % 2''',
        "empty count without the consumers": '''# Exercise 8.6
def full_count(j, stages):
    return j // stages + 1


def empty_count(j, stages, consumers):
    return j // stages


def phase_parity(j, stages):
    return (j // stages) % 2''',
        "parity flips every block": '''# Exercise 8.6
def full_count(j, stages):
    return j // stages + 1


def empty_count(j, stages, consumers):
    return consumers * (j // stages)


def phase_parity(j, stages):
    return j % 2''',
    },
}

# a fixed preference list from the lesson's ranking: right wherever FlashAttention-3 or
# ping-pong is the fastest schedule that fits, wrong at (64, 192), where neither is
WRONG["8.2"]["the lesson's ranking: FlashAttention-3 if it fits, else ping-pong, ..."] = \
    '''# Exercise 8.2
def choose(D, Bc):
    for name in ("fa3", "pingpong", "intra_pipeline", "warp_specialized", "no_ws_pipelined", "fa2_serial"):
        try:
            sim.simulate(sim.build_schedule(name, D=D, Bc=Bc, n_blocks=8))
        except sim.RegisterBudgetError:
            continue
        return name'''
WRONG["8.3"]["one scale per row"] = '''# Exercise 8.3
def quantize_block(x):
    scale = x.abs().amax(dim=1, keepdim=True) / fp8.FP8_MAX
    return (x / scale).to(fp8.FP8_DTYPE), scale'''
WRONG["8.5"]["predicted time: the ping-pong kernel's measured time"] = '''# Exercise 8.5
_mine = profile["_attn_fwd_kernel"]
top_stall_8_5 = max((r for r in _mine["stalls"] if r != "selected"), key=_mine["stalls"].get)
bottleneck_8_5 = "sync"
fix_8_5 = "pingpong"
predicted_ms_8_5 = profile["_attn_fwd_gluon_pp"]["ms"]'''
WRONG["8.6"]["parity of the phase after the wait"] = '''# Exercise 8.6
def full_count(j, stages):
    return j // stages + 1


def empty_count(j, stages, consumers):
    return consumers * (j // stages)


def phase_parity(j, stages):
    return (j // stages + 1) % 2'''
# right while every slot number is one digit: a hidden case has eleven stages (K[10])
WRONG["8.1"]["slot number from the character before the bracket"] = '''# Exercise 8.1
def add_releases(schedule):
    fixed = copy.deepcopy(schedule)
    for wg in fixed.warpgroups:
        if wg.role != "consumer":
            continue
        program = []
        for ins in wg.program:
            program.append(ins)
            if isinstance(ins, sim.Op):
                for buf in ins.reads:
                    program.append(sim.Arrive(f"{buf[0].lower()}_empty[{buf[-2]}]"))
        wg.program = program
    return fixed'''
WRONG["8.3"]["a power-of-two scale"] = '''# Exercise 8.3
def quantize_block(x):
    scale = float(2.0 ** torch.ceil(torch.log2(x.abs().max() / fp8.FP8_MAX)))
    return (x / scale).to(fp8.FP8_DTYPE), scale'''
WRONG["8.4"]["one scale for Q and K together"] = '''# Exercise 8.4
def dq_pair(a, b):
    x8, s = quantize_block(torch.cat([a, b]))
    return (x8.float() * s).split(a.shape[0])

qd, kd = dq_pair(qb, kb)
rmse_plain = fp8.rmse(qd @ kd.T, S)
qd, kd = dq_pair(qb @ h, kb @ h)
rmse_hadamard = fp8.rmse(qd @ kd.T, S)
ratio_8_4 = rmse_plain / rmse_hadamard'''
WRONG["8.6"]["empty count: every consumer of the earlier rounds, one of the last"] = '''# Exercise 8.6
def full_count(j, stages):
    return j // stages + 1


def empty_count(j, stages, consumers):
    return consumers * (j // stages - 1) + 1


def phase_parity(j, stages):
    return (j // stages) % 2'''


# Round six: wrong answers caught on every draw of tests.wrong_answers.catch_rate
WRONG['8.1']["every release on k_empty (V's slots never released)"] = edit(official('8.1'),
    ('                    program.append(sim.Arrive(f"{kind}_empty[{slot}]"))',
     '                    program.append(sim.Arrive(f"k_empty[{slot}]"))'))
# a shallow copy shares the warpgroups, so assigning their programs changes the given schedule
WRONG['8.1']['copy.copy: the warpgroups shared with the given schedule'] = edit(official('8.1'),
    ('    fixed = copy.deepcopy(schedule)',
     '    fixed = copy.copy(schedule)'))
# a slot read again for a later block of the ring is never released again: the producer deadlocks
WRONG['8.1']['releases only after the first op reading each slot'] = edit(official('8.1'),
    ('        program = []',
     '        program, done = [], set()'), 
    ('                for buf in ins.reads:',
     '                for buf in [b for b in ins.reads if b not in done]:\n                    done.add(buf)'))
WRONG['8.2']["the first schedule that fits, in the simulator's order"] = '''# Exercise 8.2
def choose(D, Bc):
    for name in sim.SCHEDULE_NAMES:
        try:
            sim.simulate(sim.build_schedule(name, D=D, Bc=Bc, n_blocks=8))
        except sim.RegisterBudgetError:
            continue
        return name'''
# e4m3 keeps fractions below 16: rounding to integers zeroes the small entries
WRONG['8.3']['rounded to integers before the cast'] = edit(official('8.3'),
    ('    return (x / scale).to(fp8.FP8_DTYPE), scale',
     '    return (x / scale).round().to(fp8.FP8_DTYPE), scale'))
# the scale itself is checked to 1e-5
WRONG['8.3']['the scale rounded to float16'] = edit(official('8.3'),
    ('    scale = x.abs().max() / fp8.FP8_MAX',
     '    scale = (x.abs().max() / fp8.FP8_MAX).half()'))
WRONG['8.3']["e5m2's largest value (57344) in the scale"] = edit(official('8.3'),
    ('    scale = x.abs().max() / fp8.FP8_MAX',
     '    scale = x.abs().max() / 57344.0'))
WRONG['8.3']["the mean |x| as the block's size"] = edit(official('8.3'),
    ('    scale = x.abs().max() / fp8.FP8_MAX',
     '    scale = x.abs().mean() / fp8.FP8_MAX'))
WRONG['8.4']['scores Q K, the transpose forgotten'] = '''# Exercise 8.4
def dq(x):
    x8, s = quantize_block(x)
    return x8.float() * s

rmse_plain = fp8.rmse(dq(qb) @ dq(kb), S)
rmse_hadamard = fp8.rmse(dq(qb @ h) @ dq(kb @ h), S)
ratio_8_4 = rmse_plain / rmse_hadamard'''
WRONG['8.4']['the dequantisation divides by the scale'] = '''# Exercise 8.4
def dq(x):
    x8, s = quantize_block(x)
    return x8.float() / s

rmse_plain = fp8.rmse(dq(qb) @ dq(kb).T, S)
rmse_hadamard = fp8.rmse(dq(qb @ h) @ dq(kb @ h).T, S)
ratio_8_4 = rmse_plain / rmse_hadamard'''
# (Q h)(K h)^T is already Q K^T; a further h^T rotates the scores
WRONG['8.4']['the rotation undone on one side only ((Q h) (K h)^T h^T)'] = '''# Exercise 8.4
def dq(x):
    x8, s = quantize_block(x)
    return x8.float() * s

rmse_plain = fp8.rmse(dq(qb) @ dq(kb).T, S)
rmse_hadamard = fp8.rmse(dq(qb @ h) @ dq(kb @ h).T @ h.T, S)
ratio_8_4 = rmse_plain / rmse_hadamard'''
# counts every earlier block, not only those that went through this slot
WRONG['8.6']['empty count: one arrival per earlier block of the ring'] = edit(official('8.6'),
    ('    return consumers * (j // stages)',
     '    return consumers * (j - stages + 1)'))


# Round seven: wrong answers caught on every draw of tests.wrong_answers.catch_rate
# every consumer reads every slot: the producer waits for all of them
WRONG['8.1']['only the first consumer releases'] = edit(official('8.1'),
    ('        if wg.role != "consumer":', '        if wg.name != "consumer0":'))
# the release is an arrival on the slot's EMPTY barrier; the full one is the producer's
WRONG['8.1']['arrives on the full barrier'] = edit(official('8.1'),
    ('                    program.append(sim.Arrive(f"{kind}_empty[{slot}]"))',
     '                    program.append(sim.Arrive(f"{kind}_full[{slot}]"))'))
# slot = block index mod 2: right only for a two-stage ring
WRONG['8.1']['the slot from a block counter mod 2'] = '''# Exercise 8.1
def add_releases(schedule):
    fixed = copy.deepcopy(schedule)
    for wg in fixed.warpgroups:
        if wg.role != "consumer":
            continue
        program, seen = [], {"K": 0, "V": 0}
        for ins in wg.program:
            program.append(ins)
            if isinstance(ins, sim.Op):
                for buf in ins.reads:
                    kind = buf[0]
                    program.append(sim.Arrive(f"{kind.lower()}_empty[{seen[kind] % 2}]"))
                    seen[kind] += 1
        wg.program = program
    return fixed'''
# building never checks the registers: the error comes from simulate, outside the try
WRONG['8.2']['RegisterBudgetError caught around build_schedule only'] = '''# Exercise 8.2
def choose(D, Bc):
    best, best_t = None, -1.0
    for name in sim.SCHEDULE_NAMES:
        try:
            s = sim.build_schedule(name, D=D, Bc=Bc, n_blocks=8)
        except sim.RegisterBudgetError:
            continue
        t = sim.simulate(s).tflops
        if t > best_t:
            best, best_t = name, t
    return best'''
WRONG['8.2']['D and Bc swapped'] = edit(official('8.2'),
    ('sim.build_schedule(name, D=D, Bc=Bc, n_blocks=8)', 'sim.build_schedule(name, D=Bc, Bc=D, n_blocks=8)'))
# one key block leaves no steady state to pipeline: the ranking changes
WRONG['8.2']['a single block simulated (n_blocks=1)'] = edit(official('8.2'),
    ('sim.build_schedule(name, D=D, Bc=Bc, n_blocks=8)', 'sim.build_schedule(name, D=D, Bc=Bc, n_blocks=1)'))
# e5m2's largest finite value is 57344, not 448: the wrong FP8 format
WRONG['8.3']['cast to float8_e5m2'] = edit(official('8.3'),
    ('    return (x / scale).to(fp8.FP8_DTYPE), scale', '    return (x / scale).to(torch.float8_e5m2), scale'))
# changes the caller's block
WRONG['8.3']['x divided in place'] = '''# Exercise 8.3
def quantize_block(x):
    scale = x.abs().max() / fp8.FP8_MAX
    x /= scale
    return x.to(fp8.FP8_DTYPE), scale'''
WRONG['8.3']['one scale per column'] = edit(official('8.3'),
    ('    scale = x.abs().max() / fp8.FP8_MAX', '    scale = x.abs().amax(dim=0, keepdim=True) / fp8.FP8_MAX'))
# K quantised before it is rotated: the rotation no longer spreads K's outlier
WRONG['8.4']['K rotated after quantising'] = '''# Exercise 8.4
def dq(x):
    x8, s = quantize_block(x)
    return x8.float() * s

rmse_plain = fp8.rmse(dq(qb) @ dq(kb).T, S)
rmse_hadamard = fp8.rmse(dq(qb @ h) @ (dq(kb) @ h).T, S)
ratio_8_4 = rmse_plain / rmse_hadamard'''
WRONG['8.4']['the mean squared error (no square root)'] = '''# Exercise 8.4
def dq(x):
    x8, s = quantize_block(x)
    return x8.float() * s

rmse_plain = float(((dq(qb) @ dq(kb).T - S) ** 2).mean())
rmse_hadamard = float(((dq(qb @ h) @ dq(kb @ h).T - S) ** 2).mean())
ratio_8_4 = rmse_plain / rmse_hadamard'''
# h @ Q mixes the tokens, not the channels: (h Q)(h K)^T = h S h^T
WRONG['8.4']['the rotation on the left (h @ qb)'] = '''# Exercise 8.4
def dq(x):
    x8, s = quantize_block(x)
    return x8.float() * s

rmse_plain = fp8.rmse(dq(qb) @ dq(kb).T, S)
rmse_hadamard = fp8.rmse(dq(h @ qb) @ dq(h @ kb).T, S)
ratio_8_4 = rmse_plain / rmse_hadamard'''
WRONG['8.4']['the ratio as a percentage'] = edit(official('8.4'),
    ('ratio_8_4 = rmse_plain / rmse_hadamard', 'ratio_8_4 = 100 * rmse_plain / rmse_hadamard'))
WRONG['8.5']['predicted time in seconds'] = edit(official('8.5'),
    ('predicted_ms_8_5 = _mine["ms"] * _mine["tensor_pct"] / profile["_attn_fwd_gluon_pp"]["tensor_pct"]',
     'predicted_ms_8_5 = _mine["ms"] / 1000 * _mine["tensor_pct"] / profile["_attn_fwd_gluon_pp"]["tensor_pct"]'))
# the time does not fall by the difference in percentage points
WRONG['8.5']['time cut by the difference in utilisation points'] = edit(official('8.5'),
    ('predicted_ms_8_5 = _mine["ms"] * _mine["tensor_pct"] / profile["_attn_fwd_gluon_pp"]["tensor_pct"]',
     'predicted_ms_8_5 = _mine["ms"] * (1 - (profile["_attn_fwd_gluon_pp"]["tensor_pct"] - _mine["tensor_pct"]) / 100)'))
WRONG['8.5']['sync-bound, fixed with more heads'] = edit(official('8.5'),
    ('fix_8_5 = "pingpong"', 'fix_8_5 = "more_heads"'))
# precedence: (consumers * j) // stages, not consumers * (j // stages)
WRONG['8.6']['empty count: consumers * j // stages'] = edit(official('8.6'),
    ('    return consumers * (j // stages)', '    return consumers * j // stages'))
# the lesson's two-stage ring typed in
WRONG['8.6']['two stages hard-coded'] = '''# Exercise 8.6
def full_count(j, stages):
    return j // 2 + 1


def empty_count(j, stages, consumers):
    return consumers * (j // 2)


def phase_parity(j, stages):
    return (j // 2) % 2'''
# the slot number's parity, not the slot's phase
WRONG['8.6']['parity of the slot'] = edit(official('8.6'),
    ('    return (j // stages) % 2', '    return (j % stages) % 2'))


# Round eight: wrong answers caught on every draw of tests.wrong_answers.catch_rate
# x8 right, but the scale returned is the block's max: x8.float() * scale is 448 times too large
WRONG["8.3"]["the block's max returned as the scale"] = '''# Exercise 8.3
def quantize_block(x):
    amax = x.abs().max()
    return (x / amax * fp8.FP8_MAX).to(fp8.FP8_DTYPE), amax
'''
WRONG["8.3"]["x multiplied by the scale"] = edit(official("8.3"),
    ("    return (x / scale).to(fp8.FP8_DTYPE), scale", "    return (x * scale).to(fp8.FP8_DTYPE), scale"))
WRONG["8.5"]["the second largest stall"] = edit(official("8.5"),
    ('top_stall_8_5 = max((r for r in _mine["stalls"] if r != "selected"), key=_mine["stalls"].get)',
     'top_stall_8_5 = sorted((r for r in _mine["stalls"] if r != "selected"), key=_mine["stalls"].get)[-2]'))
WRONG["8.6"]["empty count: the current block's release counted too"] = edit(official("8.6"),
    ("    return consumers * (j // stages)", "    return consumers * (j // stages + 1)"))
WRONG["8.6"]["full count (j + 1) // stages"] = edit(official("8.6"),
    ("    return j // stages + 1", "    return (j + 1) // stages"))
# the SM throughput (the profile's first line) read for the tensor-core figure: 0.24 % off the
# answer, inside a 1 % tolerance, outside the check's 0.1 %
WRONG["8.5"]["prediction from the SM throughputs typed in"] = edit(official("8.5"),
    ('predicted_ms_8_5 = _mine["ms"] * _mine["tensor_pct"] / profile["_attn_fwd_gluon_pp"]["tensor_pct"]',
     'predicted_ms_8_5 = _mine["ms"] * 51.858464 / 69.149701'))
