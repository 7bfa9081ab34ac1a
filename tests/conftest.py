import functools
import os
from pathlib import Path

import pytest
import torch

# Two cores on the build machines: keep intra-op threads at that, shared by the pytest-xdist workers
# (make test runs two: one thread each)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))


def _onnx_registry_built_once() -> None:
    """``torch.onnx.export(dynamo=True)`` builds its table of ATen -> ONNX functions from torchlib on every
    call (~1 s); the suite exports some thirty graphs.  On the first export of a worker, its builder
    (``ONNXRegistry.from_torchlib``) is made to build it once per opset and hand each export a copy of it
    (the lists copied: an export with a ``custom_translation_table`` adds to its own).  The graphs are the
    same; only torch's private builder is wrapped, and only if it is where it was (else: as before)."""
    export = torch.onnx.export

    @functools.wraps(export)
    def export_with_the_registry_built_once(*args, **kwargs):
        try:
            from torch.onnx._internal.exporter import _registration
        except ImportError:
            return export(*args, **kwargs)
        registry_cls = getattr(_registration, "ONNXRegistry", None)
        build = getattr(getattr(registry_cls, "from_torchlib", None), "__func__", None)
        if build is not None and not getattr(build, "built_once", False):
            built: dict = {}

            def from_torchlib(cls, *args, **kwargs):
                key = (cls, args, tuple(sorted(kwargs.items())))
                if key not in built:
                    built[key] = build(cls, *args, **kwargs)
                registry = cls.__new__(cls)
                registry.__dict__.update(built[key].__dict__)
                registry.functions = {k: list(v) for k, v in built[key].functions.items()}
                return registry

            from_torchlib.built_once = True
            registry_cls.from_torchlib = classmethod(from_torchlib)
        return export(*args, **kwargs)

    torch.onnx.export = export_with_the_registry_built_once


_onnx_registry_built_once()


@pytest.fixture(scope="session")
def prewarmed():
    """:class:`tests.prewarmed.Prewarmed`: ``python -m`` / ``-c`` commands forked from a server that imported
    torch and torchvision once (one intra-op thread, ``OMP_NUM_THREADS=1``, as the tests' commands ask)."""
    from tests.prewarmed import Prewarmed

    python = Prewarmed({**os.environ, "OMP_NUM_THREADS": "1"})
    yield python
    python.close()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (tiny models: faster, and the same kernels on every machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_thread_module():
    """:func:`one_thread` for a whole module: its module fixtures (a training run) and its tests then
    compute with the same thread count (another count changes float summation order).  A module asks
    for it before its other fixtures with ``pytestmark = pytest.mark.usefixtures("one_thread_module")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


#: the synthetic COCO set of :func:`coco`: 64 px, 3 classes, 1-2 shapes a third to half the side, 8 + 4 images
COCO_DEFAULTS = dict(size=64, num_classes=3, min_objects=1, max_objects=2, min_frac=0.3, max_frac=0.5,
                     num_train=8, num_val=4, seed=1)  # fmt: skip


@pytest.fixture(scope="session")
def coco_set(tmp_path_factory):
    """``coco_set(**fields) -> root``: a synthetic COCO set (:data:`COCO_DEFAULTS` updated by ``fields``:
    :class:`peg_detr.data.SyntheticSpec`'s, ``num_train``, ``num_val``, ``seed``), written once per session
    and shared by every module asking for the same one.  Tests read it; a test that changes files copies it."""
    made: dict[tuple, Path] = {}

    def make(**fields) -> Path:
        from peg_detr.data import SyntheticSpec, make_synthetic_coco

        options = {**COCO_DEFAULTS, **fields}
        key = tuple(sorted(options.items()))
        if key not in made:
            counts = {k: options.pop(k) for k in ("num_train", "num_val", "seed")}
            made[key] = make_synthetic_coco(
                tmp_path_factory.mktemp("coco"), spec=SyntheticSpec(**options), **counts
            )
        return made[key]

    return make


@pytest.fixture(scope="module")
def coco(request, coco_set):
    """The module's synthetic COCO set: its ``COCO_SET`` dict (``coco_set``'s fields) over :data:`COCO_DEFAULTS`."""
    return coco_set(**getattr(request.module, "COCO_SET", {}))
