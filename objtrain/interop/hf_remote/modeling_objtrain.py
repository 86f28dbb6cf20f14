"""objtrain's encoder-decoder for `transformers`, as written by `objtrain export` (loaded with
`trust_remote_code=True`). The weights keep objtrain's names, so the arithmetic below is objtrain's
(`objtrain/models/encdec.py`, `blocks.py`) without its packing: one document per row, padding masked
out with `attention_mask`.

    input_ids (B, T) -> embed -> encoder blocks (bidirectional) -> encoder_norm -> memory (B, T, D)
    decoder_input_ids (B, S) -> embed -> decoder blocks (causal self-attention, cross-attention to
        memory) -> lm_head.norm -> embed.weight^T -> logits (B, S, V)

Generation recomputes the decoder over all tokens at each step (no key/value cache).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from .configuration_objtrain import ObjtrainEncDecConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)


def rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotate x (B, T, h, K) at positions (B, T); channels (2i, 2i+1) form a pair (interleaved)."""
    K = x.size(-1)
    inv_freq = 1.0 / (theta ** (torch.arange(0, K, 2, dtype=torch.float32, device=x.device) / K))
    angles = positions[..., None].float() * inv_freq  # (B, T, K/2)
    cos, sin = angles.cos()[:, :, None].to(x.dtype), angles.sin()[:, :, None].to(x.dtype)
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)


class SelfAttention(nn.Module):
    def __init__(self, config: ObjtrainEncDecConfig) -> None:
        super().__init__()
        D = config.hidden_size
        self.n_head = config.num_attention_heads
        self.theta = config.rope_theta
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: Tensor, positions: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        B, T, D = x.shape
        H = self.n_head
        qkv = self.qkv(x)
        qk = rope(qkv[..., : 2 * D].unflatten(-1, (2 * H, -1)), positions, self.theta)
        q, k = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2)
        v = qkv[..., 2 * D :].unflatten(-1, (H, -1)).transpose(1, 2)
        if causal:
            tri = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            mask = tri if mask is None else (mask & tri)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class CrossAttention(nn.Module):
    def __init__(self, config: ObjtrainEncDecConfig) -> None:
        super().__init__()
        D = config.hidden_size
        self.n_head = config.num_attention_heads
        self.q = nn.Linear(D, D, bias=False)
        self.kv = nn.Linear(D, 2 * D, bias=False)
        self.proj = nn.Linear(D, D, bias=False)

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None) -> Tensor:
        B, T, D = x.shape
        S, H = memory.size(1), self.n_head
        k, v = self.kv(memory).view(B, S, 2, H, D // H).permute(2, 0, 3, 1, 4)
        q = self.q(x).view(B, T, H, D // H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class SwiGLU(nn.Module):
    def __init__(self, config: ObjtrainEncDecConfig) -> None:
        super().__init__()
        self.w13 = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    """Pre-norm: x + attn(norm1(x)) [+ cross(norm_cross(x), memory)] + mlp(norm2(x))."""

    def __init__(self, config: ObjtrainEncDecConfig, cross: bool) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.norm1 = RMSNorm(config.hidden_size, eps)
        self.attn = SelfAttention(config)
        self.norm_cross = RMSNorm(config.hidden_size, eps) if cross else None
        self.cross = CrossAttention(config) if cross else None
        self.norm2 = RMSNorm(config.hidden_size, eps)
        self.mlp = SwiGLU(config)

    def forward(
        self,
        x: Tensor,
        positions: Tensor,
        mask: Tensor | None,
        causal: bool,
        memory: Tensor | None = None,
        cross_mask: Tensor | None = None,
    ) -> Tensor:
        x = x + self.attn(self.norm1(x), positions, mask, causal)
        if self.cross is not None and self.norm_cross is not None and memory is not None:
            x = x + self.cross(self.norm_cross(x), memory, cross_mask)
        return x + self.mlp(self.norm2(x))


class Head(nn.Module):
    def __init__(self, config: ObjtrainEncDecConfig) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


def _key_mask(attention_mask: Tensor | None) -> Tensor | None:
    """(B, S) 1/0 -> (B, 1, 1, S) bool, True = may attend."""
    return None if attention_mask is None else attention_mask.bool()[:, None, None, :]


def _positions(ids: Tensor) -> Tensor:
    return torch.arange(ids.size(1), device=ids.device).expand(ids.size(0), -1)


class Encoder(nn.ModuleList):
    """The encoder blocks (weights `encoder.{i}.*`, as objtrain names them), callable as the encoder half
    that `get_encoder()` returns: embedding and final norm are read from the owning model."""

    main_input_name = "input_ids"

    def __init__(self, config: ObjtrainEncDecConfig) -> None:
        super().__init__(Block(config, cross=False) for _ in range(config.num_encoder_layers))
        self._owner: list[ObjtrainEncDecForConditionalGeneration] = []  # a list: not a submodule

    def forward(  # type: ignore[override]
        self, input_ids: Tensor, attention_mask: Tensor | None = None, **kwargs: Any
    ) -> BaseModelOutput:
        return BaseModelOutput(last_hidden_state=self._owner[0].encode(input_ids, attention_mask))


class ObjtrainEncDecForConditionalGeneration(PreTrainedModel, GenerationMixin):
    config_class = ObjtrainEncDecConfig
    base_model_prefix = "objtrain"
    main_input_name = "input_ids"
    _supports_cache_class = False

    def __init__(self, config: ObjtrainEncDecConfig) -> None:
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.encoder = Encoder(config)
        self.encoder._owner.append(self)
        self.encoder_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.decoder = nn.ModuleList(Block(config, cross=True) for _ in range(config.num_decoder_layers))
        self.lm_head = Head(config)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embed = value  # type: ignore[assignment]

    def get_encoder(self) -> nn.Module:
        return self.encoder

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """(B, T) -> normed memory (B, T, D)."""
        x = self.embed(input_ids)
        positions, mask = _positions(input_ids), _key_mask(attention_mask)
        for block in self.encoder:
            x = block(x, positions, mask, causal=False)
        return self.encoder_norm(x)

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple[Tensor, ...] | None = None,
        labels: Tensor | None = None,
        **kwargs: Any,
    ) -> Seq2SeqLMOutput:
        if encoder_outputs is None:
            assert input_ids is not None, "give input_ids or encoder_outputs"
            memory = self.encode(input_ids, attention_mask)
        else:
            memory = encoder_outputs[0]
        if decoder_input_ids is None:
            assert labels is not None, "give decoder_input_ids or labels"
            decoder_input_ids = labels.new_full(labels.shape, self.config.decoder_start_token_id)
            decoder_input_ids[:, 1:] = labels[:, :-1]  # shifted right, ignored positions as padding
            decoder_input_ids.masked_fill_(decoder_input_ids == -100, self.config.pad_token_id)
        x = self.embed(decoder_input_ids)
        positions = _positions(decoder_input_ids)
        self_mask, cross_mask = _key_mask(decoder_attention_mask), _key_mask(attention_mask)
        for block in self.decoder:
            x = block(x, positions, self_mask, True, memory, cross_mask)
        logits = F.linear(self.lm_head.norm(x), self.embed.weight)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        return Seq2SeqLMOutput(loss=loss, logits=logits, encoder_last_hidden_state=memory)

    def prepare_inputs_for_generation(self, input_ids: Tensor, **kwargs: Any) -> dict[str, Any]:
        """Every step reads the whole decoder sequence so far (no cache)."""
        return {
            "decoder_input_ids": input_ids,
            "encoder_outputs": kwargs.get("encoder_outputs"),
            "attention_mask": kwargs.get("attention_mask"),
        }
