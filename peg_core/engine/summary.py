"""The one closing line of every verb, and ``--json`` / ``--print-config``, written once for the three packages.

After ``train``, ``eval``, ``make-data`` and ``predict`` a command prints exactly one closing line on
stdout, in one shape and one metric vocabulary (:data:`METRIC_NAMES`)::

    train done: ap 0.318 ap50 0.716 at 80 px, 6 epochs, 0 skipped (runs/detr)
    eval done: top1 0.996 top5 1.000 at 48 px (runs/classify/eval/report.json)

With ``--json`` the report itself is that line (everything else the command prints goes to
stderr), so ``python -m peg_detr eval ... --json | jq .eval.ap`` works.  A package only says
which metric keys it shows (:class:`Summary`); :func:`run_reported` does the rest.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .cli import json_safe

__all__ = [
    "LEGACY_METRIC_NAMES",
    "METRIC_NAMES",
    "Summary",
    "metric",
    "print_closing",
    "run_reported",
    "stdout_to_stderr",
    "summary_line",
]

#: the one spelling of each headline metric, in console lines and in ``report.json``
METRIC_NAMES = ("top1", "top5", "ap", "ap50")
#: spellings older reports and console lines used -> today's (read by :func:`metric`)
LEGACY_METRIC_NAMES = {"top-1": "top1", "top-5": "top5", "AP": "ap", "AP50": "ap50"}


@dataclass(frozen=True)
class Summary:
    """What a package shows in its closing lines.

    Attributes:
        keys: metric keys in the order shown, e.g. ``("ap", "ap50")``.
        size_key: the metrics' entry holding the headline input size (``"size"``, ``"train_size"``):
            shown as ``at N px``, and the size whose ``<key>_by_size`` value stands in for a
            missing ``<key>``.
        at: instead of ``size_key``, a format string over the metrics, e.g. ``"{num_frames} frames"``.
    """

    keys: tuple[str, ...]
    size_key: str | None = None
    at: str | None = None


def metric(metrics: Mapping[str, Any], key: str, size: Any = None) -> float | None:
    """``metrics[key]``, else under an old spelling (``top-1``), in a ``mean`` entry, or ``<key>_by_size[size]``."""
    for name, value in metrics.items():
        if LEGACY_METRIC_NAMES.get(name, name) == key and isinstance(value, int | float):
            return float(value)
    mean = metrics.get("mean")
    if isinstance(mean, Mapping):
        return metric(mean, key)
    by_size = metrics.get(f"{key}_by_size")
    if size is not None and isinstance(by_size, Mapping) and str(size) in by_size:
        return float(by_size[str(size)])
    return None


def _where_measured(metrics: Mapping[str, Any], spec: Summary) -> str | None:
    if spec.size_key is not None and metrics.get(spec.size_key) is not None:
        return f"{metrics[spec.size_key]} px"
    if spec.at is not None:
        with contextlib.suppress(KeyError, IndexError, ValueError):
            return spec.at.format(**metrics)
    return None


def _metrics_text(metrics: Mapping[str, Any], spec: Summary) -> str:
    size = metrics.get(spec.size_key) if spec.size_key is not None else None
    found = {k: v for k in spec.keys if (v := metric(metrics, k, size)) is not None}
    if found:
        text = " ".join(f"{k} {v:.3f}" for k, v in found.items())
        at = _where_measured(metrics, spec)
        return text + (f" at {at}" if at else "")
    # evaluated at other sizes only (classify eval --eval-sizes without the training size)
    parts = []
    for key in spec.keys:
        by_size = metrics.get(f"{key}_by_size")
        if isinstance(by_size, Mapping) and by_size:
            parts.append(f"{key} " + ", ".join(f"{v:.3f} at {s} px" for s, v in by_size.items()))
    return "; ".join(parts) or "no metrics"


def _skipped(report: Mapping[str, Any]) -> int:
    broken = report.get("broken") or {}
    return sum(int(log.get("count", 0)) for log in broken.values() if isinstance(log, Mapping))


def summary_line(verb: str, report: Mapping[str, Any], spec: Summary, where: Any = None) -> str:
    """``<verb> done: <metrics> (<where>)`` for a ``train`` or ``eval`` report (see the module doc).

    A training run stopped by ``--stop-after-epoch`` says ``train stopped`` and how far it got.
    """
    text = _metrics_text(report.get("eval") or {}, spec)
    state = "done"
    if verb == "train":
        done, total = report.get("epochs_done", report.get("epochs")), report.get("epochs")
        if report.get("status") == "stopped":
            state, text = "stopped", text + f", {done} of {total} epochs (continue with --resume auto)"
        else:
            text += f", {total} epoch{'' if total == 1 else 's'}"
        text += f", {_skipped(report)} skipped"
    elif _skipped(report):
        text += f", {_skipped(report)} skipped"
    text += _compiled(report)
    where = where if where is not None else report.get("report") or report.get("output_dir")
    return f"{verb} {state}: {text}" + (f" ({where})" if where is not None else "")


def _compiled(report: Mapping[str, Any]) -> str:
    """``, compiled: 3 graphs in 61.2 s, 1.42x`` for a ``--compile`` run (its ``report["compile"]``)."""
    c = report.get("compile")
    if not isinstance(c, Mapping):
        return ""
    text = f", compiled: {c.get('graphs')} graphs in {c.get('compile_seconds', 0):.1f} s"
    if isinstance(c.get("speedup"), int | float):
        text += f", {c['speedup']:.2f}x"
    return text


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def print_closing(line: str, obj: Any, as_json: bool) -> None:
    """The one closing stdout line: ``line``, or ``obj`` as compact JSON under ``--json`` (rank 0 only)."""
    if _is_main():
        print(json.dumps(obj, default=str) if as_json else line, flush=True)


@contextlib.contextmanager
def stdout_to_stderr(enabled: bool) -> Iterator[None]:
    """Everything printed inside goes to stderr (``--json``: stdout keeps the one JSON line)."""
    if not enabled:
        yield
        return
    with contextlib.redirect_stdout(sys.stderr):
        yield


def run_reported(
    verb: str,
    args: Any,
    work: Callable[[], dict[str, Any]],
    spec: Summary,
    where: Callable[[dict[str, Any]], Any] | None = None,
) -> dict[str, Any]:
    """Run a ``train`` / ``eval`` command's ``work()`` and print its closing line; returns the report.

    ``train --print-config`` prints the resolved settings (after ``--config`` and the flags, and
    the package's own checks) as JSON and returns without training.  ``--json`` sends what
    ``work`` prints to stderr and prints the report as the only stdout line.
    """
    if verb == "train" and getattr(args, "print_config", False):
        settings = {k: v for k, v in json_safe(args).items() if k not in ("print_config", "json")}
        print(json.dumps(settings, indent=1, sort_keys=True), flush=True)
        return {"command": "train", "status": "print-config", "settings": settings}
    as_json = bool(getattr(args, "json", False))
    with stdout_to_stderr(as_json):
        report = work()
    shown = where(report) if where is not None else None
    print_closing(summary_line(verb, report, spec, shown), report, as_json)
    return report


def done_line(verb: str, text: str, where: Any) -> str:
    """``make-data done: 512 train and 128 val images (data/shapes)``: the closing line of a verb without metrics."""
    return f"{verb} done: {text} ({where})"


__all__ += ["done_line"]
