"""Fine-grained distribution refinement (D-FINE, Peng et al., ICLR 2025): the pure box arithmetic.

D-FINE predicts each box edge as a distribution over ``max_num_bins + 1`` bins instead of one
offset.  The bins are not evenly spaced: the weighting function :math:`W(n)` puts fine steps near
the reference edge and coarse ones far from it.  With ``c = up * reg_scale`` and
``step = (c + 1) ** (2 / (N - 2))`` (``N = max_num_bins``):

.. math::

    W = [-2c,\\; 1 - step^{N/2-1}, \\dots, 1 - step,\\; 0,\\; step - 1, \\dots, step^{N/2-1} - 1,\\; 2c]

The expected offset of an edge is :math:`\\sum_n \\mathrm{softmax}(p)_n W(n)` (:func:`integral`), in
units of the reference box's size divided by ``reg_scale`` (:func:`distance2bbox`).

Everything here is tensor arithmetic with no Python branch on values, so it traces for
``torch.export`` / ONNX at any size; the training-side inverse (box -> bin targets) is the
criterion's.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.ops import box_convert

__all__ = ["distance2bbox", "integral", "weighting_function"]


def weighting_function(max_num_bins: int, up: Tensor, reg_scale: Tensor) -> Tensor:
    """The bins' offsets :math:`W(n)`, ``(max_num_bins + 1,)``, in ``up``'s dtype and device.

    ``up`` and ``reg_scale``: one-element tensors (the decoder's fixed parameters, D-FINE's 0.5
    and 4.0); their absolute values are used, as D-FINE does.  ``max_num_bins`` is even (>= 4).
    """
    if max_num_bins < 4 or max_num_bins % 2:
        raise ValueError(f"max_num_bins must be an even number >= 4, got {max_num_bins}")
    c = up.reshape(1).abs() * reg_scale.reshape(1).abs()  # (1,): the largest inner offset
    step = (c + 1) ** (2 / (max_num_bins - 2))
    powers = torch.arange(1, max_num_bins // 2, dtype=up.dtype, device=up.device)  # 1 .. N/2 - 1
    right = step**powers - 1  # (N/2 - 1,) fine near 0, coarse far away
    return torch.cat([-2 * c, -right.flip(0), torch.zeros_like(c), right, 2 * c])


def integral(corners: Tensor, project: Tensor) -> Tensor:
    """Expected edge offsets of per-edge distributions.

    ``corners``: ``(..., 4 * (N + 1))`` logits, four edges (left, top, right, bottom) of ``N + 1``
    bins each; ``project``: ``(N + 1,)`` from :func:`weighting_function`.  Returns ``(..., 4)``.
    """
    bins = project.shape[-1]
    prob = corners.unflatten(-1, (4, bins)).softmax(dim=-1)
    return prob @ project.to(prob.dtype)


def distance2bbox(points: Tensor, distance: Tensor, reg_scale: Tensor | float) -> Tensor:
    """Reference boxes and edge offsets -> boxes, all normalised ``cxcywh``.

    ``points``: ``(..., 4)`` reference boxes ``(cx, cy, w, h)``; ``distance``: ``(..., 4)`` offsets
    of the left, top, right and bottom edges (:func:`integral`'s), in units of ``w / reg_scale``
    (horizontal) and ``h / reg_scale`` (vertical), measured outwards from the half-size
    ``0.5 * reg_scale``: a zero offset keeps the reference box.
    """
    s = reg_scale.abs() if isinstance(reg_scale, Tensor) else abs(reg_scale)
    cx, cy, w, h = points.unbind(-1)
    left, top, right, bottom = distance.unbind(-1)
    xyxy = torch.stack(
        [
            cx - (0.5 * s + left) * (w / s),
            cy - (0.5 * s + top) * (h / s),
            cx + (0.5 * s + right) * (w / s),
            cy + (0.5 * s + bottom) * (h / s),
        ],
        dim=-1,
    )
    return box_convert(xyxy, "xyxy", "cxcywh")
