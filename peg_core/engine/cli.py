"""One command-line convention for ``python -m peg_core|peg_detr|peg_video``.

Every package has the verbs ``make-data``, ``train``, ``eval`` and ``predict``
(:func:`dispatch`).  Every ``train`` takes the flags of :func:`add_train_args`,
every ``eval`` those of :func:`add_eval_args`.  Flags with several values use
one syntax everywhere: comma-separated (``--eval-sizes 60,80,100``,
``--peg-at 0,1``), grids as ``HxW`` (``--learned-grid 25x42``).  Option values
are checked by argparse types (:func:`positive_int`, ...), so a bad value is a
one-line usage error before any work starts.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..interop.classes import read_class_map
from ..interop.io import WEIGHTS_AS_TYPED
from ..jsonfile import JsonError, read_json
from ..peg import PADDING_MODES
from ..registry import EncodingSupport, PosEncError, parse_pos_enc
from ..resize import INTERPOLATION_MODES
from .command import ArgumentParser, UserError, run_command
from .helptext import plain_text
from .memory import add_max_memory_arg

__all__ = [
    "AMP_CHOICES",
    "RESIZE_MODES",
    "add_alias",
    "add_arch_arg",
    "add_class_map_arg",
    "add_data_root_arg",
    "add_eval_args",
    "add_layer_decay_arg",
    "add_make_data_counts",
    "add_num_heads_arg",
    "add_overwrite_arg",
    "add_pos_args",
    "add_train_args",
    "class_map_arg",
    "device_arg",
    "dispatch",
    "explicit_options",
    "grid_arg",
    "image_side",
    "image_side_list",
    "int_in",
    "int_list",
    "json_safe",
    "layer_decay_value",
    "nonnegative_float",
    "nonnegative_int",
    "odd_kernel",
    "parse_with_config",
    "peg_at_arg",
    "pos_enc_arg",
    "positive_float",
    "positive_int",
    "positive_int_list",
    "unit_fraction",
    "unused_pos_flags",
]

AMP_CHOICES = ("off", "bf16", "fp16")
#: how a learned table is resized to another grid (``--pos-interpolation``): the library's 2-D modes
RESIZE_MODES = tuple(INTERPOLATION_MODES[2])
#: PEG conv borders (``--peg-padding``): the library's own list
PEG_PADDINGS = PADDING_MODES


def _number(text: str, kind: type, what: str, ok: Callable[[Any], bool]) -> Any:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """``argparse`` type: an integer >= 1."""
    return _number(text, int, "a positive integer", lambda v: v >= 1)


def nonnegative_int(text: str) -> int:
    """``argparse`` type: an integer >= 0."""
    return _number(text, int, "an integer >= 0", lambda v: v >= 0)


def positive_float(text: str) -> float:
    """``argparse`` type: a finite number > 0."""
    return _number(text, float, "a number > 0", lambda v: 0 < v < float("inf"))


def nonnegative_float(text: str) -> float:
    """``argparse`` type: a finite number >= 0."""
    return _number(text, float, "a number >= 0", lambda v: 0 <= v < float("inf"))


def unit_fraction(text: str) -> float:
    """``argparse`` type: a fraction in ``[0, 1]`` (``0.01`` or ``1%``)."""
    text = str(text).strip()
    if text.endswith("%"):
        return _number(text[:-1], float, "a percentage in [0, 100]", lambda v: 0 <= v <= 100) / 100
    return _number(text, float, "a fraction in [0, 1] (or a percentage like 1%)", lambda v: 0 <= v <= 1)


def layer_decay_value(text: str) -> float:
    """``argparse`` type of ``--layer-decay``: a number in ``(0, 1]``."""
    return _number(text, float, "a layer decay in (0, 1]", lambda v: 0 < v <= 1)


def _list(text: str, kind: Callable[[str], Any], what: str) -> list:
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p for p in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated {what}, e.g. 1,2,3; got {text!r}")
    try:
        return [kind(p) for p in parts]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from None


def int_list(text: str) -> list[int]:
    """``argparse`` type: ``"0,1,2"`` -> ``[0, 1, 2]`` (integers >= 0)."""
    return _list(text, nonnegative_int, "integers >= 0")


def positive_int_list(text: str) -> list[int]:
    """``argparse`` type: ``"60,80,100"`` -> ``[60, 80, 100]`` (integers >= 1)."""
    return _list(text, positive_int, "positive integers")


#: the largest image side (pixels) a size flag accepts: a 4096x4096 RGB float batch of one is
#: 200 MB, and a typo such as ``--eval-sizes 100000`` (~50 GB per image) is refused before any work
MAX_IMAGE_SIDE = 4096


def image_side(text: str) -> int:
    """``argparse`` type: an image side in pixels, ``1..MAX_IMAGE_SIDE``."""
    return _number(text, int, f"an image side in 1..{MAX_IMAGE_SIDE}", lambda v: 1 <= v <= MAX_IMAGE_SIDE)


def int_in(lo: int, hi: int, what: str = "an integer") -> Callable[[str], int]:
    """``argparse`` type: an integer in ``lo..hi``; ``what`` names it in the usage error
    (``"expected a repeat count in 1..16, got '100000'"``)."""
    return lambda text: _number(text, int, f"{what} in {lo}..{hi}", lambda v: lo <= v <= hi)


def image_side_list(text: str) -> list[int]:
    """``argparse`` type: ``"36,48,72"`` -> ``[36, 48, 72]``, each side in ``1..MAX_IMAGE_SIDE``."""
    return _list(text, image_side, f"image sides in 1..{MAX_IMAGE_SIDE}")


def grid_arg(text: str) -> list[int]:
    """``argparse`` type: ``"25x42"`` -> ``[25, 42]``; ``"24"`` -> ``[24, 24]`` (positive sides)."""
    parts = str(text).lower().replace("×", "x").split("x")
    try:
        sides = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected HxW with positive integers, e.g. 24x32; got {text!r}"
        ) from None
    if len(sides) == 1:
        sides = sides * 2
    if len(sides) != 2 or min(sides) < 1:
        raise argparse.ArgumentTypeError(f"expected HxW with positive integers, e.g. 24x32; got {text!r}")
    return sides


def device_arg(text: str) -> str:
    """``argparse`` type: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (availability is checked at start)."""
    t = str(text).strip().lower()
    if t in ("auto", "cpu", "cuda") or (t.startswith("cuda:") and t[5:].isdigit()):
        return t
    raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N; got {text!r}")


def peg_at_arg(text: str) -> list[int] | str:
    """``argparse`` type of ``--peg-at``: ``all`` or block indices ``0,1,2`` (``-1``: before block 0).

    The meaning is the same in every model (:func:`peg_core.peg.resolve_peg_at`).
    """
    text = str(text).strip()
    if text == "all":
        return "all"
    parts = [t.strip() for t in text.split(",")]
    if "-1" in parts:
        rest = [t for t in parts if t != "-1"]
        return [-1, *(int_list(",".join(rest)) if rest else [])]
    return int_list(text)


def odd_kernel(text: str) -> int:
    """``argparse`` type: an odd kernel side >= 1 (a PEG keeps the grid's size)."""
    value = positive_int(text)
    if value % 2 == 0:
        raise argparse.ArgumentTypeError(f"expected an odd integer >= 1; got {text!r}")
    return value


# ------------------------------------------------------------------------ the shared knob vocabulary
# One spelling per knob in every package; older spellings stay as hidden aliases (add_alias) so
# commands written before the vocabulary still run.


def add_alias(group: argparse._ActionsContainer, *names: str, dest: str, **kwargs: Any) -> None:
    """Old spellings of an option: same ``dest``, hidden from ``-h``, no default of their own.

    ``default=SUPPRESS`` matters: two actions on one ``dest`` would otherwise let the alias's
    default overwrite the real option's.
    """
    group.add_argument(*names, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


def add_data_root_arg(
    group: argparse._ActionsContainer, *, help: str, aliases: Sequence[str] = (), required: bool = False
) -> None:
    """``--data-root PATH``: where a task's data set lives (``aliases``: the task's old spellings).

    argparse checks ``required`` per action, so a required option given by an alias would be
    refused; with aliases, a task checks presence after parsing (peg_detr's ``parse_train_args``).
    """
    if required and aliases:
        raise ValueError("add_data_root_arg: required=True cannot be checked by argparse with aliases")
    group.add_argument("--data-root", type=Path, required=required, help=help)
    if aliases:
        add_alias(group, *aliases, dest="data_root", type=Path)


def add_arch_arg(
    group: argparse._ActionsContainer,
    choices: Sequence[str],
    *,
    help: str,
    aliases: Sequence[str] = (),
    default: str | None = None,
) -> None:
    """``--arch NAME``: the model architecture, one of ``choices``."""
    group.add_argument("--arch", choices=list(choices), default=default, help=help)
    if aliases:
        add_alias(group, *aliases, dest="arch", choices=list(choices))


def add_layer_decay_arg(group: argparse._ActionsContainer) -> None:
    """``--layer-decay D``: layer-wise lr decay (BEiT / VideoMAE fine-tuning; unset: off).

    Layer ``i`` of a model with ``L`` blocks trains at ``lr x D ** (L + 1 - i)``
    (:func:`peg_core.engine.param_groups`).
    """
    group.add_argument("--layer-decay", type=layer_decay_value, metavar="D",
                       help="layer-wise lr decay in (0, 1]: block i of L trains at lr x D^(L-i), the "
                       "embeddings at lr x D^(L+1), the head at lr (default: off)")  # fmt: skip


def add_num_heads_arg(group: argparse._ActionsContainer, *, aliases: Sequence[str] = ()) -> None:
    """``--num-heads N``: attention heads (default: the architecture's)."""
    group.add_argument("--num-heads", type=positive_int, help="attention heads (default: the arch's)")
    if aliases:
        add_alias(group, *aliases, dest="num_heads", type=positive_int)


def pos_enc_arg(support: EncodingSupport, extra: Sequence[str] = ()) -> Callable[[str], str]:
    """An argparse ``type`` for ``--pos-enc``: the value if ``support``'s family can build it.

    The registry (:mod:`peg_core.registry`) decides, so a plugin's encoding is accepted and a
    wrong pair is refused in one line while the arguments are parsed.  ``extra``: the task's own
    words that are not encodings (peg_video's ``table``: keep an ``--init`` folder's encoding).
    """

    def parse(text: str) -> str:
        if text in extra:
            return text
        try:
            parse_pos_enc(text, support)
        except (PosEncError, TypeError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text

    parse.__name__ = "pos_enc"
    return parse


def add_pos_args(
    group: argparse._ActionsContainer,
    support: EncodingSupport,
    *,
    peg_at_help: str = "blocks followed by a PEG, e.g. 0 or 0,1,2; -1: before block 0; all: after every block",
    dynamic: bool = True,
    interpolation: bool = True,
    extra: Mapping[str, str] | None = None,
    note: str = "",
) -> None:
    """``--pos-enc`` and the PEG group, the same flags and meanings in every package.

    ``--pos-enc`` (what ``support`` accepts, from the registry: its ``-h`` lists the registered
    names, so a plugin's encoding shows), ``--peg-at`` (:func:`peg_at_arg`), ``--peg-kernel-size``,
    ``--peg-separable``, ``--peg-padding``, ``--peg-dynamic`` with ``--peg-num-kernels`` (when the
    task's PEG supports it) and ``--pos-interpolation`` (how a learned table is resized).  Every
    default is ``None``: the recipe's or the model's value.  ``extra``: task words that are not
    encodings -> their help; ``note``: a sentence appended to the help.
    """
    extra = dict(extra or {})
    words = "".join(f"; {k}: {v}" for k, v in extra.items())
    group.add_argument(
        "--pos-enc", type=pos_enc_arg(support, tuple(extra)), metavar="NAME",
        help=support.help() + words + (f"; {note}" if note else ""),
    )  # fmt: skip
    group.add_argument("--peg-at", type=peg_at_arg, help=peg_at_help + " (default: the arch's)")
    group.add_argument("--peg-kernel-size", type=odd_kernel, help="PEG depthwise kernel side (default 3)")
    group.add_argument(
        "--peg-separable",
        action=argparse.BooleanOptionalAction,
        help="separable PEG: 1xk then kx1 depthwise convs (default: off)",
    )
    group.add_argument(
        "--peg-padding",
        choices=PEG_PADDINGS,
        help="PEG conv border: zeros (CPVT) or circular/replicate (no absolute position) (default zeros)",
    )
    if dynamic:
        group.add_argument(
            "--peg-dynamic",
            action=argparse.BooleanOptionalAction,
            help="per-sample PEG kernels mixed from a bank (dynamic convolution) (default: off)",
        )
        group.add_argument(
            "--peg-num-kernels", type=positive_int, help="bank size of --peg-dynamic (default 4)"
        )
    if interpolation:
        group.add_argument(
            "--pos-interpolation",
            choices=RESIZE_MODES,
            help="how a learned table is resized for other input sizes",
        )


def unused_pos_flags(pos_enc: str, peg_dynamic: bool | None, source: str) -> dict[str, str]:
    """The position flags a model with ``pos_enc`` ignores -> why (for :func:`refuse_without_effect`).

    The PEG group without a conditional encoding, ``--peg-num-kernels`` without ``--peg-dynamic``,
    ``--pos-interpolation`` (and DETR's ``--learned-grid``) without a learned table.  ``source``
    says where ``pos_enc`` came from (``--pos-enc sine``, an ``--init`` file).  A value that names
    no encoding gives no reasons: building the model refuses it, naming it.
    """
    try:
        spec = parse_pos_enc(str(pos_enc))
    except (PosEncError, TypeError):
        return {}
    reasons: dict[str, str] = {}
    if spec.conditional is None:
        reasons |= dict.fromkeys(PEG_OPTIONS, f"has no effect without a PEG ({source})")
    elif not peg_dynamic:
        reasons["peg_num_kernels"] = "sizes the kernel bank of --peg-dynamic, which is off"
    if spec.table is None or spec.table.name != "learned":
        reasons |= dict.fromkeys(("pos_interpolation", "learned_grid"),
                                 f"has no effect without a learned table ({source})")  # fmt: skip
    return reasons


#: argparse dests of :func:`add_pos_args`'s PEG group -> the keyword every model builder takes
PEG_OPTIONS = {
    "peg_at": "peg_at",
    "peg_kernel_size": "peg_kernel_size",
    "peg_separable": "peg_separable",
    "peg_padding": "peg_padding",
    "peg_dynamic": "peg_dynamic",
    "peg_num_kernels": "peg_num_kernels",
}


def peg_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The PEG group's values that the user (or the recipe) set, as model-builder keywords."""
    return {
        kw: getattr(args, dest) for dest, kw in PEG_OPTIONS.items() if getattr(args, dest, None) is not None
    }


def add_make_data_counts(
    p: argparse._ActionsContainer, *, num_train: int, num_val: int, aliases: Sequence[tuple[str, str]] = ()
) -> None:
    """``--num-train N --num-val N`` of every ``make-data`` (``aliases``: ``(old_train, old_val)`` pairs)."""
    p.add_argument("--num-train", type=positive_int, default=num_train, help="training samples")
    p.add_argument("--num-val", type=positive_int, default=num_val, help="validation samples")
    for old_train, old_val in aliases:
        add_alias(p, old_train, dest="num_train", type=positive_int)
        add_alias(p, old_val, dest="num_val", type=positive_int)


def add_train_args(
    p: argparse.ArgumentParser,
    *,
    output_dir: str,
    configs: Mapping[str, Any] | None = None,
    init_help: str = "starting weights (a checkpoint or weights file of this task)",
) -> None:
    """The flags every ``train`` command takes (a task adds its own data / model flags).

    Defaults that depend on the task (epochs, batch size, lr, ...) come from the task's
    ``set_defaults`` or a ``--config`` recipe; ``None`` here means "the recipe's value".
    ``--config NAME`` lists no names: its help points to the ``configs`` verb, which lists each
    recipe once with what it sets (a wrong name is still a usage error that lists them).
    ``init_help``: what ``--init`` takes in this task (every format it reads).
    """
    g = p.add_argument_group("run (common to every package)")
    if configs is not None:
        package = p.prog.rsplit(" ", 1)[0]
        g.add_argument(
            "--config", choices=sorted(configs), metavar="NAME",
            help=f"named recipe; explicit flags override it (the recipes: {package} configs)",
        )  # fmt: skip
    g.add_argument("--output-dir", type=Path, default=Path(output_dir), help="checkpoints, logs, report.json")
    g.add_argument(
        "--resume",
        help="'auto': continue from OUTPUT_DIR/checkpoint.pth when there is one (the previous checkpoint "
        "if the newest is unreadable); or a checkpoint path",
    )
    add_overwrite_arg(g, help=TRAIN_OVERWRITE_HELP)
    g.add_argument("--epochs", type=positive_int, help="epochs in the schedule")
    g.add_argument("--batch-size", type=positive_int, help="samples per process and step")
    g.add_argument(
        "--grad-accum-steps",
        type=positive_int,
        default=1,
        metavar="N",
        help="accumulate the gradients of N batches of --batch-size per optimizer step (the step's batch is "
        "N x --batch-size per process; schedule, EMA, logs and checkpoints count optimizer steps)",
    )
    g.add_argument(
        "--grad-checkpointing",
        action="store_true",
        help="recompute the transformer blocks' activations in the backward instead of keeping them "
        "(less memory, about a third more compute; the same losses)",
    )
    g.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile (inductor) the model's forward: one graph per input side (DETR: per 128 px "
        "bucket), the compile time and the speed-up in report.json",
    )
    g.add_argument(
        "--fsdp",
        action="store_true",
        help="under torchrun: shard weights, gradients and optimizer state over the processes (FSDP2, one unit "
        "per transformer block plus the root) instead of DDP; checkpoint.pth stays the full usual one",
    )
    g.add_argument("--lr", type=positive_float, help="peak learning rate")
    g.add_argument("--workers", type=nonnegative_int, default=2, help="DataLoader worker processes")
    g.add_argument("--amp", choices=AMP_CHOICES, default="off", help="autocast dtype on CUDA (off on CPU)")
    g.add_argument("--clip-max-norm", type=nonnegative_float, help="gradient-norm clipping (0: off)")
    g.add_argument("--device", type=device_arg, default="auto", help="auto | cpu | cuda | cuda:N")
    g.add_argument("--seed", type=int, default=0, help="seed of data order, augmentation and init")
    g.add_argument("--init", type=Path, metavar="PATH", help=init_help)
    g.add_argument(
        "--eval-every", type=nonnegative_int, default=1, help="evaluate every N epochs (0: at the end)"
    )
    g.add_argument(
        "--save-every", type=nonnegative_int, default=0, help="also keep checkpointNNNN.pth every N epochs"
    )
    g.add_argument(
        "--early-stopping-patience",
        type=nonnegative_int,
        default=0,
        metavar="N",
        help="stop after N evaluations (see --eval-every) without a better validation metric, keeping the "
        "best evaluation's checkpoint as checkpoint_best.pth beside the last (0: off)",
    )
    g.add_argument(
        "--stop-after-epoch",
        type=positive_int,
        help="leave after this many epochs, as a job time limit would (the schedule stays that of --epochs)",
    )
    g.add_argument(
        "--max-broken",
        type=unit_fraction,
        default=0.01,
        help="stop when more than this fraction of a split is broken (default 1%%)",
    )
    g.add_argument(
        "--threads", type=positive_int, help="torch intra-op CPU threads (default: torch's choice)"
    )
    g.add_argument("--find-unused-parameters", action="store_true", help="DDP flag, for frozen branches only")
    add_max_memory_arg(g)
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress display")
    g.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    g.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved settings (recipe, then flags) as JSON and exit without training",
    )
    add_json_arg(g)


#: ``--overwrite``'s help where a command writes files (``train`` says what it means for a run)
OVERWRITE_HELP = (
    "replace what the outputs would overwrite: an input, or an existing file of another kind (a checkpoint, "
    "a training report, a Hugging Face folder's files) (default: refuse with one line)"
)
#: ``train --overwrite``
TRAIN_OVERWRITE_HELP = (
    "start a new run in an --output-dir that holds one (its checkpoints, report and log are removed "
    "when training starts; default: refuse, and --resume auto continues it)"
)


def class_map_arg(args: argparse.Namespace) -> dict[str, str] | None:
    """``--class-map FILE.json`` read and checked (``{"data name": "start name"}``); None without it.

    A file that is not such an object is a :class:`UserError` naming it (before any model is built).
    """
    path = getattr(args, "class_map", None)
    if path is None:
        return None
    try:
        return read_class_map(read_json(path, "--class-map file"), path)
    except JsonError as e:
        raise UserError(e.what, e.where) from None
    except ValueError as e:
        raise UserError(str(e).removeprefix(f"{path}: "), path) from None


def add_class_map_arg(g: argparse._ActionsContainer) -> None:
    """``--class-map FILE.json``: synonyms between the data's class names and ``--init``'s (detection, video)."""
    g.add_argument(
        "--class-map",
        type=Path,
        help='JSON {"data name": "start name"}: a class of --init kept under another name (motorbike -> '
        "motorcycle); equal names (any case) are kept without it, other classes start fresh",
    )


def add_overwrite_arg(group: argparse._ActionsContainer, *, help: str = OVERWRITE_HELP) -> None:
    """``--overwrite``: the one flag that lets a command replace what it would otherwise refuse to.

    Every verb that writes checks its outputs with :mod:`peg_core.engine.outputs` before any
    long work; this flag is what those checks' refusals point to.
    """
    group.add_argument("--overwrite", action="store_true", help=help)


def add_json_arg(group: argparse._ActionsContainer) -> None:
    """``--json``: the command's report as the only stdout line (:mod:`peg_core.engine.summary`)."""
    group.add_argument(
        "--json",
        action="store_true",
        help="print the report as one JSON line instead of the closing summary (other output: stderr)",
    )


def add_eval_args(p: argparse.ArgumentParser, *, batch_size: int | None = None) -> None:
    """The flags every ``eval`` command takes."""
    g = p.add_argument_group("run (common to every package)")
    g.add_argument("--checkpoint", type=Path, required=True, help="checkpoint.pth written by train")
    g.add_argument(
        "--output-dir",
        type=Path,
        help="where report.json goes (default: eval/ beside the checkpoint; a report of another command "
        "there is refused)",
    )
    add_overwrite_arg(g)
    g.add_argument("--batch-size", type=positive_int, default=batch_size, help="samples per process")
    g.add_argument("--workers", type=nonnegative_int, default=2, help="DataLoader worker processes")
    g.add_argument("--amp", choices=AMP_CHOICES, default="off", help="autocast dtype on CUDA (off on CPU)")
    g.add_argument("--device", type=device_arg, default="auto", help="auto | cpu | cuda | cuda:N")
    g.add_argument(
        "--max-broken", type=unit_fraction, default=0.01, help="stop when more than this fraction is broken"
    )
    g.add_argument("--threads", type=positive_int, help="torch intra-op CPU threads")
    g.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile (inductor) the model's forward: one graph per input side (DETR: per 128 px "
        "bucket), the compile time in report.json",
    )
    add_max_memory_arg(g)
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress display")
    g.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    add_json_arg(g)


def parse_with_config(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, configs: Mapping[str, Mapping[str, Any]]
) -> argparse.Namespace:
    """Parse ``argv``; ``--config NAME`` supplies defaults (``configs[NAME]``) that explicit flags override.

    Recipe keys are argparse destinations; a key the parser does not know is a bug in the recipe.
    """
    pre, _ = parser.parse_known_args(argv)
    name = getattr(pre, "config", None)
    if name:
        known = {a.dest for a in parser._actions}
        unknown = sorted(set(configs[name]) - known)
        if unknown:
            raise KeyError(f"recipe {name!r} sets unknown options {unknown}")
        parser.set_defaults(**configs[name])
    return parser.parse_args(argv)


def explicit_options(
    build_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str]
) -> dict[str, Any]:
    """The options ``argv`` itself names, without parser, ``set_defaults`` or recipe defaults.

    A fresh parser from ``build_parser`` with every default suppressed: argparse then sets only
    what the command line gives.  Call it after the real parse, so ``argv`` is known to be valid.
    (``train --init`` uses it: a file's architecture is kept except where a flag says otherwise.)
    """
    parser = build_parser()
    parser._defaults.clear()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return vars(parser.parse_known_args(list(argv))[0])


def json_safe(args: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
    """A JSON- and ``weights_only``-safe copy of parsed arguments (paths as strings, tuples as lists).

    Weights options that named remote weights (:data:`~peg_core.interop.io.WEIGHTS_AS_TYPED`) are
    recorded as typed (``init: "org/name@rev"``), their resolved paths under ``<dest>_path``.
    """
    record = dict(vars(args) if isinstance(args, argparse.Namespace) else args)
    typed = record.pop(WEIGHTS_AS_TYPED, None) or {}
    for dest, text in typed.items():  # what the user typed resolves again (from the cache) on a re-run
        record[f"{dest}_path"] = record.get(dest)
        record[dest] = text
    items = record.items()

    def conv(v: Any) -> Any:
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, tuple | list):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {str(k): conv(x) for k, x in v.items()}
        return v

    return {k: conv(v) for k, v in items}


def dispatch(
    prog: str,
    doc: str,
    commands: Mapping[str, Callable[[list[str]], Any]],
    argv: Sequence[str] | None = None,
    version: str | None = None,
    summaries: Mapping[str, str] | None = None,
) -> int:
    """``python -m PACKAGE COMMAND ...``: run ``commands[COMMAND](rest)`` under the failure policy.

    No command or ``-h`` prints the package's help (:func:`package_help`: ``doc``'s first line, the
    verbs of ``summaries`` with one line each, where the rest is); ``--version`` prints ``peg-core
    0.1.0`` (the distribution's name, from the last word of ``prog``, and ``version``); an unknown
    command is a usage error.  A command that ``summaries`` leaves out runs but is not listed (an
    old name kept as an alias).  Returns the exit code, as console scripts (``sys.exit(main())``) expect.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    shown = list(summaries) if summaries is not None else list(commands)
    if not argv or argv[0] in ("-h", "--help"):
        print(package_help(prog, doc, {name: (summaries or {}).get(name, "") for name in shown}, version))
        return 0 if argv else 2
    if argv[0] == "--version" and version is not None:
        print(f"{prog.split()[-1].replace('_', '-')} {version}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(
            f"error: {prog}: unknown command {name!r}; choose from {', '.join(shown)} (see {prog} -h)",
            file=sys.stderr,
        )
        return 2
    return run_command(commands[name], rest)


#: where every verb is described in full (the top-level ``-h`` points to it)
CLI_DOC = "docs/cli.md"


def package_help(prog: str, doc: str, verbs: Mapping[str, str], version: str | None = None) -> str:
    """The top-level ``-h`` of every package, in one layout::

        python -m peg_detr: <doc's first line>

        usage: python -m peg_detr VERB [options]

        verbs:
          make-data   <one line>
          ...

        python -m peg_detr VERB -h: the options of one verb; docs/cli.md: every verb in full.

    Only ``doc``'s first line is printed (its markup removed): the rest is for the API docs.
    """
    first = plain_text(doc).strip().splitlines()[0].strip() if doc.strip() else ""
    width = max(map(len, verbs), default=0) + 2
    lines = [f"{prog}: {first}" if first else prog, "", f"usage: {prog} VERB [options]", "", "verbs:"]
    lines += [f"  {name:<{width}}{text}".rstrip() for name, text in verbs.items()]
    lines += ["", f"{prog} VERB -h: the options of one verb; {CLI_DOC}: every verb in full."]
    if version is not None:
        lines.append(f"{prog} --version: print the version and exit.")
    return "\n".join(lines)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``-h`` keeps the description's line breaks and ends each option's help with its default.

    Unlike ``argparse.ArgumentDefaultsHelpFormatter``, nothing is added where it would mislead or
    repeat: a ``None`` default (the recipe's or the checkpoint's value, which the help says), a
    ``SUPPRESS`` one (hidden aliases), the on/off state of a switch (``store_true`` /
    ``store_false``), or a help that already names its default.  Lists print as they are typed
    (``0,1``), paths as paths.  Descriptions, epilogs and option help are docstring text: their
    reStructuredText markup is removed (:func:`~peg_core.engine.helptext.plain_text`).

    Kept short: a usage longer than :attr:`USAGE_LINES` lines names only the positionals, the
    required options and ``--config``, then ``[options]`` (the groups below list every flag once);
    an option without a ``metavar`` shows a short one for its type (``N``, ``X``, ``PATH``, ``DIR``,
    ``F``, ``HxW``) rather than its destination in capitals (``--batch-size N``, not
    ``--batch-size BATCH_SIZE``), so that most options and their help share a line.
    """

    #: the most lines of a usage that lists every option
    USAGE_LINES = 3

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return super()._fill_text(plain_text(text), width, indent)

    def _format_usage(self, usage: Any, actions: Any, groups: Any, prefix: Any) -> str:
        text = super()._format_usage(usage, actions, groups, prefix)
        if usage is not None or len(text.strip("\n").splitlines()) <= self.USAGE_LINES:
            return text
        kept = [a for a in actions if not a.option_strings or a.required or a.dest == "config"]
        return super()._format_usage(None, kept, groups, prefix).rstrip("\n") + " [options]\n\n"

    def _get_default_metavar_for_optional(self, action: argparse.Action) -> str:
        return short_metavar(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = plain_text(action.help or "") if action.help is not argparse.SUPPRESS else action.help
        default = action.default
        if (
            text == argparse.SUPPRESS
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
            or "default" in text
            or not (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))
        ):
            return text
        shown = ",".join(map(str, default)) if isinstance(default, list | tuple) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})".lstrip()


#: the metavar of an option by its argparse ``type`` (:func:`short_metavar`)
_TYPE_METAVARS: dict[Any, str] = {
    int: "N", positive_int: "N", nonnegative_int: "N", float: "X", positive_float: "X",
    nonnegative_float: "X", unit_fraction: "F", image_side: "PX", grid_arg: "HxW", image_side_list: "SIZES",
    positive_int_list: "LIST", int_list: "LIST", peg_at_arg: "BLOCKS", odd_kernel: "K", layer_decay_value: "D",
}  # fmt: skip


def short_metavar(action: argparse.Action) -> str:
    """What ``-h`` shows after an option without a ``metavar``: its destination in capitals when that
    is short (``--device DEVICE``), else a word for its type (``N``, ``X``, ``F`` a fraction, ``PX``,
    ``HxW``, ``DIR`` / ``PATH``) or the destination's last word (``--train-json JSON``)."""
    name = action.dest.upper()
    if len(name) <= 6:
        return name
    if action.type is Path:
        return "DIR" if action.dest.endswith("_dir") else "PATH"
    return _TYPE_METAVARS.get(action.type) or name.rsplit("_", 1)[-1]


def new_parser(prog: str, description: str | None = None) -> ArgumentParser:
    """An :class:`~peg_core.engine.command.ArgumentParser` whose ``-h`` shows the defaults (:class:`HelpFormatter`)."""
    return ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)


__all__ += [
    "CLI_DOC", "MAX_IMAGE_SIDE", "PEG_OPTIONS", "PEG_PADDINGS", "HelpFormatter", "add_json_arg",
    "configs_command", "new_parser", "package_help", "peg_kwargs", "short_metavar",
]  # fmt: skip


# ------------------------------------------------------------------------- the recipes, made visible


def _flag_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """argparse dest -> its visible action (the one with the long option a user types, not a hidden alias)."""
    actions: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if any(o.startswith("--") for o in action.option_strings) and action.help is not argparse.SUPPRESS:
            actions.setdefault(action.dest, action)
    return actions


def _flag_value(value: Any) -> str:
    """A recipe value as it would be typed: lists comma-separated, an empty string as ''."""
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return "''" if value == "" else str(value)


def _as_flag(dest: str, value: Any, action: argparse.Action | None) -> str:
    """One recipe entry as command-line text (``--hflip``, ``--no-hflip``, ``--epochs 6``)."""
    if action is None:
        return f"{dest}={_flag_value(value)}"
    name = next(o for o in action.option_strings if o.startswith("--"))
    if isinstance(action, argparse.BooleanOptionalAction):
        return name if value else "--no-" + name[2:]
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return name if bool(value) == action.const else f"{dest}={value}"
    if isinstance(value, dict):  # KEY=VALUE options (video's --model-opt): the flag once per key
        return " ".join(f"{name} {k}={v}" for k, v in value.items()) or f"{dest}={{}}"
    return f"{name} {_flag_value(value)}"


def recipe_flags(recipe: Mapping[str, Any], parser: argparse.ArgumentParser) -> str:
    """``--arch demo --pos-enc peg ...``: the flags a recipe sets, in the parser's spelling."""
    actions = _flag_actions(parser)
    return " ".join(_as_flag(k, v, actions.get(k)) for k, v in recipe.items())


def configs_command(
    argv: Sequence[str],
    *,
    prog: str,
    configs: Mapping[str, Mapping[str, Any]],
    train_parser: Callable[[], argparse.ArgumentParser],
    descriptions: Mapping[str, str] | None = None,
) -> int:
    """The ``configs`` verb of every package: the named recipes of ``train --config NAME``.

    ``configs`` lists each recipe with its one-line description and the flags it sets;
    ``configs NAME`` prints that recipe's full settings (the ``train`` defaults with the recipe
    applied) as JSON; an unknown name is a usage error listing the known ones.
    """
    p = new_parser(f"{prog} configs", "The named recipes of 'train --config NAME' and what they set.")
    p.add_argument("name", nargs="?", help="one recipe: print its full settings as JSON")
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    args = p.parse_args(list(argv))
    descriptions = descriptions or {}
    parser = train_parser()
    if args.name is None:
        for name, recipe in configs.items():
            print(f"{name}: {descriptions.get(name, '(no description)')}")
            print(f"    {recipe_flags(recipe, parser)}")
        print(f"\nfull settings of one: {prog} configs NAME; train with one: {prog} train --config NAME")
        return 0
    if args.name not in configs:
        p.error(f"unknown recipe {args.name!r}; choose from {', '.join(configs)}")
    settings = {
        a.dest: a.default
        for a in parser._actions
        if a.default is not argparse.SUPPRESS and a.dest not in ("help", "config")
    }
    settings = {**settings, **parser._defaults, **configs[args.name]}
    for dest in ("print_config", "json", "debug"):
        settings.pop(dest, None)
    print(json.dumps(json_safe(dict(sorted(settings.items()))), indent=1))
    return 0
