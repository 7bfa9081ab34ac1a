"""One typed config per detector family: the mechanism the families share.

Each family (DETR, RT-DETR, D-FINE, DEIMv2) declares a ``@dataclass`` subclass of
:class:`DetectorConfig` in its folder (``models/<family>/config.py``): the builder's settings with
their defaults, the published sizes as named overrides (:attr:`DetectorConfig.SIZES`), validation
in :meth:`DetectorConfig.validate`.  A field's command-line flag and Hugging Face ``config.json``
name are declared once, on the field (:func:`option`), or, for the settings every family shares
under one name (``hidden_dim``, ``num_heads``, the PEG group, ...), once in :data:`COMMON`.  The
command line (``peg_detr.cli``), the arch registry (``peg_detr.archs``) and the Hugging Face
interop read them from here instead of restating them.

A config's :meth:`~DetectorConfig.to_dict` is what a checkpoint stores as ``model_config`` (with
``arch``): the builder's keyword names, json-safe, so checkpoints written before the configs were
typed (``model.build_config`` of the keyword builders) are read by :meth:`~DetectorConfig.from_dict`
unchanged.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from peg_core.peg import PegOptions, fold_peg_keys

__all__ = ["COMMON", "DetectorConfig", "Option", "json_safe", "option", "peg_at_value"]

C = TypeVar("C", bound="DetectorConfig")


@dataclass(frozen=True)
class Option:
    """What a config field is outside Python: its flag, its Hugging Face name, how the flag parses.

    Attributes:
        flag: the ``train`` option string (``"--head-act"``); None: no flag sets it.
        hf: the field's name in the family's Hugging Face ``config.json`` (a tuple: every field holding
            it, e.g. the encoder's and the decoder's width); None: transformers has none.
        where: where a built model records each of ``hf``'s values, ``"encoder.<key>"`` /
            ``"decoder.<key>"`` (the module's ``hparams`` key: ``dec_layers`` is the decoder's
            ``num_layers``), paired with ``hf`` in order; the Hugging Face export reads them there,
            since a model built from a folder has no config of ours (:meth:`DetectorConfig.hf_names`),
            and the builder passes the value as that module's keyword (:meth:`DetectorConfig.part_options`);
            a field transformers lacks may name its place alone (no ``hf``).
        help, choices, metavar: the flag's argparse settings.
        type: the value's kind, named (``"positive_int"``, ``"unit_fraction"``, ``"int"``; None: a string): the
            command line owns the parsers, and importing a model loads no argparse.
        boolean: a ``--flag`` / ``--no-flag`` pair whose unset value is None (the builder's default).
        loss: the setting shapes the criterion, not the model (a Hugging Face ``--init`` run keeps it).
        stored: recorded in the checkpoint's ``model_config`` (a weights file's path is not).
        shared: the flag is added by the command line's shared groups (its help and aliases live there).
    """

    flag: str | None = None
    hf: str | tuple[str, ...] | None = None
    where: str | tuple[str, ...] | None = None
    help: str | None = None
    type: str | None = None
    choices: Sequence[str] | None = None
    metavar: str | None = None
    boolean: bool = False
    loss: bool = False
    stored: bool = True
    shared: bool = False


def option(default: Any = None, *, factory: Callable[[], Any] | None = None, **spec: Any) -> Any:
    """A config field with its :class:`Option` attributes ``spec``; ``factory``: a mutable default.

    On a field :data:`COMMON` names, ``spec`` adds to or replaces the common declaration
    (``hidden_dim: int = option(256, hf="d_model")`` keeps ``--hidden-dim``).
    """
    Option(**spec)  # an unknown attribute is a TypeError here, where the field is declared
    meta = {"option": spec}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


#: the settings every family that has them names alike: one flag each, declared here once.  The
#: command line's shared groups add these flags (``--num-heads`` with its alias ``--nheads``, the
#: PEG group of :func:`peg_core.engine.add_pos_args`); a family has the flag when its config has the field.
COMMON: dict[str, Option] = {
    "backbone": Option("--backbone", shared=True),
    "pos_enc": Option("--pos-enc", shared=True),
    "num_queries": Option("--num-queries", hf="num_queries", shared=True),
    "aux_loss": Option("--no-aux-loss", hf="auxiliary_loss", shared=True),
    "hidden_dim": Option("--hidden-dim", shared=True),
    "num_heads": Option("--num-heads", shared=True),
    # one hyper-parameter, three names: ours, the module's, transformers'
    "enc_layers": Option("--enc-layers", hf="encoder_layers", where="encoder.num_layers", shared=True),
    "dec_layers": Option("--dec-layers", hf="decoder_layers", where="decoder.num_layers", shared=True),
    "dim_feedforward": Option("--dim-feedforward", shared=True),
    "dropout": Option("--dropout", hf="dropout", where="encoder.dropout", shared=True),
    "backbone_weights": Option("--backbone-weights", stored=False, shared=True),
    "learned_grid": Option("--learned-grid", shared=True),
    "pos_interpolation": Option("--pos-interpolation", shared=True),
    "peg_at": Option("--peg-at", shared=True),
    "peg_kernel_size": Option("--peg-kernel-size", shared=True),
    "peg_separable": Option("--peg-separable", shared=True),
    "peg_padding": Option("--peg-padding", shared=True),
    "peg_dynamic": Option("--peg-dynamic", shared=True),
    "peg_num_kernels": Option("--peg-num-kernels", shared=True),
    "num_denoising": Option(
        "--num-denoising",
        hf="num_denoising",
        type="nonnegative_int",
        help="denoising queries per image (0: off)",
    ),
    "label_noise_ratio": Option(
        "--label-noise-ratio",
        hf="label_noise_ratio",
        type="unit_fraction",
        help="denoising: labels flipped at random",
    ),
    "box_noise_scale": Option(
        "--box-noise-scale",
        hf="box_noise_scale",
        type="nonnegative_float",
        help="denoising: box jitter, in box sizes",
    ),
    # the RT-DETR family's: added from here to the command line (DETR's encoder has no CSP, no denoising)
    "encoder_expansion": Option(
        "--encoder-expansion",
        hf="hidden_expansion",
        where="encoder.expansion",
        type="positive_float",
        help="CCFM CSP width multiplier (R18vd 0.5)",
    ),
}

#: model_config keys of older checkpoints -> today's field names
RENAMED = {"nheads": "num_heads"}


def json_safe(value: Any) -> Any:
    """``value`` as JSON reads it back: tuples as lists, paths as strings, recursively."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def peg_at_value(peg_at: Sequence[int] | int | str) -> list[int] | str:
    """``peg_at`` as configs hold it: ``"all"`` or a list of layer indices."""
    if isinstance(peg_at, str):
        return peg_at
    return [int(peg_at)] if isinstance(peg_at, int) else [int(i) for i in peg_at]


@dataclass(kw_only=True)
class DetectorConfig:
    """A family's builder settings (subclasses declare the fields; see the module docstring).

    Class attributes a family sets:
        TITLE: the family's name in messages (``"RT-DETR"``).
        HELP_TITLE: the ``--help`` heading of the flags only this family has (None: ``TITLE``).
        ENCODINGS: what ``pos_enc`` may be (the family encoder's
            :class:`~peg_core.registry.EncodingSupport`; ``--pos-enc`` is checked against it).
        SIZES: ``name -> overrides`` of the published (and the CPU demos') sizes, ``--model-size``'s presets.
    """

    TITLE: ClassVar[str] = "detector"
    HELP_TITLE: ClassVar[str | None] = None
    ENCODINGS: ClassVar[Any] = None
    SIZES: ClassVar[Mapping[str, Mapping[str, Any]]] = {}

    def __post_init__(self) -> None:
        # one form per value, the stored one: a config equals its JSON round trip ((20, 20) is [20, 20])
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                setattr(self, f.name, json_safe(value))
        if hasattr(self, "peg_at"):  # 0, (0,) and [0] alike
            self.peg_at = peg_at_value(self.peg_at)
        self.validate()

    def validate(self) -> None:
        """A ``ValueError`` naming the setting when the values cannot build a model (the family's checks)."""

    # ------------------------------------------------------------------ the fields' declarations

    @classmethod
    def field_options(cls) -> dict[str, Option]:
        """``field name -> Option`` of every field with one: :data:`COMMON`'s of that name with the field's own on top."""
        found = {}
        for f in fields(cls):
            own = f.metadata.get("option")
            if own is not None:
                found[f.name] = dataclasses.replace(COMMON.get(f.name, Option()), **own)
            elif f.name in COMMON:
                found[f.name] = COMMON[f.name]
        return found

    @classmethod
    def flags(cls) -> dict[str, Option]:
        """``field name -> Option`` of the fields a ``train`` flag sets (the field name is the flag's dest)."""
        return {name: spec for name, spec in cls.field_options().items() if spec.flag is not None}

    @classmethod
    def loss_fields(cls) -> tuple[str, ...]:
        """The fields that shape the criterion rather than the model."""
        return tuple(name for name, spec in cls.field_options().items() if spec.loss)

    @classmethod
    def hf_fields(cls) -> dict[str, tuple[str, ...]]:
        """``field name -> the Hugging Face config.json fields holding it``, for the fields transformers has."""
        return {
            name: (spec.hf,) if isinstance(spec.hf, str) else tuple(spec.hf)
            for name, spec in cls.field_options().items()
            if spec.hf is not None
        }

    @classmethod
    def hf_names(cls, part: str) -> dict[str, str]:
        """``hparams key -> Hugging Face config.json field`` of module ``part`` (``"encoder"``, ``"decoder"``).

        The Hugging Face exporters write ``model.<part>.hparams[key]`` under these names: the
        fields' declarations (:attr:`Option.where` paired with :attr:`Option.hf`), not a map of their own.
        """
        found = {}
        for spec in cls.field_options().values():
            if spec.hf is None or spec.where is None:
                continue
            names = (spec.hf,) if isinstance(spec.hf, str) else spec.hf
            places = (spec.where,) if isinstance(spec.where, str) else spec.where
            for hf, place in zip(names, places, strict=True):
                module, _, key = place.partition(".")
                if module == part:
                    found[key] = hf
        return found

    def part_options(self, part: str) -> dict[str, Any]:
        """``keyword -> value`` of the fields module ``part`` (``"encoder"``, ``"decoder"``) is built from.

        The fields' :attr:`Option.where` declarations (``"decoder.num_layers"``: ``dec_layers`` is the
        decoder's ``num_layers``), the same :meth:`hf_names` reads: the builder and the Hugging Face
        export say once which field goes where.  A field without one (``num_queries``, a value two
        parts share under one declaration) is the builder's to pass.
        """
        found = {}
        for name, spec in self.field_options().items():
            places = (spec.where,) if isinstance(spec.where, str) else spec.where or ()
            for place in places:
                module, _, key = place.partition(".")
                if module == part:
                    found[key] = getattr(self, name)
        return found

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of field ``name`` (a recipe names it instead of restating the number)."""
        f = cls.__dataclass_fields__[name]
        return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default

    # ------------------------------------------------------------------ building and storing

    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
        """The config of stored or given settings: a ``model_config`` (``arch`` ignored), old key names read.

        A key that is no field of this family is a ``TypeError`` naming it (as an unknown keyword of a
        function is); a value the family cannot build is a ``ValueError`` (:meth:`validate`).
        """
        kw = {RENAMED.get(k, k): v for k, v in data.items() if k != "arch"}
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kw) - names)
        if unknown:
            raise TypeError(f"{cls.TITLE} has no setting {', '.join(map(repr, unknown))}")
        return cls(**kw)

    @classmethod
    def preset(cls: type[C], size: str, **overrides: Any) -> C:
        """The config of the published size ``size`` (:attr:`SIZES`), with ``overrides`` on top."""
        if size not in cls.SIZES:
            raise ValueError(f"{cls.TITLE} has no size {size!r}; choose from {sorted(cls.SIZES)}")
        return cls.from_dict({**cls.SIZES[size], **overrides})

    def settings(self) -> dict[str, Any]:
        """Every field's value, the unstored ones too (what :meth:`replace` starts from)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def peg_options(self) -> PegOptions:
        """The PEG's options as one value, from this config's loose ``peg_*`` fields (the flags' destinations).

        The fields a family lacks keep :class:`~peg_core.peg.PegOptions`' defaults; the one reader
        of the loose keys is :func:`~peg_core.peg.fold_peg_keys`.
        """
        return fold_peg_keys({**self.settings(), "peg": PegOptions()})["peg"]

    def replace(self: C, **overrides: Any) -> C:
        """A copy with ``overrides`` (validated; an unknown key is a ``TypeError``)."""
        return type(self).from_dict({**self.settings(), **overrides})

    def to_dict(self) -> dict[str, Any]:
        """The stored settings, json-safe: a checkpoint's ``model_config`` without ``arch``."""
        options = self.field_options()
        return {
            f.name: json_safe(getattr(self, f.name))
            for f in fields(self)
            if options.get(f.name, Option()).stored
        }

    @classmethod
    def resolve(
        cls: type[C],
        config: C | str | None = None,
        pos_enc: str | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> C:
        """A builder's arguments as a config: a config, or (the keyword builders' form) a backbone name.

        ``build_rtdetr(config)``, ``build_rtdetr(config, hidden_dim=64)`` and the older
        ``build_rtdetr("tiny", "peg", hidden_dim=64)`` all land here.
        """
        if isinstance(config, DetectorConfig):
            if not isinstance(config, cls):
                raise TypeError(f"expected a {cls.__name__}, got a {type(config).__name__}")
            base = config.settings()
        else:
            base = {} if config is None else {"backbone": config}
        if pos_enc is not None:
            base["pos_enc"] = pos_enc
        return cls.from_dict({**base, **(overrides or {})})
