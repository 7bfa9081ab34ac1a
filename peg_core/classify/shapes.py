"""A small synthetic image-classification set in which absolute position matters.

Each image shows one shape (a reddish filled square, a greenish ring or a
bluish plus) of random size and place on a noisy grey background.  The label
is ``shape * 4 + quadrant``: the same shape is a different class in each
quadrant of the image.  The shape is easy to see in any single patch; the
quadrant needs absolute position: a ViT without position encoding and with
average pooling is permutation-invariant over patches, so it can tell the
shape but must guess the quadrant (top-1 about 1/4; chance is 1/12).

Scenes are sampled once (by seed) in continuous coordinates ``[0, 1]²`` and
rasterised at any resolution, so the *same* images can be evaluated at other
input sizes; the pixel noise is seeded per (seed, size).  torch only, no files
(``python -m peg_core make-data OUT`` writes them as an ImageFolder tree).

``labeling="shape"`` samples the other protocol: the label is the shape alone (3 classes), the
shape may sit anywhere, at any of a wider range of sizes, in any of the three hues.  Rendered at
a larger size the scene is the same picture with everything scaled up, which is how a classifier
trained at 224 px meets ImageNet images resized to 384 px.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "CLASS_NAMES",
    "LABELINGS",
    "NUM_CLASSES",
    "PALETTE",
    "QUADRANTS",
    "SHAPES",
    "ShapeScenes",
    "make_shape_splits",
    "render_scenes",
    "sample_scenes",
]

SHAPES = ("square", "ring", "plus")
QUADRANTS = ("top_left", "top_right", "bottom_left", "bottom_right")
NUM_QUADRANTS = len(QUADRANTS)
NUM_CLASSES = len(SHAPES) * NUM_QUADRANTS
#: class names in label order (label ``shape * 4 + quadrant``), e.g. ``"ring_bottom_left"``
CLASS_NAMES = tuple(f"{s}_{q}" for s in SHAPES for q in QUADRANTS)
#: base RGB colour of each shape (red square, green ring, blue plus)
PALETTE = torch.tensor([[0.9, 0.15, 0.15], [0.15, 0.85, 0.2], [0.2, 0.3, 0.95]])
#: what a label encodes: ``"quadrant"`` (shape and quadrant, :data:`CLASS_NAMES`) or ``"shape"``
#: (the shape only, :data:`SHAPES`; position, size and hue carry no label information)
LABELINGS = ("quadrant", "shape")


@dataclass(frozen=True)
class ShapeScenes:
    """Scene parameters of ``N`` images; :meth:`images` renders them at any size.

    Attributes:
        shape: ``(N,)`` index into :data:`SHAPES`.
        quadrant: ``(N,)`` 0 top-left, 1 top-right, 2 bottom-left, 3 bottom-right.
        center: ``(N, 2)`` ``(y, x)`` in ``[0, 1]``, inside the quadrant.
        radius: ``(N,)`` half-extent of the shape, in image units.
        color, background: ``(N, 3)`` RGB in ``[0, 1]``.
        seed: seeds the pixel noise (with the image size).
        noise: standard deviation of the pixel noise.
        labeling: one of :data:`LABELINGS`; decides :attr:`labels` and :attr:`class_names`.
    """

    shape: Tensor
    quadrant: Tensor
    center: Tensor
    radius: Tensor
    color: Tensor
    background: Tensor
    seed: int
    noise: float = 0.08
    labeling: str = "quadrant"

    def __len__(self) -> int:
        return self.shape.shape[0]

    @property
    def labels(self) -> Tensor:
        """``(N,)`` int64: ``shape * 4 + quadrant`` in ``[0, NUM_CLASSES)``, or ``shape`` for ``labeling="shape"``."""
        if self.labeling == "shape":
            return self.shape.clone()
        return self.shape * NUM_QUADRANTS + self.quadrant

    @property
    def class_names(self) -> tuple[str, ...]:
        """Names of the label values, in label order."""
        return SHAPES if self.labeling == "shape" else CLASS_NAMES

    def images(self, img_size: int | tuple[int, int]) -> Tensor:
        """``(N, 3, H, W)`` float32, roughly zero-mean (see :func:`render_scenes`)."""
        return render_scenes(self, img_size)

    def subset(self, index: slice | Tensor) -> ShapeScenes:
        """The scenes at ``index`` (same noise seed)."""
        return ShapeScenes(
            self.shape[index], self.quadrant[index], self.center[index], self.radius[index],
            self.color[index], self.background[index], self.seed, self.noise, self.labeling,
        )  # fmt: skip


def sample_scenes(n: int, seed: int, noise: float = 0.08, labeling: str = "quadrant") -> ShapeScenes:
    """``n`` random scenes, the same for the same ``seed``, balanced over the classes (round-robin).

    ``labeling`` (:data:`LABELINGS`) selects the protocol; see the module docstring.
    """
    if labeling not in LABELINGS:
        raise ValueError(f"labeling must be one of {LABELINGS}; got {labeling!r}")
    g = torch.Generator().manual_seed(seed)
    if labeling == "shape":
        return _sample_anywhere(n, g, seed, noise)
    labels = torch.arange(n) % NUM_CLASSES
    labels = labels[torch.randperm(n, generator=g)]
    shape, quadrant = labels // NUM_QUADRANTS, labels % NUM_QUADRANTS
    radius = 0.11 + 0.09 * torch.rand(n, generator=g)
    # Keep the whole shape (plus a margin) inside its quadrant.
    margin = radius + 0.02
    offset = torch.stack([quadrant // 2, quadrant % 2], dim=1).float() * 0.5
    span = (0.5 - 2 * margin).unsqueeze(1)
    center = offset + margin.unsqueeze(1) + span * torch.rand(n, 2, generator=g)
    # Each shape has its own hue (jittered), on a tinted grey background: the "what" is easy to
    # see in any single patch, so what the classes test is the "where".
    color = (PALETTE[shape] + 0.1 * (2 * torch.rand(n, 3, generator=g) - 1)).clamp(0, 1)
    grey = 0.3 + 0.4 * torch.rand(n, 1, generator=g)
    background = (grey + 0.08 * (2 * torch.rand(n, 3, generator=g) - 1)).clamp(0, 1)
    return ShapeScenes(shape, quadrant, center, radius, color, background, seed, noise)


def _sample_anywhere(n: int, g: torch.Generator, seed: int, noise: float) -> ShapeScenes:
    """Shape-only scenes: uniform place (whole shape inside), radius 0.15-0.3, hue independent of shape."""
    shape = (torch.arange(n) % len(SHAPES))[torch.randperm(n, generator=g)]
    radius = 0.15 + 0.15 * torch.rand(n, generator=g)
    margin = (radius + 0.02).unsqueeze(1)
    center = margin + (1 - 2 * margin) * torch.rand(n, 2, generator=g)
    quadrant = (center[:, 0] >= 0.5).long() * 2 + (center[:, 1] >= 0.5).long()  # informative only
    # The hue is drawn apart from the shape, so colour says nothing about the class.
    hue = torch.randint(len(PALETTE), (n,), generator=g)
    color = (PALETTE[hue] + 0.1 * (2 * torch.rand(n, 3, generator=g) - 1)).clamp(0, 1)
    grey = 0.3 + 0.4 * torch.rand(n, 1, generator=g)
    background = (grey + 0.08 * (2 * torch.rand(n, 3, generator=g) - 1)).clamp(0, 1)
    return ShapeScenes(shape, quadrant, center, radius, color, background, seed, noise, "shape")


def render_scenes(scenes: ShapeScenes, img_size: int | tuple[int, int]) -> Tensor:
    """Rasterise ``scenes`` at ``img_size``: ``(N, 3, H, W)`` float32 in roughly ``[-1, 1]``.

    A pixel belongs to the shape when its centre does; the value is
    ``2 * rgb - 1`` plus Gaussian noise seeded by ``(seed, H, W)``.
    """
    h, w = (img_size, img_size) if isinstance(img_size, int) else (int(img_size[0]), int(img_size[1]))
    ys = (torch.arange(h, dtype=torch.float32) + 0.5) / h
    xs = (torch.arange(w, dtype=torch.float32) + 0.5) / w
    dy = ys.view(1, h, 1) - scenes.center[:, 0].view(-1, 1, 1)  # (N, H, 1)
    dx = xs.view(1, 1, w) - scenes.center[:, 1].view(-1, 1, 1)  # (N, 1, W)
    r = scenes.radius.view(-1, 1, 1)
    ay, ax = dy.abs(), dx.abs()
    square = torch.maximum(ay, ax) <= r
    dist = (dy**2 + dx**2).sqrt()
    ring = (dist <= r) & (dist >= 0.55 * r)
    bar = r / 3
    plus = ((ay <= bar) & (ax <= r)) | ((ax <= bar) & (ay <= r))
    inside = torch.stack([square, ring, plus], dim=1)  # (N, 3 shapes, H, W)
    inside = inside.gather(1, scenes.shape.view(-1, 1, 1, 1).expand(-1, 1, h, w))  # (N, 1, H, W)
    img = torch.where(inside, scenes.color.view(-1, 3, 1, 1), scenes.background.view(-1, 3, 1, 1))
    g = torch.Generator().manual_seed(scenes.seed * 1_000_003 + h * 1009 + w)
    img = img + scenes.noise * torch.randn(img.shape, generator=g)
    return img * 2.0 - 1.0


def make_shape_splits(
    n_train: int = 2048, n_val: int = 512, seed: int = 0, noise: float = 0.08, labeling: str = "quadrant"
) -> tuple[ShapeScenes, ShapeScenes]:
    """Independent train and validation scenes (``seed`` and ``seed + 1``)."""
    return sample_scenes(n_train, seed, noise, labeling), sample_scenes(n_val, seed + 1, noise, labeling)
