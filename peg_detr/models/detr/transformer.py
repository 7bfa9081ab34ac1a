"""DETR's encoder-decoder transformer, with the encoder's position encoding chosen by name.

Layer and parameter names follow the official DETR code, so the state-dict
keys are ``transformer.encoder.layers.N.{self_attn,linear1,linear2,norm1,norm2}.*``
and ``transformer.decoder.layers.N.{self_attn,multihead_attn,linear1,linear2,norm1..3}.*``
plus the shared ``transformer.decoder.norm``.  Tokens are batch-first
``(B, N, C)`` (``nn.MultiheadAttention(batch_first=True)`` has the same keys).

Where position information enters:

* **Encoder** (``pos_enc``): ``sine`` / ``learned`` / ``sincos`` codes are
  added to the queries and keys of every encoder self-attention (DETR);
  ``peg`` adds a mask-aware :class:`peg_core.PEG2d` to the token stream after
  each encoder layer listed in ``peg_at`` (CPVT: after layer 0; ``-1``: on the
  encoder input, before layer 0), under ``transformer.encoder.pegs.N.*``
  (``pegs.-1.*`` before layer 0); ``none`` adds nothing.
* **Encoder, rotary** (``rope-axial`` / ``rope-mixed`` / ``rope-dinov3``, alone or as
  ``peg+rope-*``): a :class:`peg_core.rope.RotaryEmbedding` under ``transformer.encoder.rope``
  (``rope.freqs`` for the learned mixed kind, per encoder layer and head; no key for the fixed
  kinds) rotates each head's queries and keys after the ``self_attn`` input projection, in every
  encoder self-attention; values are not rotated.  The table is built from the padding mask, so a
  token's coordinates count from its image's first real row and column (DINOv3: normalised by
  the real region's extent): a token's rotation does not depend on how much padding the batch
  added.  The ``self_attn`` weights are used as they are, so the keys stay DETR's.
* **Encoder, attention bias** (``alibi-2d`` / ``fire`` / ``lookhere``, alone or as ``peg+alibi-2d`` / ``peg+fire``):
  a :class:`peg_core.bias.AttentionBias` under ``transformer.encoder.attn_bias`` (FIRE's MLP:
  ``attn_bias.mlp.*``, shared by every layer; ALiBi has no key) gives one ``(1, heads, N, N)``
  bias per forward, from the grid; the padding mask is folded in once as ``-inf`` key columns
  (:func:`peg_core.bias.with_key_padding`) and every encoder self-attention adds it to its logits
  through :func:`rotary_self_attention` (the same ``self_attn`` weights, so DETR's keys).  The
  bias depends on grid distances only, which bottom / right padding does not move: a real
  token's attention does not depend on how much padding the batch added.
* **Decoder cross-attention keys** (``decoder_key_pos``), a separate choice:
  ``sine`` (DETR's sine codes of the padding mask, the default for every
  ``pos_enc``), ``none``, or ``peg-output`` (what the first PEG adds to the
  tokens, i.e. its convolution output, zero at padding).  The default keeps
  DETR's decoder geometry: the object queries learn to attend to image regions
  through these keys, so with ``sine`` keys a ``peg`` model differs from DETR
  in its encoder only, and the comparison between encodings is about the
  encoder.  ``peg-output`` is the fully conditional variant (no fixed code
  anywhere); ``none`` leaves the decoder to read position from the memory alone.
  A rotary encoder keeps ``sine`` keys by default too: the decoder's object queries have no
  grid position, so cross-attention cannot be rotated, and rotary position lives only in the
  encoder's attention scores (relative offsets), not in the memory tokens; ``sine`` keys give
  the queries the absolute geometry DETR's box regression relies on.  ``none`` is the
  rotary-only variant (no additive code anywhere).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg_core import PEG2d, PositionEncoding, SinePositionEncoding2d
from peg_core.bias import AttentionBias, with_key_padding
from peg_core.peg import resolve_peg_at
from peg_core.rope import RotaryEmbedding, apply_rope

__all__ = [
    "DECODER_KEY_POS",
    "Transformer",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "rotary_self_attention",
]

DECODER_KEY_POS = ("sine", "none", "peg-output")


def _with_pos(x: Tensor, pos: Tensor | None) -> Tensor:
    return x if pos is None else x + pos


def rotary_self_attention(
    mha: nn.MultiheadAttention,
    qk: Tensor,
    value: Tensor,
    rope: tuple[Tensor, Tensor] | None,
    key_padding_mask: Tensor | None = None,
    *,
    half: bool = False,
    training: bool = False,
    attn_bias: Tensor | None = None,
) -> Tensor:
    """``mha``'s attention with its queries and keys rotated per head after the input projection.

    The same weights and the same result as ``mha(qk, qk, value, key_padding_mask=...)`` with the
    rotation inserted between the projection and the scores (``nn.MultiheadAttention`` has no hook
    there).  ``qk`` / ``value`` ``(B, N, C)``; ``rope`` an apply-form ``(sin, cos)`` table
    broadcastable to ``(B, heads, N, C / heads)``, or None (no rotation); ``key_padding_mask``
    ``(B, N)``, True = padding.  ``attn_bias``: a float bias broadcastable to ``(B, heads, N, N)``
    added to the logits (an attention bias, possibly with the padding already folded in as ``-inf``
    columns, :func:`peg_core.bias.with_key_padding`; a ``key_padding_mask`` given too is folded here).
    """
    b, n, c = qk.shape
    h = mha.num_heads
    w, bias = mha.in_proj_weight, mha.in_proj_bias
    b_qk, b_v = (None, None) if bias is None else (bias[: 2 * c], bias[2 * c :])
    # (B, N, 2C) -> (2, B, heads, N, C / heads)
    q, k = F.linear(qk, w[: 2 * c], b_qk).reshape(b, n, 2, h, c // h).permute(2, 0, 3, 1, 4).unbind(0)
    v = F.linear(value, w[2 * c :], b_v).reshape(b, n, h, c // h).transpose(1, 2)
    if rope is not None:
        sin, cos = rope
        q, k = apply_rope(q, sin, cos, half=half), apply_rope(k, sin, cos, half=half)
    if attn_bias is not None:  # float mask in the queries' dtype (SDPA's rule)
        attn_mask = with_key_padding(attn_bias.to(q.dtype), key_padding_mask)
    else:
        attn_mask = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
    p = mha.dropout if training else 0.0
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
    return mha.out_proj(out.transpose(1, 2).reshape(b, n, c))


class _DETRLayer(nn.Module):
    """DETR's sublayers in its state-dict names: ``self_attn``, ``multihead_attn`` (``cross``), the
    ReLU FFN ``linear1`` / ``dropout`` / ``linear2``, then ``norm{i}`` and ``dropout{i}`` for each of
    the 2 (encoder) or 3 (decoder) residual branches.

    Created in the official modules' order, so a seeded model draws the same initial weights.
    """

    def __init__(
        self, d_model: int, nhead: int, dim_feedforward: int, dropout: float, pre_norm: bool, *, cross: bool
    ) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        if cross:
            self.multihead_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        branches = range(1, 4 if cross else 3)
        for i in branches:
            self.add_module(f"norm{i}", nn.LayerNorm(d_model))
        for i in branches:
            self.add_module(f"dropout{i}", nn.Dropout(dropout))
        self.pre_norm = pre_norm

    def _ffn(self, x: Tensor) -> Tensor:
        """``(..., C) -> (..., C)``: ``linear2(dropout(relu(linear1(x))))``."""
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


class TransformerEncoderLayer(_DETRLayer):
    """Self-attention + FFN; ``pos`` is added to queries and keys only (values stay position-free).

    ``forward(src (B, N, C), pos (B|1, N, C) | None, key_padding_mask (B, N) | None, rope, bias) -> (B, N, C)``;
    ``rope``: an apply-form ``(sin, cos)`` table (:func:`rotary_self_attention`; pair layout
    ``rope_half``) that rotates the projected queries and keys; ``bias``: a float mask
    ``(B|1, heads, N, N)`` added to the logits, the padding folded in (``key_padding_mask`` is then
    not used again).  Post-norm (DETR) unless ``pre_norm``.
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int,
        dropout: float,
        pre_norm: bool = False,
        *,
        rope_half: bool = False,
    ) -> None:
        super().__init__(d_model, nhead, dim_feedforward, dropout, pre_norm, cross=False)
        self.rope_half = rope_half

    def _attn(
        self,
        x: Tensor,
        pos: Tensor | None,
        key_padding_mask: Tensor | None,
        rope: tuple[Tensor, Tensor] | None,
        bias: Tensor | None = None,
    ) -> Tensor:
        qk = _with_pos(x, pos)
        if bias is not None:  # the padding is in the bias already
            return rotary_self_attention(self.self_attn, qk, x, rope, None, half=self.rope_half,
                                         training=self.training, attn_bias=bias)  # fmt: skip
        if rope is not None:
            return rotary_self_attention(self.self_attn, qk, x, rope, key_padding_mask, half=self.rope_half,
                                         training=self.training)  # fmt: skip
        return self.self_attn(qk, qk, x, key_padding_mask=key_padding_mask, need_weights=False)[0]

    def forward(
        self,
        src: Tensor,
        pos: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        rope: tuple[Tensor, Tensor] | None = None,
        bias: Tensor | None = None,
    ) -> Tensor:
        if self.pre_norm:
            src = src + self.dropout1(self._attn(self.norm1(src), pos, key_padding_mask, rope, bias))
            return src + self.dropout2(self._ffn(self.norm2(src)))
        src = self.norm1(src + self.dropout1(self._attn(src, pos, key_padding_mask, rope, bias)))
        return self.norm2(src + self.dropout2(self._ffn(src)))


class TransformerDecoderLayer(_DETRLayer):
    """Query self-attention, cross-attention to the encoder memory, FFN.

    Self-attention: ``q = k = tgt + query_pos``, ``v = tgt``.  Cross-attention:
    ``query = tgt + query_pos``, ``key = memory + key_pos``, ``value = memory``.
    Shapes: ``tgt``/``query_pos`` ``(B, Q, C)``, ``memory`` ``(B, N, C)``,
    ``key_pos`` ``(B|1, N, C)`` or None, ``memory_key_padding_mask`` ``(B, N)``.
    """

    def __init__(
        self, d_model: int, nhead: int, dim_feedforward: int, dropout: float, pre_norm: bool = False
    ) -> None:
        super().__init__(d_model, nhead, dim_feedforward, dropout, pre_norm, cross=True)

    def _self(self, x: Tensor, query_pos: Tensor) -> Tensor:
        qk = x + query_pos
        return self.self_attn(qk, qk, x, need_weights=False)[0]

    def _cross(
        self, x: Tensor, memory: Tensor, query_pos: Tensor, key_pos: Tensor | None, kpm: Tensor | None
    ) -> Tensor:
        return self.multihead_attn(
            x + query_pos, _with_pos(memory, key_pos), memory, key_padding_mask=kpm, need_weights=False
        )[0]

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        query_pos: Tensor,
        key_pos: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
    ) -> Tensor:
        kpm = memory_key_padding_mask
        if self.pre_norm:
            tgt = tgt + self.dropout1(self._self(self.norm1(tgt), query_pos))
            tgt = tgt + self.dropout2(self._cross(self.norm2(tgt), memory, query_pos, key_pos, kpm))
            return tgt + self.dropout3(self._ffn(self.norm3(tgt)))
        tgt = self.norm1(tgt + self.dropout1(self._self(tgt, query_pos)))
        tgt = self.norm2(tgt + self.dropout2(self._cross(tgt, memory, query_pos, key_pos, kpm)))
        return self.norm3(tgt + self.dropout3(self._ffn(tgt)))


class TransformerEncoder(nn.Module):
    """A stack of encoder layers with the position encoding of the model.

    Args:
        layers: the encoder layers.
        pos: an encoding with ``apply_to == "qk"`` (added to q/k at every layer),
            or None.
        pegs: ``{layer index: PEG2d}``, each applied to the tokens after that layer
            (index ``-1``: to the encoder input, before layer 0).
        norm: final LayerNorm (pre-norm only; post-norm DETR has none).
        rope: a 2-D rotary encoding applied to q and k in every layer's self-attention, or None;
            a learned one (``rope-mixed``) has one set of frequencies per layer.
        attn_bias: a 2-D attention bias added to every layer's self-attention logits, or None;
            one module (and one bias tensor per forward) for all layers.

    ``forward(src (B, N, C), size (h, w), mask (B, h, w))`` returns the memory
    ``(B, N, C)`` and the first PEG's output ``(B, N, C)`` (None without PEGs).
    """

    def __init__(
        self,
        layers: list[TransformerEncoderLayer],
        pos: PositionEncoding | None = None,
        pegs: dict[int, PEG2d] | None = None,
        norm: nn.LayerNorm | None = None,
        rope: RotaryEmbedding | None = None,
        attn_bias: AttentionBias | None = None,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        if pos is not None and pos.apply_to != "qk":
            raise ValueError(f"encoder q/k encoding must have apply_to='qk'; got {pos.apply_to!r}")
        if rope is not None:
            if rope.ndim != 2:
                raise ValueError(f"the encoder's rotary encoding must be 2-D; got ndim={rope.ndim}")
            depth = getattr(rope, "depth", len(layers))
            if rope.learned and depth != len(layers):
                raise ValueError(f"rotary frequencies for {depth} layers; the encoder has {len(layers)}")
            halves = {layer.rope_half for layer in layers}
            if halves != {rope.half}:
                raise ValueError(f"rotary pair layout half={rope.half}; the layers have rope_half={halves}")
        self.pos = pos
        pegs = pegs or {}
        if pegs:  # the suite's one meaning of the indices; ValueError outside -1 .. depth - 1
            resolve_peg_at(list(pegs), len(layers))
        # An empty ModuleDict adds no state-dict keys, so sine/none keep DETR's exact keys.
        self.pegs = nn.ModuleDict({str(i): pegs[i] for i in sorted(pegs)})
        self.norm = norm
        self.rope = rope  # the fixed kinds have no state-dict key (non-persistent frequencies)
        if attn_bias is not None and attn_bias.ndim != 2:
            raise ValueError(f"the encoder's attention bias must be 2-D; got ndim={attn_bias.ndim}")
        self.attn_bias = attn_bias  # one module for every layer (FIRE shares its MLP across layers)

    def _peg(
        self, i: int, src: Tensor, size: tuple[int, int], mask: Tensor, peg_out: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """``src`` plus the PEG at position ``i`` (if any); ``peg_out`` keeps the first PEG's output."""
        if str(i) not in self.pegs:
            return src, peg_out
        delta = self.pegs[str(i)].position(src, size, mask)
        return src + delta, delta if peg_out is None else peg_out

    def forward(
        self, src: Tensor, size: tuple[int, int], mask: Tensor, pos: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """``pos`` ``(B|1, N, C)``: codes already computed by the caller (shared with the decoder keys)."""
        kpm = mask.flatten(1)
        if pos is None and self.pos is not None:
            pos = self.pos.position(src, size, mask)
        src, peg_out = self._peg(-1, src, size, mask, None)
        # (B, 1, N, D), or (layers, B, heads, N, D) for learned frequencies: coordinates from the mask
        rope = None if self.rope is None else self.rope(size, mask)
        bias = None
        if self.attn_bias is not None:
            # (B, heads, N, N): the grid's bias (1, heads, N, N) with -inf at padded keys, once for all layers
            bias = with_key_padding(self.attn_bias(size, mask, dtype=src.dtype, device=src.device), kpm)
        for i, layer in enumerate(self.layers):
            table = None if rope is None else (rope[0][i], rope[1][i]) if self.rope.learned else rope
            if bias is None:
                out = layer(src, pos, kpm, table)
            else:
                out = layer(src, pos, kpm, table, self.attn_bias.layer_bias(bias, i))
            src, peg_out = self._peg(i, out, size, mask, peg_out)
        if self.norm is not None:
            src = self.norm(src)
        return src, peg_out


class TransformerDecoder(nn.Module):
    """Decoder layers; the shared ``norm`` is applied to every layer's output (for the auxiliary losses).

    Returns ``(L, B, Q, C)``: the normalised output of each of the ``L`` layers.
    """

    def __init__(self, layers: list[TransformerDecoderLayer], norm: nn.LayerNorm) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm

    def forward(
        self, tgt: Tensor, memory: Tensor, query_pos: Tensor, key_pos: Tensor | None, kpm: Tensor
    ) -> Tensor:
        outputs = []
        for layer in self.layers:
            tgt = layer(tgt, memory, query_pos, key_pos, kpm)
            outputs.append(self.norm(tgt))
        return torch.stack(outputs)


class Transformer(nn.Module):
    """DETR's transformer: ``forward(src (B, C, h, w), mask (B, h, w), query_embed (Q, C)) -> (L, B, Q, C)``.

    Args:
        d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward,
            dropout, pre_norm: DETR's hyper-parameters.
        pos: encoder q/k encoding (``apply_to == "qk"``) or None.
        pegs: ``{encoder layer index: PEG2d}`` for ``pos_enc="peg"``.
        decoder_key_pos: ``sine`` / ``none`` / ``peg-output`` (module docstring).
        rope: a 2-D rotary encoding of the encoder's self-attention (``pos_enc="rope-*"``) or None.
        attn_bias: a 2-D attention bias of the encoder's self-attention (``pos_enc="alibi-2d"``...) or None.
    """

    def __init__(
        self,
        d_model: int = 256,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        pre_norm: bool = False,
        pos: PositionEncoding | None = None,
        pegs: dict[int, PEG2d] | None = None,
        decoder_key_pos: str = "sine",
        rope: RotaryEmbedding | None = None,
        attn_bias: AttentionBias | None = None,
    ) -> None:
        super().__init__()
        if d_model % nhead:
            raise ValueError(f"hidden_dim={d_model} must be divisible by num_heads={nhead}")
        if decoder_key_pos not in DECODER_KEY_POS:
            raise ValueError(f"decoder_key_pos must be one of {DECODER_KEY_POS}; got {decoder_key_pos!r}")
        if decoder_key_pos == "peg-output" and not pegs:
            raise ValueError("decoder_key_pos='peg-output' needs pos_enc='peg' (the model has no PEG)")
        if rope is not None and rope.head_dim != d_model // nhead:
            raise ValueError(f"rotary head_dim={rope.head_dim}; hidden_dim / num_heads is {d_model // nhead}")
        args = (d_model, nhead, dim_feedforward, dropout, pre_norm)
        half = rope is not None and rope.half
        self.encoder = TransformerEncoder(
            [TransformerEncoderLayer(*args, rope_half=half) for _ in range(num_encoder_layers)],
            pos,
            pegs,
            nn.LayerNorm(d_model) if pre_norm else None,
            rope,
            attn_bias,
        )
        self.decoder = TransformerDecoder(
            [TransformerDecoderLayer(*args) for _ in range(num_decoder_layers)], nn.LayerNorm(d_model)
        )
        self.decoder_key_pos = decoder_key_pos
        if decoder_key_pos == "sine":
            self.key_pos = SinePositionEncoding2d(d_model, normalize=True)
        # Sine encoder codes with the decoder keys' settings are computed once per forward.
        enc = self.encoder.pos
        self._share_sine = (
            decoder_key_pos == "sine"
            and isinstance(enc, SinePositionEncoding2d)
            and (enc.dim, enc.temperature, enc.normalize, enc.scale, enc.num_prefix_tokens)
            == (d_model, self.key_pos.temperature, self.key_pos.normalize, self.key_pos.scale, 0)
        )
        self.d_model = d_model
        self.nhead = nhead
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        # DETR: Xavier-uniform for every matrix of the attention/FFN layers.
        # PEGs and learned tables keep their own initialisation.
        for stack in (self.encoder.layers, self.decoder.layers):
            for p in stack.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)

    def forward(self, src: Tensor, mask: Tensor, query_embed: Tensor) -> Tensor:
        b, _, h, w = src.shape
        if mask.shape != (b, h, w):
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected (B, h, w) = {(b, h, w)}")
        tokens = src.flatten(2).transpose(1, 2)
        sine = None
        if self.decoder_key_pos == "sine":
            # One (B, h*w, C) table in float32 (float64 for float64 inputs), cast per use as
            # position() would: under autocast the tokens are half and the memory float32.
            compute = torch.float64 if tokens.dtype == torch.float64 else torch.float32
            sine = self.key_pos.grid(mask, compute).flatten(1, 2)
        enc_pos = sine.to(tokens.dtype) if self._share_sine else None
        memory, peg_out = self.encoder(tokens, (h, w), mask, enc_pos)
        if sine is not None:
            key_pos = sine.to(memory.dtype)
        elif self.decoder_key_pos == "peg-output":
            key_pos = peg_out
        else:
            key_pos = None
        query_pos = query_embed.unsqueeze(0).expand(b, -1, -1)
        tgt = torch.zeros_like(query_pos)
        return self.decoder(tgt, memory, query_pos, key_pos, mask.flatten(1))
