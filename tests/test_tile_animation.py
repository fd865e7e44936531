"""Tests for the lesson-4 tile-schedule animation: stepping, the numbers it shows,
the widget and the filmstrip."""
import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from course_utils.widgets import show  # noqa: E402
from course_utils.widgets.tile_animation import TileAnimation  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    # tiny tensors: one intra-op thread avoids oversubscribing the CI's two cores
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("order", ["fa1", "fa2"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(16, 16, 4, 4), (13, 11, 3, 4), (5, 5, 3, 4), (1, 9, 2, 2)])
def test_final_traffic_equals_formula_and_m_l_are_exact(order, causal, shape):
    nq, nk, br, bc = shape
    a = TileAnimation(Nq=nq, Nk=nk, Br=br, Bc=bc, order=order, is_causal=causal)
    assert a.n_steps == a.Tr * a.Tc
    a.goto(a.n_steps)
    assert a.final_traffic() == a.formula_traffic()
    s = a.scores
    st = a.state()
    np.testing.assert_allclose(st["m"], s.max(axis=1))
    np.testing.assert_allclose(st["l"], np.exp(s - s.max(axis=1, keepdims=True)).sum(axis=1))


def test_stepping_changes_state_text_every_step():
    a = TileAnimation(Nq=12, Nk=12, Br=3, Bc=3, order="fa1", is_causal=True)
    texts = [a.state()["text"]]
    for _ in range(a.n_steps):
        texts.append(a.step()["text"])
    assert len(set(texts)) == len(texts)
    assert a.step()["step"] == a.n_steps   # stays at the end
    a.goto(0)
    st = a.state()
    assert st["tile"] is None and st["sram"] == {} and st["hbm_reads"] == 0
    assert st["hbm_writes"] == 12 * 8 + 2 * 12   # Algorithm 1 fills O, l, m first


def test_fa2_order_and_sram_contents():
    a = TileAnimation(Nq=8, Nk=8, Br=4, Bc=4, order="fa2")
    assert [a.step()["tile"] for _ in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    a.goto(2)
    st = a.state()
    assert st["sram"] == {"Q": 0, "K": 1, "V": 1}
    assert st["moved"]["O"] == "write (final)"
    a.set_order("fa1")
    assert [a.step()["tile"] for _ in range(4)] == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_causal_skips_upper_tiles_without_traffic():
    a = TileAnimation(Nq=8, Nk=8, Br=4, Bc=4, order="fa2", is_causal=True)
    before = a.goto(1)["hbm_reads"]
    st = a.step()
    assert st["tile"] == (0, 1) and st["skipped"] and st["sram"] == {}
    assert st["hbm_reads"] == before
    a.goto(a.n_steps)
    assert a.state()["status"][0][1] == "skipped"


def test_widget_is_stepped_and_state_element_changes():
    a = TileAnimation(Nq=16, Nk=16, Br=4, Bc=4)
    w = a.widget()
    parts = w._course_parts
    assert "course-tile-state" in parts["state"]._dom_classes
    seen = {parts["state"].value}
    for k in range(1, a.n_steps + 1):
        parts["slider"].value = k
        assert a.index == k
        seen.add(parts["state"].value)
    assert len(seen) == a.n_steps + 1
    html_before = parts["view"].value
    parts["order"].value = "fa1"
    assert a.order == "fa1" and a.index == 0 and parts["slider"].value == 0
    assert parts["view"].value != html_before
    assert parts["play"].max == a.n_steps


def test_filmstrip_and_show_static(monkeypatch):
    a = TileAnimation(Nq=16, Nk=16, Br=4, Bc=4, is_causal=True)
    a.goto(3)
    fig = a.filmstrip(frames=4, cols=2)
    assert len([ax for ax in fig.axes if ax.images]) == 4
    assert a.index == 3    # drawing does not move the animation
    monkeypatch.setenv("COURSE_STATIC_WIDGETS", "1")
    assert show(a) is None
    monkeypatch.delenv("COURSE_STATIC_WIDGETS")
    assert show(a) is not None


def test_largest_grid_and_bad_arguments():
    a = TileAnimation(Nq=64, Nk=64, Br=4, Bc=4)
    assert (a.Tr, a.Tc) == (16, 16)
    with pytest.raises(ValueError, match="at most 16"):
        TileAnimation(Nq=68, Nk=64, Br=4, Bc=4)
    with pytest.raises(ValueError, match="order"):
        TileAnimation(order="fa3")
    with pytest.raises(TypeError, match="Br"):
        TileAnimation(Br=2.5)
    with pytest.raises(ValueError, match="Nk"):
        TileAnimation(Nk=0)
    with pytest.raises(ValueError, match="index"):
        a.goto(a.n_steps + 1)
    with pytest.raises(TypeError, match="index"):
        a.goto("3")
    with pytest.raises(ValueError, match="frames"):
        a.filmstrip(frames=0)


def test_replays_the_papers_example_in_algorithm_1_order():
    """N = 5, d = 3, M = 59: Br = 3, Bc = 4 (lesson 4, Step A). Algorithm 1 runs the
    K/V tiles outside: (0, 0), (1, 0), then (0, 1), (1, 1); the last tiles are short."""
    from course_utils.attention import block_sizes_from_sram
    Br, Bc = block_sizes_from_sram(59, 3)
    anim = TileAnimation(Nq=5, Nk=5, Br=Br, Bc=Bc, order="fa1", D=3, seed=0)
    tiles = []
    for k in range(1, anim.n_steps + 1):
        anim.goto(k)
        tiles.append(anim.state()["tile"])
    assert (Br, Bc) == (3, 4) and tiles == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert anim.state()["text"].startswith("FA1 step 4/4")
    assert anim.final_traffic() == anim.formula_traffic()
    # K and V are read once each (5 x 3 numbers), Q once per K/V tile
    assert anim.final_traffic()["K reads"] == 15 and anim.final_traffic()["Q reads"] == 30
    # the running sums at the end are the softmax denominators of the scores
    s = anim.scores
    l_exact = np.exp(s - s.max(1, keepdims=True)).sum(1)
    np.testing.assert_allclose(anim.state()["l"], l_exact, rtol=1e-12)
