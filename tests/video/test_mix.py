"""Mixup / CutMix of clip batches (peg_video.mix) and ``train --mixup --cutmix --layer-decay``."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from peg_core.engine import read_checkpoint
from peg_video.__main__ import main
from peg_video.mix import ClipMix, build_clip_mix, mix_seed, smooth_one_hot
from tests.video.runs import TINY

K = 5


def _batch(b: int = 4, t: int = 2, h: int = 6, w: int = 8):
    g = torch.Generator().manual_seed(7)
    video = torch.rand(b, 3, t, h, w, generator=g)  # (B, C, T, H, W)
    labels = torch.tensor([0, 3, 1, 4][:b])
    return video, labels


def _beta(alpha: float) -> float:
    """The first draw of the seeded generator, as Beta(alpha, alpha)."""
    return float(torch.distributions.Beta(torch.tensor([alpha]), torch.tensor([alpha])).sample(()))


def test_smooth_one_hot_is_timms_target():
    t = smooth_one_hot(torch.tensor([2, 0]), 4, 0.1)
    expected = torch.tensor([[0.025, 0.025, 0.925, 0.025], [0.925, 0.025, 0.025, 0.025]])
    torch.testing.assert_close(t, expected, rtol=0, atol=1e-7)


def test_mixup_is_the_lam_mix_of_each_clip_with_the_previous_one():
    video, labels = _batch()
    state = torch.get_rng_state()
    mixed, targets = ClipMix(K, mixup_alpha=0.8, label_smoothing=0.1)(video, labels, seed=123)
    assert torch.equal(torch.get_rng_state(), state)  # the global generator is left as it was
    if torch.cuda.is_available():  # and the CUDA ones are not reseeded
        cuda_state = torch.cuda.get_rng_state()
        ClipMix(K, mixup_alpha=0.8)(video.cuda(), labels.cuda(), seed=123)
        assert torch.equal(torch.cuda.get_rng_state(), cuda_state)
    torch.manual_seed(123)
    lam = _beta(0.8)
    assert 0.0 < lam < 1.0
    prev = video.roll(1, 0)  # clip b pairs with clip b - 1
    assert mixed.shape == video.shape
    torch.testing.assert_close(mixed, lam * video + (1 - lam) * prev, rtol=0, atol=1e-6)
    smooth = smooth_one_hot(labels, K, 0.1)
    torch.testing.assert_close(targets, lam * smooth + (1 - lam) * smooth.roll(1, 0), rtol=0, atol=1e-6)
    assert targets.sum(1).tolist() == pytest.approx([1.0] * 4, abs=1e-6)
    # the same seed mixes the same; another seed draws another lam
    again, _ = ClipMix(K, mixup_alpha=0.8, label_smoothing=0.1)(video, labels, seed=123)
    other, _ = ClipMix(K, mixup_alpha=0.8, label_smoothing=0.1)(video, labels, seed=124)
    assert torch.equal(again, mixed) and not torch.equal(other, mixed)


def test_cutmix_pastes_one_box_in_every_frame_and_weights_labels_by_area():
    video, labels = _batch()
    mixed, targets = ClipMix(K, cutmix_alpha=1.0)(video, labels, seed=5)
    torch.manual_seed(5)  # torchvision's draws: lam, then the box centre (x, then y)
    lam = _beta(1.0)
    cx, cy = int(torch.randint(8, (1,))), int(torch.randint(6, (1,)))
    r = 0.5 * math.sqrt(1 - lam)
    x1, x2 = max(cx - int(r * 8), 0), min(cx + int(r * 8), 8)
    y1, y2 = max(cy - int(r * 6), 0), min(cy + int(r * 6), 6)
    expected = video.clone()
    expected[..., y1:y2, x1:x2] = video.roll(1, 0)[..., y1:y2, x1:x2]
    assert torch.equal(mixed, expected)
    area = (x2 - x1) * (y2 - y1) / 48
    assert 0 < area < 1  # a box that is neither empty nor the whole frame at this seed
    # the pixels that changed are exactly the box, in every channel and frame
    changed = (mixed != video).any(0).any(0)  # (T, H, W)
    assert changed.float().mean().item() == pytest.approx(area) and changed.all(0).sum().item() == area * 48
    one_hot = F.one_hot(labels, K).float()
    torch.testing.assert_close(targets, (1 - area) * one_hot + area * one_hot.roll(1, 0), rtol=0, atol=1e-6)


def test_both_pick_one_per_batch_and_targets_sum_to_one():
    video, labels = _batch()
    mix = ClipMix(K, mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)
    kinds = set()
    for seed in range(12):
        mixed, targets = mix(video, labels, seed)
        assert targets.sum(1).tolist() == pytest.approx([1.0] * 4, abs=1e-6)
        assert targets.min() >= 0.1 / K - 1e-7  # smoothing survives the mix
        kinds.add("mixup" if (mixed != video).all() else "cutmix")
    assert kinds == {"mixup", "cutmix"}


def test_alpha_zero_is_no_mix_and_soft_targets_give_the_old_loss():
    assert build_clip_mix(K, 0.0, 0.0, 0.1) is None  # the step keeps CrossEntropyLoss(label_smoothing)
    with pytest.raises(ValueError, match="mixup_alpha > 0 or cutmix_alpha > 0"):
        ClipMix(K)
    with pytest.raises(ValueError, match="alphas must be >= 0"):
        ClipMix(K, mixup_alpha=-1.0)
    logits, labels = torch.randn(4, K), torch.tensor([0, 3, 1, 4])
    old = nn.CrossEntropyLoss(label_smoothing=0.1)(logits, labels)
    soft = nn.CrossEntropyLoss()(logits, smooth_one_hot(labels, K, 0.1))  # an unmixed batch, smoothed first
    torch.testing.assert_close(soft, old, rtol=1e-6, atol=1e-7)
    assert mix_seed(0, 0, 3) == mix_seed(0, 0, 3) != mix_seed(0, 1, 3)


def test_a_five_d_batch_is_required():
    with pytest.raises(ValueError, match=r"expected clips \(B, C, T, H, W\)"):
        ClipMix(K, mixup_alpha=1.0)(torch.zeros(2, 3, 8, 8), torch.tensor([0, 1]), 0)


# ------------------------------------------------------------------------------- the train command


def _train(data, out, *extra) -> int:
    return main(["train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"),
                 "--output-dir", str(out), *TINY, "--model-opt", "depth=2", *extra])  # fmt: skip


def _losses(out):
    records = map(json.loads, (out / "log.jsonl").read_text().splitlines())
    return [r["loss"] for r in records if r["tag"] == "train"]


MIXED = ("--mixup", "0.8", "--cutmix", "1.0", "--layer-decay", "0.7", "--label-smoothing", "0.1")


def test_train_with_mix_and_layer_decay_resumes_exactly(data, tmp_path, capsys):
    """Two epochs straight == one epoch, stop, resume: the mixes and the per-layer lrs continue.

    A resume with another --layer-decay (the checkpoint's optimiser groups are the first run's) is
    one line naming both values, and trains nothing."""
    common = ("--epochs", "2", "--eval-every", "2", *MIXED)
    assert _train(data, tmp_path / "straight", *common) == 0
    cut = tmp_path / "cut"
    assert _train(data, cut, *common, "--stop-after-epoch", "1") == 0
    capsys.readouterr()
    assert _train(data, cut, *common, "--layer-decay", "0.5", "--resume", "auto") == 1
    assert capsys.readouterr().err == (
        "error: --resume continues a run trained with --layer-decay 0.7; another value would change its recipe "
        "(give the run's value, or start a new run): --layer-decay 0.5\n"
    )
    assert read_checkpoint(cut / "checkpoint.pth", "video")["epoch"] == 0
    assert _train(data, cut, *common, "--resume", "auto") == 0
    a = read_checkpoint(tmp_path / "straight" / "checkpoint.pth", "video")
    b = read_checkpoint(cut / "checkpoint.pth", "video")
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert _losses(tmp_path / "straight") == _losses(cut)
    groups = a["optimizer"]["param_groups"]
    # depth 2, a PEG3d before block 0 and after it: layers 3 (head) .. 0, decayed and not
    assert [g["name"] for g in groups] == [f"layer_{i}{s}" for i in (3, 2, 1, 0) for s in ("", "_no_decay")]
    assert [g["lr_scale"] for g in groups[::2]] == pytest.approx([1.0, 0.7, 0.49, 0.343])
    run_args = json.loads((tmp_path / "straight" / "args.json").read_text())
    assert (run_args["mixup"], run_args["cutmix"], run_args["layer_decay"]) == (0.8, 1.0, 0.7)
    assert 0.0 <= json.loads((cut / "report.json").read_text())["eval"]["top1"] <= 1.0


def test_train_without_mix_flags_is_the_unmixed_run(data, tmp_path):
    """--mixup 0 --cutmix 0 (the defaults) trains exactly as a run without the flags; nonzero differs."""
    assert _train(data, tmp_path / "plain", "--epochs", "1", "--eval-every", "0") == 0
    assert (
        _train(data, tmp_path / "zero", "--epochs", "1", "--eval-every", "0", "--mixup", "0", "--cutmix", "0")
        == 0
    )
    assert _losses(tmp_path / "plain") == _losses(tmp_path / "zero")
    # and the flags do act: the same epoch with both mixes trains on other batches
    assert (
        _train(
            data, tmp_path / "mixed", "--epochs", "1", "--eval-every", "0", "--mixup", "0.8", "--cutmix", "1"
        )
        == 0
    )
    assert _losses(tmp_path / "mixed") != _losses(tmp_path / "plain")
    groups = read_checkpoint(tmp_path / "plain" / "checkpoint.pth", "video")["optimizer"]["param_groups"]
    assert [g["name"] for g in groups] == ["main", "main_no_decay"] and "lr_scale" not in groups[0]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--layer-decay", "1.5"), "argument --layer-decay: expected a layer decay in (0, 1], got '1.5'"),
        (("--layer-decay", "0"), "argument --layer-decay: expected a layer decay in (0, 1], got '0'"),
        (("--mixup", "-1"), "argument --mixup: expected a number >= 0, got '-1'"),
    ],
)
def test_bad_values_are_one_line_errors(data, tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as e:
        _train(data, tmp_path / "bad", *flags)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.count("\n") == 1 and err.startswith("error: python -m peg_video train: ") and message in err, (
        err
    )


def test_videomae_recipes_set_the_published_values():
    """run_class_finetuning.py: layer decay 0.75 (SSv2 ViT-S script: 0.7), mixup 0.8, cutmix 1.0."""
    from peg_video.configs import CONFIGS, FINETUNE_CONFIGS

    for name in FINETUNE_CONFIGS:
        recipe = CONFIGS[name]
        assert recipe["layer_decay"] == (0.7 if name.startswith("ssv2") else 0.75), name
        assert (recipe["mixup"], recipe["cutmix"], recipe["label_smoothing"]) == (0.8, 1.0, 0.1), name
    assert all(
        "mixup" not in r and "layer_decay" not in r for n, r in CONFIGS.items() if n not in FINETUNE_CONFIGS
    )
