"""The position-encoding registry: the one list of encoding names and the one parser of ``--pos-enc``.

An encoding enters a transformer in one of three ways, its *kind*:

* ``"add"``: codes added to the tokens.  A *table* depends on the grid alone (learned, sin-cos,
  DETR's sine) and is added once at the input (ViTs) or to the attention queries and keys of
  every layer (DETR); a *conditional* encoding is computed from the tokens themselves (a PEG) and
  runs after the blocks a model names (``peg_at``).
* ``"rotate"``: a rotation of the attention queries and keys (RoPE); the module is a
  :class:`peg_core.rope.RotaryEmbedding`, called with the grid size for its ``(sin, cos)`` table.
* ``"bias"``: a term added to the attention logits; the module is a
  :class:`peg_core.bias.AttentionBias`, called with the grid size for its ``(1, heads, N, N)``
  float bias, which the model passes to ``scaled_dot_product_attention`` (``alibi-2d``, ``fire``,
  ``lookhere``).

A ``--pos-enc`` value is one registered name, ``none``, or a ``+`` combination of names that fill
different *slots* (``table``, ``conditional``, ``rotary``, ``bias``), at most one each, e.g.
``peg+rope-mixed``.  :func:`parse_pos_enc` turns it into an :class:`EncodingSpec` and checks it
against what a model family supports (:class:`EncodingSupport`: grid rank, slots, combinations,
names it has no implementation of); every task's command line takes its ``--pos-enc`` help and
validation from here, so a wrong pair is refused when the arguments are parsed.

A model builds its parts with one :func:`build_encoding_parts` call (its table, its PEGs by
position, its rotary and bias parts: :class:`EncodingParts`) from the spec and one
:class:`EncodingContext`, which carries what the model knows (channels, training grid, prefix
tokens, where the codes go, resize mode, heads, depth, the PEG's options as one
:class:`peg_core.peg.PegOptions`, and the family's extra options).  The rotary kinds register
themselves in :mod:`peg_core.rope` (:func:`peg_core.rope.rotary_kind`); this module registers an
encoding for each.

Your own encoding, from Python::

    from peg_core.registry import Encoding, register_encoding
    register_encoding(Encoding("my-table", "add", build=lambda ctx: MyTable(ctx.dim), dims=(2, 3)))

or for every command line, from an installed package's metadata (entry-point group
``peg.encodings``; the object named is an :class:`Encoding`, a sequence of them, or a function
that returns either)::

    [project.entry-points."peg.encodings"]
    my-table = "my_package.encodings:MY_TABLE"

A plugin is third-party code, so whatever it does wrong stays one line: an entry point that fails
to load (an exception, ``SystemExit`` included) is skipped with one warning naming it and its
package, the other encodings keep working; a plugin builder that fails is a :class:`PosEncError`
naming the entry point and the package.  The result of every builder (plugin or not) is checked
against its kind: a :class:`peg_core.PositionEncoding` for ``"add"``, a
:class:`peg_core.rope.RotaryEmbedding` for ``"rotate"``, a :class:`peg_core.bias.AttentionBias` for
``"bias"`` (a builder that returns ``None`` would give a model without position information).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from torch import nn

from .base import PositionEncoding
from .bias import ALiBiBias, AttentionBias, FIREBias, LookHereBias
from .encodings import (
    LearnedPositionEncoding2d,
    LearnedPositionEncoding3d,
    NoPositionEncoding,
    SinCosPositionEncoding2d,
    SinCosPositionEncoding3d,
    SinePositionEncoding2d,
)
from .errors import InputError
from .peg import PEG2d, PEG3d, PegOptions, resolve_peg_at
from .rope import ROTARY_KINDS, RotaryEmbedding, build_rope

__all__ = [
    "ENTRY_POINT_GROUP",
    "KINDS",
    "KIND_TYPES",
    "NONE",
    "SLOTS",
    "Encoding",
    "EncodingContext",
    "EncodingParts",
    "EncodingSpec",
    "EncodingSupport",
    "PosEncError",
    "build_encoding_parts",
    "build_position_encoding",
    "encoding_names",
    "get_encoding",
    "parse_pos_enc",
    "register_encoding",
    "unregister_encoding",
]

KINDS = ("add", "rotate", "bias")
#: the slots of a spec, in the order a spec lists them
SLOTS = ("table", "conditional", "rotary", "bias")
#: the name of "no position information"; never registered, never combined
NONE = "none"
ENTRY_POINT_GROUP = "peg.encodings"


class PosEncError(InputError):
    """A ``pos_enc`` value that names no registered encoding, or a combination a model cannot take."""


@dataclass(frozen=True)
class EncodingContext:
    """What a model tells an encoding's builder.

    Attributes:
        dim: channels ``C`` (``"add"``), or the head dimension (``"rotate"``).
        grid_size: the training grid, ``(H, W)`` or ``(T, H, W)``; its length is the grid rank.
        num_prefix_tokens: class / register tokens in front of the grid tokens (not encoded).
        apply_to: where a table's codes go: ``"tokens"`` (added once) or ``"qk"`` (every layer's
            attention queries and keys).  Conditional encodings are always added to the tokens.
        interpolation, antialias: how a table is resized to another grid (anti-aliased when shrinking).
        temporal_interpolation: how a 3-D table's time axis is resized (``"linear"``, ``"nearest"``...).
        num_heads, depth: attention heads (rotary frequencies, attention biases) and layers
            (per-layer rotary frequencies).
        options: the family's further keywords for this part (rotary ``temperature``,
            ``indexing``...); builders take the ones they know.
        peg: the PEG's options (:class:`peg_core.peg.PegOptions`), read by the conditional
            builders.
    """

    dim: int
    grid_size: tuple[int, ...]
    num_prefix_tokens: int = 0
    apply_to: str = "tokens"
    interpolation: str = "bicubic"
    antialias: bool = False
    temporal_interpolation: str = "linear"
    num_heads: int = 1
    depth: int = 1
    options: Mapping[str, Any] = field(default_factory=dict)
    peg: PegOptions = field(default_factory=PegOptions)

    @property
    def ndim(self) -> int:
        """The grid rank: 2 for images, 3 for videos."""
        return len(self.grid_size)


Builder = Callable[[EncodingContext], nn.Module]

#: what a builder of each kind must return
KIND_TYPES: dict[str, type] = {"add": PositionEncoding, "rotate": RotaryEmbedding, "bias": AttentionBias}


class _CheckedBuild:
    """An :class:`Encoding`'s builder, its result checked against the kind (:data:`KIND_TYPES`).

    ``source`` (an entry point's plugin): the builder's own failure, ``SystemExit`` included, is a
    :class:`PosEncError` naming it (third-party code: one line, not its traceback); without a source
    (a built-in encoding, or one registered from the caller's own code) it keeps its traceback.
    Compares and hashes as the function it wraps.
    """

    def __init__(self, fn: Builder, name: str, kind: str, source: str) -> None:
        self.fn, self.name, self.kind, self.source = fn, name, kind, source

    def __call__(self, ctx: EncodingContext) -> nn.Module:
        where = self.source or f"pos_enc={self.name!r}"
        try:
            module = self.fn(ctx)
        except (Exception, SystemExit) as e:
            if not self.source:
                raise
            why = " ".join(f"{type(e).__name__}: {e}".split())
            raise PosEncError(f"position-encoding plugin {self.name!r} failed to build ({why})", where) from e
        expected = KIND_TYPES[self.kind]
        if not isinstance(module, expected):
            raise PosEncError(f"encoding {self.name!r} of kind {self.kind!r} built {type(module).__name__}, not a "
                              f"{expected.__module__}.{expected.__name__}", where)  # fmt: skip
        return module

    def __eq__(self, other: object) -> bool:
        return self.fn == (other.fn if isinstance(other, _CheckedBuild) else other)

    def __hash__(self) -> int:
        return hash(self.fn)

    def __repr__(self) -> str:
        return repr(self.fn)


@dataclass(frozen=True)
class Encoding:
    """One registered encoding.

    Attributes:
        name: what ``--pos-enc`` calls it (no ``+``).
        kind: ``"add"``, ``"rotate"`` or ``"bias"`` (module docstring).
        build: ``EncodingContext -> nn.Module``: a :class:`peg_core.PositionEncoding` for
            ``"add"``, a :class:`peg_core.rope.RotaryEmbedding` for ``"rotate"``, a
            :class:`peg_core.bias.AttentionBias` for ``"bias"``.
        dims: the grid ranks it runs on (``(2,)`` images, ``(3,)`` videos, ``(2, 3)`` both).
        conditional: for ``"add"``: computed from the tokens and run after blocks (a PEG), rather
            than a table of the grid added at the input.
        description: one line for ``-h`` and the docs.
        source: where a plugin's encoding comes from (its entry point and package; set by the
            loader); empty for the built-in encodings and those registered from Python.

    ``build`` is kept wrapped: its result is checked against ``kind``, and a plugin's failure is one
    :class:`PosEncError` naming ``source`` (module docstring).
    """

    name: str
    kind: str
    build: Builder
    dims: tuple[int, ...] = (2,)
    conditional: bool = False
    description: str = ""
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if (
            not isinstance(self.name, str)
            or not self.name
            or "+" in self.name
            or self.name != self.name.strip()
        ):
            raise ValueError(
                f"an encoding name is a non-empty string without '+' or spaces; got {self.name!r}"
            )
        if self.name == NONE:
            raise ValueError(f"{NONE!r} is reserved (no position information)")
        if self.kind not in KINDS:
            raise ValueError(f"encoding {self.name!r}: kind must be one of {KINDS}; got {self.kind!r}")
        if not callable(self.build):
            raise TypeError(f"encoding {self.name!r}: build must be callable (EncodingContext -> nn.Module)")
        if not self.dims or any(d not in (1, 2, 3) for d in self.dims):
            raise ValueError(
                f"encoding {self.name!r}: dims must list grid ranks 1, 2 or 3; got {self.dims!r}"
            )
        if self.conditional and self.kind != "add":
            raise ValueError(f"encoding {self.name!r}: only an 'add' encoding can be conditional")
        fn = self.build.fn if isinstance(self.build, _CheckedBuild) else self.build
        object.__setattr__(self, "build", _CheckedBuild(fn, self.name, self.kind, self.source))

    @property
    def slot(self) -> str:
        """Which slot of a spec it fills: ``table``, ``conditional``, ``rotary`` or ``bias``."""
        if self.kind == "add":
            return "conditional" if self.conditional else "table"
        return "rotary" if self.kind == "rotate" else "bias"


_REGISTRY: dict[str, Encoding] = {}
_PLUGINS_LOADED = False


def register_encoding(encoding: Encoding, *, replace: bool = False) -> Encoding:
    """Add ``encoding`` to the registry (every task's ``--pos-enc`` then offers it); returns it.

    A name already registered is refused unless ``replace=True`` (re-registering the same object is
    a no-op, so a module may register at import time).
    """
    if not isinstance(encoding, Encoding):
        raise TypeError(f"register_encoding takes an Encoding; got {type(encoding).__name__}")
    old = _REGISTRY.get(encoding.name)
    if old is not None and old is not encoding and not replace:
        raise ValueError(f"encoding {encoding.name!r} is already registered; pass replace=True to replace it")
    _REGISTRY[encoding.name] = encoding
    return encoding


def unregister_encoding(name: str) -> None:
    """Remove a registered name (tests, interactive work); unknown names are ignored."""
    _REGISTRY.pop(name, None)


def _plugin_encodings(obj: Any) -> list[Encoding]:
    if callable(obj) and not isinstance(obj, Encoding):
        obj = obj()
    if isinstance(obj, Encoding):
        return [obj]
    if isinstance(obj, Iterable) and not isinstance(obj, (str, bytes)):
        items = list(obj)
        if all(isinstance(e, Encoding) for e in items):
            return items
    raise TypeError(
        f"names {type(obj).__name__}, not an Encoding, a sequence of them or a function returning them"
    )


def _entry_point_text(ep: metadata.EntryPoint) -> str:
    """``entry point my-table = my_package.encodings:MY_TABLE (package my-package 1.0)``."""
    dist = getattr(ep, "dist", None)
    try:
        package = f"{dist.metadata['Name'] or dist.name} {dist.version}" if dist is not None else "unknown"
    except Exception:  # a broken dist-info: the entry point still names the plugin
        package = "unknown"
    return f"entry point {ep.name} = {ep.value} (package {package})"


def _load_plugins() -> None:
    """Register the encodings of installed packages (entry-point group ``peg.encodings``), once.

    A plugin that fails to load (any exception, ``SystemExit`` included: its module may call
    ``sys.exit`` at import) is skipped with one warning line naming its entry point and package:
    a broken third-party package must not take every command line down with it.  Each encoding
    loaded carries its entry point as ``source`` (its builder's failures name it).
    """
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        source = _entry_point_text(ep)
        try:
            for encoding in _plugin_encodings(ep.load()):
                register_encoding(dataclasses.replace(encoding, source=source))
        except (Exception, SystemExit) as e:
            why = " ".join(f"{type(e).__name__}: {e}".split())
            # one line: no source line under it (the "file" is the entry-point group, line 0)
            warnings.warn_explicit(f"position-encoding plugin {ep.name!r} skipped ({why}): {source}",
                                   RuntimeWarning, ENTRY_POINT_GROUP, 0, module=__name__)  # fmt: skip


def _register_rotary_kinds() -> None:
    """An encoding of kind ``"rotate"`` for every rotary kind :mod:`peg_core.rope` lists (:data:`ROTARY_KINDS`)
    and the registry has not yet: the one list of rotary names is there, kinds added later included."""
    for k in ROTARY_KINDS.values():
        if k.name not in _REGISTRY:
            register_encoding(Encoding(k.name, "rotate", _rope(k.name), k.dims, description=k.description))


def get_encoding(name: str) -> Encoding:
    """The registered encoding ``name``; :class:`PosEncError` naming the choices otherwise."""
    _load_plugins()
    _register_rotary_kinds()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PosEncError(
            f"unknown position encoding {name!r} (registered: {', '.join(sorted(_REGISTRY))})"
        ) from None


def encoding_names(*, kind: str | None = None, ndim: int | None = None) -> list[str]:
    """Registered names in registration order, optionally of one kind / for one grid rank."""
    _load_plugins()
    _register_rotary_kinds()
    return [
        e.name
        for e in _REGISTRY.values()
        if (kind is None or e.kind == kind) and (ndim is None or ndim in e.dims)
    ]


@dataclass(frozen=True)
class EncodingSpec:
    """A parsed ``pos_enc``: at most one encoding per slot (``None`` where the slot is empty).

    ``text`` is the value as given (what configs and checkpoints store); ``none`` has all slots empty.
    """

    text: str
    table: Encoding | None = None
    conditional: Encoding | None = None
    rotary: Encoding | None = None
    bias: Encoding | None = None

    @property
    def parts(self) -> tuple[Encoding, ...]:
        """The filled slots in :data:`SLOTS` order."""
        return tuple(e for e in (self.table, self.conditional, self.rotary, self.bias) if e is not None)

    @property
    def slots(self) -> tuple[str, ...]:
        return tuple(e.slot for e in self.parts)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class EncodingSupport:
    """What one model family accepts as ``pos_enc``.

    Attributes:
        family: its name in messages ("CPVT", "the DETR encoder"...).
        ndim: the grid rank of its tokens; only encodings whose ``dims`` hold it are offered.
        slots: the slots it implements.
        combos: the slot sets it can take together (``None``: any set of its slots); a single slot
            is always allowed.
        exclude: registered names it has no implementation of (refused with a reason).
        examples: combinations to show in ``-h``.
    """

    family: str
    ndim: int
    slots: tuple[str, ...] = ("table", "conditional", "rotary")
    combos: tuple[tuple[str, ...], ...] | None = None
    exclude: tuple[str, ...] = ()
    examples: tuple[str, ...] = ()

    def names(self) -> list[str]:
        """The single names it accepts: ``none`` and every registered encoding it can build."""
        return [NONE] + [
            e.name
            for e in (get_encoding(n) for n in encoding_names(ndim=self.ndim))
            if e.slot in self.slots and e.name not in self.exclude
        ]

    def check(self, spec: EncodingSpec) -> EncodingSpec:
        """``spec`` if this family can build it; :class:`PosEncError` saying why not otherwise."""
        where = f"pos_enc={spec.text!r}"
        for e in spec.parts:
            if self.ndim not in e.dims:
                raise PosEncError(
                    f"{self.family} has a {self.ndim}-D token grid; encoding {e.name!r} runs on "
                    f"{'/'.join(f'{d}-D' for d in e.dims)} grids", where
                )  # fmt: skip
            if e.name in self.exclude or e.slot not in self.slots:
                raise PosEncError(f"{self.family} has no {e.slot} encoding {e.name!r}; choose from "
                                  f"{', '.join(self.names())}", where)  # fmt: skip
        slots = set(spec.slots)
        if len(slots) > 1 and self.combos is not None and not any(slots == set(c) for c in self.combos):
            allowed = ", ".join("+".join(c) for c in self.combos) or "none"
            raise PosEncError(f"{self.family} takes no {'+'.join(spec.slots)} combination (it combines: "
                              f"{allowed})", where)  # fmt: skip
        return spec

    def help(self) -> str:
        """One ``-h`` line: the names, the combination rule and examples."""
        names = ", ".join(self.names())
        if self.combos == ():
            rule = "one of them"
        elif self.combos is None:
            rule = "or a '+' combination with at most one " + ", one ".join(self.slots) + " encoding"
        else:
            rule = "or a '+' combination of " + "; ".join("+".join(c) for c in self.combos) + " encodings"
        examples = f" (e.g. {', '.join(self.examples)})" if self.examples else ""
        return f"position encoding: {names}; {rule}{examples}"


def parse_pos_enc(text: str, support: EncodingSupport | None = None) -> EncodingSpec:
    """``"peg+rope-mixed"`` -> ``EncodingSpec(conditional=peg, rotary=rope-mixed)``, checked against ``support``.

    Rules for every family: each part is a registered name; ``none`` stands alone; no slot twice.
    Raises :class:`PosEncError` (a ``ValueError``) naming the value; ``TypeError`` for a non-string.
    """
    if not isinstance(text, str):
        raise TypeError(f"pos_enc must be a string; got {type(text).__name__}")
    where = f"pos_enc={text!r}"
    parts = text.split("+")
    if NONE in parts:
        if len(parts) > 1:
            raise PosEncError(f"{NONE!r} means no position encoding and combines with nothing", where)
        spec = EncodingSpec(text)
    else:
        filled: dict[str, Encoding] = {}
        for name in parts:
            if not name:
                raise PosEncError("empty part in a '+' combination", where)
            try:
                e = get_encoding(name)
            except PosEncError as err:
                raise PosEncError(err.what, where) from None
            if e.slot in filled:
                raise PosEncError(f"{filled[e.slot].name!r} and {name!r} are both {e.slot} encodings; keep one",
                                  where)  # fmt: skip
            filled[e.slot] = e
        spec = EncodingSpec(text, **filled)
    return spec if support is None else support.check(spec)


# --- a family's parts --------------------------------------------------------------------------


@dataclass
class EncodingParts:
    """What one family builds from a spec (:func:`build_encoding_parts`); ``None`` / empty where the slot is.

    Attributes:
        table: the ``"add"`` table (a :class:`peg_core.PositionEncoding`: codes ``(1, N, C)`` added
            to the tokens, or to every layer's queries and keys when its ``apply_to`` is ``"qk"``).
        pegs: the conditional encodings by position ``{i: module}``: ``-1`` before block 0, ``i``
            after block ``i`` (sorted); each is a :class:`peg_core.PositionEncoding` computed from
            the tokens.
        rotary: the ``"rotate"`` part (a :class:`peg_core.rope.RotaryEmbedding`: a ``(sin, cos)``
            table per grid for the queries and keys of every attention).
        bias: the ``"bias"`` part (a :class:`peg_core.bias.AttentionBias`: one ``(1, heads, N, N)``
            float term per grid for every attention's logits).
    """

    table: nn.Module | None = None
    pegs: dict[int, nn.Module] = field(default_factory=dict)
    rotary: nn.Module | None = None
    bias: nn.Module | None = None

    @property
    def peg_at(self) -> tuple[int, ...]:
        """The positions of :attr:`pegs`, sorted."""
        return tuple(sorted(self.pegs))

    def peg_modules(self) -> nn.ModuleDict:
        """:attr:`pegs` keyed by ``str(i)`` (the state-dict keys ``pos_blocks.<i>.*`` / ``pegs.<i>.*``)."""
        return nn.ModuleDict({str(i): self.pegs[i] for i in self.peg_at})


def build_encoding_parts(
    spec: EncodingSpec,
    ctx: EncodingContext,
    *,
    peg_at: Sequence[int] | str = (),
    rotary_options: Mapping[str, Any] | None = None,
    table_prefix_tokens: int | None = None,
    own: Mapping[str, Builder] | None = None,
    order: Sequence[str] = SLOTS,
) -> EncodingParts:
    """Build the parts of ``spec`` a family asks for: its table, its PEGs by position, its rotary and bias.

    Args:
        spec: the parsed ``pos_enc`` (:func:`parse_pos_enc`, checked against the family).
        ctx: the model's context: channels ``C``, training grid, prefix tokens, where a table's codes
            go, resize modes, heads and depth (the number of blocks the PEG positions and the
            per-layer rotary / bias parts count), the PEG's options ``ctx.peg`` and a table's
            ``ctx.options``.  The rotary and bias parts get it with ``dim = C // heads`` (they work
            per head) and ``rotary_options`` / no options.
        peg_at: where the conditional encodings go (:func:`peg_core.peg.resolve_peg_at` over
            ``ctx.depth`` blocks: ``-1`` before block 0, ``i`` after block ``i``, ``"all"``).
        rotary_options: the rotary class's keywords (``temperature``, ``indexing``, ``layout``...).
        table_prefix_tokens: the table's own count of prefix entries when it differs from the
            tokens' (timm's ``no_embed_class``: 0); ``None``: ``ctx.num_prefix_tokens``.
        own: the family's own builder of a registered name (RT-DETR's layout of ``sincos``).
        order: the slots to build, in this order (:data:`SLOTS` by default).  A slot not listed is
            left empty, so a family that builds layers between its parts keeps the order its
            parameters were always drawn from the RNG in (seeded runs keep their weights).

    Raises :class:`ValueError` for ``peg_at`` outside the blocks, and what the builders raise.
    """
    unknown = [slot for slot in order if slot not in SLOTS]
    if unknown:
        raise ValueError(f"order names slots {unknown}; the slots are {SLOTS}")
    own = own or {}
    parts = EncodingParts()

    def build(e: Encoding, c: EncodingContext) -> nn.Module:
        return own[e.name](c) if e.name in own else e.build(c)

    head = dataclasses.replace(ctx, dim=ctx.dim // max(1, ctx.num_heads), options={})
    for slot in order:
        e = getattr(spec, slot)
        if e is None:
            continue
        if slot == "table":
            prefix = ctx.num_prefix_tokens if table_prefix_tokens is None else table_prefix_tokens
            parts.table = build(e, dataclasses.replace(ctx, num_prefix_tokens=prefix))
        elif slot == "conditional":
            conditional = dataclasses.replace(ctx, options={})
            parts.pegs = {i: build(e, conditional) for i in resolve_peg_at(peg_at, ctx.depth)}
        elif slot == "rotary":
            parts.rotary = build(e, dataclasses.replace(head, options=dict(rotary_options or {})))
        else:
            parts.bias = build(e, head)
    return parts


# --- the built-in encodings -------------------------------------------------------------------


def _sine(ctx: EncodingContext) -> nn.Module:
    return SinePositionEncoding2d(ctx.dim, num_prefix_tokens=ctx.num_prefix_tokens, apply_to=ctx.apply_to,
                                  **ctx.options)  # fmt: skip


def _sincos(ctx: EncodingContext) -> nn.Module:
    if ctx.ndim == 3:
        return SinCosPositionEncoding3d(ctx.dim, num_prefix_tokens=ctx.num_prefix_tokens, **ctx.options)
    return SinCosPositionEncoding2d(ctx.dim, num_prefix_tokens=ctx.num_prefix_tokens, apply_to=ctx.apply_to,
                                    **ctx.options)  # fmt: skip


def _learned(ctx: EncodingContext) -> nn.Module:
    cls = LearnedPositionEncoding3d if ctx.ndim == 3 else LearnedPositionEncoding2d
    if ctx.ndim == 3:
        kw = {"temporal_interpolation": ctx.temporal_interpolation}
    else:
        kw = {"apply_to": ctx.apply_to, "antialias": ctx.antialias}
    return cls(ctx.dim, tuple(ctx.grid_size), num_prefix_tokens=ctx.num_prefix_tokens,
               interpolation=ctx.interpolation, **kw, **ctx.options)  # fmt: skip


def _peg(ctx: EncodingContext) -> nn.Module:
    # options given directly (build_position_encoding's keywords) override the PegOptions value
    return PEG2d(
        ctx.dim, num_prefix_tokens=ctx.num_prefix_tokens, **{**ctx.peg.class_options(2), **ctx.options}
    )


def _peg3d(factorized: bool) -> Builder:
    def build(ctx: EncodingContext) -> nn.Module:
        return PEG3d(ctx.dim, num_prefix_tokens=ctx.num_prefix_tokens, factorized=factorized,
                     **{**ctx.peg.class_options(3), **ctx.options})  # fmt: skip

    return build


def _rope(kind: str) -> Builder:
    def build(ctx: EncodingContext) -> nn.Module:
        return build_rope(kind, ctx.dim, num_heads=ctx.num_heads, depth=ctx.depth, **ctx.options)

    return build


def _alibi(ctx: EncodingContext) -> nn.Module:
    return ALiBiBias(ctx.num_heads, ctx.ndim, **ctx.options)


def _fire(ctx: EncodingContext) -> nn.Module:
    # L0 of FIRE's threshold: half the training grid's diagonal (FIRE: 512 for 2048-token training)
    options = dict(ctx.options)
    options.setdefault("init_threshold", max(1.0, 0.5 * sum((s - 1) ** 2 for s in ctx.grid_size) ** 0.5))
    return FIREBias(ctx.num_heads, ctx.ndim, **options)


def _lookhere(ctx: EncodingContext) -> nn.Module:
    return LookHereBias(ctx.num_heads, ctx.ndim, depth=ctx.depth, **ctx.options)


for _e in (
    Encoding("peg", "add", _peg, (2,), conditional=True, description="PEG: depthwise conv after blocks (CPVT)"),
    Encoding("peg3d", "add", _peg3d(False), (3,), conditional=True, description="3-D PEG after blocks"),
    Encoding("peg3d-factorized", "add", _peg3d(True), (3,), conditional=True,
             description="3-D PEG as (k,1,1) then (1,k,k) depthwise convs"),
    Encoding("learned", "add", _learned, (2, 3), description="learned table, resized to the grid"),
    Encoding("sincos", "add", _sincos, (2, 3), description="fixed sin-cos table (MAE)"),
    Encoding("sine", "add", _sine, (2,), description="DETR's mask-aware sine encoding"),
):  # fmt: skip
    register_encoding(_e)
# the rotary kinds as peg_core.rope registers them (rotary_kind): one list
_register_rotary_kinds()
for _e in (
    Encoding("alibi-2d", "bias", _alibi, (2, 3),
             description="ALiBi slopes times the grid distance (3-D for videos), added to the logits"),
    Encoding("fire", "bias", _fire, (2, 3),
             description="FIRE: an MLP of the log-normalised grid distance, added to the logits"),
    Encoding("lookhere", "bias", _lookhere, (2,),
             description="LookHere: directed 2-D attention masks per head with distance penalties"),
):  # fmt: skip
    register_encoding(_e)
del _e


def build_position_encoding(kind: str, dim: int, **options: Any) -> nn.Module:
    """A 2-D ``"add"`` encoding (or ``"none"``) by name, with its class's own keywords.

    The direct form for scripts: ``kind`` is a registered 2-D ``add`` name or ``"none"``
    (:class:`peg_core.NoPositionEncoding`); ``options`` go to the class (``kernel_size``,
    ``num_prefix_tokens``, ``grid_size``, ``interpolation``, ``temperature``, ``apply_to``...).  The
    result's ``apply_to`` says whether a model adds it to the tokens or only to queries / keys.
    """
    if kind == NONE:
        return NoPositionEncoding(dim, **options)
    e = get_encoding(kind)
    if e.kind != "add" or 2 not in e.dims:
        raise PosEncError(f"build_position_encoding builds 2-D 'add' encodings; {kind!r} is {e.kind} "
                          f"on {e.dims}-D grids", kind)  # fmt: skip
    ctx_keys = {"num_prefix_tokens", "apply_to", "interpolation", "antialias", "grid_size"}
    ctx = {k: options.pop(k) for k in ctx_keys & options.keys()}
    grid = ctx.pop("grid_size", 14)
    grid = (grid, grid) if isinstance(grid, int) else tuple(grid)
    if "apply_to" not in ctx and kind == "sine":
        ctx["apply_to"] = "qk"  # DETR's default for its sine encoding
    try:
        return e.build(EncodingContext(dim, grid, options=options, **ctx))
    except TypeError as err:
        raise TypeError(f"build_position_encoding({kind!r}, ...): {err}") from None
