"""Hugging Face ``RTDetrForObjectDetection`` key names <-> ``peg_detr``'s RT-DETR.

Keys are renamed by prefix; inside a layer the names are the same on both sides (the files'
names: transformers 5 keeps ``mlp.fc1`` / ``self_attn.o_proj`` in memory and writes ``fc1`` /
``self_attn.out_proj``; both are read).
"""

from __future__ import annotations

__all__ = ["DECODER_PREFIXES", "decoder_hf_keys", "decoder_key_from_hf", "decoder_key_to_hf"]

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
