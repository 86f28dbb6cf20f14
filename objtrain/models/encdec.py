"""Encoder-decoder (T5 family, with the shared blocks): bidirectional encoder, causal decoder with
cross-attention, one embedding matrix shared by encoder input, decoder input and the output head.

    enc ids (B, T) -> embed -> encoder blocks -> RMSNorm -> memory (B, T, D)
    dec ids (B, S) -> embed -> decoder blocks (self: causal in-document; cross: memory of the same
                      document) -> RMSNorm -> E^T -> logits (B, S, V)

Decoder position s with document id d cross-attends only to encoder positions of document d, so packed
examples never see each other.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from objtrain.batch import AttentionKind, Batch, ModelOutput, positions_of
from objtrain.models.attention import (
    causal_chunk_mask,
    cross_attention_mask,
    flex_cross_attention_spec,
)
from objtrain.models.base import TrunkOutput, ZooModel, make_block
from objtrain.models.blocks import Embedding, KVCache, RMSNorm, Rotary
from objtrain.models.config import ModelConfig
from objtrain.models.heads import LMHead


class EncoderDecoder(ZooModel):
    kind = "encdec"

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = Embedding(cfg.vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_base)
        self.encoder = nn.ModuleList(make_block(cfg) for _ in range(cfg.n_layer))
        self.encoder_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.decoder = nn.ModuleList(make_block(cfg, cross=True) for _ in range(cfg.decoder_layers))
        self.lm_head = LMHead(cfg.d_model, cfg.norm_eps)
        self._init()

    def encode(
        self,
        input_ids: Tensor,
        positions: Tensor,
        document_ids: Tensor,
        attention: AttentionKind = "bidirectional",
        prefix_mask: Tensor | None = None,
        single_document: bool | None = None,
    ) -> Tensor:
        """Encoder input (B, T) -> normed memory (B, T, D)."""
        ctx = self.context(positions, document_ids, attention, prefix_mask, single_document)
        x = self.drop(self.embed(input_ids))
        for block in self.encoder:
            x = block.run(x, ctx)
        return self.encoder_norm(x)

    def trunk(self, batch: Batch) -> TrunkOutput:
        assert batch.decoder_input_ids is not None, "an encoder-decoder model needs decoder_input_ids"
        memory = self.encode(
            batch.input_ids,
            batch.positions,
            batch.document_ids,
            batch.attention,
            batch.prefix_mask,
            batch.single_document,
        )
        dec_ids = batch.decoder_input_ids  # (B, S)
        dec_docs = batch.decoder_document_ids
        if dec_docs is None:
            dec_docs = torch.zeros_like(dec_ids)
        dec_pos = batch.decoder_positions if batch.decoder_positions is not None else positions_of(dec_docs)
        ctx = self.context(dec_pos, dec_docs, "causal", single_document=batch.decoder_single_document)
        known = batch.single_document is not None and batch.decoder_single_document is not None
        both = bool(batch.single_document and batch.decoder_single_document) if known else None
        cross = flex_cross_attention_spec if self.uses_flex(dec_ids.device) else cross_attention_mask
        ctx.cross_mask = cross(dec_docs, batch.document_ids, both)
        x = self.drop(self.embed(dec_ids))
        for block in self.decoder:
            x = block.run(x, ctx, memory)
        return TrunkOutput(x, ctx, memory)

    def heads(self, trunk: TrunkOutput) -> ModelOutput:
        hidden, logits = self.lm_head(trunk.hidden, self.embed.weight)
        return ModelOutput(logits=logits, hidden=hidden)

    # --- incremental decoding (one document per row) --------------------------------------------

    def new_cache(self, batch: int, max_len: int) -> list[KVCache]:
        like = self.embed.weight
        cfg = self.config
        return [KVCache(batch, cfg.n_head, max_len, cfg.head_dim, like) for _ in range(len(self.decoder))]

    def memory_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Cross-attention keys/values of every decoder layer, computed once per generation."""
        return [block.cross.memory_kv(memory) for block in self.decoder]  # type: ignore[union-attr]

    def step(
        self,
        ids: Tensor,
        positions: Tensor,
        caches: list[KVCache],
        memory_kv: list[tuple[Tensor, Tensor]],
        mask: Tensor | None = None,
        cross_mask: Tensor | None = None,
    ) -> Tensor:
        """New decoder tokens ids (B, t) at positions (B, t) -> logits (B, t, V). `mask` (1, 1, t, S)
        replaces the causal one over the cache and `cross_mask` (1, 1, t, T) hides padded memory (static
        caches and memory buffers give both)."""
        t = ids.size(1)
        cos, sin = self.rotary(positions)
        if mask is None:
            mask = causal_chunk_mask(t, caches[0].length + t, ids.device)
        x = self.embed(ids)
        for block, cache, kv in zip(self.decoder, caches, memory_kv, strict=True):
            x = block(x, cos, sin, mask, False, cross_mask=cross_mask, cache=cache, memory_kv=kv)
        return self.lm_head(x, self.embed.weight)[1]
