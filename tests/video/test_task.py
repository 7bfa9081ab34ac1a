"""The video task's pieces: recipes as parser defaults, weight-decay groups, the warm-up + cosine schedule."""

import pytest

from peg_core.engine import param_groups
from peg_video import build_video_model
from peg_video.cli import parse_eval_args, parse_train_args
from peg_video.configs import CONFIGS, FINETUNE_CONFIGS


# the fine-tuning recipes need an --init folder, whose model replaces --arch / --tubelet
# (tests/video/test_video_init_cli.py)
@pytest.mark.parametrize("name", sorted(set(CONFIGS) - set(FINETUNE_CONFIGS)))
def test_recipes_are_parser_defaults(name):
    # Kinetics recipes read annotation files; the others an official tree under --data-root
    data = (
        ["--train-ann", "a.csv"]
        if CONFIGS[name].get("dataset", "kinetics") == "kinetics"
        else ["--data-root", "d"]
    )
    args = parse_train_args(["--config", name, *data])
    for key, value in CONFIGS[name].items():
        assert getattr(args, key) == value, key


def test_flags_override_recipes_and_model_options():
    args = parse_train_args([
        "--config", "k400_vit_s_16x4_peg3d", "--train-ann", "a.csv", "--scale-jitter", "240,300",
        "--tubelet", "4,16,16", "--clip-max-norm", "0", "--amp", "off", "--model-opt", "depth=4",
        "--model-opt", "attention=divided",
    ])  # fmt: skip
    assert args.scale_jitter == [240, 300] and args.tubelet == [4, 16, 16]
    assert (args.clip_max_norm, args.amp, args.resume) == (0.0, "off", None)
    assert args.model_opts == {"drop_path_rate": 0.1, "depth": 4, "attention": "divided"}
    # another model than the recipe's: the recipe's model options do not apply, explicit ones do
    other = parse_train_args(["--config", "synthetic_tiny", "--train-ann", "a.csv", "--arch", "x3d_xs",
                        "--pos-enc", "none", "--model-opt", "width_factor=0.5"])  # fmt: skip
    assert other.model_opts == {"width_factor": 0.5}
    assert parse_train_args(["--train-ann", "a.csv", "--resume", "auto"]).resume == "auto"


def test_eval_options_default_to_the_run():
    args = parse_eval_args(["--checkpoint", "c.pth", "--num-frames", "16"])
    assert args.num_frames == 16 and args.crop is None and args.reduction is None and args.output_dir is None


def test_weight_decay_follows_no_weight_decay():
    model = build_video_model(
        "vit_tiny", pos_enc="learned", num_classes=3, num_frames=4, img_size=16, tubelet=(2, 8, 8),
        embed_dim=16, depth=2, num_heads=2, global_pool="token",
    )  # fmt: skip
    names = {id(p): n for n, p in model.named_parameters()}
    decay, no_decay = (sorted(names[id(p)] for p in g["params"]) for g in param_groups(model, 0.05))
    assert model.no_weight_decay() <= set(no_decay)  # cls_token, pos_enc.spatial, pos_enc.temporal
    assert all(n in model.no_weight_decay() or model.get_parameter(n).ndim == 1 for n in no_decay)
    assert "patch_embed.proj.weight" in decay and "blocks.0.attn.qkv.weight" in decay
    peg = build_video_model("vit_tiny", num_classes=3, num_frames=4, img_size=16, tubelet=(2, 8, 8),
                            embed_dim=16, depth=1, num_heads=2)  # fmt: skip
    decay, no_decay = (
        {n for n, p in peg.named_parameters() if any(p is q for q in g["params"])}
        for g in param_groups(peg, 0.05)
    )
    assert "pos_blocks.0.proj.weight" in decay and "pos_blocks.0.proj.bias" in no_decay  # PEG kernels decay
