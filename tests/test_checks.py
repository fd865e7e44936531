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
