"""Decoder-only language model (GPT/Llama family), optionally with multi-token-prediction heads.

    ids (B, T) -> embed -> blocks[0 .. L-2] (trunk) -> head layer k -> shared RMSNorm -> E^T -> logits

With `mtp_heads = n`, head 1's layer is the model's last block and heads 2..n are extra one-layer
heads on the same trunk, sharing the final norm and the unembedding
(Gloeckle et al. 2024). With n = 1 this is exactly a plain L-layer decoder.

The unembedding is the token embedding E unless `tie_embeddings` is false (then `lm_head.out`, as in
Llama 2); `n_kv_head < n_head` makes attention grouped-query (Llama 3), with caches of n_kv_head heads.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from objtrain.batch import Batch, ModelOutput
from objtrain.models.attention import causal_chunk_mask
from objtrain.models.base import TrunkOutput, ZooModel, make_block
from objtrain.models.blocks import Block, Embedding, KVCache, Rotary, StackedBlocks
from objtrain.models.config import ModelConfig
from objtrain.models.heads import LMHead


class Decoder(ZooModel):
    kind = "decoder"

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = Embedding(cfg.vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_base)
        self.blocks = nn.ModuleList(make_block(cfg) for _ in range(cfg.n_layer))  # last = head 1's layer
        self.mtp = nn.ModuleList(make_block(cfg) for _ in range(cfg.mtp_heads - 1))  # heads 2..n
        self.lm_head = LMHead(cfg.d_model, cfg.norm_eps, 0 if cfg.tie_embeddings else cfg.vocab_size)
        self._init()

    @property
    def head_layers(self) -> list[Block]:
        return [self.blocks[-1], *self.mtp]  # type: ignore[list-item]

    def trunk(self, batch: Batch) -> TrunkOutput:
        ctx = self.context(
            batch.positions, batch.document_ids, batch.attention, batch.prefix_mask, batch.single_document
        )
        x = self.drop(self.embed(batch.input_ids))  # (B, T, D)
        for block in self.blocks[:-1]:
            x = block.run(x, ctx)
        return TrunkOutput(x, ctx)

    def head(self, k: int, trunk: TrunkOutput) -> tuple[Tensor, Tensor]:
        """Head k (0-based; k predicts offset k+1): normed hidden (B, T, D), logits (B, T, V), or (N, V)
        at `trunk.logit_mask` for head 1 (sparse prediction)."""
        x = self.head_layers[k].run(trunk.hidden, trunk.ctx)
        return self.lm_head(x, self.embed.weight, trunk.logit_mask if k == 0 else None)

    def last_hidden(self, batch: Batch) -> Tensor:
        """Head 1's normed hidden states (B, T, D), as `forward` gives them, without the unembedding (a
        probe reads features; the (V, D) product is most of a small model's forward)."""
        trunk = self.trunk(batch)
        return self.lm_head.norm(self.head_layers[0].run(trunk.hidden, trunk.ctx))

    def heads(self, trunk: TrunkOutput) -> ModelOutput:
        hidden, logits = self.head(0, trunk)
        mtp = [self.head(k, trunk)[1] for k in range(1, self.config.mtp_heads)]
        return ModelOutput(logits=logits, hidden=hidden, mtp_logits=mtp or None)

    # --- incremental decoding -------------------------------------------------------------------

    def new_cache(self, batch: int, max_len: int) -> list[KVCache]:
        """One KV cache per attention layer: trunk blocks, head 1's layer, then the MTP heads."""
        like = self.embed.weight
        layers = len(self.blocks) + len(self.mtp)
        return [
            KVCache(batch, self.config.kv_heads, max_len, self.config.head_dim, like) for _ in range(layers)
        ]

    def step(self, ids: Tensor, positions: Tensor, caches: list[KVCache], n_heads: int = 1) -> list[Tensor]:
        """Feed new tokens ids (B, t) at positions (B, t) after the cached ones (one document per row).

        Returns the logits (B, t, V) of the first `n_heads` heads. Only those heads' caches advance, so a
        caller mixes `n_heads` values only if it never reads the skipped heads again.
        """
        return [self.unembed(h) for h in self.step_hidden(ids, positions, caches, n_heads)]

    def step_hidden(
        self,
        ids: Tensor,
        positions: Tensor,
        caches: list[KVCache],
        n_heads: int = 1,
        mask: Tensor | None = None,
    ) -> list[Tensor]:
        """As `step`, but each head's normed hidden state (B, t, D): unembed only the positions needed.
        `mask` (1, 1, t, S) bool replaces the causal one over the cache (static caches give it)."""
        x, cos, sin, mask = self._step_trunk(ids, positions, caches, mask)
        n_trunk = len(self.blocks) - 1
        out = []
        for k in range(n_heads):
            h = self.head_layers[k](x, cos, sin, mask, False, cache=caches[n_trunk + k])
            out.append(self.lm_head.norm(h))
        return out

    def stacked_heads(self) -> StackedBlocks:
        """All n heads' layers as one batched block, for self-speculative decoding (a weight snapshot)."""
        return StackedBlocks(self.head_layers)

    def new_stacked_cache(self, batch: int, max_len: int) -> list[KVCache]:
        """Caches for `step_stacked`: one per trunk block, then one for all n heads (n x batch rows)."""
        like, cfg = self.embed.weight, self.config
        caches = [KVCache(batch, cfg.kv_heads, max_len, cfg.head_dim, like) for _ in self.blocks[:-1]]
        return [*caches, KVCache(cfg.mtp_heads * batch, cfg.kv_heads, max_len, cfg.head_dim, like)]

    def step_stacked(
        self,
        ids: Tensor,
        positions: Tensor,
        caches: list[KVCache],
        heads: StackedBlocks,
        mask: Tensor | None = None,
    ) -> Tensor:
        """As `step_hidden` with every head, through `heads`: normed hidden states (n, B, t, D).

        `mask` (1, 1, t, cached + t) bool, True = may attend, replaces the causal one: a token tree's
        nodes see the cache and their own ancestors only.
        """
        x, cos, sin, mask = self._step_trunk(ids, positions, caches, mask)
        return self.lm_head.norm(heads(x, cos, sin, mask, caches[-1]))

    def _step_trunk(
        self, ids: Tensor, positions: Tensor, caches: list[KVCache], mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """The trunk's output (B, t, D) for new tokens, with the rotary angles and mask the heads reuse."""
        cos, sin = self.rotary(positions)
        if mask is None:
            mask = causal_chunk_mask(ids.size(1), caches[0].length + ids.size(1), ids.device)
        x = self.embed(ids)
        for block, cache in zip(self.blocks[:-1], caches, strict=False):
            x = block(x, cos, sin, mask, False, cache=cache)
        return x, cos, sin, mask

    def unembed(self, hidden: Tensor) -> Tensor:
        """Normed hidden (..., D) -> logits (..., V)."""
        return hidden @ self.lm_head.unembedding(self.embed.weight).T

    @torch.no_grad()
    def logits(self, ids: Tensor) -> Tensor:
        """Uncached next-token logits (B, T, V) of a single-document batch (the tests' yardstick)."""
        B, T = ids.shape
        positions = torch.arange(T, device=ids.device).expand(B, T)
        batch = Batch(ids, ids, positions, torch.zeros_like(ids), "causal")
        return self(batch).logits
