"""Benchmark PEG2d (against a naive formulation and a memory copy), the rotary path and attention biases.

Run ``python tools/bench_core.py`` (``--quick`` for a short run, ``--json PATH``
to save the figures, ``--min-run-time S`` per timing block).  For each shape it times the forward and the
forward+backward pass of

* ``peg``: :class:`peg_core.PEG2d` (channels-last view, residual added in place);
* ``naive``: :func:`peg_core.peg.peg2d_reference` (transpose, NCHW-contiguous
  reshape, ``F.conv2d``, add, cat);
* ``copy``: ``x.clone()`` of the same token tensor, the bandwidth floor;
* ``conv``: the depthwise ``F.conv2d`` alone on an already channels-last grid
  (no mask, no residual), i.e. what the convolution kernel itself costs,

and prints ``peg`` as ratios to the first two (targets: ``peg/naive <= 1``,
``peg/copy <= 4``) and ``conv/copy`` to show how much of ``peg`` is the
kernel.  Shapes: DeiT-tiny (C=192, 14×14 + class token) and the DETR encoder
(C=256, 25×34 with a padding mask).  Each implementation is timed
``--repeats`` times in turn and the smallest median is kept, so a burst of
load from other processes does not land on one implementation only.

A second table times the dynamic-kernel PEG (``PEG2d(dynamic=True,
num_kernels=4)``: router, kernel mix and one grouped conv with ``groups =
B*C``) against the static PEG on the same shapes (``dynamic/static``), and
against the same dynamic PEG with the batch folded into channels in
channels-first order (``nchw-fold``: ``(1, B*C, H, W)`` contiguous), the
layout its implementation avoids.

A third table times the rotary path (``--only rope`` runs it alone): ``peg_core.apply_rope``
on queries ``(B, heads, 1 + N, 64)`` with a table that has identity rows for the class token,
next to timm's ``apply_rot_embed_cat`` on the same tensors as timm's attention uses it (slice
off the prefix, rotate, concatenate back; target ``rope/timm <= 1``), and
:class:`peg_core.models.layers.Attention` with a mixed-RoPE table next to the same attention
without one (``attn+rope/attn``).  timm is needed for the first ratio only.

A fourth table times the attention biases (``--only bias`` runs it alone) on one ViT-S/16 attention
layer (:class:`peg_core.models.layers.Attention`, dim 384, 6 heads of 64, a class token, ``--batch``
images, default 1) at 224 px (14×14 grid) and 448 px (28×28), next to the same layer as plain SDPA
(``plain``, no mask) and with each rotary kind.  Every bias kind (``alibi-2d``, ``fire``,
``lookhere``) and 2-D rotary kind (``rope-axial``, ``rope-mixed``, ``rope-dinov3``) of
:mod:`peg_core.registry` is built as a ViT-S model builds it (training grid 14×14, 12 layers), and
three calls are timed per kind, forward and forward+backward:

* ``pos``: what a model computes once per forward: the bias ``(1, heads, 1 + N, 1 + N)``, or the
  rotary table (all 12 layers' tables for ``rope-mixed``); in the forward+backward pass with its
  backward when the kind is learned (``fire``, ``rope-mixed``), the forward alone otherwise;
* ``attn+pos``: one attention layer with that computation inside the call;
* ``attn``: the attention alone with a precomputed bias / table (a leaf that takes a gradient when
  the kind is learned, as the shared bias does in a model),

printed as ``attn+pos/plain``, ``attn/plain`` and the 12-layer ratio ``(pos + 12 attn) / (12 plain)``,
the bias cost per forward amortised over the layers that share it.  Run it with ``--threads 1``.
A memory table follows for every timed size and the 4× size (896 px, 56×56 grid + class token, 6 heads):
the bytes of the returned bias in float32 and bfloat16 (from the shape), the largest intermediate from the shapes
(FIRE's ``(N, N, hidden)`` MLP hidden layer, or its row chunk above ``FIRE_CHUNK_BYTES``; the float32
``(heads, N, N)`` grid bias otherwise),
and the measured peak: the rise of the resident set size over the call (result included, no
gradient), read from ``/proc/self/status`` after resetting the high-water mark through
``/proc/self/clear_refs`` (Linux only; ``n/a`` elsewhere), in a fresh subprocess whose glibc maps
every buffer of 64 KiB or more on its own (``MALLOC_MMAP_THRESHOLD_``), so no buffer is served from
heap pages already resident.  A measurement whose estimate exceeds 3.5 GiB is skipped.  ``--quick`` shrinks the table to dim 64, 2 heads of 32,
4×4 and 6×6 grids, and the memory table to a 16×16 grid.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.benchmark import Timer

from peg_core import PEG2d, apply_rope
from peg_core.bias import FIRE_CHUNK_BYTES, FIRE_MAX_CHUNKS, AttentionBias, FIREBias
from peg_core.models.layers import Attention
from peg_core.peg import peg2d_reference, tokens_to_grid
from peg_core.registry import EncodingContext, encoding_names, get_encoding


@dataclass
class Case:
    name: str
    batch: int
    dim: int
    size: tuple[int, int]
    num_prefix: int
    masked: bool


@dataclass
class Row:
    case: str
    batch: int
    pass_: str
    peg_us: float
    naive_us: float
    copy_us: float
    conv_us: float

    @property
    def vs_naive(self) -> float:
        return self.peg_us / self.naive_us

    @property
    def vs_copy(self) -> float:
        return self.peg_us / self.copy_us

    @property
    def conv_vs_copy(self) -> float:
        return self.conv_us / self.copy_us


def cases(quick: bool) -> list[Case]:
    deit = (8, 32) if quick else (8, 32, 64)
    detr = (2, 8) if quick else (2, 4, 8)
    return [Case("deit-tiny 14x14+cls", b, 192, (14, 14), 1, False) for b in deit] + [
        Case("detr 25x34 mask", b, 256, (25, 34), 0, True) for b in detr
    ]


def detr_mask(batch: int, size: tuple[int, int]) -> Tensor:
    """Bottom/right padding as in a DETR batch: image ``b`` loses a few rows and columns."""
    mask = torch.zeros(batch, *size, dtype=torch.bool)
    for b in range(1, batch):
        mask[b, size[0] - 1 - b % 5 :, :] = True
        mask[b, :, size[1] - 2 - b % 7 :] = True
    return mask


def timed(fn: Callable[[], object], threads: int, min_run_time: float, cpu_time: bool = False) -> float:
    """Median seconds per call over blocked runs (wall clock, or this thread's CPU time)."""
    fn()  # warm-up (oneDNN primitive creation, allocator)
    clock = {"timer": time.thread_time} if cpu_time else {}
    timer = Timer("fn()", globals={"fn": fn}, num_threads=threads, **clock)
    return timer.blocked_autorange(min_run_time=min_run_time).median


def measure(case: Case, threads: int, min_run_time: float, repeats: int, cpu_time: bool) -> list[Row]:
    b, c, (h, w), p = case.batch, case.dim, case.size, case.num_prefix
    peg = PEG2d(c, kernel_size=3, num_prefix_tokens=p)
    weight, bias = peg.proj.weight, peg.proj.bias
    mask = detr_mask(b, case.size) if case.masked else None
    x = torch.randn(b, p + h * w, c)
    impls: dict[str, Callable[[Tensor], Tensor]] = {
        "peg": lambda t: peg(t, (h, w), mask),
        "naive": lambda t: peg2d_reference(t, weight, bias, (h, w), p, mask),
        "copy": lambda t: t.clone(),
        "conv": lambda t: peg.proj(tokens_to_grid(t[:, p:], (h, w))),
    }
    torch.testing.assert_close(impls["peg"](x), impls["naive"](x), atol=1e-5, rtol=1e-5)
    # the conv-only floor gets a tensor that is already channels-last
    inputs = {name: x for name in impls} | {"conv": x[:, p:].contiguous()}
    if p:
        impls["conv"] = lambda t: peg.proj(tokens_to_grid(t, (h, w)))

    rows = []
    for pass_ in ("fwd", "fwd+bwd"):
        calls: dict[str, Callable[[], object]] = {}
        for name, f in impls.items():
            xin = inputs[name]
            if pass_ == "fwd":
                calls[name] = lambda f=f, xin=xin: f(xin)
                continue
            xg = xin.clone().requires_grad_()
            params = [xg, *peg.parameters()]

            def step(f=f, xg=xg, params=params) -> None:
                for t in params:  # fresh gradients each call: no accumulation cost
                    t.grad = None
                out = f(xg)
                out.backward(torch.ones_like(out))

            calls[name] = step
        us = dict.fromkeys(calls, float("inf"))
        for _ in range(repeats):
            for name, call in calls.items():
                with torch.set_grad_enabled(pass_ != "fwd"):
                    us[name] = min(us[name], timed(call, threads, min_run_time, cpu_time) * 1e6)
        rows.append(Row(case.name, b, pass_, us["peg"], us["naive"], us["copy"], us["conv"]))
    return rows


@dataclass
class DynRow:
    case: str
    batch: int
    pass_: str
    static_us: float
    dynamic_us: float
    nchw_us: float

    @property
    def vs_static(self) -> float:
        return self.dynamic_us / self.static_us

    @property
    def nchw_vs_dynamic(self) -> float:
        return self.nchw_us / self.dynamic_us


def dynamic_nchw(peg: PEG2d, x: Tensor, size: tuple[int, int], mask: Tensor | None) -> Tensor:
    """The dynamic PEG with the batch folded into channels through an NCHW-contiguous copy (the baseline)."""
    p = peg.num_prefix_tokens
    tokens = x[:, p:]
    b, _, c = tokens.shape
    keep = None if mask is None else (~mask).unsqueeze(1).to(x.dtype)
    grid = tokens.transpose(1, 2).reshape(b, c, *size)
    if keep is not None:
        grid = grid * keep
    weight, bias = peg.kernels(grid, keep)
    out = F.conv2d(grid.reshape(1, b * c, *size), weight.reshape(b * c, 1, *weight.shape[3:]),
                   None if bias is None else bias.reshape(-1), padding=peg.kernel_size // 2, groups=b * c)  # fmt: skip
    out = out.reshape(b, c, *size)
    if keep is not None:
        out = out * keep
    return torch.cat([x[:, :p], tokens + out.flatten(2).transpose(1, 2)], dim=1)


def pass_calls(
    impls: dict[str, tuple[Tensor, Callable[[Tensor], Tensor], list[Tensor]]], pass_: str
) -> dict[str, Callable[[], object]]:
    """One zero-argument call per implementation ``name: (input, fn, params)``: the forward, or
    forward + backward with fresh gradients (no accumulation cost) on a copy of the input."""
    calls: dict[str, Callable[[], object]] = {}
    for name, (xin, f, mod_params) in impls.items():
        if pass_ == "fwd":
            calls[name] = lambda f=f, xin=xin: f(xin)
            continue
        xg = xin.clone().requires_grad_()
        params = [xg, *mod_params]

        def step(f=f, xg=xg, params=params) -> None:
            for t in params:
                t.grad = None
            out = f(xg)
            out.backward(torch.ones_like(out))

        calls[name] = step
    return calls


def measure_dynamic(
    case: Case, threads: int, min_run_time: float, repeats: int, cpu_time: bool
) -> list[DynRow]:
    """Static vs dynamic PEG2d (and the NCHW-fold baseline), forward and forward+backward."""
    b, c, (h, w), p = case.batch, case.dim, case.size, case.num_prefix
    static = PEG2d(c, kernel_size=3, num_prefix_tokens=p)
    dyn = PEG2d(c, kernel_size=3, num_prefix_tokens=p, dynamic=True, num_kernels=4)
    mask = detr_mask(b, case.size) if case.masked else None
    x = torch.randn(b, p + h * w, c)
    impls = {
        "static": (x, lambda t: static(t, (h, w), mask), list(static.parameters())),
        "dynamic": (x, lambda t: dyn(t, (h, w), mask), list(dyn.parameters())),
        "nchw": (x, lambda t: dynamic_nchw(dyn, t, (h, w), mask), list(dyn.parameters())),
    }
    torch.testing.assert_close(impls["dynamic"][1](x), impls["nchw"][1](x), atol=1e-5, rtol=1e-5)
    rows = []
    for pass_ in ("fwd", "fwd+bwd"):
        us = best_of(pass_calls(impls, pass_), pass_ != "fwd", threads, min_run_time, repeats, cpu_time)
        rows.append(DynRow(case.name, b, pass_, us["static"], us["dynamic"], us["nchw"]))
    return rows


def markdown_dynamic(rows: list[DynRow]) -> str:
    lines = [
        "Dynamic-kernel PEG2d (K=4, one grouped conv, groups = B*C) vs the static PEG2d; median µs per call",
        "",
        "| shape | B | pass | static µs | dynamic µs | nchw-fold µs | dynamic/static | nchw-fold/dynamic |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.batch} | {r.pass_} | {r.static_us:.0f} | {r.dynamic_us:.0f} | {r.nchw_us:.0f} "
            f"| {r.vs_static:.2f} | {r.nchw_vs_dynamic:.2f} |"
        )
    return "\n".join(lines)


@dataclass
class RopeRow:
    case: str
    batch: int
    pass_: str
    rope_us: float
    timm_us: float
    attn_rope_us: float
    attn_us: float

    @property
    def vs_timm(self) -> float:
        return self.rope_us / self.timm_us

    @property
    def attn_vs_plain(self) -> float:
        return self.attn_rope_us / self.attn_us


def best_of(calls: dict[str, Callable[[], object]], grad: bool, threads: int, min_run_time: float, repeats: int,
            cpu_time: bool) -> dict[str, float]:  # fmt: skip
    """Smallest median µs per implementation over interleaved rounds."""
    us = dict.fromkeys(calls, float("inf"))
    for _ in range(repeats):
        for name, call in calls.items():
            with torch.set_grad_enabled(grad):
                us[name] = min(us[name], timed(call, threads, min_run_time, cpu_time) * 1e6)
    return us


def measure_rope(
    batch: int, heads: int, threads: int, min_run_time: float, repeats: int, cpu_time: bool
) -> list[RopeRow]:
    """apply_rope vs timm's apply_rot_embed_cat, and Attention with / without RoPE; 14x14 grid + class token."""
    from timm.layers.pos_embed_sincos import apply_rot_embed_cat

    from peg_core import build_rope

    d, size, p = 64, (14, 14), 1
    n = p + size[0] * size[1]
    axial = build_rope("rope-axial", d)
    sin, cos = axial(size, num_prefix_tokens=p)
    # timm's cat layout for the same rotation: plain sin / cos of each pair, interleaved, no prefix rows
    ang = axial.angles(size)[0, 0, 0]
    emb = torch.cat([ang.sin().repeat_interleave(2, -1), ang.cos().repeat_interleave(2, -1)], -1)
    mixed = build_rope("rope-mixed", d, num_heads=heads, depth=1)
    attn = Attention(heads * d, heads)
    x = torch.randn(batch, heads, n, d)
    tokens = torch.randn(batch, n, heads * d)

    def timm_rope(t: Tensor) -> Tensor:
        return torch.cat([t[:, :, :p], apply_rot_embed_cat(t[:, :, p:], emb)], dim=2)

    def attn_rope(t: Tensor) -> Tensor:
        s, c = mixed(size, num_prefix_tokens=p)  # the table is built per forward, as CPVT does
        return attn(t, (s[0], c[0]))

    params = [*attn.parameters(), *mixed.parameters()]
    impls = {"rope": (x, lambda t: apply_rope(t, sin, cos), []), "timm": (x, timm_rope, []),
             "attn_rope": (tokens, attn_rope, params), "attn": (tokens, attn, params)}  # fmt: skip
    torch.testing.assert_close(impls["rope"][1](x), timm_rope(x), atol=1e-5, rtol=1e-5)
    rows = []
    for pass_ in ("fwd", "fwd+bwd"):
        us = best_of(pass_calls(impls, pass_), pass_ != "fwd", threads, min_run_time, repeats, cpu_time)
        rows.append(RopeRow(f"{heads} heads 14x14+cls", batch, pass_, us["rope"], us["timm"], us["attn_rope"],
                            us["attn"]))  # fmt: skip
    return rows


def markdown_rope(rows: list[RopeRow]) -> str:
    lines = [
        "Rotary path: apply_rope vs timm apply_rot_embed_cat (same q, head dim 64), Attention + mixed RoPE vs "
        "plain Attention; median µs per call",
        "",
        "| shape | B | pass | apply_rope µs | timm µs | attn+rope µs | attn µs | rope/timm | attn+rope/attn |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.batch} | {r.pass_} | {r.rope_us:.0f} | {r.timm_us:.0f} | {r.attn_rope_us:.0f} "
            f"| {r.attn_us:.0f} | {r.vs_timm:.2f} | {r.attn_vs_plain:.2f} |"
        )
    return "\n".join(lines)


#: layers of the ViT-S model whose per-forward position cost the bias table amortises
BIAS_DEPTH = 12
#: the training grid the models are built for (ViT-S/16 at 224 px): FIRE's threshold follows from it
BIAS_TRAIN_GRID = (14, 14)
#: memory measurements whose estimated peak exceeds this are skipped (the machine is shared)
BIAS_MEMORY_LIMIT = 3.5 * 2**30


@dataclass
class BiasCase:
    name: str
    batch: int
    dim: int
    heads: int
    size: tuple[int, int]


@dataclass
class BiasRow:
    case: str
    batch: int
    pass_: str
    kind: str
    pos_us: float  # the bias / rotary table alone, once per forward
    call_us: float  # attention with the bias / table computed in the call
    attn_us: float  # attention with a precomputed bias / table
    plain_us: float  # plain SDPA attention, no mask
    depth: int = BIAS_DEPTH

    @property
    def call_vs_plain(self) -> float:
        return self.call_us / self.plain_us

    @property
    def attn_vs_plain(self) -> float:
        return self.attn_us / self.plain_us

    @property
    def model_vs_plain(self) -> float:
        """``(pos + depth * attn) / (depth * plain)``: the position cost of a ``depth``-layer forward."""
        return (self.pos_us + self.depth * self.attn_us) / (self.depth * self.plain_us)


def bias_cases(quick: bool, batch: int) -> list[BiasCase]:
    """ViT-S/16 at 224 and 448 px (class token); ``quick``: dim 64, 2 heads, 4x4 and 6x6 grids."""
    if quick:
        return [BiasCase(f"{h}x{h}+cls", batch, 64, 2, (h, h)) for h in (4, 6)]
    return [BiasCase(f"{16 * h}px {h}x{h}+cls", batch, 384, 6, (h, h)) for h in (14, 28)]


def build_position(kind: str, head_dim: int, heads: int) -> nn.Module:
    """A registered bias / rotary kind as a ViT-S model builds it (training grid, 12 layers, class token)."""
    ctx = EncodingContext(head_dim, BIAS_TRAIN_GRID, num_prefix_tokens=1, num_heads=heads, depth=BIAS_DEPTH)
    return get_encoding(kind).build(ctx)


def position_kinds() -> list[str]:
    """The registry's 2-D bias kinds, then its 2-D rotary kinds."""
    return encoding_names(kind="bias", ndim=2) + encoding_names(kind="rotate", ndim=2)


def _learned(module: nn.Module) -> bool:
    return any(t.requires_grad for t in module.parameters())


def measure_bias(
    case: BiasCase, threads: int, min_run_time: float, repeats: int, cpu_time: bool
) -> list[BiasRow]:
    """Plain attention vs attention with each bias / rotary kind (in the call, precomputed, alone)."""
    b, c, heads, size = case.batch, case.dim, case.heads, case.size
    attn = Attention(c, heads)
    attn_half = Attention(c, heads, rope_half=True)  # DINOv3's pair layout, same weights
    attn_half.load_state_dict(attn.state_dict())
    attn_params = [*attn.parameters(), *attn_half.parameters()]
    x = torch.randn(b, 1 + size[0] * size[1], c)
    kinds = position_kinds()
    modules = {kind: build_position(kind, c // heads, heads) for kind in kinds}

    def per_forward(kind: str) -> Tensor | tuple[Tensor, Tensor]:
        """What the model computes once per forward: the bias, or the rotary table of every layer."""
        mod = modules[kind]
        if isinstance(mod, AttentionBias):
            return mod(size, num_prefix_tokens=1, dtype=x.dtype)
        return mod(size, num_prefix_tokens=1)

    def layer_input(kind: str, out: Tensor | tuple[Tensor, Tensor]) -> Tensor | tuple[Tensor, Tensor]:
        """Layer 0's share: the bias itself, or its rotary table (rope-mixed: (depth, heads, P + N, D))."""
        if isinstance(out, Tensor) or not modules[kind].learned:
            return out
        return out[0][0], out[1][0]

    def layer(kind: str, t: Tensor, inp: Tensor | tuple[Tensor, Tensor]) -> Tensor:
        if isinstance(inp, Tensor):
            return attn(t, None, inp)
        return (attn_half if modules[kind].half else attn)(t, inp)

    def precomputed(kind: str, grad: bool) -> Tensor | tuple[Tensor, Tensor]:
        """Layer 0's input computed once: a leaf that takes a gradient when the kind is learned (with
        ``grad``), as the shared bias / table does in a model."""
        with torch.no_grad():
            inp = layer_input(kind, per_forward(kind))
        flag = grad and _learned(modules[kind])
        if isinstance(inp, Tensor):
            return inp.detach().requires_grad_(flag)
        return inp[0].detach().requires_grad_(flag), inp[1].detach().requires_grad_(flag)

    rows = []
    for pass_ in ("fwd", "fwd+bwd"):
        grad = pass_ != "fwd"
        impls: dict[str, tuple[Tensor, Callable[[Tensor], Tensor], list[Tensor]]] = {
            "plain": (x, attn, list(attn.parameters()))
        }
        for kind in kinds:
            pre = precomputed(kind, grad)
            leaves = [t for t in ([pre] if isinstance(pre, Tensor) else pre) if t.requires_grad]
            impls[f"{kind}:call"] = (
                x,
                lambda t, kind=kind: layer(kind, t, layer_input(kind, per_forward(kind))),
                attn_params + list(modules[kind].parameters()),
            )
            impls[f"{kind}:attn"] = (
                x,
                lambda t, kind=kind, pre=pre: layer(kind, t, pre),
                attn_params + leaves,
            )
            if not grad:
                torch.testing.assert_close(impls[f"{kind}:call"][1](x), impls[f"{kind}:attn"][1](x))
        calls = pass_calls(impls, pass_)
        for kind in kinds:
            calls[f"{kind}:pos"] = _pos_call(
                lambda kind=kind: per_forward(kind), list(modules[kind].parameters()), grad
            )
        us = best_of(calls, grad, threads, min_run_time, repeats, cpu_time)
        rows += [
            BiasRow(case.name, b, pass_, k, us[f"{k}:pos"], us[f"{k}:call"], us[f"{k}:attn"], us["plain"])
            for k in kinds
        ]
    return rows


def _pos_call(fn: Callable[[], object], params: list[Tensor], grad: bool) -> Callable[[], object]:
    """The per-forward bias / table alone; with ``grad``, its backward too when it has parameters."""

    def step() -> None:
        for t in params:
            t.grad = None
        out = fn()
        outs = [out] if isinstance(out, Tensor) else list(out)
        if grad and outs[0].requires_grad:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    return step


def markdown_bias(rows: list[BiasRow], threads: int, cpu_time: bool) -> str:
    depth = rows[0].depth if rows else BIAS_DEPTH
    clock = "thread CPU time" if cpu_time else "wall clock"
    lines = [
        f"Attention biases and rotary kinds on one attention layer vs plain SDPA ({threads} threads); median "
        f"µs per call, {clock} (pos: the bias / table per forward; {depth}-layer = (pos + {depth} attn) / "
        f"({depth} plain))",
        "",
        "| shape | B | pass | kind | pos µs | attn+pos µs | attn µs | plain µs | attn+pos/plain | attn/plain "
        f"| {depth}-layer/plain |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.batch} | {r.pass_} | {r.kind} | {r.pos_us:.0f} | {r.call_us:.0f} "
            f"| {r.attn_us:.0f} | {r.plain_us:.0f} | {r.call_vs_plain:.2f} | {r.attn_vs_plain:.2f} "
            f"| {r.model_vs_plain:.2f} |"
        )
    return "\n".join(lines)


@dataclass
class BiasMemRow:
    kind: str
    size: tuple[int, int]
    heads: int
    tokens: int  # P + N
    float32_bytes: int  # the returned bias, from its shape
    bfloat16_bytes: int
    largest: str  # the largest intermediate, from the shapes
    largest_bytes: int
    peak_float32_bytes: float  # measured RSS rise over the call (nan: not measured)
    peak_bfloat16_bytes: float


def bias_bytes(heads: int, size: tuple[int, ...], num_prefix_tokens: int, itemsize: int) -> int:
    """Bytes of the bias ``(1, heads, P + N, P + N)`` a model gets, ``N = prod(size)``."""
    m = num_prefix_tokens + math.prod(size)
    return heads * m * m * itemsize


def largest_intermediate(module: nn.Module, size: tuple[int, ...]) -> tuple[str, int]:
    """The largest float32 tensor computing the bias makes, from the shapes (grid tokens only).

    FIRE's ``(N, N, hidden)`` hidden layer is made whole up to :data:`~peg_core.bias.FIRE_CHUNK_BYTES`
    and in row chunks above (at most :data:`~peg_core.bias.FIRE_MAX_CHUNKS`), as :class:`FIREBias` does.
    """
    n = math.prod(size)
    grid = (f"({module.num_heads}, N, N) grid bias", module.num_heads * n * n * 4)
    if not isinstance(module, FIREBias):
        return grid
    hidden = (module.axis_mlps[0] if module.per_axis else module.mlp)[0].out_features
    whole = n * n * hidden * 4
    if whole <= FIRE_CHUNK_BYTES:
        return f"(N, N, {hidden}) MLP hidden", whole
    rows = max(FIRE_CHUNK_BYTES // (n * hidden * 4), -(-n // FIRE_MAX_CHUNKS), 1)
    chunk = (f"({rows}, N, {hidden}) MLP hidden chunk", rows * n * hidden * 4)
    return max(chunk, grid, key=lambda c: c[1])


def _proc_status_bytes(field: str) -> int:
    """``VmRSS`` / ``VmHWM`` of this process in bytes (``/proc/self/status`` gives kB)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{field} not in /proc/self/status")


def bias_peaks_here(kinds: list[str], heads: int, size: tuple[int, int], dtypes: list[str],
                    limits: dict[str, float]) -> dict[str, dict[str, float]]:  # fmt: skip
    """Peak RSS rise (bytes) of each bias call, in this process: ``{kind: {dtype: bytes}}``.

    The high-water mark is reset to the current RSS (``/proc/self/clear_refs``, Linux >= 4.0) before
    each call, so the figure is the call's own peak, its result included.  Run with glibc's mmap
    threshold fixed low (``MALLOC_MMAP_THRESHOLD_``, :func:`measure_bias_memory`) so that buffers are
    mapped when allocated and returned when freed, not served from resident heap pages.  Linux
    counts RSS in per-thread batches, so figures below about a MiB are rough.  ``nan`` where the
    reset is unavailable or the estimate in ``limits`` is above :data:`BIAS_MEMORY_LIMIT`.
    """
    out: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        for kind in kinds:
            mod = build_position(kind, 64, heads)
            mod((2, 2), num_prefix_tokens=1)  # warm-up: kernels, lazy state
            out[kind] = {}
            for name in dtypes:
                peak = float("nan")
                if limits.get(kind, 0.0) <= BIAS_MEMORY_LIMIT:
                    gc.collect()
                    try:
                        with open("/proc/self/clear_refs", "w") as fh:
                            fh.write("5")
                        rss0 = _proc_status_bytes("VmRSS")
                        bias = mod(size, num_prefix_tokens=1, dtype=getattr(torch, name))
                        peak = float(_proc_status_bytes("VmHWM") - rss0)
                        del bias
                    except OSError:
                        pass
                out[kind][name] = peak
    return out


def measure_bias_memory(heads: int, size: tuple[int, int], threads: int) -> list[BiasMemRow]:
    """The memory table: bytes from the shapes, and the peaks measured in a fresh subprocess."""
    kinds = encoding_names(kind="bias", ndim=2)
    rows, limits = [], {}
    for kind in kinds:
        mod = build_position(kind, 64, heads)
        what, nbytes = largest_intermediate(mod, size)
        f32 = bias_bytes(heads, size, 1, 4)
        # FIRE keeps its linear output and its ReLU output at once
        limits[kind] = (2 if isinstance(mod, FIREBias) else 1) * nbytes + 2 * f32
        bf16 = bias_bytes(heads, size, 1, 2)
        nan = float("nan")
        rows.append(BiasMemRow(kind, size, heads, 1 + math.prod(size), f32, bf16, what, nbytes, nan, nan))
    spec = {"kinds": kinds, "heads": heads, "size": list(size), "dtypes": ["float32", "bfloat16"],
            "limits": limits, "threads": threads}  # fmt: skip
    # a fresh interpreter, where glibc maps every buffer of 64 KiB or more on its own and unmaps it on
    # free: no buffer of the call lands in heap pages that are already resident (then RSS would not rise)
    env = os.environ | {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--bias-memory-child", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode:
        print(f"bias memory measurement failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}",
              file=sys.stderr)  # fmt: skip
        return rows
    peaks = json.loads(proc.stdout.strip().splitlines()[-1])
    for r in rows:
        r.peak_float32_bytes = peaks[r.kind]["float32"]
        r.peak_bfloat16_bytes = peaks[r.kind]["bfloat16"]
    return rows


def _mib(nbytes: float) -> str:
    return "n/a" if math.isnan(nbytes) else f"{nbytes / 2**20:.1f}"


def markdown_bias_memory(rows: list[BiasMemRow]) -> str:
    lines = [
        "Attention-bias memory (MiB): the returned bias (1, heads, P + N, P + N) from its shape, the "
        "largest intermediate from the shapes, and the measured peak RSS rise over the call (result "
        "included, no grad)",
        "",
        "| kind | grid | heads | P + N | bias f32 | bias bf16 | largest intermediate | MiB | peak f32 "
        "| peak bf16 |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.kind} | {r.size[0]}x{r.size[1]}+cls | {r.heads} | {r.tokens} | {_mib(r.float32_bytes)} "
            f"| {_mib(r.bfloat16_bytes)} | {r.largest} | {_mib(r.largest_bytes)} "
            f"| {_mib(r.peak_float32_bytes)} | {_mib(r.peak_bfloat16_bytes)} |"
        )
    return "\n".join(lines)


def markdown(rows: list[Row], threads: int, cpu_time: bool) -> str:
    clock = "thread CPU time" if cpu_time else "wall clock"
    lines = [
        f"PEG2d on CPU ({platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{threads} threads); median µs per call, {clock}",
        "",
        "| shape | B | pass | PEG2d µs | naive µs | copy µs | conv µs | PEG2d/naive | PEG2d/copy | conv/copy |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.batch} | {r.pass_} | {r.peg_us:.0f} | {r.naive_us:.0f} | {r.copy_us:.0f} "
            f"| {r.conv_us:.0f} | {r.vs_naive:.2f} | {r.vs_copy:.1f} | {r.conv_vs_copy:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes, shorter timing")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("--repeats", type=int, default=None, help="timing rounds per implementation")
    parser.add_argument("--min-run-time", type=float, default=None, metavar="S",
                        help="seconds per timing block (default 0.5; 0.2 with --quick)")  # fmt: skip
    parser.add_argument(
        "--only", choices=("peg", "rope", "bias"), default=None, help="run one part (default: all)"
    )
    parser.add_argument("--batch", type=int, default=1, help="images in the attention-bias table (default 1)")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with this thread's CPU time instead of the wall clock (needs --threads 1): "
        "robust when other processes load the machine, since descheduled time is not counted",
    )
    # internal: the fresh interpreter that measures the bias memory (measure_bias_memory)
    parser.add_argument("--bias-memory-child", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bias_memory_child:
        spec = json.loads(args.bias_memory_child)
        torch.set_num_threads(spec["threads"])
        peaks = bias_peaks_here(
            spec["kinds"], spec["heads"], tuple(spec["size"]), spec["dtypes"], spec["limits"]
        )
        print(json.dumps(peaks))
        return
    if args.cpu_time and args.threads != 1:
        parser.error("--cpu-time only sees the calling thread; use it with --threads 1")
    if args.batch < 1:
        parser.error(f"--batch must be >= 1; got {args.batch}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    min_run_time = args.min_run_time or (0.2 if args.quick else 0.5)
    repeats = args.repeats or (2 if args.quick else 3)
    payload: dict = {"threads": args.threads, "clock": "thread_cpu" if args.cpu_time else "wall",
                     "torch": torch.__version__}  # fmt: skip
    if args.only in (None, "rope"):
        rope_rows = [
            row
            for b, heads in ((8, 3), (32, 6) if not args.quick else (8, 6))
            for row in measure_rope(b, heads, args.threads, min_run_time, repeats, args.cpu_time)
        ]
        print(markdown_rope(rope_rows))
        print(f"\nworst rope/timm = {max(r.vs_timm for r in rope_rows):.2f} (target <= 1)")
        payload["rope_rows"] = [asdict(r) | {"vs_timm": r.vs_timm, "attn_vs_plain": r.attn_vs_plain}
                                for r in rope_rows]  # fmt: skip
    if args.only in (None, "peg"):
        rows = [
            row
            for case in cases(args.quick)
            for row in measure(case, args.threads, min_run_time, repeats, args.cpu_time)
        ]
        print(markdown(rows, args.threads, args.cpu_time))
        worst_naive = max(r.vs_naive for r in rows)
        worst_copy = max(r.vs_copy for r in rows)
        print(
            f"\nworst PEG2d/naive = {worst_naive:.2f} (target <= 1), "
            f"worst PEG2d/copy = {worst_copy:.1f} (target <= 4)"
        )
        dyn_rows = [
            row
            for case in cases(args.quick)
            for row in measure_dynamic(case, args.threads, min_run_time, repeats, args.cpu_time)
        ]
        print("\n" + markdown_dynamic(dyn_rows))
        print(f"\nworst dynamic/static = {max(r.vs_static for r in dyn_rows):.2f}")
        payload |= {
            "rows": [
                asdict(r) | {"vs_naive": r.vs_naive, "vs_copy": r.vs_copy, "conv_vs_copy": r.conv_vs_copy}
                for r in rows
            ],
            "dynamic_rows": [
                asdict(r) | {"vs_static": r.vs_static, "nchw_vs_dynamic": r.nchw_vs_dynamic} for r in dyn_rows
            ],
        }
    if args.only in (None, "bias"):
        bias_list = bias_cases(args.quick, args.batch)
        bias_rows = [
            row
            for case in bias_list
            for row in measure_bias(case, args.threads, min_run_time, repeats, args.cpu_time)
        ]
        if args.only is None:
            print()
        print(markdown_bias(bias_rows, args.threads, args.cpu_time))
        last = bias_list[-1].name
        ratios: dict[str, list[str]] = {}
        for r in bias_rows:
            if r.case == last:
                ratios.setdefault(r.kind, []).append(f"{r.model_vs_plain:.2f}")
        summary = ", ".join(f"{kind} {' / '.join(v)}" for kind, v in ratios.items())
        print(f"\n{BIAS_DEPTH}-layer/plain at {last} (fwd / fwd+bwd): {summary}")
        # every timed size, then 4x the first (896 px for ViT-S): the peak memory per size
        first = bias_list[0]
        mem_sizes = [case.size for case in bias_list] + [(4 * first.size[0], 4 * first.size[1])]
        mem_rows = [row for size in dict.fromkeys(mem_sizes)
                    for row in measure_bias_memory(first.heads, size, args.threads)]  # fmt: skip
        print("\n" + markdown_bias_memory(mem_rows))
        payload["bias_rows"] = [
            asdict(r) | {"call_vs_plain": r.call_vs_plain, "attn_vs_plain": r.attn_vs_plain,
                         "model_vs_plain": r.model_vs_plain}
            for r in bias_rows
        ]  # fmt: skip
        payload["bias_memory"] = [asdict(r) for r in mem_rows]
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=2)


if __name__ == "__main__":
    main()
