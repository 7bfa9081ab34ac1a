"""Detector weights by name, offline: a hub cache laid out as huggingface_hub lays it out (``HF_HOME``)
holding tiny random DETR and RT-DETR folders, and torchvision's ResNet file in ``TORCH_HOME``.
``--arch rtdetr --backbone-weights`` takes an RT-DETR folder's (or hub id's) ResNet-vd.

``from_hf("org/name")``, ``train --init org/name`` and ``--backbone-weights`` (a torchvision enum) read
the caches with ``HF_HUB_OFFLINE=1`` and give the model the local folder / file gives; a missing id, a
bad revision and a folder of another family are one line each.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from peg_core.engine import read_checkpoint
from peg_core.interop.hf_folder import read_hf_weights
from peg_detr import from_hf
from peg_detr.__main__ import main as cli
from peg_detr.cli import parse_train_args
from peg_detr.interop import load_rtdetr_backbone
from peg_detr.model import build_model
from peg_detr.models import build_detr
from peg_detr.models.rtdetr.backbone import build_resnet_vd
from tests.detr.rtdetr_checks import tiny_rfdetr_config, tiny_rtdetr_config
from tests.hub_cache import offline_caches, put_in_hf_cache

transformers = pytest.importorskip("transformers")
pytest.importorskip("huggingface_hub")


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    return offline_caches(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Tiny random ``save_pretrained`` folders: a DETR (timm ResNet-18), an RT-DETR (basic ResNet), an RF-DETR."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    detr = transformers.DetrConfig(
        use_timm_backbone=True, backbone="resnet18", use_pretrained_backbone=False, d_model=32,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=5, num_labels=3, auxiliary_loss=False,
    )  # fmt: skip
    transformers.DetrForObjectDetection(detr).save_pretrained(root / "detr")
    rtdetr = tiny_rtdetr_config(transformers)
    transformers.RTDetrForObjectDetection(rtdetr).save_pretrained(root / "rtdetr")
    transformers.RfDetrForObjectDetection(tiny_rfdetr_config(transformers)).save_pretrained(root / "rfdetr")
    video = transformers.VideoMAEConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32,
        patch_size=8, num_frames=4, tubelet_size=2,
    )  # fmt: skip
    transformers.VideoMAEModel(video).save_pretrained(root / "videomae")
    return root


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0, msg=k)


@pytest.mark.filterwarnings("ignore:resnet18 backbone starts from random weights")
@pytest.mark.parametrize("name", ["detr", "rtdetr", "rfdetr"])
def test_from_hf_hub_id_is_the_local_folders_model(hf_home, folders, name, capsys):
    snapshot = put_in_hf_cache(hf_home, f"org/tiny-{name}", folders / name)
    local, _ = from_hf(folders / name)
    cached, report = from_hf(f"org/tiny-{name}")
    _same_state(local, cached)
    assert report.source.startswith(str(snapshot))
    assert f"org/tiny-{name}" in capsys.readouterr().err  # the one line saying where it came from


def test_hub_errors_are_one_line(hf_home, folders):
    put_in_hf_cache(hf_home, "org/tiny-detr", folders / "detr")
    put_in_hf_cache(hf_home, "org/videomae", folders / "videomae")
    for spec, message in (
        ("org/absent", "'org/absent' is not in the cache"),
        ("org/tiny-detr@v9", "revision 'v9' is not in the cache"),
        ("org/videomae", "model_type 'videomae' is not supported"),  # another family's folder
    ):
        with pytest.raises(ValueError) as e:
            from_hf(spec)
        assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="models--org--absent"):  # the cache folder looked in
        from_hf("org/absent")


@pytest.mark.filterwarnings("ignore:resnet18 backbone starts from random weights")
@pytest.mark.parametrize("name", ["detr", "rtdetr", "rfdetr"])
def test_predictor_from_a_hub_id(hf_home, folders, name):
    from peg_detr.predict import Predictor

    put_in_hf_cache(hf_home, f"org/tiny-{name}", folders / name)
    image = torch.randint(0, 256, (3, 64, 80), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    named = Predictor.from_checkpoint(f"org/tiny-{name}", threshold=0.0, size=64)
    local = Predictor.from_checkpoint(folders / name, threshold=0.0, size=64)
    assert named.arch == local.arch == name
    (want,), (got,) = local([image]), named([image])
    assert got.detections and [d.to_json() for d in got.detections] == [d.to_json() for d in want.detections]
    assert got.detections[0].name.startswith("LABEL_")  # transformers' default id2label names the labels


COCO_SET = dict(num_train=4, num_val=2)  # the module's ``data`` (tests/conftest.py)


def test_train_init_and_backbone_weights_resolve_from_the_caches(hf_home, folders, data, tmp_path, capsys):
    tv = pytest.importorskip("torchvision.models")
    snapshot = put_in_hf_cache(hf_home, "PekingU/tiny-rtdetr", folders / "rtdetr")
    args = parse_train_args(["--arch", "rtdetr", "--data-root", str(data), "--init", "PekingU/tiny-rtdetr"])
    assert args.init == snapshot
    run = ["train", "--config", "rtdetr_demo_tiny", "--data-root", str(data), "--epochs", "1", "--eval-every",
           "0", "--workers", "0", "--no-progress", "--init"]  # fmt: skip
    assert cli([*run, "PekingU/tiny-rtdetr", "--output-dir", str(tmp_path / "named")]) == 0
    assert cli([*run, str(folders / "rtdetr"), "--output-dir", str(tmp_path / "local")]) == 0
    named, local = (read_checkpoint(tmp_path / d / "checkpoint.pth", "detect") for d in ("named", "local"))
    assert named["model_config"] == local["model_config"]
    for k, v in local["model"].items():
        torch.testing.assert_close(named["model"][k], v, rtol=0, atol=0, msg=k)
    # the run records the id typed (a re-run resolves it again, from the cache) and the path it resolved to
    recorded = json.loads((tmp_path / "named" / "args.json").read_text())
    for saved in (recorded, named["args"]):
        assert saved["init"] == "PekingU/tiny-rtdetr" and saved["init_path"] == str(snapshot)
        assert "weights_as_typed" not in saved and "backbone_weights_path" not in saved
    assert local["args"]["init"] == str(folders / "rtdetr") and "init_path" not in local["args"]
    # --resume with the same command line: the id resolves again and the resume checks pass
    two = [*run[:6], "2", *run[7:]]  # --epochs 2
    out = ["--output-dir", str(tmp_path / "named"), "--resume", "auto"]
    assert cli([*two, "PekingU/tiny-rtdetr@main", *out]) == 0
    again = read_checkpoint(tmp_path / "named" / "checkpoint.pth", "detect")
    assert again["epoch"] == 1 and again["args"]["init"] == "PekingU/tiny-rtdetr@main"
    assert again["args"]["init_path"] == str(snapshot)
    # torchvision's file of the enum, as torchvision names it (the URL's basename) in TORCH_HOME
    weights = tv.get_model_weights("resnet18")["IMAGENET1K_V1"]
    file = tmp_path / "torch_home" / "hub" / "checkpoints" / weights.url.rsplit("/", 1)[1]
    file.parent.mkdir(parents=True)
    torch.manual_seed(1)
    torch.save(tv.resnet18().state_dict(), file)
    for spec in ("IMAGENET1K_V1", "torchvision:resnet18.IMAGENET1K_V1"):
        args = parse_train_args(
            ["--data-root", str(data), "--backbone", "resnet18", "--backbone-weights", spec]
        )
        assert args.backbone_weights == file
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        small = dict(
            backbone="resnet18", hidden_dim=32, num_heads=2, enc_layers=1, dec_layers=1, dim_feedforward=64
        )
        named, _, _ = build_detr(**small, backbone_weights=args.backbone_weights)
        local, _, _ = build_detr(**small, backbone_weights=file)
    _same_state(named.backbone, local.backbone)
    capsys.readouterr()
    # one line each, exit 1: an id not in the cache, an enum not in TORCH_HOME
    out = ["train", "--data-root", str(data), "--output-dir", str(tmp_path / "o")]
    for extra, message in (
        (["--init", "org/absent"], "'org/absent' is not in the cache"),
        (["--backbone-weights", "torchvision:resnet50.IMAGENET1K_V2"], "is not in the cache"),
    ):
        assert cli([*out, *extra]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


# ------------------------------------------------------------ --arch rtdetr --backbone-weights FOLDER / hub id


@pytest.fixture(scope="module")
def r18_folder(tmp_path_factory):
    """A random RT-DETR folder with R18-vd's backbone (a small encoder / decoder), its norms' buffers random too."""
    torch.manual_seed(2)
    backbone = transformers.RTDetrResNetConfig(
        layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512], embedding_size=64,
        out_features=["stage2", "stage3", "stage4"],
    )  # fmt: skip
    config = transformers.RTDetrConfig(
        backbone_config=backbone, encoder_hidden_dim=32, d_model=32, encoder_in_channels=[128, 256, 512],
        decoder_in_channels=[32, 32, 32], encoder_ffn_dim=64, decoder_ffn_dim=64, decoder_layers=1,
        num_queries=10, num_labels=3, anchor_image_size=None, num_denoising=0,
    )  # fmt: skip
    model = transformers.RTDetrForObjectDetection(config)
    with torch.no_grad():  # the frozen norms start at 0 / 1: make every tensor tell whether it was copied
        for name, buffer in model.named_buffers():
            if "running_" in name:
                buffer.uniform_(0.5, 1.5)
    folder = tmp_path_factory.mktemp("hf") / "rtdetr_r18"
    model.save_pretrained(folder)
    return folder


#: a small RT-DETR around the R18-vd backbone (build_model's keywords)
_R18 = dict(arch="rtdetr", backbone="r18vd", num_classes=3, hidden_dim=32, num_heads=2, dec_layers=1,
            dim_feedforward=64, num_queries=10, num_denoising=0)  # fmt: skip


def test_rtdetr_backbone_weights_from_a_folder_or_hub_id(hf_home, r18_folder, data, tmp_path):
    snapshot = put_in_hf_cache(hf_home, "PekingU/tiny-rtdetr-r18", r18_folder)
    argv = ["--arch", "rtdetr", "--backbone", "r18vd", "--data-root", str(data), "--backbone-weights"]
    assert parse_train_args([*argv, "PekingU/tiny-rtdetr-r18"]).backbone_weights == snapshot
    theirs, _ = read_hf_weights(r18_folder)
    torch.manual_seed(0)
    plain_model = build_model(_R18)[0]
    plain = plain_model.state_dict()
    for source in (snapshot, r18_folder, r18_folder / "model.safetensors"):  # a folder, or its weights file
        torch.manual_seed(0)
        named, _, _ = build_model({**_R18, "backbone_weights": str(source)})
        # the weights are not part of the model's config
        assert named.build_config == plain_model.build_config
        copied = 0
        for k, v in named.state_dict().items():
            if k.startswith("backbone.") and not k.endswith("num_batches_tracked"):
                want = theirs["model.backbone.model." + k.removeprefix("backbone.")]
                copied += 1
            else:  # the rest of the model as built without the weights
                want = plain[k]
            torch.testing.assert_close(v, want, rtol=0, atol=0, msg=k)
        assert copied > 100
    # a plain ResNet-vd state dict in our names still loads (build_rtdetr's way)
    net = build_resnet_vd("r18vd")
    own = tmp_path / "r18vd.pth"
    torch.save(build_resnet_vd("r18vd").state_dict(), own)
    report = load_rtdetr_backbone(net, own)
    assert report.copied and report.source == str(own)
    report = load_rtdetr_backbone(net, r18_folder)
    assert len(report.copied) == copied
    # another depth: one line naming both backbones, nothing built past the check
    for name in ("r34vd", "r50vd"):
        with pytest.raises(ValueError) as e:
            build_model({**_R18, "backbone": name, "backbone_weights": str(snapshot)})
        msg = str(e.value)
        assert "the folder's backbone has basic blocks [2, 2, 2, 2]" in msg and "\n" not in msg, msg
    # its weights file alone (no config.json beside it to read): the key check
    with pytest.raises(ValueError, match=r"do not fit the model") as e:
        build_model({**_R18, "backbone": "r34vd", "backbone_weights": str(r18_folder / "model.safetensors")})
    assert "\n" not in str(e.value)
