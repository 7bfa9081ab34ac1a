"""Fixtures of the detector tests (``tests/conftest.py``'s ``coco`` / ``coco_set`` / ``one_thread_module`` too)."""

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def data(coco) -> Path:
    """The module's synthetic COCO set (``coco``: the module's ``COCO_SET`` fields over the defaults)."""
    return coco


@pytest.fixture(scope="session")
def gap_data(tmp_path_factory) -> Path:
    """The shapes set with category ids 1, 3, 7 (:func:`tests.detr.label_runs.make_gap_data`), written once."""
    from tests.detr.label_runs import make_gap_data

    return make_gap_data(tmp_path_factory.mktemp("gaps"))
