"""The layers every detector family builds from: activations by name, MLPs, conv + norm + activation.

As timm's ``layers/create_act.py``, ``mlp.py`` and ``conv_bn_act.py`` serve its models, this module
serves DETR, RT-DETR, D-FINE and DEIMv2 (one copy of each block instead of one per family).  The
attribute names are the state-dict keys the families' checkpoints, the official files and
Hugging Face's ``RTDetr*`` / ``DFine*`` modules use, so they never change:

* :class:`MLP`: ``layers.N.*`` (DETR's box head; RT-DETR's and D-FINE's box, query-position and
  LQE heads);
* :class:`FeedForward`: ``fc1.*``, ``fc2.*`` (a transformer layer's feed-forward block, keys
  ``mlp.fc1`` in RT-DETR's AIFI);
* :class:`ConvNormLayer`: ``conv.*``, ``norm.*`` (the hybrid encoders' convolutions, HF's
  ``RTDetrConvNormLayer`` / ``DFineConvNormLayer``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ACTIVATIONS", "LAYER_ACTIVATIONS", "MLP", "ConvNormLayer", "FeedForward", "create_act"]

#: the activations of the transformer layers, heads and encoder convolutions: what the families'
#: configs and Hugging Face's ``*activation_function`` fields offer
LAYER_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}
#: every activation by name: the layers' and the backbones' (DEIMv2's HGNetv2 ``get_activation``
#: names SiLU ``swish`` too)
ACTIVATIONS: dict[str, type[nn.Module]] = {**LAYER_ACTIVATIONS, "swish": nn.SiLU, "hardswish": nn.Hardswish}


def create_act(
    name: str | None,
    what: str = "activation",
    *,
    optional: bool = True,
    choices: dict[str, type[nn.Module]] = LAYER_ACTIVATIONS,
) -> nn.Module:
    """A new activation module by name (one of ``choices``); ``nn.Identity`` for ``None`` when ``optional``.

    ``what`` names the option in the ``ValueError`` for an unknown name (``"mlp_activation"``...).
    """
    if name is None and optional:
        return nn.Identity()
    if name not in choices:
        allowed = f"{sorted(choices)}{' or None' if optional else ''}"
        raise ValueError(f"unknown {what} {name!r}; expected one of {allowed}")
    return choices[name]()


class MLP(nn.Module):
    """``num_layers`` linear layers with an activation between them (keys ``layers.N.*``, as in DETR's box head).

    ``activation``: ReLU (DETR, RT-DETR, D-FINE) or any elementwise function (DEIM's heads: SiLU).
    ``forward(x (..., input_dim)) -> (..., output_dim)``.
    """

    def __init__(
        self,
        input_dim: int,
        hidden_dim: int,
        output_dim: int,
        num_layers: int,
        activation: Callable[[Tensor], Tensor] = F.relu,
    ) -> None:
        super().__init__()
        dims = [input_dim] + [hidden_dim] * (num_layers - 1)
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims, [*dims[1:], output_dim]))
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else self.activation(layer(x))
        return x


class FeedForward(nn.Module):
    """A transformer layer's feed-forward block ``dropout(fc2(dropout(act(fc1(x)))))``; keys ``fc1``, ``fc2``.

    ``forward(x (..., dim)) -> (..., dim)``; ``act`` by name (:func:`create_act`).
    """

    def __init__(self, dim: int, hidden: int, act: str = "gelu", dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.activation = create_act(act)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.fc2(self.dropout(self.activation(self.fc1(x)))))


class ConvNormLayer(nn.Module):
    """``Conv2d`` (no bias, padding ``(k - 1) // 2``) -> ``BatchNorm2d`` -> activation; keys ``conv.*``, ``norm.*``.

    ``forward(x (B, cin, H, W)) -> (B, cout, ceil(H / stride), ceil(W / stride))`` for odd ``k``;
    ``groups=cin`` is the depthwise form (D-FINE's ``SCDown``).  ``act`` by name (:func:`create_act`,
    ``None``: none).  :func:`~peg_detr.models.rtdetr.fuse.fuse_for_deploy` folds the norm into the conv.
    """

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel_size: int,
        stride: int = 1,
        act: str | None = None,
        eps: float = 1e-5,
        *,
        groups: int = 1,
    ) -> None:
        super().__init__()
        pad = (kernel_size - 1) // 2
        self.conv = nn.Conv2d(cin, cout, kernel_size, stride, padding=pad, groups=groups, bias=False)
        self.norm = nn.BatchNorm2d(cout, eps)
        self.activation = create_act(act)

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(self.norm(self.conv(x)))
