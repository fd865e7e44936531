"""Compile and run the ping-pong Gluon kernel once (sm90), under a time limit set by the
caller: ``timeout 120 python3 benchmarks/smoke_pingpong.py`` exits non-zero if it fails."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course_utils import device  # noqa: E402
from course_utils.attention import naive_attention  # noqa: E402
from course_utils.hopper.gluon_fwd import attention_gluon  # noqa: E402

if device.needs("hopper"):
    q, k, v = (torch.randn(1, 2, 512, 128, device=device.DEVICE, dtype=torch.float16) for _ in range(3))
    o = attention_gluon(q, k, v, pingpong=True, enable_gqa=True)
    torch.cuda.synchronize()
    err = float((o.float() - naive_attention(q, k, v, enable_gqa=True).float()).abs().max())
    print("ping-pong max |error|", err)
    sys.exit(0 if err < 1e-2 else 1)
