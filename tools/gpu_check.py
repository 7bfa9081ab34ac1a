"""One prepared GPU check: is the suite correct on this device, and how fast is it?

Needs only torch and torchvision (scipy, pycocotools, decord and pytorchvideo
are optional).  In one run, in this order:

1. PEG2d / PEG3d forward and backward on the device against float64 CPU
   references (``F.conv2d`` / ``F.conv3d``) on random inputs;
2. DETR-R50 training steps (``peg`` and ``sine``) at 800x1066, batch 4, bf16
   autocast, eager and ``torch.compile``: images/s and peak memory;
3. the PEG video transformer (ViT-S, 16x224x224, batch 8) the same way;
4. PEG2d and PEG3d alone against a device-to-device copy of the same tensor
   (the bandwidth floor), as a ratio;
5. RT-DETR-R18vd (``peg`` and ``sincos`` in AIFI) training steps at 640x640, batch 4, bf16
   autocast, with denoising queries and the VFL criterion; then the ``peg`` model evaluated at
   two sizes (640 and 960): its encoder against a float32 CPU copy, and bf16 eval images/s;
6. the CPVT-S/16 classifier (PEG) training steps at 224x224, batch 64, bf16 autocast, eager and
   compiled.

The compiled rows compile what ``train --compile`` compiles (:class:`peg_core.engine.compile.CompiledModel`:
the whole classifier, video ViT and DETR; the RT-DETR family's backbone and encoder) and give its
graph count.

Steps 2 and 3 also count the host-device synchronisations of one training
step under ``torch.cuda.set_sync_debug_mode("warn")`` ("syncs per step"; the
DETR step's expected 1 is the Hungarian matcher's transfer; n/a on CPU).

It prints a table last and writes every number to JSON::

    python tools/gpu_check.py                      # on a GPU, < 8 minutes
    python tools/gpu_check.py --device cpu --quick # seconds; what the tests run

Without a GPU it measures nothing: on a machine where ``torch.cuda.is_available()`` is False (no
GPU, a CPU-only torch, ``CUDA_VISIBLE_DEVICES=""``) it prints one line on stderr and exits with
status 77 before any work, so a CI job on the wrong machine neither passes as if the GPU had been
checked nor spends ten minutes running the full-size models on the CPU.  77 is the "skipped"
status of the automake and meson test harnesses: a CI step that allows GPU-less runners can treat
it as a skip, any other as a failure.  ``--device cpu`` is the smoke run of the code paths and
needs ``--quick`` (a usage error, status 2, otherwise).

The DETR step uses the Hungarian criterion when scipy is installed; without it
the step's loss is a plain sum of the outputs (the timing of the model is the
same; the table says which was used).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peg_core import PEG2d
from peg_video import PEG3d, build_video_model


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Callable[[], object], device: torch.device, warmup: int, iters: int) -> float:
    """Median seconds per call of ``fn`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


# --------------------------------------------------------------------------- 1. correctness
def check_correctness(device: torch.device, quick: bool) -> list[dict]:
    """Max abs error of PEG2d/PEG3d (fwd output, input grad, weight grad) vs float64 CPU references."""
    rows = []
    g = torch.Generator().manual_seed(0)
    cases2d = [(2, 1, (7, 11), 3, False), (2, 0, (5, 6), 5, True), (1, 2, (1, 9), 7, False)]
    for b, prefix, (h, w), k, sep in cases2d:
        c = 32
        peg = PEG2d(c, kernel_size=k, num_prefix_tokens=prefix, separable=sep)
        with torch.no_grad():
            for p in peg.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        x = torch.randn(b, prefix + h * w, c, generator=g)

        def ref2d(x64, params, h=h, w=w, prefix=prefix, sep=sep, k=k):
            grid = x64[:, prefix:].transpose(1, 2).reshape(x64.shape[0], -1, h, w)
            if sep:
                wx, wy, bias = params
                y = F.conv2d(grid, wx, None, padding=(0, k // 2), groups=grid.shape[1])
                y = F.conv2d(y, wy, bias, padding=(k // 2, 0), groups=grid.shape[1])
            else:
                wgt, bias = params
                y = F.conv2d(grid, wgt, bias, padding=k // 2, groups=grid.shape[1])
            out = x64[:, prefix:] + y.flatten(2).transpose(1, 2)
            return torch.cat([x64[:, :prefix], out], 1)

        rows.append(
            _compare(f"PEG2d k{k}{' sep' if sep else ''} P{prefix} {h}x{w}", peg, x, (h, w), ref2d, device)
        )
    cases3d = [(2, 1, (3, 5, 7), False), (1, 0, (1, 4, 6), True), (2, 0, (4, 3, 3), False)]
    for b, prefix, (t, h, w), fac in cases3d:
        c = 16
        peg = PEG3d(c, num_prefix_tokens=prefix, factorized=fac)
        with torch.no_grad():
            for p in peg.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        x = torch.randn(b, prefix + t * h * w, c, generator=g)

        def ref3d(x64, params, t=t, h=h, w=w, prefix=prefix, fac=fac):
            grid = x64[:, prefix:].transpose(1, 2).reshape(x64.shape[0], -1, t, h, w)
            ch = grid.shape[1]
            if fac:
                ws, bs, wt, bt = params if len(params) == 4 else (params[0], None, params[1], params[2])
                y = F.conv3d(grid, ws, bs, padding=(0, ws.shape[-2] // 2, ws.shape[-1] // 2), groups=ch)
                y = F.conv3d(y, wt, bt, padding=(wt.shape[2] // 2, 0, 0), groups=ch)
            else:
                wgt, bias = params
                y = F.conv3d(grid, wgt, bias, padding=tuple(s // 2 for s in wgt.shape[2:]), groups=ch)
            out = x64[:, prefix:] + y.flatten(2).transpose(1, 2)
            return torch.cat([x64[:, :prefix], out], 1)

        rows.append(
            _compare(f"PEG3d{' fac' if fac else ''} P{prefix} {t}x{h}x{w}", peg, x, (t, h, w), ref3d, device)
        )
    return rows


def _compare(name, peg, x, size, ref, device) -> dict:
    params64 = [p.detach().double().requires_grad_() for p in peg.parameters()]
    x64 = x.double().requires_grad_()
    y64 = ref(x64, params64)
    gy = torch.randn_like(y64)
    y64.backward(gy)

    peg_d = peg.to(device)
    xd = x.to(device).requires_grad_()
    yd = peg_d(xd, size)
    yd.backward(gy.float().to(device))
    err_out = (yd.detach().cpu().double() - y64.detach()).abs().max().item()
    err_gx = (xd.grad.cpu().double() - x64.grad).abs().max().item()
    err_gw = max(
        (p.grad.cpu().double() - q.grad).abs().max().item() for p, q in zip(peg_d.parameters(), params64)
    )
    return {
        "check": name,
        "max_err_out": err_out,
        "max_err_grad_x": err_gx,
        "max_err_grad_w": err_gw,
        "ok": max(err_out, err_gx, err_gw) < 1e-3,
    }


# --------------------------------------------------------------------------- 2./3. training steps
def _train_step_timer(
    model, make_batch, loss_fn, device, amp_dtype, compile_model, warmup, iters, forward_targets=False
):
    """``forward_targets``: the model takes the targets too (RT-DETR builds its denoising queries from them)."""
    model.to(device).train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    graphs = None
    if compile_model:  # what train --compile compiles, in place
        from peg_core.engine.compile import CompiledModel

        graphs = CompiledModel(model)
    fwd = model
    inputs, targets = make_batch()

    def step():
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            out = fwd(inputs, targets) if forward_targets else fwd(inputs)
            loss = loss_fn(out, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    step()  # first step, includes compilation
    _sync(device)
    first = time.perf_counter() - t0
    sec = _time(step, device, warmup, iters)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    if graphs is not None:
        print(
            f"  compiled: {graphs.report()['graphs']} graphs in {graphs.report()['compile_seconds']} s",
            flush=True,
        )
    return sec, first, peak, _count_syncs(step, device)


def _count_syncs(step: Callable[[], object], device: torch.device) -> int | str:
    """Host-device synchronisations in one training step (CUDA's sync debug mode), "n/a" elsewhere.

    Each synchronising CUDA call (``.item()``, a blocking copy, ``nonzero``...) issues one warning;
    all are recorded, repeats included.  A DETR step with the Hungarian loss should show 1 (the
    matcher's transfer of the cost matrices).
    """
    if device.type != "cuda":
        return "n/a"
    _sync(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def _has_scipy() -> bool:
    try:
        import scipy  # noqa: F401
    except ImportError:
        return False
    return True


def _detection_batch(batch: int, h: int, w: int, device: torch.device) -> tuple[torch.Tensor, list[dict]]:
    """``(images (batch, 3, h, w), targets)``: random pixels, two normalised cxcywh boxes per image."""
    g = torch.Generator().manual_seed(0)
    imgs = torch.randn(batch, 3, h, w, generator=g).to(device)
    boxes = torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.6, 0.5, 0.3, 0.2]], device=device)
    return imgs, [{"labels": torch.tensor([1, 5], device=device), "boxes": boxes} for _ in range(batch)]


def _detection_loss(criterion, use_criterion: bool) -> Callable:
    """The weighted Hungarian loss of ``criterion``, or (no scipy) a plain sum of the outputs."""

    def loss_fn(out, tg):
        if use_criterion:
            losses = criterion(out, tg)
            return sum(losses[k] * criterion.weight_dict[k] for k in criterion.weight_dict if k in losses)
        return out["pred_logits"].float().sum() * 0 + out["pred_boxes"].float().sum()

    return loss_fn


def bench_detr(device, quick, amp_dtype, compile_modes) -> list[dict]:
    from peg_detr import build_detr

    use_criterion = _has_scipy()
    if quick:
        cfg = dict(
            backbone="tiny", hidden_dim=64, enc_layers=2, dec_layers=2, dim_feedforward=128, num_queries=10
        )
        batch, h, w, warmup, iters = 2, 96, 128, 1, 2
    else:
        cfg = dict(backbone="resnet50")
        batch, h, w, warmup, iters = 4, 800, 1066, 3, 10
    rows = []
    for pos in ("peg", "sine"):
        for comp in compile_modes:
            model, criterion, _ = build_detr(pos_enc=pos, num_classes=91, **cfg)
            criterion.to(device)

            sec, first, peak, syncs = _train_step_timer(
                model, lambda: _detection_batch(batch, h, w, device), _detection_loss(criterion, use_criterion),
                device, amp_dtype, comp, warmup, iters,
            )  # fmt: skip
            rows.append(
                {
                    "model": f"DETR-{cfg['backbone']} {pos}",
                    "input": f"{batch}x3x{h}x{w}",
                    "compile": comp,
                    "img_per_s": batch / sec,
                    "step_ms": sec * 1e3,
                    "first_step_s": first,
                    "peak_mem_gib": peak,
                    "syncs_per_step": syncs,
                    "loss": "hungarian" if use_criterion else "sum (no scipy)",
                }
            )
            del model
    return rows


def bench_video(device, quick, amp_dtype, compile_modes) -> list[dict]:
    if quick:
        kw = dict(
            name="vit_tiny", embed_dim=64, depth=2, num_heads=2, num_frames=4, img_size=32, tubelet=(2, 8, 8)
        )
        batch, warmup, iters = 2, 1, 2
    else:
        kw = dict(name="vit_small", num_frames=16, img_size=224)
        batch, warmup, iters = 8, 3, 10
    rows = []
    for comp in compile_modes:
        model = build_video_model(pos_enc="peg3d", num_classes=400, **kw)
        t, s = kw["num_frames"], kw["img_size"]

        def make_batch(t=t, s=s):
            g = torch.Generator().manual_seed(0)
            return torch.randn(batch, 3, t, s, s, generator=g).to(device), torch.randint(0, 400, (batch,)).to(
                device
            )

        sec, first, peak, syncs = _train_step_timer(
            model,
            make_batch,
            lambda o, y: F.cross_entropy(o.float(), y),
            device,
            amp_dtype,
            comp,
            warmup,
            iters,
        )
        rows.append(
            {
                "model": f"Video {kw['name']} peg3d",
                "input": f"{batch}x3x{t}x{s}x{s}",
                "compile": comp,
                "clips_per_s": batch / sec,
                "step_ms": sec * 1e3,
                "first_step_s": first,
                "peak_mem_gib": peak,
                "syncs_per_step": syncs,
            }
        )
        del model
    return rows


# --------------------------------------------------------------------------- 5. RT-DETR
def _rtdetr_config(quick: bool) -> tuple[dict, int, int, tuple[int, int], int, int]:
    """``(build_rtdetr keywords, batch, train side, eval sides, warmup, iters)``: R18vd, or tiny when quick."""
    if quick:
        cfg = dict(backbone="tiny", hidden_dim=32, num_heads=2, dim_feedforward=64, dec_layers=2,
                   encoder_expansion=0.5, num_queries=20, num_denoising=10)  # fmt: skip
        return cfg, 2, 64, (64, 96), 1, 2
    cfg = dict(backbone="r18vd", dec_layers=3, encoder_expansion=0.5)  # rtdetr_r18vd_6x's model
    return cfg, 4, 640, (640, 960), 3, 10


def bench_rtdetr(device, quick, amp_dtype, compile_modes) -> list[dict]:
    """RT-DETR training steps (peg and sincos in AIFI): images/s, first step, peak memory, syncs."""
    from peg_detr.models.rtdetr.build import build_rtdetr

    cfg, batch, side, _, warmup, iters = _rtdetr_config(quick)
    use_criterion = _has_scipy()
    rows = []
    for pos in ("peg", "sincos"):
        for comp in compile_modes:
            model, criterion, _ = build_rtdetr(pos_enc=pos, num_classes=80, **cfg)
            sec, first, peak, syncs = _train_step_timer(
                model, lambda: _detection_batch(batch, side, side, device), _detection_loss(criterion, use_criterion),
                device, amp_dtype, comp, warmup, iters, forward_targets=True,
            )  # fmt: skip
            rows.append({"model": f"RT-DETR-{cfg['backbone']} {pos}", "input": f"{batch}x3x{side}x{side}",
                         "compile": comp, "img_per_s": batch / sec, "step_ms": sec * 1e3, "first_step_s": first,
                         "peak_mem_gib": peak, "syncs_per_step": syncs,
                         "loss": "vfl+l1+giou, denoising" if use_criterion else "sum (no scipy)"})  # fmt: skip
            del model
    return rows


# --------------------------------------------------------------------------- 6. classifier
def bench_classify(device, quick, amp_dtype, compile_modes) -> list[dict]:
    """CPVT-S/16 (PEG) training steps, eager and compiled: images/s, first step (compilation), peak memory."""
    from peg_core.models import CPVT, cpvt_small

    if quick:
        make, side, batch, warmup, iters = (
            lambda: CPVT(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10),
            32, 2, 1, 2,
        )  # fmt: skip
        name = "CPVT-tiny peg"
    else:
        make, side, batch, warmup, iters = (lambda: cpvt_small(num_classes=1000)), 224, 64, 3, 10
        name = "CPVT-S/16 peg"
    rows = []
    for comp in compile_modes:
        model = make()
        classes = model.head.out_features

        def make_batch(side=side, classes=classes):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(batch, 3, side, side, generator=g).to(device)
            return x, torch.randint(0, classes, (batch,), generator=g).to(device)

        sec, first, peak, syncs = _train_step_timer(
            model,
            make_batch,
            lambda o, y: F.cross_entropy(o.float(), y),
            device,
            amp_dtype,
            comp,
            warmup,
            iters,
        )
        rows.append({"model": name, "input": f"{batch}x3x{side}x{side}", "compile": comp, "img_per_s": batch / sec,
                     "step_ms": sec * 1e3, "first_step_s": first, "peak_mem_gib": peak, "syncs_per_step": syncs})  # fmt: skip
        del model
    return rows


def eval_rtdetr_sizes(device, quick, amp_dtype) -> list[dict]:
    """The ``peg`` RT-DETR (PEG weights perturbed from zero) in eval mode at two square sizes.

    ``enc_rel_err``: max abs difference of the hybrid encoder's maps on the device (float32, TF32
    off) from a float32 CPU copy, over the maps' max abs value (the decoder's top-K query selection
    makes its outputs a discontinuous function of tiny differences, so the encoder is compared);
    ``img_per_s``: eval forward under ``amp_dtype`` autocast.
    """
    from peg_detr.models.rtdetr.build import build_rtdetr

    cfg, batch, _, sides, warmup, iters = _rtdetr_config(quick)
    model, _, _ = build_rtdetr(pos_enc="peg", num_classes=80, **cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in (p for n, p in model.named_parameters() if ".pegs." in n):
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    model.eval()
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    rows = []
    for side in sides:
        x = torch.rand(batch, 3, side, side, generator=g)
        with torch.no_grad():
            model.load_state_dict(reference)
            want = model.encoder(model.backbone(x.to("cpu")))
            model.to(device)
            tf32 = torch.backends.cudnn.allow_tf32
            torch.backends.cudnn.allow_tf32 = False
            try:
                got = model.encoder(model.backbone(x.to(device)))
            finally:
                torch.backends.cudnn.allow_tf32 = tf32
            err = max(
                (a.cpu() - b).abs().max().item() / max(b.abs().max().item(), 1e-12) for a, b in zip(got, want)
            )

            xd = x.to(device)

            def forward(xd=xd):
                with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    return model(xd)

            sec = _time(forward, device, warmup, iters)
            out = forward()
        finite = bool(torch.isfinite(out["pred_logits"]).all() and torch.isfinite(out["pred_boxes"]).all())
        rows.append({"model": f"RT-DETR-{cfg['backbone']} peg (eval)", "input": f"{batch}x3x{side}x{side}",
                     "enc_rel_err": err, "img_per_s": batch / sec, "eval_ms": sec * 1e3,
                     "ok": err < 1e-3 and finite})  # fmt: skip
        model.to("cpu")
    return rows


# --------------------------------------------------------------------------- 4. PEG vs copy
def bench_peg_vs_copy(device, quick, dtype) -> list[dict]:
    warmup, iters = (1, 3) if quick else (10, 50)
    rows = []
    shapes2d = (
        [(8, 1, 14, 14, 192), (4, 0, 25, 34, 256)] if quick else [(64, 1, 14, 14, 192), (8, 0, 100, 134, 256)]
    )
    for b, p, h, w, c in shapes2d:
        peg = PEG2d(c, num_prefix_tokens=p).to(device, dtype)
        x = torch.randn(b, p + h * w, c, device=device, dtype=dtype)
        with torch.no_grad():
            tp = _time(lambda peg=peg, x=x, h=h, w=w: peg(x, (h, w)), device, warmup, iters)
            tc = _time(lambda x=x: x.clone(), device, warmup, iters)
        rows.append(
            {"op": f"PEG2d {b}x({p}+{h}x{w})x{c}", "peg_ms": tp * 1e3, "copy_ms": tc * 1e3, "ratio": tp / tc}
        )
    shapes3d = [(2, 4, 8, 8, 64)] if quick else [(8, 8, 14, 14, 384), (4, 16, 14, 14, 384)]
    for b, t, h, w, c in shapes3d:
        for fac in (False, True):
            peg = PEG3d(c, factorized=fac).to(device, dtype)
            x = torch.randn(b, t * h * w, c, device=device, dtype=dtype)
            with torch.no_grad():
                tp = _time(lambda peg=peg, x=x, t=t, h=h, w=w: peg(x, (t, h, w)), device, warmup, iters)
                tc = _time(lambda x=x: x.clone(), device, warmup, iters)
            rows.append(
                {
                    "op": f"PEG3d{' fac' if fac else ''} {b}x{t}x{h}x{w}x{c}",
                    "peg_ms": tp * 1e3,
                    "copy_ms": tc * 1e3,
                    "ratio": tp / tc,
                }
            )
    return rows


# --------------------------------------------------------------------------- report
def _table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return "nan" if v != v else (f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.2f}")
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


#: exit status without a GPU: nothing was measured (the automake / meson "skipped" status)
EXIT_NO_GPU = 77


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--device", default="cuda", help="cuda (default), cuda:N, or cpu with --quick (the CPU smoke run)"
    )
    ap.add_argument("--quick", action="store_true", help="tiny shapes, few steps (CPU smoke run)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile timings")
    ap.add_argument("--json", type=Path, default=Path("runs/gpu_check.json"))
    args = ap.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        ap.error(f"--device {args.device}: not a torch device (cuda, cuda:N or cpu)")
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            f"error: no CUDA GPU on this machine (torch.cuda.is_available() is False), nothing was measured "
            f"(exit {EXIT_NO_GPU}: skipped); run it on a GPU, or --device cpu --quick for the CPU smoke run",
            file=sys.stderr,
        )
        raise SystemExit(EXIT_NO_GPU)
    if device.type == "cpu" and not args.quick:
        ap.error(
            "--device cpu runs only the smoke run (the full-size models take over ten minutes on a CPU): add --quick"
        )
    amp_dtype = torch.bfloat16 if device.type == "cuda" else None
    bench_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    compile_modes = [False] if (args.no_compile or args.quick) else [False, True]
    torch.backends.cudnn.benchmark = device.type == "cuda"

    t0 = time.time()
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "quick": args.quick,
    }
    print(f"gpu_check on {env['name']} (torch {env['torch']})", flush=True)
    correctness = check_correctness(device, args.quick)
    print(_table(correctness, ["check", "max_err_out", "max_err_grad_x", "max_err_grad_w", "ok"]), flush=True)
    detr = bench_detr(device, args.quick, amp_dtype, compile_modes)
    video = bench_video(device, args.quick, amp_dtype, compile_modes)
    peg = bench_peg_vs_copy(device, args.quick, bench_dtype)
    rtdetr = bench_rtdetr(device, args.quick, amp_dtype, compile_modes)
    rtdetr_eval = eval_rtdetr_sizes(device, args.quick, amp_dtype)
    classify = bench_classify(device, args.quick, amp_dtype, compile_modes)
    result = {
        "env": env,
        "correctness": correctness,
        "detr": detr,
        "video": video,
        "peg_vs_copy": peg,
        "rtdetr": rtdetr,
        "rtdetr_eval": rtdetr_eval,
        "classify": classify,
        "seconds": round(time.time() - t0, 1),
        "all_correct": all(r["ok"] for r in correctness + rtdetr_eval),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")

    print("\n## gpu_check results (" + env["name"] + f", torch {env['torch']}, {result['seconds']} s)\n")
    print(_table(correctness, ["check", "max_err_out", "max_err_grad_x", "max_err_grad_w", "ok"]))
    print()
    print(
        _table(
            detr,
            [
                "model",
                "input",
                "compile",
                "img_per_s",
                "step_ms",
                "first_step_s",
                "peak_mem_gib",
                "syncs_per_step",
                "loss",
            ],
        )
    )
    print()
    print(
        _table(
            video,
            [
                "model",
                "input",
                "compile",
                "clips_per_s",
                "step_ms",
                "first_step_s",
                "peak_mem_gib",
                "syncs_per_step",
            ],
        )
    )
    print()
    print(_table(peg, ["op", "peg_ms", "copy_ms", "ratio"]))
    print()
    train_cols = ["model", "input", "compile", "img_per_s", "step_ms", "first_step_s", "peak_mem_gib"]
    print(_table(rtdetr, [*train_cols, "syncs_per_step", "loss"]))
    print()
    print(_table(rtdetr_eval, ["model", "input", "enc_rel_err", "img_per_s", "eval_ms", "ok"]))
    print()
    print(_table(classify, [*train_cols, "syncs_per_step"]))
    print(f"\nJSON: {args.json}")
    return result


if __name__ == "__main__":
    main()
