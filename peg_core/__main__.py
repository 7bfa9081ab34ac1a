"""The CPVT classifier (a ViT with a PEG) and checkpoint surgery for ViTs.

``python -m peg_core VERB ...``; ``python -m peg_core -h`` lists the verbs (:data:`SUMMARIES`, one
line each), ``VERB -h`` their options, docs/cli.md all of it::

    python -m peg_core make-data OUT [--num-train 2048 --num-val 512 --img-size 48 --format png]
    python -m peg_core train [--config demo] [--data-root PATH] [--output-dir runs/classify] ...
    python -m peg_core eval --checkpoint CKPT [--data-root PATH] [--eval-sizes 36,48,72,96]
    python -m peg_core predict --checkpoint CKPT IMAGE...
    python -m peg_core export CKPT OUT.onnx [--check]
    python -m peg_core quantize CKPT OUT.pt2 [--calib 256] [--calib-data PATH] [--img-size S]
    python -m peg_core resize-pos-embed IN OUT --grid 24x24 [--mode bicubic] [--key K] [--prefix-tokens N]
    python -m peg_core to-cpvt IN OUT [--peg-at 0] [--kernel-size 3]

This is the command-line layer: the library's documented errors (``WeightsError``, a
``ValueError``; ``OSError`` while writing; ``MissingDependency`` for a missing safetensors) become
one ``error: <what>: <where>`` line here.  Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .classify import cli as classify_cli
from .classify.export import main as export_cli
from .classify.quantize import main as quantize_cli
from .engine import (
    UserError,
    add_overwrite_arg,
    check_output_file,
    dispatch,
    grid_arg,
    int_list,
    new_parser,
    nonnegative_int,
    positive_int,
)
from .engine.outputs import WEIGHTS
from .interop import WeightsError, learned_to_cpvt, read_state_file, resize_checkpoint, write_state_file

PROG = "python -m peg_core"

#: what the surgery verbs read and write (their -h says it)
SURGERY_FILES = """IN / OUT are .pth (read with weights_only=True) or .safetensors files; OUT is written in the
format its suffix names.  OUT may not be IN, a training checkpoint or a file of another kind
unless --overwrite (an earlier weights file of the same name is replaced)."""


def _resize_parser() -> argparse.ArgumentParser:
    r = new_parser(
        f"{PROG} resize-pos-embed", f"Resize the position table of a ViT checkpoint.\n\n{SURGERY_FILES}"
    )
    r.add_argument("input", type=Path)
    r.add_argument("output", type=Path)
    r.add_argument(
        "--grid", type=grid_arg, required=True, help="new grid in patches, e.g. 24x24 (384 px / 16)"
    )
    r.add_argument("--mode", default="bicubic", choices=["nearest", "bilinear", "bicubic", "area"])
    r.add_argument("--key", default=None, help="table key (found by name when omitted)")
    r.add_argument("--prefix-tokens", type=nonnegative_int, help="class/distillation tokens in the table")
    r.add_argument("--old-grid", type=grid_arg, default=None, help="the table's grid when it is not square")
    r.add_argument("--antialias", action="store_true", help="anti-aliased down-sizing")
    add_overwrite_arg(r)
    r.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    return r


def _to_cpvt_parser() -> argparse.ArgumentParser:
    c = new_parser(
        f"{PROG} to-cpvt", f"Drop the learned table, add zero-initialised PEG weights.\n\n{SURGERY_FILES}"
    )
    c.add_argument("input", type=Path)
    c.add_argument("output", type=Path)
    c.add_argument("--peg-at", type=int_list, default=[0], help="blocks followed by a PEG, e.g. 0 or 0,1,2")
    c.add_argument("--kernel-size", type=positive_int, default=3)
    c.add_argument("--key", default=None, help="table key (found by name when omitted)")
    add_overwrite_arg(c)
    c.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    return c


def _load(path: Path) -> object:
    """The object in ``path``; an unreadable file is a :class:`UserError`.

    A missing safetensors package is a ``MissingDependency`` (an ``InputError``), printed as one line
    by the command line like a :class:`UserError`.
    """
    try:
        return read_state_file(path)
    except WeightsError as e:  # names the file already
        raise UserError(e.what, e.where) from None


def _write(new: object, args: argparse.Namespace, summary: str) -> int:
    try:
        left_out = write_state_file(new, args.output)
    except (WeightsError, OSError) as e:
        raise UserError(f"cannot write ({e})", args.output) from None
    print(summary)
    for name in left_out:
        print(f"not written to {args.output.suffix} (tensors only): {name}")
    print(f"wrote {args.output}")
    return 0


def _check_output(args: argparse.Namespace) -> None:
    """OUT may not be IN, a training checkpoint or a file of another kind (unless ``--overwrite``)."""
    check_output_file(args.output, WEIGHTS, inputs=[args.input], overwrite=args.overwrite)


def resize_pos_embed(argv: Sequence[str]) -> int:
    args = _resize_parser().parse_args(argv)
    _check_output(args)
    obj = _load(args.input)
    try:
        new, change = resize_checkpoint(
            obj, args.grid, key=args.key, mode=args.mode, num_prefix_tokens=args.prefix_tokens,
            old_size=args.old_grid, antialias=args.antialias,
        )  # fmt: skip
    except WeightsError as e:  # no (single) table, or one that cannot be resized: the message names it
        raise UserError(e.what, args.input) from None
    return _write(new, args, str(change))


def to_cpvt(argv: Sequence[str]) -> int:
    args = _to_cpvt_parser().parse_args(argv)
    _check_output(args)
    obj = _load(args.input)
    try:
        new, report = learned_to_cpvt(obj, peg_at=args.peg_at, kernel_size=args.kernel_size, key=args.key)
    except WeightsError as e:
        raise UserError(e.what, args.input) from None
    return _write(new, args, str(report))


COMMANDS = {
    "make-data": classify_cli.make_data,
    "train": classify_cli.train,
    "eval": classify_cli.evaluate,
    "predict": classify_cli.predict,
    "configs": classify_cli.configs,
    "models": classify_cli.models,
    "export": export_cli,
    "quantize": quantize_cli,
    "resize-pos-embed": resize_pos_embed,
    "to-cpvt": to_cpvt,
}

#: the top-level -h: one line per verb
SUMMARIES = {
    "make-data": "write the generated shapes as an ImageFolder tree",
    "train": "train a CPVT classifier on the shapes or an ImageFolder (torchrun: several GPUs)",
    "eval": "top-1 / top-5 of a checkpoint (or a quantized .pt2) at one or several sizes",
    "predict": "the top-k classes of image files",
    "configs": "the named recipes of train --config and what they set",
    "models": "the public ViTs --init takes by name, their published accuracy, a PEG run",
    "export": "a checkpoint as an ONNX graph (dynamic batch, height, width)",
    "quantize": "int8 post-training quantization to a .pt2 file (eval runs it on the CPU)",
    "resize-pos-embed": "resize a ViT checkpoint's learned position table to another grid",
    "to-cpvt": "a ViT checkpoint with zero-initialised PEG weights in place of its table",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit code (0 ok, 1 user error, 2 usage, 3 NaN/inf loss)."""
    try:
        return dispatch(PROG, __doc__ or "", COMMANDS, argv, version=__version__, summaries=SUMMARIES)
    except SystemExit as e:  # argparse: usage errors (2) and --help (0)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)


if __name__ == "__main__":
    sys.exit(main())
