"""Benchmark PEG2d against the naive formulation and a plain memory copy.

Run ``python tools/bench_core.py`` (``--quick`` for a short run, ``--json PATH``
to save the figures).  For each shape it times the forward and the
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
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.benchmark import Timer

from peg_core import PEG2d, apply_rope
from peg_core.peg import peg2d_reference, tokens_to_grid


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
    from peg_core.models.layers import Attention

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
    parser.add_argument("--only", choices=("peg", "rope"), default=None, help="run one part (default: all)")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time with this thread's CPU time instead of the wall clock (needs --threads 1): "
        "robust when other processes load the machine, since descheduled time is not counted",
    )
    args = parser.parse_args(argv)
    if args.cpu_time and args.threads != 1:
        parser.error("--cpu-time only sees the calling thread; use it with --threads 1")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    min_run_time = 0.2 if args.quick else 0.5
    repeats = args.repeats or (2 if args.quick else 3)
    payload: dict = {"threads": args.threads, "clock": "thread_cpu" if args.cpu_time else "wall",
                     "torch": torch.__version__}  # fmt: skip
    if args.only != "peg":
        rope_rows = [
            row
            for b, heads in ((8, 3), (32, 6) if not args.quick else (8, 6))
            for row in measure_rope(b, heads, args.threads, min_run_time, repeats, args.cpu_time)
        ]
        print(markdown_rope(rope_rows))
        print(f"\nworst rope/timm = {max(r.vs_timm for r in rope_rows):.2f} (target <= 1)")
        payload["rope_rows"] = [asdict(r) | {"vs_timm": r.vs_timm, "attn_vs_plain": r.attn_vs_plain}
                                for r in rope_rows]  # fmt: skip
    if args.only == "rope":
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(payload, fh, indent=2)
        return
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
    if args.json:
        payload |= {
            "rows": [
                asdict(r) | {"vs_naive": r.vs_naive, "vs_copy": r.vs_copy, "conv_vs_copy": r.conv_vs_copy}
                for r in rows
            ],
            "dynamic_rows": [
                asdict(r) | {"vs_static": r.vs_static, "nchw_vs_dynamic": r.nchw_vs_dynamic} for r in dyn_rows
            ],
        }
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=2)


if __name__ == "__main__":
    main()
