"""What every benchmark shares: timing on the GPU, the record of where a number
came from, and saving results next to the course."""
from __future__ import annotations

import datetime as _dt
import json
import platform
import re
import shlex
import sys
from pathlib import Path

import torch

from course_utils import device

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks"


def environment() -> dict:
    """Device, versions and the command line, stored with every result."""
    import triton
    info = device.describe()
    info.update({
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "command": "python -m course_utils.bench " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    })
    return info


def settle(fn, ms: float) -> int:
    """Run ``fn`` back to back for ``ms`` milliseconds of wall time; returns the calls.

    Why: under a sustained attention load the H200 reaches its 700 W power cap within
    about 0.15 s and lowers its SM clock from 1980 MHz, to as little as about 1500 MHz: a
    clock that depends on the kernel's own power draw. A kernel timed right after the
    GPU idled (a compile, an autotuning pass on the CPU) runs its first tens of
    milliseconds at the full clock, so a short timing window gives it up to 15 % more than
    it sustains (``benchmarks/nvidia-h200/clock_probe*.json``). Running it first settles
    the clock the kernel holds when it runs for a while, whatever ran before it."""
    if ms < 0:
        raise ValueError(f"settle time must be >= 0 ms, got {ms!r}")
    import time
    calls = 0
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        for _ in range(4):
            fn()
        calls += 4
        if device.HAS_GPU:
            torch.cuda.synchronize()
    return calls


def settle_arg(text: str) -> float:
    """``--settle``'s type: milliseconds, finite and >= 0."""
    import argparse
    import math
    try:
        ms = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"milliseconds expected, got {text!r}") from None
    if not (math.isfinite(ms) and ms >= 0):
        raise argparse.ArgumentTypeError(f"milliseconds >= 0 expected, got {text!r}")
    return ms


def add_settle_option(ap, default: float = 1000.0) -> None:
    """The benchmarks' ``--settle MS``: each provider runs back to back that long before
    it is timed (:func:`settle`)."""
    ap.add_argument("--settle", type=settle_arg, default=default, metavar="MS",
                    help="milliseconds each provider runs back to back before it is timed, "
                         f"so it is timed at the clock it sustains (default {default:g})")


def time_ms(fn, warmup: int = 10, rep: int = 50, settle_ms: float = 0) -> float:
    """Median milliseconds per call of ``fn`` on the GPU (CUDA events, L2 flushed
    by triton's ``do_bench``), after running it back to back for ``settle_ms`` (see
    :func:`settle`). On CPU it times with ``time.perf_counter``: such
    numbers only compare variants in one run and are never reported as speeds."""
    if settle_ms < 0:
        raise ValueError(f"settle time must be >= 0 ms, got {settle_ms!r}")
    if device.HAS_GPU:
        import triton.testing
        settle(fn, settle_ms)
        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    import time
    fn()
    times = []
    for _ in range(max(3, rep // 10)):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return times[len(times) // 2]


def sdpa(backend: str, q, k, v, causal: bool):
    """A zero-argument callable running SDPA with one back end: ``"flash"`` or
    ``"cudnn"`` (or a ``torch.nn.attention.SDPBackend`` member's name)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = getattr(SDPBackend, {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION"}.get(
        backend, backend))

    def run():
        with sdpa_kernel([be]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def load_file(path, name: str):
    """A module from a source file outside the package (an older copy of a kernel,
    compared with the current one in the same run); any file name."""
    import importlib.machinery
    import importlib.util
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    loader.exec_module(mod)
    return mod


def attention_flops(b, h, nq, nk, d, causal, mode="fwd") -> float:
    """FLOPs of attention as the FlashAttention papers count them: 2 matmuls of
    2*Nq*Nk*d each in the forward (halved when causal), 2.5x that for the backward."""
    f = 4.0 * b * h * nq * nk * d
    if causal:
        f /= 2
    return {"fwd": f, "bwd": 2.5 * f, "fwd+bwd": 3.5 * f}[mode]


def forward_points(head_dims, lengths=(4096, 16384), b=4, h=32, dtype=torch.float16):
    """The forward probes' sweep: for each head dim, length and causal setting (off,
    then on), seeded inputs ``q, k, v`` of shape ``(b, h, n, d)``, the forward's FLOPs
    and the row that names the point. The same point draws the same inputs in every
    probe."""
    for d in head_dims:
        for n in lengths:
            for causal in (False, True):
                gen = torch.Generator(device=device.DEVICE).manual_seed(n + d)
                q, k, v = (torch.randn(b, h, n, d, device=device.DEVICE, dtype=dtype,
                                       generator=gen) for _ in range(3))
                yield (q, k, v, causal, attention_flops(b, h, n, n, d, causal),
                       {"d": d, "n": n, "causal": causal})


def time_tflops(row: dict, fns: dict, flops: float, rep: int) -> dict:
    """Time each zero-argument callable of ``fns`` into ``row[name]`` as TFLOPS (one
    decimal); a callable that raises gets ``row[name + "_error"]`` instead."""
    for key, fn in fns.items():
        try:
            row[key] = round(flops / time_ms(fn, rep=rep) / 1e9, 1)
        except Exception as e:  # noqa: BLE001 - a variant that fails is a result
            row[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return row


def kernel_us(fn, calls: int = 20, warmup: int = 3) -> dict:
    """GPU time of each kernel ``fn`` launches, in µs per call of ``fn``: ``calls`` eager
    calls under the PyTorch profiler (no L2 flush), after ``warmup`` calls."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times: dict = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            times[e.name] = times.get(e.name, 0.0) + e.device_time / calls
    return times


def device_slug() -> str:
    return re.sub(r"[^a-z0-9]+", "-", device.describe()["name"].lower()).strip("-")


def save(suite: str, rows: list[dict], extra: dict | None = None) -> Path:
    """Write ``benchmarks/<device>/<suite>.json`` and return its path."""
    out = RESULTS / device_slug()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{suite}.json"
    record = {"environment": environment(), "rows": rows}
    if extra:
        record.update(extra)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def table(rows: list[dict], columns: list[str]) -> str:
    """A plain-text table of ``rows`` restricted to ``columns``."""
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c)
              for i, c in enumerate(columns)]
    line = lambda xs: "  ".join(x.rjust(w) for x, w in zip(xs, widths))  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths])] + [line(x) for x in cells])


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"
    return str(v)
