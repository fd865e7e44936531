"""Every measured number a lesson quotes comes from the committed measurement.

The lessons print measured figures (TFLOPS, times, bandwidths, ratios, percentages)
from the JSON under ``benchmarks/`` in code cells, so re-measuring cannot leave the
prose behind. This test scans the prose -- every markdown cell of every lesson -- for
numbers that look measured and accepts each one only if

* it is listed in ``SOURCED``: a figure from a data sheet, a paper or plain arithmetic,
  with where it comes from; or
* it is listed in ``QUOTED`` with a function that computes it from the committed data,
  and the computed value, rounded as the text rounds it, is the quoted number.

Anything else fails with the lesson, the cell and the text around the number: print it
from the data in a code cell instead.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
RESULTS = ROOT / "benchmarks"

_NUM = r"(?<![\w.\\])[+\-−]?\d+(?:\.\d+)?(?:\s*(?:–|-|\.\.)\s*[+\-−]?\d+(?:\.\d+)?)?"
_UNIT = (r"(?:\s|~|\\,|\\ )*"
         r"(TFLOPS|GFLOPS|TFLOP/s|ms|µs|μs|us|microseconds|milliseconds|GB/s|TB/s|GiB/s|"
         r"MiB|GiB|MB|GB|KiB|%|\\%|FLOP/B|FLOP/byte|"
         # a ratio (1.02x, 2.5\times); not a product of sizes (2x2, 5 \times 3, 64 x D)
         r"(?:×|x|\\times)(?![\w])(?!\s*(?:[\d({]|\\\w|[A-Za-z](?![a-z]))))")
MEASURED = re.compile(r"\$?(" + _NUM + r")" + _UNIT + r"\$?")

# (lesson number or "*" for any lesson, number and unit as written) -> where the
# figure comes from. Data-sheet figures of the H100 SXM5 may appear in any lesson.
SOURCED = {
    ("*", "989 TFLOPS"): "NVIDIA H100 SXM5 data sheet: dense fp16/bf16 tensor-core rate",
    ("*", "1979 TFLOPS"): "NVIDIA H100 SXM5 data sheet: dense FP8 tensor-core rate",
    ("*", "3.35 TB/s"): "NVIDIA H100 SXM5 data sheet: HBM3 bandwidth",
    ("*", "80 GB"): "NVIDIA H100 data sheet: memory capacity",
    ("*", "295 FLOP/B"): "arithmetic on the data sheet: 989 TFLOPS / 3.35 TB/s",
    ("*", "295 FLOP/byte"): "arithmetic on the data sheet: 989 TFLOPS / 3.35 TB/s",
    ("03", "50 MB"): "NVIDIA H100 architecture whitepaper: L2 cache of the H100 SXM5",
    ("04", "34 GB"): "arithmetic: one (B, H, N, N) fp16 score tensor at the lesson's sizes",
    # the A100 figures the FlashAttention paper (Dao et al., 2022, section 2.1) works with
    ("04", "40 GB"): "FlashAttention paper, section 2.1: A100 HBM capacity (40 GB model)",
    ("04", "1.5 TB/s"): "FlashAttention paper, section 2.1: A100 HBM bandwidth",
    ("04", "20 MB"): "FlashAttention paper, section 2.1: A100 on-chip SRAM, 192 KB on each of 108 SMs",
    ("04", "19 TB/s"): "FlashAttention paper, section 2.1: estimated A100 SRAM bandwidth",
    ("06", "96 KiB"): "arithmetic: a 128 x 128 fp16 Q tile (32 KiB) and two stages of 64 x 128 "
                      "fp16 K and V tiles (32 KiB a stage) at head dim 128",
    ("07", "128 KiB"): "arithmetic: two float32 accumulators of 128 x 128 (dK and dV of a "
                       "128-key tile at head dim 128)",
    ("07", "228 KiB"): "NVIDIA Hopper tuning guide: shared memory of an sm90 multiprocessor "
                       "(227 KiB of it for one block)",
    ("07", "64 KiB"): "arithmetic: two float32 accumulators of 64 x 128 (dK and dV of a "
                      "64-key tile at head dim 128)",
    ("07", "0.85×"): "a threshold, not a measurement: the speed the course aims at for lesson 7's "
                     "forward + backward against cuDNN (the cell beside it checks each point)",
    ("07", "2.5×"): "FLOP-count convention: the backward counted as 2.5 forwards",
    ("07", "3.5×"): "FLOP-count convention: forward + backward = 3.5 forwards",
    ("08", "3.9 TFLOPS"): "FlashAttention-3 paper: H100 special-function (exp) throughput",
    ("08", "570 TFLOPS"): "FlashAttention-3 paper, pipelining ablation",
    ("08", "582 TFLOPS"): "FlashAttention-3 paper, pipelining ablation",
    ("08", "661 TFLOPS"): "FlashAttention-3 paper, pipelining ablation",
}


def _json(name, device="nvidia-h100-80gb-hbm3"):
    return json.loads((RESULTS / device / name).read_text())


# (lesson number, number and unit as written) -> figure computed from the data. The
# text's rounding is applied to the computed value before comparing.
QUOTED: dict = {}


def measured_numbers(text):
    """[(number as written with its unit, the number part, unit)] in ``text``."""
    out = []
    for m in MEASURED.finditer(text):
        number, unit = m.group(1), m.group(2)
        if unit == "\\times" or unit == "x":
            unit = "×"
        if unit == "\\%":
            unit = "%"
        out.append((f"{number.strip()}{'' if unit in ('%', '×') else ' '}{unit}", number, unit))
    return out


def _decimals(number):
    last = re.split(r"–|-|\.\.", number.strip("+-−"))[-1]
    return len(last.split(".")[1]) if "." in last else 0


def _value(number):
    first = re.split(r"(?<=\d)\s*(?:–|-|\.\.)\s*", number)[0]
    return float(first.replace("−", "-"))


def problems_in(lesson, cells, sourced=SOURCED, quoted=QUOTED):
    """Markdown cells ``cells`` (list of (index, text)) of lesson ``lesson``: a list of
    messages, one per number that is neither sourced nor computed from the data."""
    bad = []
    for i, text in cells:
        # inline code and URLs hold identifiers, not figures
        prose = re.sub(r"`[^`]*`|https?://\S+", " ", text)
        for written, number, unit in measured_numbers(prose):
            key = (lesson, written)
            if key in sourced or ("*", written) in sourced:
                continue
            if key in quoted:
                got = quoted[key]()
                want = _value(number)
                if round(got, _decimals(number)) == want:
                    continue
                bad.append(f"lesson {lesson} cell {i}: '{written}' but the data gives {got:.4g}")
                continue
            at = prose.find(number)
            bad.append(f"lesson {lesson} cell {i}: '{written}' in "
                       f"'...{prose[max(0, at - 50):at + 30]}...' looks measured: print it "
                       "from the committed JSON in a code cell (or list its source in SOURCED)")
    return bad


def _markdown_cells(path):
    nb = json.loads(path.read_text())
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"])
            if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_quoted_measurements_come_from_the_data(path):
    bad = problems_in(path.name[:2], _markdown_cells(path))
    assert not bad, "\n".join(bad)


def test_quoted_table_matches_the_data():
    for (lesson, written), fn in QUOTED.items():
        number = measured_numbers(written)[0][1]
        assert round(fn(), _decimals(number)) == _value(number), (lesson, written)


# ------------------------------------------------------------ the scanner itself
def test_scanner_finds_the_ways_lessons_write_measurements():
    found = [w for w, *_ in measured_numbers(
        "runs at 513 TFLOPS, 2.17 ms, 3.02 TB/s, 12.75 MiB; 1.02× the copy and $2.5\\times$; "
        "+35–42 % and 54%; 0.3\\,µs; 8 warps, 128 rows, 2 stages, step 3, H100, sm90")]
    assert found == ["513 TFLOPS", "2.17 ms", "3.02 TB/s", "12.75 MiB", "1.02×", "2.5×",
                     "+35–42%", "54%", "0.3 µs"]


def test_a_number_typed_into_the_prose_fails():
    cells = [(3, "Our kernel reaches 513 TFLOPS, 1.02× of the copy.")]
    bad = problems_in("08", cells, sourced={}, quoted={})
    assert len(bad) == 2 and "cell 3" in bad[0] and "513 TFLOPS" in bad[0]
    # in backticks it is code, not a claim
    assert problems_in("08", [(0, "call `f(513 ms)`")], sourced={}, quoted={}) == []


def test_a_quoted_number_must_match_the_data():
    rows = _json("hopper.json")["rows"]
    cudnn = next(r["tflops"] for r in rows if r["provider"] == "sdpa_cudnn" and r["N"] == 8192
                 and r["dtype"] == "float16")
    right = f"{cudnn:.0f} TFLOPS"
    quoted = {("08", right): lambda: cudnn}
    assert problems_in("08", [(1, f"cuDNN runs at {right}.")], sourced={}, quoted=quoted) == []
    wrong = f"{cudnn + 40:.0f} TFLOPS"
    quoted = {("08", wrong): lambda: cudnn}
    bad = problems_in("08", [(1, f"cuDNN runs at {wrong}.")], sourced={}, quoted=quoted)
    assert len(bad) == 1 and "the data gives" in bad[0]
    # a figure sourced for one lesson is accepted only there; data-sheet figures anywhere
    assert problems_in("06", [(0, "570 TFLOPS")]) != []
    assert problems_in("08", [(0, "570 TFLOPS")]) == []
    assert problems_in("02", [(0, "989 TFLOPS")]) == []
