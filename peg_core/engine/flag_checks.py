"""Flags that would change nothing, or change a resumed run's recipe: refused with one line, before any work.

Every ``train`` of the three packages uses these two checks, so a refusal reads the same
everywhere: ``error: <why>: <the flag as typed>``.

* :func:`refuse_without_effect`: an option the command line gives (:func:`~.cli.explicit_options`)
  that the chosen configuration ignores, e.g. ``--peg-kernel-size 5`` with ``--pos-enc sine`` (no
  PEG to size), ``--pos-interpolation`` on a model without a learned table, or a model flag next to
  an ``--init`` folder that fixes the model.  A recipe's or a default value is not the user's
  choice and is left alone.
* :func:`refuse_changed_on_resume`: an option a resumed run cannot change, because the checkpoint's
  optimiser state, schedule or label meaning are those of its first run (``--layer-decay``,
  DETR's ``--labels``); both values are named.

A refusal names the flag as the user typed it (``--head-act silu``, not the destination's
``--mlp-activation``) when the caller passes :func:`typed_options`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from .command import UserError

__all__ = [
    "RESUME_FIXED",
    "flag_text",
    "refuse_changed_on_resume",
    "refuse_resume_changes",
    "refuse_without_effect",
    "typed_options",
]

#: options whose value a resumed run keeps from its checkpoint, in every task that has them:
#: ``--layer-decay`` shapes the optimiser's parameter groups and their learning rates, which the
#: checkpoint's optimiser and scheduler states restore
RESUME_FIXED = ("layer_decay",)


def flag_text(dest: str, value: Any, option: str | None = None) -> str:
    """An option as it is typed: ``--peg-kernel-size 5``, ``--peg-at 0,1``, ``--learned-grid 5x7``, ``--peg-separable`` / ``--no-peg-separable``.

    ``option``: the option string the command line used (:func:`typed_options`, e.g. ``--head-act``
    for the destination ``mlp_activation``); without it, the destination's own spelling.
    ``None`` is ``no --flag`` (not given); lists are comma-separated, grids (``*_grid``) ``HxW``.
    """
    flag = option or "--" + dest.replace("_", "-")
    if value is None:
        return f"no {flag}"
    if isinstance(value, bool):
        if option is not None:  # --x or --no-x, as typed
            return option
        return flag if value else "--no-" + flag[2:]
    if isinstance(value, list | tuple):
        return f"{flag} {('x' if dest.endswith('_grid') else ',').join(map(str, value))}"
    return f"{flag} {value}"


def typed_options(build_parser: Callable[[], argparse.ArgumentParser], argv: Sequence[str]) -> dict[str, str]:
    """Destination -> the option string ``argv`` gave it (the last one; an abbreviation as argparse
    completes it), e.g. ``{"mlp_activation": "--head-act", "data_root": "--coco-path"}``.

    A fresh parser from ``build_parser`` whose actions record the option string argparse hands
    them; call it after the real parse, so ``argv`` is known to be valid.
    """
    parser = build_parser()
    typed: dict[str, str] = {}

    def recording(base: type) -> type:
        def __call__(self, parser, namespace, values, option_string=None):
            if option_string is not None:
                typed[self.dest] = option_string
            return base.__call__(self, parser, namespace, values, option_string)

        return type(base.__name__, (base,), {"__call__": __call__})

    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            action.__class__ = recording(type(action))
    parser.parse_known_args(list(argv))
    return typed


def refuse_without_effect(
    args: argparse.Namespace,
    explicit: Collection[str],
    reasons: Mapping[str, str],
    typed: Mapping[str, str] | None = None,
) -> None:
    """A :class:`UserError` ``<reason>: <flag value>`` for the first option of ``reasons`` the command line gave.

    Args:
        args: the parsed arguments (the values named in the message).
        explicit: the argparse destinations the command line itself set
            (:func:`~peg_core.engine.cli.explicit_options`); a recipe's or default value is not refused.
        reasons: destination -> why it has no effect in this configuration, e.g.
            ``{"peg_kernel_size": "has no effect without a PEG (--pos-enc sine)"}``.
        typed: destination -> the option string the command line used (:func:`typed_options`): the
            flag is named as typed.
    """
    for dest, reason in reasons.items():
        if dest in explicit:
            option = (typed or {}).get(dest)
            raise UserError(reason, flag_text(dest, getattr(args, dest, None), option))


def refuse_changed_on_resume(dest: str, saved: Any, now: Any) -> None:
    """A :class:`UserError` naming both values when a resumed run would change ``dest`` from ``saved`` to ``now``."""
    if saved != now:
        raise UserError(
            f"--resume continues a run trained with {flag_text(dest, saved)}; another value would change its "
            "recipe (give the run's value, or start a new run)",
            flag_text(dest, now),
        )


def refuse_resume_changes(
    args: argparse.Namespace, ckpt: Mapping[str, Any] | None, dests: Collection[str] = RESUME_FIXED
) -> None:
    """:func:`refuse_changed_on_resume` for each of ``dests`` that ``args`` has, against the checkpoint's stored ``args``.

    A checkpoint written before an option existed stored no value for it: ``None``, the option's
    "off".  Nothing to check when not resuming (``ckpt`` is ``None``).
    """
    if ckpt is None:
        return
    saved = ckpt.get("args") if isinstance(ckpt.get("args"), Mapping) else {}
    for dest in dests:
        if hasattr(args, dest):
            refuse_changed_on_resume(dest, saved.get(dest), getattr(args, dest))
