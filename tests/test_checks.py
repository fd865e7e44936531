"""Every check must be able to fail, with a message that helps."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from course_utils.checks import (CheckFailed, check_close, check_dtype, check_equal,
                                 check_raises, check_shape, check_true)


def test_close_passes_and_prints(capsys):
    check_close(torch.tensor([1.0, 2.0]), [1.0, 2.0 + 1e-7], name="row")
    assert "ok: row" in capsys.readouterr().out


def test_close_names_first_differing_element_and_hint():
    exp = torch.zeros(3, 4)
    got = exp.clone()
    got[1, 2] = 0.5
    got[2, 0] = 0.25
    with pytest.raises(CheckFailed) as e:
        check_close(got, exp, name="o", hint="did you rescale l?")
    msg = str(e.value)
    assert "element [1, 2]" in msg and "expected 0" in msg and "got 0.5" in msg
    assert "2 of 12 elements differ" in msg and "did you rescale l?" in msg
    assert "tolerance" in msg


def test_close_tolerance_is_respected():
    check_close([1.0], [1.001], atol=0, rtol=1e-2, quiet=True)
    with pytest.raises(CheckFailed):
        check_close([1.0], [1.001], atol=0, rtol=1e-4, quiet=True)


def test_close_shape_mismatch():
    with pytest.raises(CheckFailed, match=r"shape is \(2,\), expected \(3,\)"):
        check_close([1.0, 2.0], [1.0, 2.0, 3.0], quiet=True)


def test_close_nan_and_inf():
    check_close([math.nan, math.inf], [math.nan, math.inf], quiet=True)
    with pytest.raises(CheckFailed, match="got nan"):
        check_close([math.nan], [1.0], quiet=True)
    with pytest.raises(CheckFailed, match="got inf"):
        check_close([math.inf], [1.0], quiet=True)
    with pytest.raises(CheckFailed):
        check_close([-math.inf], [math.inf], quiet=True)
    with pytest.raises(CheckFailed, match="expected nan"):
        check_close([1.0], [math.nan], quiet=True)


def test_close_accepts_numpy_and_rejects_junk():
    check_close(np.ones(3), torch.ones(3), quiet=True)
    with pytest.raises(TypeError, match="expected a tensor"):
        check_close("1.0", [1.0], quiet=True)


@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=20), st.integers(0, 19),
       st.floats(1e-2, 1e2))
def test_close_catches_any_single_perturbation(xs, pos, delta):
    exp = torch.tensor(xs, dtype=torch.float64)
    got = exp.clone()
    i = pos % len(xs)
    got[i] += delta + 1e-5 * abs(float(exp[i]))
    with pytest.raises(CheckFailed, match=rf"element \[{i}\]"):
        check_close(got, exp, quiet=True)


def test_shape_and_dtype():
    check_shape(torch.zeros(2, 3), (2, 3), quiet=True)
    with pytest.raises(CheckFailed, match=r"shape is \(3, 2\), expected \(2, 3\)"):
        check_shape(torch.zeros(3, 2), (2, 3), hint="transposed?", quiet=True)
    check_dtype(torch.zeros(1, dtype=torch.float16), torch.float16, quiet=True)
    with pytest.raises(CheckFailed, match="dtype is torch.float32, expected torch.float16"):
        check_dtype(torch.zeros(1), torch.float16, quiet=True)
    with pytest.raises(CheckFailed, match="expected a torch.Tensor"):
        check_dtype([1.0], torch.float32, quiet=True)


def test_equal():
    check_equal(7, 7, quiet=True)
    with pytest.raises(CheckFailed, match="is 8, expected 7"):
        check_equal(8, 7, name="cycles", quiet=True)
    with pytest.raises(CheckFailed, match="item 1 is 'x', expected 'y'"):
        check_equal(["a", "x"], ["a", "y"], quiet=True)
    with pytest.raises(CheckFailed, match="has 1 items, expected 2"):
        check_equal(["a"], ["a", "b"], quiet=True)
    with pytest.raises(CheckFailed, match=r"\['loads'\] is 14, expected 13"):
        check_equal({"loads": 14}, {"loads": 13}, quiet=True)
    with pytest.raises(CheckFailed, match="missing key 'stores'"):
        check_equal({}, {"stores": 1}, quiet=True)
    with pytest.raises(CheckFailed, match="unexpected keys"):
        check_equal({"a": 1, "b": 2}, {"a": 1}, quiet=True)
    with pytest.raises(TypeError):
        check_equal(torch.ones(1), torch.ones(1))


def test_true_and_raises():
    check_true(True, "never shown", quiet=True)
    with pytest.raises(CheckFailed, match="m must never decrease"):
        check_true(False, "m must never decrease", quiet=True)
    with pytest.raises(TypeError):
        check_true("yes", "strings are not conditions")

    def bad():
        raise ValueError("Hq must be a multiple of Hkv")

    check_raises(bad, ValueError, match="multiple", quiet=True)
    with pytest.raises(CheckFailed, match="returned normally"):
        check_raises(lambda: None, ValueError, quiet=True)
    with pytest.raises(CheckFailed, match="raised ValueError.*expected TypeError"):
        check_raises(bad, TypeError, quiet=True)
    with pytest.raises(CheckFailed, match="does not mention"):
        check_raises(bad, ValueError, match="head dim", quiet=True)


# --------------------------------------------------------------------------- precision policy
from course_utils.checks import compute_precision, tolerance  # noqa: E402


def tf32(x):
    """Round float32 to TF32 (10 explicit mantissa bits, round to nearest), as a GPU's
    tensor cores do with the operands of a float32 tl.dot."""
    bits = x.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def tf32_attention(q, k, v, causal=False):
    """Attention with both products on TF32 operands and float32 accumulators."""
    s = tf32(q) @ tf32(k).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(s, -1)
    return tf32(p) @ tf32(v)


def reference_attention(q, k, v, causal=False, drop_last_key=False, extra_key=False):
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    n = s.shape[-1]
    if causal:
        # extra_key: the off-by-one mask j <= i + 1
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(2 if extra_key else 1),
                          float("-inf"))
    if drop_last_key:                      # the loop bound range(0, N - 1)
        s[..., -1] = float("-inf")
    return (torch.softmax(s, -1) @ v.double()).float()


def no_rescale_attention(q, k, v, block=16):
    """The online softmax without exp(m_old - m_new): the learner's classic mistake."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    l = torch.zeros(s.shape[:-1])
    acc = torch.zeros(*s.shape[:-1], v.shape[-1])
    for j in range(0, s.shape[-1], block):
        t = s[..., j:j + block]
        p = torch.exp(t - t.amax(-1, keepdim=True))
        l = l + p.sum(-1)
        acc = acc + p @ v[..., j:j + block, :]
    return acc / l[..., None]


def _qkv(n=64, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, n, d, generator=g) for _ in range(3)]


def test_policy_float32_dot_is_tf32_on_gpu_only():
    assert compute_precision(torch.float32, device="cuda") == "tf32"
    assert compute_precision(torch.float32, device="cuda", input_precision="ieee") == "float32"
    assert compute_precision(torch.float32, device="cpu") == "float32"
    assert compute_precision(torch.float32, device="cuda", op="elementwise") == "float32"
    assert compute_precision(torch.float16, device="cuda") == "float16"
    gpu, cpu = tolerance(torch.float32, device="cuda"), tolerance(torch.float32, device="cpu")
    assert gpu[0] > 100 * cpu[0]
    assert tolerance(torch.float32, device="cuda", input_precision="ieee") == cpu
    # a dot product of length k: atol grows as sqrt(k), rtol does not
    a16, r16 = tolerance(torch.float32, device="cuda", op="dot", k=16)
    a64, r64 = tolerance(torch.float32, device="cuda", op="dot", k=64)
    assert a64 == pytest.approx(2 * a16) and r64 == r16


def test_tolerance_rejects_bad_arguments():
    with pytest.raises(TypeError, match="dtype"):
        tolerance(torch.int32)
    with pytest.raises(ValueError, match="op must be one of"):
        tolerance(torch.float32, op="matmul")
    with pytest.raises(ValueError, match="needs k"):
        tolerance(torch.float32, op="dot")
    with pytest.raises(ValueError, match="op='dot' only"):
        tolerance(torch.float32, op="attention", k=4)
    with pytest.raises(ValueError, match="input_precision"):
        tolerance(torch.float32, input_precision="fast")
    with pytest.raises(TypeError, match="device"):
        tolerance(torch.float32, device=3)


@pytest.mark.parametrize("causal", [False, True])
def test_tf32_attention_passes_the_gpu_tolerance(causal):
    q, k, v = _qkv()
    check_close(tf32_attention(q, k, v, causal), reference_attention(q, k, v, causal),
                dtype=torch.float32, device="cuda", quiet=True)
    # ... and is far outside the CPU (float32) tolerance: the policy is what lets it pass
    with pytest.raises(CheckFailed):
        check_close(tf32_attention(q, k, v, causal), reference_attention(q, k, v, causal),
                    dtype=torch.float32, device="cpu", quiet=True)


@pytest.mark.parametrize("wrong", ["no_rescale", "extra_key", "drop_last_key"])
@pytest.mark.parametrize("n", [64, 256])
def test_wrong_attention_fails_the_gpu_tolerance(wrong, n):
    q, k, v = _qkv(n=n, seed=n)
    if wrong == "no_rescale":
        out = no_rescale_attention(q, k, v)
        ref = reference_attention(q, k, v)
    elif wrong == "extra_key":
        out = reference_attention(q, k, v, causal=True, extra_key=True)
        ref = reference_attention(q, k, v, causal=True)
    else:
        out = reference_attention(q, k, v, drop_last_key=True)
        ref = reference_attention(q, k, v)
    with pytest.raises(CheckFailed):
        check_close(out, ref, dtype=torch.float32, device="cuda", quiet=True)


def test_tf32_matmul_passes_and_wrong_matmuls_fail():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(50, 70, generator=g), torch.randn(70, 30, generator=g)
    ref = a.double() @ b.double()
    tol = dict(dtype=torch.float32, device="cuda", op="dot", k=70, quiet=True)
    check_close(tf32(a) @ tf32(b), ref, **tol)
    with pytest.raises(CheckFailed):
        check_close(a[:, :-1] @ b[:-1], ref, **tol)              # off by one along k
    with pytest.raises(CheckFailed):
        check_close(a[:, :64] @ b[:64], ref, **tol)              # the ragged last slice lost
    with pytest.raises(CheckFailed):
        check_close(tf32(a) @ tf32(b), ref, dtype=torch.float32, device="cpu", op="dot", k=70,
                    quiet=True)


def test_check_close_takes_the_device_from_actual_and_explicit_tolerances_win():
    x = torch.ones(4)
    check_close(x + 1e-3, x, dtype=torch.float32, device="cuda", quiet=True)
    with pytest.raises(CheckFailed):
        check_close(x + 1e-3, x, dtype=torch.float32, quiet=True)   # x is on the CPU
    with pytest.raises(CheckFailed):
        check_close(x + 1e-3, x, dtype=torch.float32, device="cuda", atol=1e-6, rtol=0,
                    quiet=True)
