"""Memory budgets before work: the largest tensor a size would allocate, refused when it cannot fit.

A verb that builds an attention bias, a position table or a clip from a size the user gives
(``eval --eval-sizes``, ``predict --size``, ``--num-frames`` / ``--crop``, ...) runs the model's
forward once on *fake* tensors (:class:`torch._subclasses.fake_tensor.FakeTensorMode`: shapes
and dtypes only, no memory, no arithmetic) at that size and records the largest tensor any
operation would return (:func:`largest_tensor`).  When it exceeds the limit, :func:`check_memory`
raises a :class:`~.command.UserError` naming the flag, the size and the bytes, before any data is
read: ``error: a (1, 6, 65537, 65537) float32 tensor of 103.1 GB would not fit the memory limit of
31.3 GB (the machine's memory; --max-memory to change): --eval-sizes 4096``.

The limit is ``--max-memory`` (``16G``, ``512M``, ``2.5GiB``, a number of bytes), by default the
machine's memory: the device's total memory on CUDA, the physical memory on the CPU.  A forward
that cannot run on fake tensors (a data-dependent branch) is not checked (``largest_tensor`` is None).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..models.layers import Attention
from .command import UserError

__all__ = ["Largest", "add_max_memory_arg", "check_memory", "default_memory_limit", "human_bytes", "largest_tensor",
           "memory_bytes", "memory_limit"]  # fmt: skip

_UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}  # fmt: skip


def memory_bytes(text: str) -> int:
    """argparse type of ``--max-memory``: ``16G`` / ``16GB`` (10^9), ``16GiB`` (2^30), ``512M``, a byte count."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]i?)?b?\s*", text, re.IGNORECASE)
    if m is None:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r} (e.g. 16G, 512MiB, 2000000000)")
    value = float(m.group(1)) * _UNITS[(m.group(2) or "").upper()]
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return int(value)


def human_bytes(n: float) -> str:
    """``275.0 GB`` (powers of 1000, as the units of :func:`memory_bytes`)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def add_max_memory_arg(group: argparse._ActionsContainer) -> None:
    """``--max-memory SIZE``: the limit of :func:`check_memory`."""
    group.add_argument(
        "--max-memory",
        type=memory_bytes,
        metavar="SIZE",
        help="refuse, before any work, a size whose largest tensor exceeds this (16G, 512MiB, bytes; "
        "default: the machine's memory, the GPU's on CUDA)",
    )


def default_memory_limit(device: torch.device | str | None = None) -> int:
    """The device's total memory on CUDA, else the machine's physical memory."""
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # not POSIX: no default check
        return 2**63


def memory_limit(
    args: argparse.Namespace | None, device: torch.device | str | None = None
) -> tuple[int, str]:
    """``(bytes, where it comes from)``: ``--max-memory`` or :func:`default_memory_limit`."""
    given = getattr(args, "max_memory", None) if args is not None else None
    if given:
        return int(given), f"--max-memory {human_bytes(given)}"
    return default_memory_limit(device), "the machine's memory; --max-memory to change"


class Largest:
    """The largest tensor a dry run saw: ``nbytes``, ``shape``, ``dtype``."""

    def __init__(self) -> None:
        self.nbytes, self.shape, self.dtype = 0, (), torch.float32

    def see(self, t: Tensor) -> None:
        nbytes = t.numel() * t.element_size()
        if nbytes > self.nbytes:
            self.nbytes, self.shape, self.dtype = nbytes, tuple(t.shape), t.dtype

    def describe(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"a {self.shape} {dtype} tensor of {human_bytes(self.nbytes)}"


def largest_tensor(
    fn: Callable[..., Any], *shapes: Any, device: torch.device | str = "cpu"
) -> Largest | None:
    """The largest tensor ``fn(*inputs)`` allocates, found on fake tensors (no memory used); None when unknown.

    ``shapes``: one entry per positional input, a shape tuple (a float32 tensor of zeros) or a
    callable that builds the input from ``torch.zeros`` (called under the fake mode).  Runs under
    ``torch.no_grad()``, a module ``fn`` in eval mode (its mode is restored: no batch-norm statistics
    move); any exception of the dry run (a forward that needs real values) gives None.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    seen = Largest()

    class _Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, Tensor):
                    seen.see(t)
            return out

    training = fn.training if isinstance(fn, torch.nn.Module) else None
    probe, Attention.probe = Attention.probe, None  # diagnostics must not record fake tensors
    try:
        if training:
            fn.eval()
        with FakeTensorMode(allow_non_fake_inputs=True), _Record(), torch.no_grad():
            inputs = [s() if callable(s) else torch.zeros(s, device=device) for s in shapes]
            for x in tree_flatten(inputs)[0]:
                if isinstance(x, Tensor):
                    seen.see(x)
            fn(*inputs)
    except Exception:  # a dry run that cannot run says nothing
        return None
    finally:
        Attention.probe = probe
        if training:
            fn.train()
    return seen


def check_memory(
    fn: Callable[..., Any],
    *shapes: Any,
    where: str,
    args: argparse.Namespace | None = None,
    device: torch.device | str = "cpu",
    limit: int | None = None,
) -> Largest | None:
    """Refuse (:class:`UserError` at ``where``, e.g. ``--eval-sizes 4096``) when the largest tensor of
    ``fn(*inputs)`` (:func:`largest_tensor`) exceeds the memory limit (``limit``, else :func:`memory_limit`)."""
    found = largest_tensor(fn, *shapes, device=device)
    if found is None:
        return None
    source = "the given limit"
    if limit is None:
        limit, source = memory_limit(args, device)
    if found.nbytes > limit:
        raise UserError(
            f"{found.describe()} would not fit the memory limit of {human_bytes(limit)} ({source})", where
        )
    return found
