"""``peg_video.demo.demo_data``: data kept on disk is reused only when its stamp is this spec and generator."""

from __future__ import annotations

import json

from peg_video.data.synthetic import GENERATOR_VERSION, SyntheticSpec
from peg_video.demo import demo_data

SPEC = SyntheticSpec(num_train=3, num_val=2, seed=0)


def _files(root):
    return {p.relative_to(root): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_kept_data_is_reused_only_with_the_same_spec_and_generator(tmp_path):
    root = demo_data(tmp_path / "data", SPEC)
    stamp = json.loads((root / "spec.json").read_text())
    assert stamp["generator_version"] == GENERATOR_VERSION and stamp["num_train"] == 3
    first = _files(root)
    assert (root / "val.csv").is_file() and len(first) > 5
    assert _files(demo_data(root, SPEC)) == first  # the same stamp: nothing rewritten

    (root / "stale.txt").write_text("left by an older generator")
    (root / "spec.json").write_text(json.dumps({**stamp, "generator_version": 1}))
    demo_data(root, SPEC)  # an older generator's data: removed and generated anew
    assert not (root / "stale.txt").exists()
    assert json.loads((root / "spec.json").read_text()) == stamp
    regenerated = _files(root)
    assert regenerated.keys() == first.keys() and all(regenerated[k] > first[k] for k in first)

    other = SyntheticSpec(num_train=4, num_val=2, seed=0)
    demo_data(root, other)  # another spec: generated for it
    assert json.loads((root / "spec.json").read_text())["num_train"] == 4
