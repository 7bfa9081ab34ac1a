"""Fixtures of the video tests (``tests/conftest.py``'s too)."""

from pathlib import Path

import pytest

#: the moving-shapes set of :func:`data`: 64x48 px, 12 frames, 8 train + 4 val videos
VIDEO_DEFAULTS = dict(num_train=8, num_val=4, width=64, height=48, frames=12, seed=3)


@pytest.fixture(scope="session")
def video_set(tmp_path_factory):
    """``video_set(**fields) -> root``: a synthetic moving-shapes set (:data:`VIDEO_DEFAULTS` updated by
    ``fields``, :class:`peg_video.data.SyntheticSpec`'s), written once per session and shared by every module
    asking for the same one.  Tests read it; a test that changes files copies it."""
    made: dict[tuple, Path] = {}

    def make(**fields) -> Path:
        from peg_video.data import SyntheticSpec, make_synthetic_kinetics

        options = {**VIDEO_DEFAULTS, **fields}
        key = tuple(sorted(options.items()))
        if key not in made:
            root = tmp_path_factory.mktemp("videos")
            make_synthetic_kinetics(root, SyntheticSpec(**options))
            made[key] = root
        return made[key]

    return make


@pytest.fixture(scope="module")
def data(request, video_set) -> Path:
    """The module's synthetic video set: its ``VIDEOS`` dict (``video_set``'s fields) over :data:`VIDEO_DEFAULTS`."""
    return video_set(**getattr(request.module, "VIDEOS", {}))
