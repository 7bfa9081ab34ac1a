"""One inference API for the three task packages: ``Predictor.from_checkpoint(path)`` then ``predictor(inputs)``.

    from peg_detr.predict import Predictor          # or peg_core.classify.predict, peg_video.predict
    predictor = Predictor.from_checkpoint("runs/detr/checkpoint.pth", device="cpu")
    for p in predictor.predict_files(["a.jpg", "b.jpg"]):
        print(p.line())

A task's predictor subclasses :class:`FilePredictor`: it says how to read a file
(:meth:`~FilePredictor.read`, raising :class:`~peg_core.engine.broken.BrokenSample` for one that
cannot be used), how to turn an input into the model's input (:meth:`~FilePredictor.prepare`)
and how to run a batch of them (:meth:`~FilePredictor.run`).  This module does the rest: paths
and in-memory inputs mixed, every input checked and converted in one place
(:meth:`~FilePredictor.normalise`: :func:`as_image` for images, :func:`as_clip` for video clips),
unreadable or unusable files kept as skipped :class:`Prediction` s (never an exception, never
silently dropped), batching, results in input order.

What an image predictor takes (``input_kind = "image"``):

* a path, ``str`` or ``os.PathLike`` (``bytes`` is a ``TypeError``: decode it first);
* a PIL image of any mode: grey, palette, RGBA (alpha dropped), CMYK, and 16-bit / 32-bit
  grey (``I;16``, ``I``: scaled by 255 / 65535, not clipped) or float (``F``: taken as [0, 1]);
* a numpy array ``(H, W)`` or ``(H, W, C)`` (channels last), a tensor ``(H, W)`` or ``(C, H, W)``
  (channels first), with ``C`` 1 (grey) or 3 (RGB): uint8 pixels, uint16 pixels (scaled by
  1 / 65535), other integers in 0..255, or floats in [0, 1];
* a 4-D array or tensor ``(N, ...)``: ``N`` images.

Anything else is a ``TypeError`` (the kind of object) or a ``ValueError`` (its shape or values:
4 channels, no pixels, floats outside [0, 1] such as 0-255 pixels, NaN) naming the argument
(``inputs[2]``); a file whose pixels are unusable is a skipped prediction saying why.
"""

from __future__ import annotations

import numbers
import operator
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import InputError
from .broken import BrokenSample

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

__all__ = [
    "ClassPrediction",
    "FilePredictor",
    "Prediction",
    "as_clip",
    "as_image",
    "check_fraction",
    "check_int",
    "is_pil_image",
    "resolve_device",
    "rgb_image",
]

#: how far a float image may stray outside [0, 1] (a resampling overshoot) before it is refused;
#: what is tolerated is clamped
UNIT_SLACK = 1e-3
#: PIL modes of more than 8 bits per pixel, whose values are 16-bit (``I``: 32-bit, read as 16-bit)
HIGH_BIT_MODES = ("I", "I;16", "I;16L", "I;16B", "I;16N")


@dataclass
class Prediction(ABC):
    """The result for one input: ``path`` (``None`` for an in-memory input) and ``skipped`` (why not, or None).

    A task's subclass adds its result and :meth:`result_text`.
    """

    path: str | None
    skipped: str | None = None

    @property
    def name(self) -> str:
        return self.path if self.path is not None else "<input>"

    @abstractmethod
    def result_text(self) -> str:
        """The result in words (one line); the subclass's."""

    def line(self) -> str:
        """One console line: ``PATH: <result>`` or ``PATH: skipped (<reason>)``."""
        if self.skipped is not None:
            return f"{self.name}: skipped ({self.skipped})"
        return f"{self.name}: {self.result_text()}"

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict of the prediction (``--json``, ``--output``)."""


@dataclass
class ClassPrediction(Prediction):
    """Classes with probabilities, best first (classify: images; video: clips)."""

    top: list[tuple[str, float]] = field(default_factory=list)

    def result_text(self) -> str:
        return ", ".join(f"{name} {p:.3f}" for name, p in self.top)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "top": [{"class": c, "p": p} for c, p in self.top],
            "skipped": self.skipped,
        }


# ------------------------------------------------------------------------------- arguments


def resolve_device(device: str | torch.device) -> torch.device:
    """``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"auto"`` (CUDA when there is one) or a ``torch.device``.

    A device this machine does not have is one :class:`~peg_core.errors.InputError` (a
    ``ValueError``) naming it, before any checkpoint is read.
    """
    if isinstance(device, str):
        text = device.strip().lower()
        if text == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            dev = torch.device(text)
        except (RuntimeError, ValueError):
            raise ValueError(f"device={device!r}: expected 'cpu', 'cuda', 'cuda:N' or 'auto'") from None
    elif isinstance(device, torch.device):
        dev = device
    else:
        raise TypeError(
            f"device: expected a str such as 'cpu' or a torch.device, got {type(device).__name__}"
        )
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError("CUDA is not available on this machine", f"device={device!r}")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"no such GPU ({torch.cuda.device_count()} visible)", f"device={device!r}")
    return dev


def check_int(value: Any, name: str, low: int = 1, high: int | None = None) -> int:
    """``value`` as an ``int`` in ``low..high``: a ``TypeError`` for a non-integer (``"5"``, ``True``, 5.0), else a ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    number = operator.index(value)
    if number < low or (high is not None and number > high):
        bounds = f">= {low}" if high is None else f"in {low}..{high}"
        raise ValueError(f"{name} must be an int {bounds}, got {number}")
    return number


def check_fraction(value: Any, name: str) -> float:
    """``value`` as a ``float`` in ``[0, 1]``: a ``TypeError`` for a non-number (``"0.5"``, ``True``), else a ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number in [0, 1], got {type(value).__name__} {value!r}")
    number = float(value)
    if not 0.0 <= number <= 1.0:  # NaN fails too
        raise ValueError(f"{name} must be a number in [0, 1], got {number}")
    return number


# ---------------------------------------------------------------------------------- images


def _pil_image_class() -> type | None:
    """PIL's ``Image`` class when PIL is loaded (it is, whenever a PIL image exists), else ``None``.

    PIL is an optional dependency of the engine, so it is looked up rather than imported.
    """
    module = sys.modules.get("PIL.Image")
    return getattr(module, "Image", None)


def is_pil_image(item: Any) -> bool:
    """Whether ``item`` is a PIL image (without importing PIL)."""
    cls = _pil_image_class()
    return cls is not None and isinstance(item, cls)


def rgb_image(image: PILImage) -> PILImage:
    """A PIL image of any mode as 8-bit RGB (a new image; the file behind ``image`` is no longer needed).

    Grey, palette and CMYK images are converted, RGBA loses its alpha channel (as torchvision's
    loader does, so files read for training and for prediction agree).  PIL's ``convert`` would
    clip 16-bit grey (``I;16``, and ``I``, read as 16-bit) to white above 255: those values are
    scaled by 255 / 65535 instead, and float grey (``F``) is taken as [0, 1].  Raises
    ``ValueError`` for a mode PIL cannot convert to RGB.
    """
    if image.mode in HIGH_BIT_MODES:
        # point() on "I" applies v * scale + offset exactly; + 0.5 rounds instead of truncating
        image = image.convert("I").point(lambda v: v * (255 / 65535) + 0.5).convert("L")
    elif image.mode == "F":
        image = image.point(lambda v: v * 255 + 0.5).convert("L")
    elif image.mode in ("P", "PA") and ("transparency" in image.info or image.mode == "PA"):
        image = image.convert("RGBA")  # PIL's route for palettes with transparency (and no warning)
    return image.convert("RGB")


def _layout(shape: tuple[int, ...], channels_last: bool) -> str:
    if channels_last:
        return f"an array of shape {shape}: expected (H, W) or (H, W, C) with C = 1 or 3 (numpy images are channels-last)"
    return f"a tensor of shape {shape}: expected (H, W) or (C, H, W) with C = 1 or 3 (tensors are channels-first; a channels-last one: .permute(2, 0, 1))"


def _channels_first(array: Any, name: str, channels_last: bool) -> torch.Tensor:
    """A 2-D or 3-D image array / tensor as a ``(C, H, W)`` tensor (not yet of a pixel dtype)."""
    shape = tuple(array.shape)
    if len(shape) == 2:
        tensor = torch.as_tensor(array)[None]
    elif len(shape) == 3:
        channels = shape[-1] if channels_last else shape[0]
        if channels == 4:
            cut = "a[..., :3]" if channels_last else "t[:3]"
            raise InputError(
                f"4 channels (RGBA?): expected 1 (grey) or 3 (RGB); drop the alpha channel first, e.g. {cut}",
                name,
            )
        if channels not in (1, 3):
            raise InputError(_layout(shape, channels_last), name)
        tensor = torch.as_tensor(array)
        tensor = tensor.permute(2, 0, 1) if channels_last else tensor
    else:
        raise InputError(_layout(shape, channels_last), name)
    if tensor.numel() == 0:
        raise InputError(f"an empty image (shape {shape}): it has no pixels", name)
    return tensor


def _numpy_pixels(array: np.ndarray, name: str) -> np.ndarray:
    """A numpy image in a dtype torch takes: uint8, float32, or int64 (other integers); uint16 scaled to [0, 1]."""
    kind = array.dtype.kind
    if kind == "b" or kind not in "uif":
        raise TypeError(
            f"{name}: a numpy array of dtype {array.dtype}: expected uint8, uint16, other integers or floats"
        )
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    if array.dtype == np.uint16:
        return array.astype(np.float32) / 65535.0  # a 16-bit image: scaled, not clipped
    if kind == "f":
        return array.astype(np.float32)
    return array.astype(np.int64)


def _unit_floats(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """A float image as float32 in [0, 1]: NaN / inf, and values outside it (0-255 pixels), are refused."""
    tensor = tensor.to(torch.float32)
    if not bool(torch.isfinite(tensor).all()):
        raise InputError("float pixel values are not all finite (NaN or inf)", name)
    low, high = float(tensor.min()), float(tensor.max())
    if low < -UNIT_SLACK or high > 1 + UNIT_SLACK:
        hint = "; 0-255 pixels? pass them as uint8, or divide by 255" if high > 1 else ""
        raise InputError(
            f"float pixel values must lie in [0, 1], these span [{low:.4g}, {high:.4g}]{hint}", name
        )
    return tensor.clamp(0.0, 1.0)


def as_image(item: Any, name: str = "image") -> Any:
    """One image, checked and converted: an 8-bit RGB PIL image (for a PIL input) or a ``(3, H, W)`` tensor.

    The tensor is uint8 (uint8 inputs, other integers in 0..255) or float32 in [0, 1] (float inputs
    in [0, 1]; uint16 ones scaled by 1 / 65535); a grey image is repeated over the 3 channels.
    ``name`` is the argument named in the ``TypeError`` / ``ValueError`` of an input that is none of
    these (see the module's docstring).
    """
    if is_pil_image(item):
        if item.width == 0 or item.height == 0:
            raise InputError(f"an empty PIL image ({item.width} x {item.height} px): it has no pixels", name)
        try:
            return rgb_image(item)
        except ValueError as e:  # a mode PIL cannot convert
            raise InputError(
                f"a PIL image of mode {item.mode!r} that cannot be converted to RGB ({e})", name
            ) from None
    if isinstance(item, np.ndarray):
        pixels = _numpy_pixels(item, name)
        tensor = _channels_first(pixels, name, channels_last=True)
    elif isinstance(item, torch.Tensor):
        if item.dtype == torch.bool or item.is_complex():
            raise TypeError(
                f"{name}: a tensor of dtype {item.dtype}: expected uint8, other integers or floats"
            )
        tensor = _channels_first(item.detach().cpu(), name, channels_last=False)
    else:
        raise TypeError(
            f"{name}: expected an image path (str or os.PathLike), a PIL image, a numpy array (H, W, C) "
            f"or a tensor (C, H, W); got {type(item).__name__}"
        )
    if tensor.is_floating_point():
        tensor = _unit_floats(tensor, name)
    elif tensor.dtype == torch.uint16:
        tensor = tensor.to(torch.float32) / 65535.0
    elif tensor.dtype != torch.uint8:
        low, high = int(tensor.min()), int(tensor.max())
        if low < 0 or high > 255:
            raise InputError(
                f"integer pixel values must lie in 0..255, these span {low}..{high}; pass uint8 pixels or floats in [0, 1]",
                name,
            )
        tensor = tensor.to(torch.uint8)
    return tensor.expand(3, -1, -1).contiguous() if tensor.shape[0] == 1 else tensor


# ----------------------------------------------------------------------------------- clips


def as_clip(
    item: Any, name: str = "clip", value_range: tuple[float, float] | None = None, channels: int = 3
) -> torch.Tensor:
    """One video input, checked: a float32 clip ``(C, T, H, W)`` or the views of one video ``(V, C, T, H, W)``.

    Clips are at the model's input, normalised as in training; ``value_range`` is the
    ``(low, high)`` a normalised pixel can take (with a 10 % margin), so 0-255 pixels are refused
    rather than classified.  A ``TypeError`` / ``ValueError`` names ``name``.
    """
    if isinstance(item, np.ndarray):
        if item.dtype.kind != "f":
            raise TypeError(
                f"{name}: a numpy array of dtype {item.dtype}: clips are floats, normalised as in training"
            )
        item = torch.from_numpy(np.ascontiguousarray(item, dtype=np.float32))
    elif not isinstance(item, torch.Tensor):
        raise TypeError(
            f"{name}: expected a video path (str or os.PathLike) or a clip tensor (C, T, H, W) / views "
            f"(V, C, T, H, W); got {type(item).__name__}"
        )
    shape = tuple(item.shape)
    if item.dim() not in (4, 5):
        raise InputError(
            f"a tensor of shape {shape}: expected a clip (C, T, H, W) or views (V, C, T, H, W)", name
        )
    if item.numel() == 0:
        raise InputError(f"an empty clip (shape {shape}): it has no pixels", name)
    if shape[-4] != channels:
        raise InputError(
            f"a clip of shape {shape} has {shape[-4]} channels at dim -4; the model takes {channels}", name
        )
    if not item.is_floating_point():
        raise TypeError(
            f"{name}: a tensor of dtype {item.dtype}: clips are floats, normalised as in training"
        )
    clip = item.detach().to(torch.float32)
    if not bool(torch.isfinite(clip).all()):
        raise InputError("clip values are not all finite (NaN or inf)", name)
    if value_range is not None:
        low, high = value_range
        margin = 0.1 * (high - low)
        got = (float(clip.min()), float(clip.max()))
        if got[0] < low - margin or got[1] > high + margin:
            raise InputError(
                f"clip values span [{got[0]:.4g}, {got[1]:.4g}], outside the normalised range [{low:.3g}, {high:.3g}]: "
                "clips are (pixels in [0, 1] - mean) / std, as in training",
                name,
            )
    return clip


# ------------------------------------------------------------------------------- the base


def _refuse_bytes(item: Any, name: str) -> None:
    """A ``bytes`` path is a ``TypeError`` naming ``name`` (iterated, it would be a list of ints)."""
    if isinstance(item, bytes | bytearray):
        raise TypeError(
            f"{name}: a bytes path {bytes(item)!r}: pass a str or pathlib.Path (os.fsdecode(path))"
        )


def _path(item: Any, name: str) -> str:
    """``os.fspath(item)`` as a ``str``; a ``bytes`` path is a ``TypeError`` naming ``name``."""
    path = os.fspath(item)
    if not isinstance(path, str):
        raise TypeError(f"{name}: a bytes path {path!r}: pass a str or pathlib.Path (os.fsdecode(path))")
    return path


def _is_path(item: Any) -> bool:
    return isinstance(item, str | os.PathLike)


class FilePredictor(ABC):
    """Base of the task predictors: ``predictor(inputs) -> list[Prediction]`` in input order.

    ``inputs`` is one input or a sequence of them; a ``str`` / ``os.PathLike`` is a file read by
    :meth:`read`, anything else is an in-memory input.  Both go through :meth:`normalise`
    (``input_kind``: ``"image"``, :func:`as_image`; ``"clip"``, :func:`as_clip`), then
    :meth:`prepare`.  Subclasses set :attr:`batch_size` and implement :meth:`read`,
    :meth:`prepare`, :meth:`run` and :meth:`skipped`; :meth:`prepare` raises
    :class:`~peg_core.errors.InputError` for an input the model cannot take (a file then comes
    back skipped with that reason, an in-memory input is the error, naming its argument).
    """

    batch_size: int = 1
    device: torch.device = torch.device("cpu")
    #: what :meth:`normalise` checks and converts: ``"image"`` (:func:`as_image`), ``"clip"``
    #: (:func:`as_clip`), or ``None`` (a task of another kind: inputs reach :meth:`prepare` as given)
    input_kind: str | None = None
    #: ``"clip"``: the ``(low, high)`` of a normalised pixel (``None``: not checked)
    clip_range: tuple[float, float] | None = None

    @abstractmethod
    def read(self, path: str) -> Any:
        """The input in ``path``; :class:`BrokenSample` when it cannot be used."""

    def normalise(self, item: Any, name: str) -> Any:
        """One input (in memory, or what :meth:`read` returned) checked and converted; errors name ``name``."""
        if self.input_kind == "image":
            return as_image(item, name)
        if self.input_kind == "clip":
            return as_clip(item, name, self.clip_range)
        return item

    def prepare(self, item: Any) -> Any:
        """A normalised input -> what :meth:`run` batches (default: unchanged)."""
        return item

    @abstractmethod
    def run(self, paths: list[str | None], items: list[Any]) -> list[Prediction]:
        """Predictions for a batch of prepared inputs (``paths[i]`` names ``items[i]``)."""

    @abstractmethod
    def skipped(self, path: str, reason: str) -> Prediction:
        """The prediction of a file that could not be used (the subclass's type, without a result)."""

    def _items(self, inputs: Any, name: str) -> list[tuple[str, Any]]:
        """``inputs`` as ``[(argument name, one input), ...]``: one input, or each of a sequence."""
        _refuse_bytes(inputs, name)
        if _is_path(inputs) or is_pil_image(inputs):
            return [(name, inputs)]
        if isinstance(inputs, torch.Tensor | np.ndarray):
            if self.input_kind == "image" and inputs.ndim == 4:  # a batch (N, ...) of images
                return [(f"{name}[{i}]", x) for i, x in enumerate(inputs)]
            return [(name, inputs)]
        if isinstance(inputs, Mapping) or not isinstance(inputs, Iterable):
            return [(name, inputs)]  # not a sequence: normalise names its type
        items = [(f"{name}[{i}]", x) for i, x in enumerate(inputs)]
        for item_name, item in items:
            _refuse_bytes(item, item_name)
        return items

    @torch.no_grad()
    def __call__(self, inputs: Any) -> list[Prediction]:
        """Predictions for ``inputs`` (one input or a sequence), in order; see the module's docstring."""
        return self._predict(self._items(inputs, "inputs"))

    def predict_files(self, paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Prediction]:
        """:meth:`__call__` on files (one path, or a sequence): unusable ones come back skipped, with the reason."""
        items = self._items(paths, "paths")
        for name, item in items:
            if not _is_path(item):
                raise TypeError(
                    f"{name}: expected a file path (str or os.PathLike), got {type(item).__name__}"
                )
        with torch.no_grad():
            return self._predict(items)

    def load(self, path: str | os.PathLike) -> Any:
        """The file at ``path`` as :meth:`run` takes it (:meth:`read`, :meth:`normalise`, :meth:`prepare`).

        :class:`BrokenSample` when it cannot be read, or is not an input the model can take (an
        image too elongated for DETR's resize, a clip that does not fit the model): one file's
        problem, never another exception.
        """
        path = _path(path, "path")
        try:
            return self._prepare(self.read(path), path)
        except InputError as e:
            raise BrokenSample(path, e.what) from None

    def _predict(self, items: Sequence[tuple[str, Any]]) -> list[Prediction]:
        out: list[Prediction | None] = [None] * len(items)
        ready: list[tuple[int, str | None, Any]] = []
        for i, (name, item) in enumerate(items):
            if not _is_path(item):  # in memory: a bad input is the caller's error, naming the argument
                ready.append((i, None, self._prepare(item, name)))
                continue
            path = _path(item, name)
            try:
                ready.append((i, path, self.load(path)))
            except BrokenSample as e:
                out[i] = self.skipped(path, e.reason)
        step = max(1, self.batch_size)
        for start in range(0, len(ready), step):
            chunk = ready[start : start + step]
            results = self.run([p for _, p, _ in chunk], [x for _, _, x in chunk])
            for (i, _, _), pred in zip(chunk, results, strict=True):
                out[i] = pred
        return [p for p in out if p is not None]

    def _prepare(self, item: Any, name: str) -> Any:
        """:meth:`prepare` of :meth:`normalise`; an :class:`InputError` of :meth:`prepare` gets ``name``."""
        try:
            return self.prepare(self.normalise(item, name))
        except InputError as e:
            if e.where is None:
                raise InputError(e.what, name) from None
            raise
