"""Lesson 7 capstone: a small character-level GPT whose attention is either PyTorch's
``scaled_dot_product_attention`` or our :func:`~course_utils.triton_attention.triton_attention`.

Everything else is shared, so two training runs from the same seed see the same weights
and the same batches; their loss curves differ only through the attention kernel.
The corpus, ``course_utils/data/tiles_and_tides.txt``, is a short story written for
the course.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_utils import device
from course_utils.triton_attention import triton_attention

__all__ = ["CORPUS", "load_corpus", "CharTokenizer", "GPTConfig", "TinyGPT", "get_batch",
           "train", "ATTENTIONS"]

CORPUS = Path(__file__).resolve().parent / "data" / "tiles_and_tides.txt"
ATTENTIONS = ("sdpa", "triton")


def load_corpus(path=CORPUS) -> str:
    """The training text."""
    return Path(path).read_text(encoding="utf-8")


class CharTokenizer:
    """One token per distinct character of the text, in sorted order."""

    def __init__(self, text: str):
        if not isinstance(text, str) or not text:
            raise ValueError("CharTokenizer needs a non-empty string")
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        unknown = sorted(set(text) - set(self.stoi))
        if unknown:
            raise ValueError(f"characters not in the vocabulary: {unknown!r}")
        return torch.tensor([self.stoi[c] for c in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int = 32      # context length N
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32          # head dim = n_embd // n_head
    attention: str = "sdpa"   # "sdpa" or "triton"

    def __post_init__(self):
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be a multiple of n_head={self.n_head}")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        B, T, C = x.shape
        H = self.cfg.n_head
        # (B, T, 3, H, hd) -> three (B, H, T, hd) views: strided, no copy
        q, k, v = self.qkv(x).view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4).unbind(0)
        if self.cfg.attention == "triton":
            y = triton_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token and position embeddings, ``n_layer`` pre-norm blocks, a linear head."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        if T > self.cfg.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size "
                             f"{self.cfg.block_size}")
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


def get_batch(data: torch.Tensor, block_size: int, batch_size: int, gen: torch.Generator):
    """``batch_size`` random windows of ``block_size`` tokens and the next-token targets."""
    if data.numel() <= block_size:
        raise ValueError(f"the text has {data.numel()} tokens; need more than {block_size}")
    starts = torch.randint(0, data.numel() - block_size, (batch_size,), generator=gen)
    x = torch.stack([data[s:s + block_size] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + 1 + block_size] for s in starts.tolist()])
    return x, y


def train(attention: str = "sdpa", steps: int = 20, *, block_size: int = 32, n_layer: int = 2,
          n_head: int = 2, n_embd: int = 32, batch_size: int = 4, lr: float = 3e-3,
          seed: int = 0, dev=None, amp_dtype=None, progress: bool = False):
    """Train a fresh :class:`TinyGPT` for ``steps`` AdamW steps; return the losses.

    The same ``seed`` gives the same initial weights and the same batches whichever
    ``attention`` is used. ``amp_dtype`` (for example ``torch.bfloat16`` on a GPU) runs
    the model under autocast, so the attention sees half-precision inputs."""
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    dev = device.DEVICE if dev is None else torch.device(dev)
    text = load_corpus()
    tok = CharTokenizer(text)
    data = tok.encode(text)
    cfg = GPTConfig(tok.vocab_size, block_size, n_layer, n_head, n_embd, attention)
    torch.manual_seed(seed)
    model = TinyGPT(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    it = range(steps)
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc=f"{attention:>6}", leave=False)
    for _ in it:
        x, y = (t.to(dev) for t in get_batch(data, block_size, batch_size, gen))
        with torch.autocast(dev.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    if not all(math.isfinite(v) for v in losses):
        raise RuntimeError(f"training with attention={attention!r} diverged: {losses}")
    return losses
