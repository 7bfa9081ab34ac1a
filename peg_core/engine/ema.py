"""A model's weight EMA with RT-DETR's warm-up decay: :class:`EmaModel` and :func:`warmup_ema_decay`.

Task-agnostic (any ``nn.Module``); peg_detr's RT-DETR / D-FINE / DEIMv2 recipes train with it.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

__all__ = ["EmaModel", "warmup_ema_decay"]


def warmup_ema_decay(decay: float, warmups: int, n: int) -> float:
    """RT-DETR's warm-up EMA decay ``decay * (1 - exp(-n / warmups))`` of the ``n``-th update (from 1).

    Early averages follow the model closely; the decay reaches ``decay`` after a few ``warmups``.
    """
    return decay * (1.0 - math.exp(-n / warmups))


class EmaModel(nn.Module):
    """A model and its weight EMA (``torch.optim.swa_utils.AveragedModel``); ``forward`` is the model's.

    The state dict holds ``model.*`` (trained weights) and ``ema.module.*`` / ``ema.n_averaged``
    (the average, buffers included), so a checkpoint resumes both and
    a task's loader evaluates the average (:func:`peg_detr.model.load_model`).  The average's parameters need no
    gradient, so DDP and the gradient clipping see the model's alone.  Call :meth:`update` after
    every optimiser step (peg_detr's ``DetectTask`` registers it as the optimiser's step post-hook); its decay
    is :func:`warmup_ema_decay` of the update count, RT-DETR's (which counts the current update too).
    """

    def __init__(self, model: nn.Module, decay: float, warmups: int) -> None:
        super().__init__()
        self.model = model
        self.decay, self.warmups = decay, warmups
        # The update count on the host: read from the (device) ``n_averaged`` once, at the first
        # update and again after a load, so the decay costs no device sync per step.  It is kept
        # here, not in the averaging function, because AveragedModel calls that function once per
        # (device, dtype) group of parameters and buffers: several times per update.
        self._count: int | None = None
        self._decay_now = 0.0
        self.ema = AveragedModel(model, multi_avg_fn=self._average, use_buffers=True)
        self.ema.requires_grad_(False)
        self.register_load_state_dict_post_hook(EmaModel._forget_count)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model(*args, **kwargs)

    def _average(self, ema_params: list[Tensor], params: list[Tensor], num_averaged: Tensor) -> None:
        get_ema_multi_avg_fn(self._decay_now)(ema_params, params, num_averaged)

    @staticmethod
    def _forget_count(module: nn.Module, _incompatible: Any) -> None:
        module._count = None  # a resumed state: the next update reads the loaded n_averaged

    def update(self) -> None:
        if self._count is None:
            self._count = int(self.ema.n_averaged)
        self._decay_now = warmup_ema_decay(self.decay, self.warmups, self._count + 1)
        self.ema.update_parameters(self.model)
        self._count += 1

    @property
    def averaged(self) -> nn.Module:
        """The averaged copy of the model (evaluated instead of the live weights)."""
        return self.ema.module
