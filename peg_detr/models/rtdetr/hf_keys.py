"""transformers' ``RTDetrForObjectDetection`` state-dict keys <-> peg_detr's RT-DETR keys.

Our modules keep HF's names below three prefixes, so the mapping is a prefix map
(:data:`ENCODER_HF_PREFIXES`), the same in both directions.  Our keys are those of the detector
``RTDETR`` with its ``backbone`` (:class:`~peg_detr.models.rtdetr.backbone.ResNetVd`) and
``encoder`` (:class:`~peg_detr.models.rtdetr.encoder.HybridEncoder`) attributes:

=====================================  ===========================  =====================================
HF key prefix                          ours                         what
=====================================  ===========================  =====================================
``model.backbone.model.``              ``backbone.``                ResNet-vd: ``embedder.embedder.{0,1,2}``
                                                                    (the D stem), ``encoder.stages.{s}``
                                                                    ``.layers.{b}.{layer,shortcut}``
``model.encoder_input_proj.``          ``encoder.input_proj.``      per level ``{l}.0`` 1×1 conv, ``{l}.1`` BN
``model.encoder.``                     ``encoder.``                 ``aifi.{i}.layers.{j}.*``,
                                                                    ``lateral_convs``, ``fpn_blocks``,
                                                                    ``downsample_convs``, ``pan_blocks``
=====================================  ===========================  =====================================

Keys of ours with no HF counterpart (the map returns None for them): the position modules of
the non-``sincos`` encoders, ``encoder.aifi.{i}.pegs.*`` (``peg``), ``encoder.aifi.{i}.pos.pos_embed``
(``learned``), ``encoder.aifi.{i}.rope.freqs`` (``rope-mixed``).  HF's ``sincos`` table is not in
its state dict either, so an HF checkpoint loads into any of our encodings; the extra modules
keep their initialisation (the PEG: zero, so ``peg`` then computes what ``none`` computes).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "DECODER_PREFIXES",
    "ENCODER_HF_PREFIXES",
    "decoder_hf_keys",
    "decoder_key_from_hf",
    "decoder_key_to_hf",
    "encoder_hf_keys",
    "encoder_hf_to_ours",
    "encoder_ours_to_hf",
]

#: ``(HF prefix, our prefix)`` pairs for the backbone, the encoder input projections and the encoder.
ENCODER_HF_PREFIXES: tuple[tuple[str, str], ...] = (
    ("model.backbone.model.", "backbone."),
    ("model.encoder_input_proj.", "encoder.input_proj."),
    ("model.encoder.", "encoder."),
)

# Our keys of position modules that HF does not have (the map leaves them out).
_OURS_ONLY = (".pegs.", ".pos.", ".rope.")


def encoder_hf_to_ours(key: str) -> str | None:
    """Our key for an HF backbone / input-projection / encoder key; None for any other HF key."""
    for hf, ours in ENCODER_HF_PREFIXES:
        if key.startswith(hf):
            return ours + key[len(hf) :]
    return None


def encoder_ours_to_hf(key: str) -> str | None:
    """The HF key for one of our backbone / encoder keys; None for other keys and our position modules."""
    if key.startswith("encoder.aifi.") and any(part in key for part in _OURS_ONLY):
        return None
    # The longer of our prefixes first: "encoder.input_proj." also starts with "encoder.".
    for hf, ours in sorted(ENCODER_HF_PREFIXES, key=lambda p: -len(p[1])):
        if key.startswith(ours):
            return hf + key[len(ours) :]
    return None


def encoder_hf_keys(keys: Iterable[str], *, to_hf: bool = False) -> dict[str, str]:
    """``{source key: target key}`` for the backbone + encoder keys among ``keys`` (others left out).

    ``to_hf=False`` maps HF keys to ours, ``to_hf=True`` ours to HF.
    """
    rename = encoder_ours_to_hf if to_hf else encoder_hf_to_ours
    out = {}
    for key in keys:
        target = rename(key)
        if target is not None:
            out[key] = target
    return out


# ---------------------------------------------------------------- decoder side (rtdetr-decoder)
# Denoising embedding, query selection, decoder layers and heads.  Renamed by prefix; inside a
# layer the names are transformers' file names (transformers 5 keeps ``mlp.fc1`` /
# ``self_attn.o_proj`` in memory and writes ``fc1`` / ``self_attn.out_proj``; both are read).

#: (Hugging Face prefix, peg_detr prefix): denoising embedding, query selection, decoder and heads
DECODER_PREFIXES: tuple[tuple[str, str], ...] = (
    ("model.denoising_class_embed.", "denoising_class_embed."),
    ("model.enc_output.", "decoder.enc_output."),
    ("model.enc_score_head.", "decoder.enc_score_head."),
    ("model.enc_bbox_head.", "decoder.enc_bbox_head."),
    ("model.weight_embedding.", "decoder.weight_embedding."),
    ("model.decoder_input_proj.", "decoder.input_proj."),
    ("model.decoder.layers.", "decoder.layers."),
    ("model.decoder.query_pos_head.", "decoder.query_pos_head."),
    ("model.decoder.class_embed.", "decoder.class_embed."),
    ("model.decoder.bbox_embed.", "decoder.bbox_embed."),
)
# transformers 5's in-memory names inside a decoder layer -> the names of its files (and ours)
_IN_MEMORY = ((".mlp.fc1.", ".fc1."), (".mlp.fc2.", ".fc2."), (".self_attn.o_proj.", ".self_attn.out_proj."))


def decoder_hf_keys() -> tuple[tuple[str, str], ...]:
    """The ``(Hugging Face prefix, peg_detr prefix)`` pairs of the decoder side."""
    return DECODER_PREFIXES


def decoder_key_from_hf(key: str) -> str | None:
    """A Hugging Face key of the decoder side in ``peg_detr`` names; None for other keys."""
    for hf, ours in DECODER_PREFIXES:
        if key.startswith(hf):
            new = ours + key.removeprefix(hf)
            for memory, file in _IN_MEMORY:
                new = new.replace(memory, file)
            return new
    return None


def decoder_key_to_hf(key: str) -> str | None:
    """A ``peg_detr`` key of the decoder side in the names ``save_pretrained`` writes; None for other keys."""
    for hf, ours in DECODER_PREFIXES:
        if key.startswith(ours):
            return hf + key.removeprefix(ours)
    return None
