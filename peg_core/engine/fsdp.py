"""``--fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard``) under ``torchrun``, instead of DDP.

Every transformer block that :func:`peg_core.grad_checkpoint.transformer_blocks` finds (CPVT's and
the video ViT's blocks, DEIMv2's DINOv3 blocks, the DETR / AIFI encoder layers, the decoders'
layers) is one FSDP unit, and the root holds the rest (patch embedding, PEG, heads, CNN
backbones).  Parameters, gradients and optimizer state are sharded over the processes; a block's
parameters are all-gathered for its forward and backward only.  With ``--amp bf16`` the blocks
compute in bfloat16 through a :class:`~torch.distributed.fsdp.MixedPrecisionPolicy` (gradients are
reduced in float32).

Checkpoints stay the usual ``checkpoint.pth``: at every save the full model and optimizer state are
gathered onto rank 0 (on the CPU) and written in the same layout as a DDP run's (the optimizer's
state indexed by parameter position, as ``Optimizer.state_dict`` writes it), so a sharded run's
checkpoint is evaluated, exported, fine-tuned or resumed (with or without ``--fsdp``, with any
number of processes) like any other, and a sharded resume loads it back into the shards exactly.

What FSDP does not do that DDP does: it does not broadcast buffers at every forward (BatchNorm's
running statistics stay per process; the CNN backbones' are frozen in the published recipes).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..grad_checkpoint import transformer_blocks
from .command import UserError

__all__ = [
    "check_fsdp_args",
    "full_model_state",
    "full_optimizer_state",
    "load_full_state",
    "local_tensor",
    "no_gradient_sync",
    "shard_model",
]


def check_fsdp_args(args: argparse.Namespace, world_size: int) -> None:
    """The combinations ``--fsdp`` cannot run, refused in one line before any data is read."""
    if (getattr(args, "ema_decay", 0) or 0) > 0:
        raise UserError(
            "the weight EMA is not sharded (its average would need the full weights on every process); "
            "give --ema-decay 0",
            f"--fsdp --ema-decay {args.ema_decay}",
        )
    if getattr(args, "amp", "off") == "fp16":
        raise UserError(
            "sharded gradients are not unscaled by the fp16 GradScaler; use --amp bf16", "--fsdp --amp fp16"
        )
    if world_size < 2:
        raise UserError("shards over processes: launch with torchrun --nproc_per_node 2 or more", "--fsdp")


def _broadcast_from_rank0(model: nn.Module) -> None:
    """Rank 0's weights and buffers on every rank (each rank initialised with ``seed + rank``), as DDP does."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)


def shard_model(
    model: nn.Module, optimizer: torch.optim.Optimizer, amp_dtype: torch.dtype | None
) -> list[str]:
    """Shard ``model`` in place (its transformer blocks, then the root); returns the blocks' names.

    ``fully_shard`` replaces every parameter by a sharded one (a ``DTensor``), so the optimizer,
    built by the task before, is given the new parameters in place of the old, by name (it has
    taken no step yet: a resumed state is loaded after, by :func:`load_full_state`).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    _broadcast_from_rank0(model)
    names = {id(p): n for n, p in model.named_parameters()}
    policy = (
        MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32)
        if amp_dtype is not None
        else MixedPrecisionPolicy()
    )
    blocks = transformer_blocks(model)
    for _, block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    sharded = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [sharded[names[id(p)]] for p in group["params"]]
    return [n for n, _ in blocks]


def local_tensor(t: Tensor) -> Tensor:
    """This process's shard of a sharded tensor (a ``DTensor``), else ``t``."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


@contextlib.contextmanager
def no_gradient_sync(model: nn.Module) -> Iterator[None]:
    """The micro-batches of ``--grad-accum-steps`` before the last: gradients accumulate unreduced
    (FSDP2's ``set_requires_gradient_sync``, DDP's ``no_sync``)."""
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module) -> dict[str, Tensor]:
    """The full state dict of a sharded model on rank 0 (CPU tensors), ``{}`` on the others; every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options())


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of every parameter of ``optimizer``, in its state dict's (group, position) order."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The full optimizer state on rank 0 in ``Optimizer.state_dict``'s layout (``{}`` on the others).

    ``get_optimizer_state_dict`` keys the state by parameter name; it is re-keyed by position so
    that the checkpoint is the one a DDP run writes.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    by_name = get_optimizer_state_dict(model, optimizer, options=_options())
    if not by_name:
        return {}
    index = {n: i for i, n in enumerate(_param_names(model, optimizer))}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in by_name["param_groups"]]
    return {"state": {index[n]: s for n, s in by_name["state"].items()}, "param_groups": groups}


def load_full_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_state: Mapping[str, Tensor],
    optimizer_state: Mapping[str, Any] | None,
    source: Any,
) -> None:
    """A full (``checkpoint.pth``) model and optimizer state into a sharded model's shards; every rank calls it."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    try:
        set_model_state_dict(model, dict(model_state), options=_options())
    except (RuntimeError, KeyError, ValueError) as e:
        raise UserError(
            f"checkpoint's model does not fit this run ({' '.join(str(e).split())[:300]})", source
        ) from None
    if optimizer is None or not optimizer_state:
        return
    names = _param_names(model, optimizer)
    try:
        by_name = {
            "state": {names[int(i)]: s for i, s in optimizer_state["state"].items()},
            "param_groups": [
                {**g, "params": [names[int(i)] for i in g["params"]]} for g in optimizer_state["param_groups"]
            ],
        }
        set_optimizer_state_dict(model, optimizer, by_name, options=_options())
    except (RuntimeError, KeyError, ValueError, IndexError, TypeError) as e:
        raise UserError(f"checkpoint's optimizer state does not fit this run ({e})", source) from None
