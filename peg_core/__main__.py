"""Command line: checkpoint surgery.

    python -m peg_core resize-pos-embed IN OUT --grid 24x24 [--mode bicubic] [--key K] [--prefix-tokens N]
    python -m peg_core to-cpvt IN OUT [--peg-at 0] [--kernel-size 3]

``IN`` / ``OUT`` are ``.pth`` (read with ``weights_only=True``) or
``.safetensors`` files; ``OUT`` is written in the format its suffix names.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .surgery import learned_to_cpvt, load_state_file, resize_checkpoint, save_state_file


def _grid(text: str) -> tuple[int, int]:
    """``"24x24"``, ``"24x32"`` or ``"24"`` -> ``(H, W)``."""
    parts = text.lower().replace("×", "x").split("x")
    try:
        size = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"grid must look like 24x24 or 24; got {text!r}") from None
    if len(size) == 1:
        size = size * 2
    if len(size) != 2 or min(size) < 1:
        raise argparse.ArgumentTypeError(f"grid must be HxW with positive sides; got {text!r}")
    return size


def _indices(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(i) for i in text.split(",") if i.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--peg-at takes block indices like 0 or 0,1,2; got {text!r}"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m peg_core", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="command", required=True)

    r = sub.add_parser("resize-pos-embed", help="resize the position table of a ViT checkpoint")
    r.add_argument("input", type=Path)
    r.add_argument("output", type=Path)
    r.add_argument("--grid", type=_grid, required=True, help="new grid in patches, e.g. 24x24 (384 px / 16)")
    r.add_argument("--mode", default="bicubic", choices=["nearest", "bilinear", "bicubic", "area"])
    r.add_argument("--key", default=None, help="table key (found by name when omitted)")
    r.add_argument("--prefix-tokens", type=int, default=None, help="class/distillation tokens in the table")
    r.add_argument("--old-grid", type=_grid, default=None, help="the table's grid when it is not square")
    r.add_argument("--antialias", action="store_true", help="anti-aliased down-sizing")

    c = sub.add_parser("to-cpvt", help="drop the learned table, add zero-initialised PEG weights")
    c.add_argument("input", type=Path)
    c.add_argument("output", type=Path)
    c.add_argument("--peg-at", type=_indices, default=(0,), help="blocks followed by a PEG, e.g. 0 or 0,1,2")
    c.add_argument("--kernel-size", type=int, default=3)
    c.add_argument("--key", default=None, help="table key (found by name when omitted)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        obj = load_state_file(args.input)
        if args.command == "resize-pos-embed":
            new, change = resize_checkpoint(
                obj, args.grid, key=args.key, mode=args.mode, num_prefix_tokens=args.prefix_tokens,
                old_size=args.old_grid, antialias=args.antialias,
            )  # fmt: skip
            summary = str(change)
        else:
            new, report = learned_to_cpvt(obj, peg_at=args.peg_at, kernel_size=args.kernel_size, key=args.key)
            summary = str(report)
        left_out = save_state_file(new, args.output)
    except (OSError, KeyError, ValueError, TypeError, RuntimeError, ImportError) as e:
        print(f"error: {args.input}: {e}", file=sys.stderr)
        return 1
    print(summary)
    for name in left_out:
        print(f"not written to {args.output.suffix} (tensors only): {name}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
