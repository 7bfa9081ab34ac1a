import os

import pytest
import torch

# Two cores on the build machines: keep intra-op threads at that.
torch.set_num_threads(min(2, os.cpu_count() or 1))


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
