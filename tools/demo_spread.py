"""Measure the demo across seeds and CPU kernel paths, and write the README's demo table from the runs.

    python -m tools.demo_spread [--seeds 0,1,2] [--paths default,avx2] [--jobs 2] [--out runs/spread]

Each (path, seed) is one ``python -m tools.demo --seed S`` in its own process under that path's
environment (:data:`PATHS`), two at a time by default; the summaries land in
``OUT/<path>_s<seed>/summary.json`` and the README's table is then rewritten with, for every
metric, the bar these runs clear (85% of their lowest value, rounded down to 0.05), merged with the
bar the README quotes already: ``readme_numbers --write`` keeps the lower of the two, so measuring on
a new machine only ever lowers a bar (:mod:`tools.readme_numbers`).  A run already done (its summary
exists) is reused unless ``--fresh`` (which reruns the demos; the README's bars are merged all the
same).  ``default`` is the CPU's own best path (AVX-512 where it has it); ``avx2`` makes ATen, MKL
and oneDNN take their AVX2 kernels, which is what a machine without AVX-512 runs.  Six runs of about
150 s take about 8 minutes two at a time on two cores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tools import readme_numbers

REPO = Path(__file__).resolve().parents[1]

#: CPU kernel path -> environment that selects it (see ``tools.demo.CPU_PATH_VARIABLES``)
PATHS: dict[str, dict[str, str]] = {
    "default": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512"},
}


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def run_one(path: str, seed: int, out: Path, fresh: bool) -> Path:
    """One demo run under ``path``'s environment; its summary.json (reused when present)."""
    summary = out / f"{path}_s{seed}" / "summary.json"
    if summary.is_file() and not fresh:
        return summary
    env = {**os.environ, **PATHS[path]}
    for name in set().union(*PATHS.values()) - set(PATHS[path]):
        env.pop(name, None)  # the default path is the machine's own, whatever the caller's shell says
    log = summary.parent.with_suffix(".log")
    summary.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "tools.demo", "--seed", str(seed), "--out", str(summary.parent)],
            cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
    if proc.returncode != 0 or not summary.is_file():
        raise RuntimeError(f"the demo failed under {path} with seed {seed}: see {log}")
    print(f"done: {path} seed {seed} ({summary})", flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2", help="training seeds (comma-separated)")
    ap.add_argument("--paths", default="default,avx2", help="CPU paths, from " + ",".join(PATHS))
    ap.add_argument("--jobs", type=int, default=2, help="demo runs at a time")
    ap.add_argument("--out", type=Path, default=Path("runs/spread"))
    ap.add_argument("--fresh", action="store_true", help="run again even where a summary exists")
    ap.add_argument("--no-write", action="store_true", help="measure only; leave README.md as it is")
    args = ap.parse_args(argv)
    paths = _csv(args.paths)
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        print(
            f"error: unknown CPU paths: --paths {','.join(unknown)} (choose from {','.join(PATHS)})",
            file=sys.stderr,
        )
        return 2
    try:
        seeds = [int(s) for s in _csv(args.seeds)]
    except ValueError:
        print(f"error: seeds must be integers: --seeds {args.seeds}", file=sys.stderr)
        return 2
    if not seeds or args.jobs < 1:
        print("error: needs at least one seed and one job: --seeds / --jobs", file=sys.stderr)
        return 2
    cells = [(p, s) for p in paths for s in seeds]
    out = args.out.resolve()
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            summaries = list(pool.map(lambda c: run_one(*c, out, args.fresh), cells))
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not args.no_write:
        return readme_numbers.main(["--write", "--summary", *map(str, summaries)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
