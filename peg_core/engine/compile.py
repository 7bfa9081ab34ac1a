"""``--compile``: ``torch.compile`` (inductor) of the model's training and evaluation forward.

Inductor on this torch specialises the image side in its convolution lowerings (the patch
embedding, the PEG's depth-wise convolution and its backward) and fails on symbolic strides
(``cannot determine truth value of Relational``), so nothing is compiled for dynamic height and
width.  Every compiled region is compiled with ``dynamic=False`` instead: one graph per input
shape, a bounded set of buckets, with a recompile limit above the number of shapes a run can meet:

* square inputs (the classifier's ``--img-size`` / ``--train-sizes`` / ``--progressive-sizes``,
  the video clip, the RT-DETR family's 13 multi-scale sides): one graph per side (and one per
  evaluation side, and one for a short last batch), the whole model for the classifier and the
  video ViT;
* RT-DETR / D-FINE / DEIMv2: the ``backbone`` and the ``encoder`` (their input is the image alone);
  the decoder runs eagerly, since its training input holds the denoising queries made from the
  targets, whose count changes every batch;
* DETR: batches are padded, beyond the collate's own padding, to multiples of
  :data:`DETR_BUCKET` pixels (the padding is masked, as the collate's is), so that the padded
  shapes of a short-side multi-scale epoch fall in a few buckets rather than one per batch.

Random ops (dropout) draw from eager's generator (inductor's ``fallback_random``), so a compiled run
draws the numbers the eager run draws.  Each region's graphs go through one counting backend (inductor's ``compile_fx``), which gives
the number of graphs (the first and the recompiles) and the seconds spent compiling them.  The
speed-up is measured in the run itself: the first :data:`EAGER_STEPS` training steps at a shape run
eagerly (timed; the first of a process pays one-off costs, hence the fastest is kept), the next one
compiles, later ones are the steady state; the reported speed-up is the eager time of the shapes
over their median compiled time.  The eager steps are the run's own steps (compiled steps equal
them within float tolerance), so the measurement costs no extra work.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "DETR_BUCKET",
    "EAGER_STEPS",
    "RECOMPILE_LIMIT",
    "CompiledModel",
    "compile_regions",
    "input_key",
    "pad_to_bucket",
]

#: DETR's padded batches are padded further to multiples of this many pixels under ``--compile``
DETR_BUCKET = 128
#: graphs per compiled region before dynamo runs it eagerly: above every run's set of shapes
#: (13 RT-DETR sides x train / eval x a short last batch; DETR's (1333 / 128) ** 2 buckets)
RECOMPILE_LIMIT = 128
#: training steps per shape run eagerly (timed) before the compiled ones
EAGER_STEPS = 2


def _is_rtdetr_family(model: nn.Module) -> bool:
    return all(hasattr(model, a) for a in ("backbone", "encoder", "decoder", "denoising_group"))


def _is_detr(model: nn.Module) -> bool:
    return all(hasattr(model, a) for a in ("backbone", "transformer", "input_proj"))


def compile_regions(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of what ``--compile`` compiles in ``model`` (see the module docstring).

    A model with a weight EMA (``peg_detr``'s ``EmaModel``: ``.model`` and ``.averaged``) has the
    regions of both: the live model trains, the average is evaluated.
    """
    if hasattr(model, "averaged") and isinstance(getattr(model, "model", None), nn.Module):
        return [(f"model.{n}" if n else "model", m) for n, m in compile_regions(model.model)] + [
            (f"averaged.{n}" if n else "averaged", m) for n, m in compile_regions(model.averaged)
        ]
    if _is_rtdetr_family(model):
        return [("backbone", model.backbone), ("encoder", model.encoder)]
    return [("", model)]


def pad_to_bucket(samples: Any, bucket: int) -> Any:
    """A DETR :class:`~peg_detr.structures.ImageBatch` padded bottom / right to multiples of ``bucket``
    (images with zeros, the mask with True, as :func:`~peg_detr.structures.pad_images` pads)."""
    tensors, mask = samples
    h, w = tensors.shape[-2:]
    ph, pw = -(-h // bucket) * bucket - h, -(-w // bucket) * bucket - w
    if ph == 0 and pw == 0:
        return samples
    return type(samples)(F.pad(tensors, (0, pw, 0, ph)), F.pad(mask, (0, pw, 0, ph), value=True))


def _first_tensor(data: Any) -> Tensor | None:
    """The first tensor of a batch (depth first): the images of every task's batch."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, dict):
        data = list(data.values())
    if isinstance(data, list | tuple):
        for item in data:
            found = _first_tensor(item)
            if found is not None:
                return found
    return None


def input_key(data: Any, bucket: int | None = None) -> tuple[int, ...] | None:
    """The shape of a batch's images (rounded up to ``bucket`` in H and W): the key of its graph."""
    first = _first_tensor(data)
    if first is None:
        return None
    shape = list(first.shape)
    if bucket and len(shape) >= 2:
        shape[-2:] = [-(-s // bucket) * bucket for s in shape[-2:]]
    return tuple(shape)


class _PaddedCall:
    """A region's ``_compiled_call_impl`` that pads a DETR batch to its bucket before the compiled call
    (outside the graph: the graph's guards see the bucket's shape, not the batch's)."""

    def __init__(self, compiled: Callable[..., Any], bucket: int) -> None:
        self.compiled, self.bucket = compiled, bucket

    def __call__(self, samples: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(samples, tuple) and len(samples) == 2 and isinstance(samples[0], Tensor):
            samples = pad_to_bucket(samples, self.bucket)
        return self.compiled(samples, *args, **kwargs)


class CompiledModel:
    """The compiled regions of a model, their graph count and compile time, and the step timings.

    Args:
        model: the bare model (before DDP); its regions are compiled in place
            (:meth:`torch.nn.Module.compile`: state-dict keys, hooks and the EMA copy stay as they were).
        recompile_limit: graphs per region before dynamo gives up compiling it (runs it eagerly).
    """

    def __init__(self, model: nn.Module, recompile_limit: int = RECOMPILE_LIMIT) -> None:
        # Random ops (dropout) through eager's generator: inductor's own draws other numbers and leaves the
        # global generator elsewhere (RT-DETR's denoising queries draw from it next), so a compiled run
        # would not be the eager run.  Process-wide, like --compile itself.
        import torch._inductor.config as inductor_config

        inductor_config.fallback_random = True
        self.regions = compile_regions(model)
        self.bucket = DETR_BUCKET if _is_detr(getattr(model, "model", model)) else None
        self.graphs: list[dict[str, Any]] = []  # one per graph: region, training, seconds
        self._training = False  # inside :meth:`timed_step`: the graphs compiled are training graphs
        for name, region in self.regions:
            # isolate_recompiles: every module's call is the one ``Module._call_impl`` code object, so
            # without it the regions (and other compiled modules of the process) share one limit
            region.compile(
                backend=self._backend(name or "model"),
                dynamic=False,
                recompile_limit=recompile_limit,
                isolate_recompiles=True,
            )
            if self.bucket is not None:
                region._compiled_call_impl = _PaddedCall(region._compiled_call_impl, self.bucket)
        self._compiled = {id(m): m._compiled_call_impl for _, m in self.regions}
        self._eager: dict[tuple[Any, ...] | None, list[float]] = {}  # shape -> the eager steps' seconds
        self._steady: dict[tuple[Any, ...] | None, list[float]] = {}  # shape -> compiled steps' seconds
        self._compile_steps: dict[tuple[Any, ...] | None, float] = {}  # shape -> the compiling step's seconds

    def _backend(self, region: str) -> Callable[..., Any]:
        def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
            from torch._inductor.compile_fx import compile_fx

            # dynamo's id of this compilation: (frame, its n-th compilation); a graph break's resumed
            # code is another frame, so n > 0 alone marks a recompile (a guard that failed)
            cid = torch._guards.CompileContext.current_compile_id()
            t0 = time.perf_counter()
            compiled = compile_fx(gm, example_inputs)
            self.graphs.append(
                {
                    "region": region,
                    "training": self._training,
                    "seconds": time.perf_counter() - t0,
                    "compile_id": (cid.frame_id, cid.frame_compile_id) if cid is not None else None,
                }
            )
            return compiled

        return backend

    @contextlib.contextmanager
    def eager(self) -> Iterator[None]:
        """The plain forward of every region inside the block (DETR: on the same bucket-padded batch, so
        the eager steps are steps of the run the compiled ones make)."""
        for _, m in self.regions:
            m._compiled_call_impl = (
                _PaddedCall(m._call_impl, self.bucket) if self.bucket is not None else None
            )
        try:
            yield
        finally:
            for _, m in self.regions:
                m._compiled_call_impl = self._compiled[id(m)]

    @contextlib.contextmanager
    def timed_step(self, data: Any) -> Iterator[None]:
        """One training micro-step on ``data``: eager and timed at the first step of its shape, then
        compiled (the second step compiles, the later ones are the steady state)."""
        key = input_key(data, self.bucket)
        first = len(self._eager.get(key, [])) < EAGER_STEPS
        before = len(self.graphs)
        t0 = time.perf_counter()
        self._training = True
        try:
            with self.eager() if first else contextlib.nullcontext():
                yield
        finally:
            self._training = False
        seconds = time.perf_counter() - t0
        if first:
            self._eager.setdefault(key, []).append(seconds)
        elif len(self.graphs) > before or key not in self._compile_steps:
            self._compile_steps[key] = seconds
        else:
            self._steady.setdefault(key, []).append(seconds)

    @property
    def recompiles(self) -> int:
        """Dynamo's recompilations of a frame (a new shape, train / eval): its compilations after the first.

        Graph breaks (FSDP's hooks, activation checkpointing) add graphs, not recompiles."""
        ids = {g["compile_id"] for g in self.graphs if g["compile_id"] is not None}
        return sum(1 for _, n in ids if n > 0)

    def report(self) -> dict[str, Any]:
        """JSON-safe numbers for ``report.json``: graphs, recompiles, compile seconds, step times, speed-up."""
        keys = [k for k in self._steady if k in self._eager]
        eager = sum(min(self._eager[k]) for k in keys)
        steady = sum(statistics.median(self._steady[k]) for k in keys)
        out: dict[str, Any] = {
            "regions": [n or "model" for n, _ in self.regions],
            "graphs": len(self.graphs),
            "train_graphs": sum(1 for g in self.graphs if g["training"]),
            "eval_graphs": sum(1 for g in self.graphs if not g["training"]),
            "recompiles": self.recompiles,
            "compile_seconds": round(sum(g["seconds"] for g in self.graphs), 2),
            "shapes": len(self._eager),
        }
        if self.bucket is not None:
            out["bucket"] = self.bucket
        if keys and steady > 0:
            out["eager_step_s"] = round(eager / len(keys), 5)
            out["compiled_step_s"] = round(steady / len(keys), 5)
            out["speedup"] = round(eager / steady, 3)
        return out

    def line(self) -> str:
        """The one console line: ``--compile: 3 graphs (2 recompiles) compiled in 61.2 s; ...``."""
        r = self.report()
        shapes = f", {r['shapes']} training shapes" if r["shapes"] else ""
        text = (
            f"--compile: {r['graphs']} graphs ({r['recompiles']} recompiles{shapes}) "
            f"compiled in {r['compile_seconds']:.1f} s"
        )
        if "speedup" in r:
            text += (
                f"; steady step {r['compiled_step_s'] * 1e3:.1f} ms vs {r['eager_step_s'] * 1e3:.1f} ms eager "
                f"({r['speedup']:.2f}x)"
            )
        elif r["shapes"]:
            text += "; no training shape ran twice compiled, so no steady-state speed-up"
        return text
