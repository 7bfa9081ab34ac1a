"""Mixed precision on the training paths of peg_detr and peg_video."""

from __future__ import annotations

import contextlib

import torch

__all__ = ["AMP_DTYPES", "autocast_context"]

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_context(device: torch.device, amp: str) -> contextlib.AbstractContextManager:
    """bf16/fp16 autocast on CUDA; a no-op for ``amp="none"`` or on CPU (CPU autocast is slower here)."""
    if amp not in ("none", *AMP_DTYPES):
        raise ValueError(f"--amp must be one of none, bf16, fp16; got {amp!r}")
    if amp == "none" or device.type != "cuda":
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=AMP_DTYPES[amp])
