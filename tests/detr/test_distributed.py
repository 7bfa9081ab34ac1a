"""Two processes on CPU (gloo): DDP gradients agree across ranks, merged COCO numbers equal single-process ones."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from peg_detr import build_detr
from peg_detr.cli import evaluate as eval_main
from peg_detr.cli import train as train_main
from peg_detr.data import SyntheticSpec, make_synthetic_coco

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _targets(g: torch.Generator, n_images: int) -> list[dict[str, torch.Tensor]]:
    out = []
    for _ in range(n_images):
        n = int(torch.randint(1, 3, (), generator=g))
        cxcy = 0.3 + 0.4 * torch.rand(n, 2, generator=g)
        wh = 0.1 + 0.2 * torch.rand(n, 2, generator=g)
        out.append({"labels": torch.randint(1, 4, (n,), generator=g), "boxes": torch.cat([cxcy, wh], 1)})
    return out


def _worker(rank: int, world: int, port: int, data: str, out: str) -> None:
    os.environ.update(
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world)}
    )
    os.environ["LOCAL_RANK"] = str(rank)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    # 1) One DDP step on different data per rank: identical gradients, equal to the mean of local ones.
    torch.manual_seed(0)
    model, criterion, _ = build_detr(
        "tiny", "peg", num_classes=4, num_queries=5, hidden_dim=32, num_heads=2, enc_layers=1, dec_layers=1,
        dim_feedforward=64, dropout=0.0,
    )  # fmt: skip
    g = torch.Generator().manual_seed(100 + rank)
    images = torch.randn(2, 3, 64, 48, generator=g)
    targets = _targets(g, 2)

    def loss_of(m):
        losses = criterion(m(images), targets)
        return sum(losses[k] * criterion.weight_dict[k] for k in losses if k in criterion.weight_dict)

    loss_of(model).backward()
    local = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    ddp = DistributedDataParallel(model)
    loss_of(ddp).backward()
    synced = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    gathered = [None] * world
    dist.all_gather_object(gathered, synced)
    local_all = [None] * world
    dist.all_gather_object(local_all, local)
    mean_local = [sum(gs) / world for gs in zip(*local_all)]
    report = {
        "ranks_equal": all(torch.equal(a, b) for a, b in zip(gathered[0], gathered[1])),
        "equals_mean_of_local": all(
            torch.allclose(a, b, atol=1e-6, rtol=1e-5) for a, b in zip(synced, mean_local)
        ),
        "local_differ": any(not torch.allclose(a, b) for a, b in zip(local_all[0], local_all[1])),
        "grad_norm": float(sum(s.norm() ** 2 for s in synced) ** 0.5),
    }
    del ddp

    # 2) The real entry point under DDP: one epoch of training, then evaluation merged over both ranks.
    result = train_main(
        [
            "--data-root", data, "--output-dir", out, "--epochs", "1", "--backbone", "tiny", "--hidden-dim", "32",
            "--num-heads", "2", "--enc-layers", "1", "--dec-layers", "1", "--dim-feedforward", "64",
            "--num-queries", "5", "--train-sizes", "64", "--max-size", "96", "--crop-resize", "",
            "--val-size", "64", "--total-batch-size", "4", "--workers", "0", "--no-progress", "--device", "cpu",
        ]
    )  # fmt: skip
    report["eval"] = result["eval"]["sizes"]["64"]
    report["steps"] = result["steps"]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


def test_two_process_gloo(tmp_path):
    spec = SyntheticSpec(size=64, num_classes=3, min_objects=1, max_objects=2, min_frac=0.3)
    # 5 val images over 2 ranks: the DistributedSampler repeats one, the evaluator must count it once.
    data = make_synthetic_coco(tmp_path / "data", num_train=8, num_val=5, seed=2, spec=spec)
    out = tmp_path / "run"
    mp.spawn(_worker, args=(2, _free_port(), str(data), str(out)), nprocs=2, join=True)
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r in reports:
        assert r["ranks_equal"] and r["equals_mean_of_local"] and r["local_differ"] and r["grad_norm"] > 0
    assert reports[0]["eval"] == reports[1]["eval"] and reports[0]["eval"]["images"] == 5
    assert reports[0]["steps"] == 2  # 8 images over 2 processes, --total-batch-size 4: 2 per process and step

    # Single process, same checkpoint: the same 12 numbers.
    torch.set_num_threads(1)
    single = eval_main(
        [
            "--checkpoint", str(out / "checkpoint.pth"), "--output-dir", str(tmp_path / "single"),
            "--batch-size", "1", "--workers", "0", "--no-progress", "--device", "cpu",
        ]
    )  # fmt: skip
    for k, v in single["eval"]["sizes"]["64"].items():
        assert v == pytest.approx(reports[0]["eval"][k], abs=1e-9), k
