"""Shared pieces of the classifier command tests: the tiny model's flags, the one-line error check."""

from __future__ import annotations

import pytest
import torch

#: a 1-block, 16-wide CPVT on 16 px shapes (patch 8: a 2x2 grid): a CPU epoch takes about a second
TINY_MODEL = [
    "--img-size", "16", "--embed-dim", "16", "--depth", "1", "--num-heads", "2", "--peg-at", "0",
    "--batch-size", "8", "--workers", "0", "--threads", "1", "--no-progress", "--device", "cpu",
]  # fmt: skip


def tiny(num_train: int, num_val: int, *extra: str) -> list[str]:
    """:data:`TINY_MODEL` on ``num_train`` / ``num_val`` generated shapes, then ``extra`` flags."""
    return [*TINY_MODEL, "--num-train", str(num_train), "--num-val", str(num_val), *extra]


def no_peg(argv: list[str]) -> list[str]:
    """``argv`` without :data:`TINY_MODEL`'s ``--peg-at 0``, for a model without a PEG (``--pos-enc learned``).

    ``train`` refuses a PEG flag that would change nothing (``error: has no effect without a PEG``).
    """
    i = argv.index("--peg-at")
    return [*argv[:i], *argv[i + 2 :]]


def one_line_error(capsys: pytest.CaptureFixture, code: int, expected_code: int = 1) -> str:
    """The stderr of a command that failed with ``expected_code``: one ``error: ...`` line, no traceback."""
    err = capsys.readouterr().err
    assert code == expected_code, err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err.strip()


@pytest.fixture(autouse=True)
def keep_threads():
    """``--threads 1`` sets torch's thread count for the process: put it back after each test."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
