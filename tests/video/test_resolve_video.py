"""Video weights by name, offline: tiny random VideoMAE and V-JEPA 2 folders in a hub cache laid out as
huggingface_hub lays it out (``HF_HOME``, ``HF_HUB_OFFLINE=1``).

``peg_video.from_hf("org/name")``, ``train --init org/name`` and ``Predictor.from_checkpoint("org/name")``
give the model of the local folder; a missing id, a bad revision and a detector's folder are one line each.
"""

from __future__ import annotations

import pytest
import torch

from peg_video import from_hf
from peg_video.cli import parse_train_args
from peg_video.predict import Predictor
from tests.hub_cache import offline_caches, put_in_hf_cache

transformers = pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")

#: the VideoMAE classifier's class names (its config.json's id2label)
CLASSES = ("abseiling", "archery", "bowling", "juggling", "surfing")
SIZES = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    return offline_caches(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    cfg = transformers.VideoMAEConfig(
        **SIZES, image_size=32, patch_size=8, num_frames=4, tubelet_size=2, id2label=dict(enumerate(CLASSES))
    )
    transformers.VideoMAEForVideoClassification(cfg).save_pretrained(root / "videomae")
    cfg = transformers.VJEPA2Config(
        hidden_size=48, num_hidden_layers=1, num_attention_heads=2, crop_size=32, patch_size=8,
        frames_per_clip=4, tubelet_size=2, pred_hidden_size=32, pred_num_hidden_layers=1,
        pred_num_attention_heads=2, num_pooler_layers=1,
    )  # fmt: skip
    transformers.VJEPA2Model(cfg).save_pretrained(root / "vjepa2")
    (root / "detr").mkdir()
    (root / "detr" / "config.json").write_text('{"model_type": "detr"}')
    return root


@pytest.mark.parametrize("name", ["videomae", "vjepa2"])
def test_from_hf_hub_id_is_the_local_folders_model(hf_home, folders, name, capsys):
    snapshot = put_in_hf_cache(hf_home, f"org/tiny-{name}", folders / name)
    local, _ = from_hf(folders / name)
    cached, _ = from_hf(f"org/tiny-{name}@main")
    want, got = local.state_dict(), cached.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)
    assert str(snapshot) in capsys.readouterr().err


def test_train_init_hub_id_is_its_snapshot(hf_home, folders, tmp_path):
    snapshot = put_in_hf_cache(hf_home, "MCG-NJU/tiny-videomae", folders / "videomae")
    args = parse_train_args(["--train-ann", "a.csv", "--init", "MCG-NJU/tiny-videomae", "--pos-enc", "peg3d"])
    assert args.init == snapshot and args.num_frames == 4  # the folder's clip, read from the snapshot


def test_hub_errors_are_one_line(hf_home, folders):
    put_in_hf_cache(hf_home, "org/tiny-videomae", folders / "videomae")
    put_in_hf_cache(hf_home, "org/detr", folders / "detr")
    for spec, message in (
        ("org/absent", "'org/absent' is not in the cache"),
        ("org/tiny-videomae@nope", "revision 'nope' is not in the cache"),
        ("org/detr", "detr"),  # another family's folder: the reader's model_type check
    ):
        with pytest.raises(ValueError) as e:
            from_hf(spec)
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_train_init_timm_name_is_its_2d_file(hf_home, tmp_path):
    """``--init timm:NAME --init-source deit``: timm's 2-D weights file, inflated as a local file would be."""
    timm = pytest.importorskip("timm")
    repo = timm.models.get_pretrained_cfg("deit_tiny_patch16_224").hf_hub_id
    snapshot = put_in_hf_cache(hf_home, repo, {"model.safetensors": b"not read at parse time"})
    args = parse_train_args(
        ["--train-ann", "a.csv", "--init", "timm:deit_tiny_patch16_224", "--init-source", "deit"]
    )
    assert args.init == snapshot / "model.safetensors"


def test_predictor_from_a_hub_id(hf_home, folders):
    """A classifier folder or its hub id predicts with its id2label names, its clip as ``train --init`` sees it."""
    put_in_hf_cache(hf_home, "MCG-NJU/tiny-videomae", folders / "videomae")
    named = Predictor.from_checkpoint("MCG-NJU/tiny-videomae", top_k=3)
    local = Predictor.from_checkpoint(folders / "videomae", top_k=3)
    assert named.classes == local.classes == list(CLASSES)
    run = parse_train_args(["--train-ann", "a.csv", "--init", str(folders / "videomae")])
    views = ("num_frames", "stride", "crop", "tubelet", "mean", "std", "test_scale", "num_clips")
    assert {k: getattr(named.run_args, k) for k in views} == {k: getattr(run, k) for k in views}
    clip = torch.randn(3, 4, 32, 32, generator=torch.Generator().manual_seed(0)).clamp(-2, 2)
    (want,), (got,) = local([clip]), named([clip])
    assert got.top == want.top and len(got.top) == 3 and {c for c, _ in got.top} <= set(CLASSES)
    # an encoder has no classes to predict; another family's folder is the reader's one line
    put_in_hf_cache(hf_home, "org/tiny-vjepa2", folders / "vjepa2")
    put_in_hf_cache(hf_home, "org/detr", folders / "detr")
    for spec, message in (("org/tiny-vjepa2", "has no classifier"), ("org/detr", "detr")):
        with pytest.raises(ValueError) as e:
            Predictor.from_checkpoint(spec)
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
