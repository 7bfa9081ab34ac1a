"""The training and evaluation engine shared by classify, detect and video.

A task supplies only what is specific to it, in a :class:`TrainParts` (model,
optimizer, data, one ``step`` that returns the loss, ``evaluate``) or an
:class:`EvalParts`; :func:`fit` and :func:`evaluate_checkpoint` do the rest:

* process group under ``torchrun`` (one node or many), device checks, seeding;
* ``--resume auto|PATH``: model, optimizer, scheduler, AMP scaler, epoch, step and
  every rank's RNG, so a resumed run continues exactly; the previous checkpoint
  when the newest is unreadable;
* DDP wrapping, one AMP path (``torch.autocast`` + ``GradScaler``, both disabled
  by ``--amp off`` or on CPU), gradient clipping, a NaN/inf stop that keeps the
  last good checkpoint (exit code 3): a non-finite loss, a :class:`~peg_core.errors.NonFiniteError`
  raised in the step (the DETR matcher's NaN/inf cost), non-finite weights at the end of an epoch or
  NaN/inf predictions or metrics in the evaluation after it;
* ``--grad-accum-steps N``: N micro-batches per optimizer step (:mod:`.accum`);
* ``--grad-checkpointing``: the transformer blocks' activations recomputed in the backward
  (:mod:`peg_core.grad_checkpoint`);
* ``--early-stopping-patience N``: a stop after N evaluations without a better ``monitor`` metric,
  the best evaluation's checkpoint kept as ``checkpoint_best.pth``;
* an atomic ``checkpoint.pth`` every epoch, JSONL + TensorBoard logs, progress;
* broken samples skipped, counted and listed in ``report.json``, with a stop
  above ``--max-broken``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from ..errors import NonFiniteError
from ..grad_checkpoint import enable_grad_checkpointing
from .accum import Micro, accum_steps, split_batch
from .broken import BrokenLog, SampleBatch
from .checkpoint import (
    BEST_NAME,
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    CheckpointStore,
    capture_rng_state,
    load_model_state,
    read_checkpoint,
    remove_stale_temp_files,
    restore_rank_rng,
)
from .cli import json_safe
from .command import TrainingDiverged, UserError
from .compile import CompiledModel
from .distributed import (
    DistInfo,
    all_gather_object,
    barrier,
    cleanup_distributed,
    init_distributed,
    reduce_mean,
    seed_everything,
)
from .flag_checks import refuse_changed_on_resume, refuse_resume_changes
from .fsdp import (
    check_fsdp_args,
    full_model_state,
    full_optimizer_state,
    load_full_state,
    local_tensor,
    no_gradient_sync,
    shard_model,
)
from .metric_log import MetricLogger
from .outputs import REPORT_NAME, check_output_folder, check_run_folder, clear_run_files, ensure_writable
from .progress import Progress, epoch_line
from .recipes import check_recipe_args, size_for_step, uses_sizes

__all__ = [
    "EvalParts",
    "RunContext",
    "StepOutput",
    "Task",
    "TrainParts",
    "ensure_writable",
    "eval_output_dir",
    "evaluate_checkpoint",
    "fit",
    "write_json",
]

#: ``eval``'s default output folder, beside the checkpoint (the training run's report stays)
EVAL_DIR_NAME = "eval"
#: ``--amp`` values -> autocast dtype (CUDA only; CPU autocast is slower here)
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class StepOutput:
    """What a task's ``step`` returns: the loss to back-propagate and scalars to log (rank-averaged)."""

    loss: Tensor
    logs: Mapping[str, Tensor | float] = field(default_factory=dict)


@dataclass
class TrainParts:
    """Everything task-specific that :func:`fit` needs.

    Attributes:
        model: the bare model (the engine wraps it in DDP and moves nothing: put it on ``ctx.device``).
        optimizer: its optimizer.
        train_loader: yields :class:`~peg_core.engine.broken.SampleBatch` (or plain batches).
        train_size: samples in the training split (for ``--max-broken``).
        step: ``step(model, data, ctx) -> StepOutput``; runs the forward under ``ctx.autocast()``.
        evaluate: ``evaluate(model, ctx) -> dict`` of JSON-safe metrics (merged over ranks).
        scheduler: stepped every epoch or every step (``scheduler_interval``).
        model_config: JSON-safe keywords that rebuild the model (stored in the checkpoint).
        meta: JSON-safe task data for the checkpoint (class names, categories, ...).
        on_epoch_start: called with the epoch before it runs (samplers, data sets).
        summary: one-line text of the metrics of ``evaluate`` for the console.
        resize_batch: ``resize_batch(batch, size) -> batch`` shows a batch at input side ``size``;
            needed by ``--train-sizes`` / ``--progressive-sizes`` (see :mod:`.recipes`).
        monitor: the metric of ``evaluate`` (higher is better) that ``--early-stopping-patience`` watches.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    train_loader: Iterable[Any]
    train_size: int
    step: Callable[[nn.Module, Any, RunContext], StepOutput]
    evaluate: Callable[[nn.Module, RunContext], dict[str, Any]] | None = None
    scheduler: Any = None
    scheduler_interval: str = "epoch"
    model_config: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    on_epoch_start: Callable[[int], None] | None = None
    summary: Callable[[dict[str, Any]], str] | None = None
    resize_batch: Callable[[Any, int], Any] | None = None
    #: the key of ``evaluate``'s metrics that ``--early-stopping-patience`` watches (higher is better)
    monitor: str | None = None


@dataclass
class EvalParts:
    """What :func:`evaluate_checkpoint` needs: the loaded model and its evaluation."""

    model: nn.Module
    evaluate: Callable[[nn.Module, RunContext], dict[str, Any]]
    summary: Callable[[dict[str, Any]], str] | None = None


class Task(Protocol):
    """A task package's hooks: its name (stored in checkpoints) and how to set up a run."""

    name: str

    def setup_train(
        self, args: argparse.Namespace, ctx: RunContext, ckpt: dict[str, Any] | None
    ) -> TrainParts: ...

    def setup_eval(self, args: argparse.Namespace, ctx: RunContext, ckpt: dict[str, Any]) -> EvalParts: ...


class RunContext:
    """Per-run state handed to the task: device, ranks, AMP, progress and broken-sample logs.

    Made by :func:`fit` / :func:`evaluate_checkpoint` (or directly, for a task's own tests).
    """

    def __init__(
        self,
        dist: DistInfo,
        out_dir: Path,
        amp: str = "off",
        show_progress: bool = True,
        max_broken: float = 0.01,
        args: argparse.Namespace | None = None,
    ) -> None:
        self.dist = dist
        self.device = dist.device
        self.out_dir = Path(out_dir)
        self.amp = "off" if amp in ("off", "none") or self.device.type != "cuda" else amp
        self.requested_amp = amp
        self.show_progress = show_progress and dist.rank == 0
        self.max_broken = max_broken
        self.args = args
        self.broken: dict[str, BrokenLog] = {}
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp == "fp16")
        #: the micro-batch being run under ``--grad-accum-steps`` (:class:`~.accum.Micro`); None otherwise
        self.micro: Micro | None = None

    @property
    def is_main(self) -> bool:
        return self.dist.rank == 0

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward pass's autocast (a no-op for ``--amp off`` and on CPU)."""
        if self.amp == "off":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=AMP_DTYPES[self.amp])

    def print(self, *msg: Any) -> None:
        """Print on the main process only."""
        if self.is_main:
            print(*msg, flush=True)

    def batches(self, loader: Iterable[Any], split: str, total: int, desc: str = "") -> BatchStream:
        """Iterate ``loader``: yields the usable data of each batch, logs broken samples under ``split``."""
        log = self.broken.setdefault(split, BrokenLog(split, total, self.max_broken))
        return BatchStream(loader, log, Progress(loader, desc=desc or split, enable=self.show_progress))


class BatchStream:
    """Iterator over a loader's usable batches (see :meth:`RunContext.batches`).

    After the last batch the broken samples of every rank are merged and checked
    (all ranks reach that point together, so the check never hangs DDP).
    """

    def __init__(self, loader: Iterable[Any], log: BrokenLog, bar: Progress) -> None:
        self.loader = loader
        self.log = log
        self.bar = bar
        self.used = 0

    def set_postfix(self, **values: Any) -> None:
        self.bar.set_postfix(**values)

    def __iter__(self) -> Iterator[Any]:
        local: dict[str, str] = {}
        for batch in self.bar:
            if isinstance(batch, SampleBatch):
                for path, reason in batch.broken:
                    local.setdefault(path, reason)
                if batch.data is None:
                    continue
                batch = batch.data
            self.used += 1
            yield batch
        parts = all_gather_object((local, self.used))
        self.log.merge([p for p, _ in parts])
        self.log.check(nothing_read=sum(n for _, n in parts) == 0)


# ------------------------------------------------------------------------------------------ set-up


def _check_device(device: str) -> None:
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserError("CUDA is not available on this machine (torch.cuda.is_available() is False)",
                            f"--device {device}")  # fmt: skip
        index = device.partition(":")[2]
        if index and int(index) >= torch.cuda.device_count():
            raise UserError(f"only {torch.cuda.device_count()} CUDA devices", f"--device {device}")


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON through a temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def _start(args: argparse.Namespace, out_dir: Path) -> RunContext:
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    device = getattr(args, "device", "auto")
    _check_device(device)
    if int(os.environ.get("RANK", "0")) == 0:
        ensure_writable(out_dir)
    dist = init_distributed(device)
    return RunContext(
        dist,
        out_dir,
        amp=getattr(args, "amp", "off"),
        show_progress=getattr(args, "progress", True),
        max_broken=getattr(args, "max_broken", 0.01),
        args=args,
    )


# -------------------------------------------------------------------------------------------- fit


def fit(task: Task, args: argparse.Namespace) -> dict[str, Any]:
    """Train ``task`` as ``args`` say; returns the run's report (also written to ``report.json``)."""
    out = Path(args.output_dir)
    # before any work: a new run never replaces another run's checkpoints or another command's report
    check_run_folder(
        out, resume=bool(getattr(args, "resume", None)), overwrite=bool(getattr(args, "overwrite", False))
    )
    ctx = _start(args, out)
    try:
        return _Fit(task, args, ctx).run()
    finally:
        cleanup_distributed()


class _Fit:
    """One training run: set-up from the task and the checkpoint, the epochs, the report."""

    def __init__(self, task: Task, args: argparse.Namespace, ctx: RunContext) -> None:
        self.task, self.args, self.ctx = task, args, ctx
        self.out = ctx.out_dir
        self.store = CheckpointStore(self.out, task.name)
        self.t0 = time.time()

    def _resume(self) -> tuple[dict[str, Any] | None, Path | None]:
        resume = getattr(self.args, "resume", None)
        if not resume:
            return None, None
        if resume == "auto":
            ckpt, path = self.store.find_resume(log=self.ctx.print)
            if ckpt is None:
                self.ctx.print(f"--resume auto: no checkpoint in {self.out}; starting from scratch")
            return ckpt, path
        return read_checkpoint(resume, self.task.name), Path(resume)

    def run(self) -> dict[str, Any]:
        ctx, args = self.ctx, self.args
        if ctx.is_main:
            for f in remove_stale_temp_files(self.out):
                print(f"removed {f.name}, left by a run stopped while saving", flush=True)
        if ctx.requested_amp not in ("off", "none") and ctx.amp == "off":
            ctx.print(f"--amp {ctx.requested_amp} applies on CUDA only; running in float32 on {ctx.device}")
        check_recipe_args(args)
        #: --fsdp: FSDP2 shards instead of DDP (:mod:`.fsdp`)
        self.fsdp = bool(getattr(args, "fsdp", False))
        if self.fsdp:
            check_fsdp_args(args, ctx.dist.world_size)
        patience = getattr(args, "early_stopping_patience", 0) or 0
        if patience and getattr(args, "eval_every", 1) == 0:
            raise UserError("needs evaluations during training; give --eval-every N (0 evaluates at the end only)",
                            f"--early-stopping-patience {patience}")  # fmt: skip
        seed_everything(args.seed, ctx.dist.rank)
        ckpt, ckpt_path = self._resume()
        refuse_resume_changes(args, ckpt)  # --layer-decay: the checkpoint's optimiser groups
        if ckpt is not None:  # the schedule's and the data order's steps are optimizer steps
            saved = ckpt.get("args") if isinstance(ckpt.get("args"), Mapping) else {}
            refuse_changed_on_resume(
                "grad_accum_steps", int(saved.get("grad_accum_steps") or 1), accum_steps(args)
            )
        parts = self.task.setup_train(args, ctx, ckpt)
        self.parts = parts
        if getattr(args, "grad_checkpointing", False):
            blocks = enable_grad_checkpointing(parts.model)
            if not blocks:
                raise UserError(f"task {self.task.name!r}'s model has no transformer blocks to checkpoint",
                                "--grad-checkpointing")  # fmt: skip
            ctx.print(f"--grad-checkpointing: {len(blocks)} transformer blocks recompute their activations "
                      "in the backward")  # fmt: skip
        if self.fsdp:
            sharded = shard_model(parts.model, parts.optimizer, AMP_DTYPES.get(ctx.amp))
            ctx.print(f"--fsdp: {len(sharded)} transformer blocks and the root sharded over "
                      f"{ctx.dist.world_size} processes")  # fmt: skip
        if uses_sizes(args) and parts.resize_batch is None:
            raise UserError(f"task {self.task.name!r} does not resize batches",
                            "--train-sizes / --progressive-sizes")  # fmt: skip
        if patience and (parts.evaluate is None or parts.monitor is None):
            what = (
                "a validation set"
                if parts.evaluate is None
                else f"a validation metric of task {self.task.name!r}"
            )
            raise UserError(f"needs {what} to watch", f"--early-stopping-patience {patience}")
        #: --early-stopping-patience: the best value of the monitored metric, its epoch, evaluations since
        self.early: dict[str, Any] = {"metric": parts.monitor, "best": None, "epoch": None, "bad": 0}
        start_epoch, step, metrics = 0, 0, {}
        if ckpt is not None:
            start_epoch, step, metrics = self._restore(ckpt, ckpt_path)
            if isinstance(ckpt.get("early_stopping"), Mapping):
                self.early.update(ckpt["early_stopping"])
        self.epochs_done = start_epoch
        net: nn.Module = parts.model
        #: --compile: the model's regions compiled in place, before DDP wraps it
        self.compiled = CompiledModel(parts.model) if getattr(args, "compile", False) else None
        if ctx.dist.distributed and not self.fsdp:
            net = nn.parallel.DistributedDataParallel(
                parts.model,
                device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                find_unused_parameters=getattr(args, "find_unused_parameters", False),
            )
        if ctx.is_main:
            if getattr(args, "overwrite", False) and ckpt is None:
                # --overwrite starts a new run: the earlier run's checkpoints (which --resume auto could
                # fall back to) and its appended log go, now that the data and the model are ready
                for f in clear_run_files(self.out):
                    print(f"--overwrite: removed the earlier run's {f.relative_to(self.out)}", flush=True)
            write_json(self.out / "args.json", json_safe(args))
        logger = MetricLogger(self.out, enabled=ctx.is_main)
        epochs = args.epochs
        train_stats: dict[str, float] = {}
        status = "finished"
        if start_epoch >= epochs:
            ctx.print(f"already trained for {start_epoch} of {epochs} epochs ({ckpt_path}); nothing to do")
        elif patience and self.early["bad"] >= patience:
            ctx.print(f"{self._early_line(patience)} ({ckpt_path}); nothing to do")
            start_epoch, status = epochs, "early_stopped"
        try:
            for epoch in range(start_epoch, epochs):
                if parts.on_epoch_start is not None:
                    parts.on_epoch_start(epoch)
                started = time.time()
                train_stats, step = self._train_epoch(net, epoch, step, logger)
                lr = max(float(g["lr"]) for g in parts.optimizer.param_groups)  # the epoch's, the head's
                self._check_finite_weights(step, epoch)
                if parts.scheduler is not None and parts.scheduler_interval == "epoch":
                    parts.scheduler.step()
                logger.log(epoch, "train", **train_stats, lr=parts.optimizer.param_groups[0]["lr"])
                # the total loss, its main terms, lr and time; every term is in the metrics log above
                ctx.print(epoch_line(epoch + 1, epochs, train_stats, lr, time.time() - started))
                last = epoch + 1 == epochs
                every = getattr(args, "eval_every", 1)
                improved = False
                if parts.evaluate is not None and (last or (every > 0 and (epoch + 1) % every == 0)):
                    try:
                        metrics = _evaluate_finite(parts.evaluate, parts.model, ctx)
                    except NonFiniteError as e:  # finite weights whose predictions overflow
                        raise TrainingDiverged(
                            self._diverged_message(f"{e} in the evaluation", step, epoch)
                        ) from None
                    self._log_metrics(logger, epoch, metrics)
                    if parts.summary is not None:
                        ctx.print(f"epoch {epoch + 1}/{epochs}: {parts.summary(metrics)}")
                    improved = patience > 0 and self._watch(metrics, epoch)
                self._save(epoch, step, metrics, best=improved)
                self.epochs_done = epoch + 1
                if patience and self.early["bad"] >= patience and not last:
                    ctx.print(self._early_line(patience))
                    status = "early_stopped"
                    break
                stop_after = getattr(args, "stop_after_epoch", None)
                if stop_after is not None and epoch + 1 >= stop_after and not last:
                    ctx.print(
                        f"stopping after epoch {epoch + 1} (--stop-after-epoch); continue with --resume auto"
                    )
                    status = "stopped"
                    break
        except TrainingDiverged as e:
            logger.log(step, "error", message=str(e))
            raise
        finally:
            logger.close()
        report = self._report(status, step, train_stats, metrics)
        if self.compiled is not None:
            report["compile"] = self.compiled.report()
            ctx.print(self.compiled.line())
        if ctx.is_main:
            write_json(self.out / REPORT_NAME, report)
        return report

    def _restore(self, ckpt: dict[str, Any], path: Path | None) -> tuple[int, int, dict[str, Any]]:
        parts, ctx = self.parts, self.ctx
        if self.fsdp:  # the full state into this process's shards
            load_full_state(parts.model, parts.optimizer, ckpt["model"], ckpt["optimizer"], path)
        else:
            load_model_state(parts.model, ckpt["model"], path)
        try:
            if not self.fsdp:
                parts.optimizer.load_state_dict(ckpt["optimizer"])
            if parts.scheduler is not None and ckpt.get("scheduler") is not None:
                parts.scheduler.load_state_dict(ckpt["scheduler"])
            if ckpt.get("scaler"):
                ctx.scaler.load_state_dict(ckpt["scaler"])
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(f"checkpoint's optimizer state does not fit this run ({e})", path) from None
        epoch = int(ckpt["epoch"]) + 1
        if not restore_rank_rng(ckpt, ctx.dist.rank, ctx.dist.world_size):
            # Another world size: the run stays reproducible, if not bit-identical.
            seed_everything(self.args.seed + epoch, ctx.dist.rank)
        ctx.print(f"resumed from {path} (epoch {epoch}, step {ckpt.get('step', 0)})")
        return epoch, int(ckpt.get("step", 0)), dict(ckpt.get("metrics") or {})

    def _train_epoch(
        self, net: nn.Module, epoch: int, step: int, logger: MetricLogger
    ) -> tuple[dict[str, float], int]:
        parts, ctx, args = self.parts, self.ctx, self.args
        clip = getattr(args, "clip_max_norm", 0.0) or 0.0
        net.train()
        sums: dict[str, float] = {}
        steps = 0
        stream = ctx.batches(
            parts.train_loader, "train", parts.train_size, desc=f"epoch {epoch + 1}/{args.epochs}"
        )
        drawn: list[int] = []
        accum = accum_steps(args)
        for data in stream:
            # Drawn from (seed, epoch, step) alone: every rank and a resumed run see the same size;
            # one size per optimizer step, whatever --grad-accum-steps.
            size = size_for_step(args, epoch, step)
            if size is not None and parts.resize_batch is not None:
                drawn.append(size)
            micros = [(data, 0)] if accum == 1 else split_batch(data, accum)
            total = sum(n for _, n in micros)
            local: Tensor | None = None
            parts.optimizer.zero_grad(set_to_none=True)
            for index, (micro, n) in enumerate(micros):
                share = 1.0 if accum == 1 else n / total
                ctx.micro = None if accum == 1 else Micro(index, len(micros), share, data)
                if size is not None and parts.resize_batch is not None:
                    micro = parts.resize_batch(micro, size)
                last_micro = index + 1 == len(micros)
                # DDP: the gradients are averaged over processes once, at the step's last micro-batch
                sync = contextlib.nullcontext() if last_micro else self._no_sync(net)
                timed = self.compiled.timed_step(micro) if self.compiled else contextlib.nullcontext()
                with sync, timed:
                    try:
                        out = parts.step(net, micro, ctx)
                    except NonFiniteError as e:
                        # NaN/inf predictions met inside the step (the DETR matcher), before any loss.  Weights
                        # are the same on every rank, so a diverged model raises this on all ranks at this step.
                        raise TrainingDiverged(self._diverged_message(str(e), step + 1, epoch)) from None
                    finally:
                        ctx.micro = None
                    names = ["loss", *out.logs]
                    values = torch.stack(
                        [out.loss.detach().float().to(ctx.device)]
                        + [
                            torch.as_tensor(v, dtype=torch.float32, device=ctx.device).detach().reshape(())
                            for v in out.logs.values()
                        ]
                    )
                    # the step's values are the share-weighted sums of the micro-batches': the large batch's
                    local = values * share if local is None else local + values * share
                    loss = out.loss if accum == 1 else out.loss * share
                    ctx.scaler.scale(loss).backward()
            assert local is not None
            # One collective for every logged value; the loss check uses the rank mean so all ranks stop together.
            means = reduce_mean(local).tolist()
            if not math.isfinite(means[0]):
                parts.optimizer.zero_grad(set_to_none=True)
                raise TrainingDiverged(self._diverged_message(f"loss is {means[0]}", step + 1, epoch))
            if clip > 0:
                ctx.scaler.unscale_(parts.optimizer)
                nn.utils.clip_grad_norm_(net.parameters(), clip)
            ctx.scaler.step(parts.optimizer)
            ctx.scaler.update()
            if parts.scheduler is not None and parts.scheduler_interval == "step":
                parts.scheduler.step()
            step += 1
            steps += 1
            for k, v in zip(names, means):
                sums[k] = sums.get(k, 0.0) + v
            stream.set_postfix(loss=f"{means[0]:.3f}")
            if step % 10 == 0:
                logger.log(step, "train_step", loss=means[0], lr=parts.optimizer.param_groups[0]["lr"])
        stats = {k: v / max(steps, 1) for k, v in sums.items()}
        stats["steps"] = steps
        stats["broken"] = ctx.broken["train"].count
        if drawn:  # the input size of the epoch (progressive) or the mean of the drawn ones
            stats["size"] = drawn[0] if len(set(drawn)) == 1 else sum(drawn) / len(drawn)
        return stats, step

    def _no_sync(self, net: nn.Module) -> contextlib.AbstractContextManager:
        """A micro-batch before the step's last: gradients accumulate without a reduction over processes."""
        if self.fsdp:
            return no_gradient_sync(net)
        return net.no_sync() if hasattr(net, "no_sync") else contextlib.nullcontext()

    def _watch(self, metrics: Mapping[str, Any], epoch: int) -> bool:
        """Count an evaluation for ``--early-stopping-patience``; True when it is the best so far."""
        key = self.early["metric"]
        value = metrics.get(key)
        if not isinstance(value, int | float):
            raise UserError(f"the evaluation gave no number {key!r} to watch", "--early-stopping-patience")
        best = self.early["best"]
        if best is None or value > best:
            self.early.update(best=float(value), epoch=epoch, bad=0)
            return True
        self.early["bad"] += 1
        return False

    def _early_line(self, patience: int) -> str:
        e = self.early
        return (
            f"early stopping: val {e['metric']} has not improved for {patience} evaluations "
            f"(--early-stopping-patience {patience}); the best, {e['best']:.4f} at epoch {e['epoch'] + 1}, "
            f"is {self.out / BEST_NAME}"
        )

    def _diverged_message(self, what: str, step: int, epoch: int) -> str:
        """The NaN policy's line: ``<what> at step S (epoch E); training stopped and <checkpoint kept>: <advice>``."""
        kept = self.store.path
        where = f"the last good checkpoint is {kept}" if kept.is_file() else "no checkpoint was written yet"
        return (
            f"{what} at step {step} (epoch {epoch + 1}); training stopped and {where}: "
            "lower the learning rate or check the data, then resume with --resume auto"
        )

    def _check_finite_weights(self, step: int, epoch: int) -> None:
        """Stop before evaluating or saving an epoch whose last optimiser step left NaN/inf weights.

        The loss check runs before each update, so the update of an epoch's last step is seen by
        nothing else: without this check such weights would be evaluated and saved over the last
        good checkpoint.  One device-to-host read per epoch; the flag is summed over ranks (buffers,
        e.g. batch-norm statistics, may differ between them) so that every rank stops together.
        """
        tensors = [  # --fsdp: this process's shards (the flag is summed over processes)
            local_tensor(t)
            for t in (*self.parts.model.parameters(), *self.parts.model.buffers())
            if t.is_floating_point()
        ]
        if not tensors:
            return
        bad = torch.stack([~torch.isfinite(t.detach()).all() for t in tensors]).any().float()
        if float(reduce_mean(bad.to(self.ctx.device))) > 0:
            raise TrainingDiverged(self._diverged_message("the weights are not finite", step, epoch))

    def _log_metrics(
        self, logger: MetricLogger, epoch: int, metrics: Mapping[str, Any], tag: str = "val"
    ) -> None:
        """Numbers under ``tag``; nested mappings under ``tag_key`` (e.g. ``val_sizes_800``)."""
        flat = {k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        if flat:
            logger.log(epoch, tag, **flat)
        for key, value in metrics.items():
            if isinstance(value, Mapping):
                self._log_metrics(logger, epoch, value, f"{tag}_{key}")

    def _save(self, epoch: int, step: int, metrics: dict[str, Any], best: bool = False) -> None:
        parts, ctx, args = self.parts, self.ctx, self.args
        rng_per_rank = all_gather_object(capture_rng_state())  # every rank's RNG, for an exact resume
        # --fsdp: every process takes part in gathering the full states onto rank 0
        model_state = full_model_state(parts.model) if self.fsdp else None
        optimizer_state = full_optimizer_state(parts.model, parts.optimizer) if self.fsdp else None
        if ctx.is_main:
            state = {
                "format": CHECKPOINT_FORMAT,
                "task": self.task.name,
                "model": model_state if model_state is not None else parts.model.state_dict(),
                "model_config": parts.model_config,
                "meta": parts.meta,
                "optimizer": optimizer_state if optimizer_state is not None else parts.optimizer.state_dict(),
                "scheduler": parts.scheduler.state_dict() if parts.scheduler is not None else None,
                "scaler": ctx.scaler.state_dict(),
                "epoch": epoch,
                "step": step,
                "args": json_safe(args),
                "metrics": _json_roundtrip(metrics),
                "rng_per_rank": rng_per_rank,
                "early_stopping": dict(self.early),
            }
            every = getattr(args, "save_every", 0)
            copy = f"checkpoint{epoch:04d}.pth" if every and (epoch + 1) % every == 0 else None
            self.store.save(state, keep_copy=copy, best=best)
        barrier()

    def _report(
        self, status: str, step: int, train: dict[str, Any], metrics: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "task": self.task.name,
            "command": "train",
            "status": status,
            "epochs": self.args.epochs,
            "epochs_done": self.epochs_done,
            "steps": step,
            "seconds": round(time.time() - self.t0, 1),
            "train": train,
            "eval": metrics,
            "broken": {name: log.report() for name, log in self.ctx.broken.items()},
            "checkpoint": str(self.out / CHECKPOINT_NAME),
            "output_dir": str(self.out),
            **(
                {"best": {**self.early, "checkpoint": str(self.out / BEST_NAME)}}
                if getattr(self.args, "early_stopping_patience", 0)
                else {}
            ),
        }


def _non_finite_metric(metrics: Mapping[str, Any], prefix: str = "") -> tuple[str, float] | None:
    """The first ``(dotted key, value)`` of ``metrics`` (nested mappings too) that is a NaN/inf float."""
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            found = _non_finite_metric(value, f"{prefix}{key}.")
            if found is not None:
                return found
        elif isinstance(value, float) and not math.isfinite(value):
            return f"{prefix}{key}", value
    return None


def _evaluate_finite(
    evaluate: Callable[[nn.Module, RunContext], dict[str, Any]], model: nn.Module, ctx: RunContext
) -> dict[str, Any]:
    """``evaluate(model, ctx)``; a NaN/inf metric (a validation loss, an accuracy of NaN logits) is a
    :class:`~peg_core.errors.NonFiniteError`, like one the evaluation raises itself.

    A split where nothing could be read is an error before this point (:class:`BatchStream`), so a
    non-finite number here means the model's outputs are not finite; the metrics are the same on
    every rank, so every rank raises.
    """
    metrics = evaluate(model, ctx)
    found = _non_finite_metric(metrics)
    if found is not None:
        raise NonFiniteError(f"the metric {found[0]!r} is {found[1]}")
    return metrics


def _json_roundtrip(obj: Any) -> Any:
    """Metrics as plain JSON types (keys as strings), safe for ``weights_only`` loading."""
    return json.loads(json.dumps(obj, default=str))


# --------------------------------------------------------------------------------------- evaluate


def eval_output_dir(checkpoint: Path, output_dir: str | os.PathLike | None, overwrite: bool = False) -> Path:
    """Where ``eval`` writes its ``report.json``: ``--output-dir``, by default ``<checkpoint folder>/eval``.

    The training run's ``report.json`` sits beside its checkpoint, so ``eval`` never writes
    there by default; an ``--output-dir`` whose ``report.json`` is not an earlier eval's (a
    training report, ``predict``'s, a file of someone else) is refused rather than overwritten,
    unless ``overwrite`` (:func:`~peg_core.engine.outputs.check_output_folder`).
    """
    default = checkpoint.parent / EVAL_DIR_NAME
    out = Path(output_dir) if output_dir else default
    hint = f", or choose another folder (default: {default})"
    return check_output_folder(
        out, [REPORT_NAME], command="eval", inputs=[checkpoint], overwrite=overwrite, hint=hint, create=False
    )


def evaluate_checkpoint(task: Task, args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate ``args.checkpoint``; returns the report (also written to OUTPUT_DIR/report.json).

    OUTPUT_DIR is ``--output-dir``, by default ``eval/`` beside the checkpoint
    (:func:`eval_output_dir`: a training report is never overwritten).  The output folder is
    checked before the checkpoint is read, so an unwritable folder fails in a second, not after
    the whole evaluation.
    """
    ckpt_path = Path(args.checkpoint)
    out = eval_output_dir(ckpt_path, getattr(args, "output_dir", None), getattr(args, "overwrite", False))
    args.output_dir = out
    t0 = time.time()
    ctx = _start(args, out)
    try:
        # A task may read other files too (classify: quantized .pt2 models).
        reader = getattr(task, "read_checkpoint", None)
        ckpt = reader(ckpt_path) if reader is not None else read_checkpoint(ckpt_path, task.name)
        parts = task.setup_eval(args, ctx, ckpt)
        parts.model.eval()
        compiled = CompiledModel(parts.model) if getattr(args, "compile", False) else None
        try:
            metrics = _evaluate_finite(parts.evaluate, parts.model, ctx)
        except NonFiniteError as e:  # a diverged run's weights: nothing to score
            raise UserError(f"{e}; the checkpoint's weights are not usable", ckpt_path) from None
        report = {
            "task": task.name,
            "command": "eval",
            "status": "finished",
            "checkpoint": str(ckpt_path),
            "epoch": ckpt.get("epoch"),
            "seconds": round(time.time() - t0, 1),
            "eval": _json_roundtrip(metrics),
            "broken": {name: log.report() for name, log in ctx.broken.items()},
            "output_dir": str(out),
            "report": str(out / REPORT_NAME),
        }
        if compiled is not None:
            report["compile"] = compiled.report()
            ctx.print(compiled.line())
        if ctx.is_main:
            write_json(out / REPORT_NAME, report)
            if parts.summary is not None:
                print(parts.summary(metrics), flush=True)
        return report
    finally:
        cleanup_distributed()
