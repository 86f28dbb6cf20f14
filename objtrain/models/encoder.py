"""Bidirectional encoder (BERT family, with the decoder's blocks): MLM head, segments, pooled head.

    ids (B, T) [+ segment embedding] -> blocks -> RMSNorm -> E^T -> token logits (B, T, V)
                                                         \\-> tanh(dense(h)) -> seq logits (B, T, C)
                                                         \\-> mean over real tokens -> pooled (B, D)

The attention pattern still comes from the batch (normally bidirectional, always within documents).
There is no learned absolute position embedding: rotary angles from `batch.positions` do that job.
"""

from __future__ import annotations

from torch import Tensor, nn

from objtrain.batch import Batch, ModelOutput
from objtrain.models.base import TrunkOutput, ZooModel, make_block
from objtrain.models.blocks import Embedding, Rotary
from objtrain.models.config import ModelConfig
from objtrain.models.heads import LMHead, Pooler, mean_pool


class Encoder(ZooModel):
    kind = "encoder"

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = Embedding(cfg.vocab_size, cfg.d_model)
        self.segment = nn.Embedding(cfg.n_segments, cfg.d_model) if cfg.n_segments else None
        self.drop = nn.Dropout(cfg.dropout)
        self.rotary = Rotary(cfg.head_dim, cfg.rope_base)
        self.blocks = nn.ModuleList(make_block(cfg) for _ in range(cfg.n_layer))
        self.lm_head = LMHead(cfg.d_model, cfg.norm_eps)
        self.pooler = Pooler(cfg.d_model, cfg.n_classes) if cfg.n_classes else None
        self._init()

    def trunk(self, batch: Batch) -> TrunkOutput:
        ctx = self.context(
            batch.positions, batch.document_ids, batch.attention, batch.prefix_mask, batch.single_document
        )
        x = self.embed(batch.input_ids)  # (B, T, D)
        if self.segment is not None and batch.segment_ids is not None:
            x = x + self.segment(batch.segment_ids)
        x = self.drop(x)
        for block in self.blocks:
            x = block.run(x, ctx)
        return TrunkOutput(x, ctx, document_ids=batch.document_ids, pair_labels=batch.seq_labels is not None)

    def last_hidden(self, batch: Batch) -> Tensor:
        """The normed hidden states (B, T, D), as `forward` gives them, without the unembedding."""
        return self.lm_head.norm(self.trunk(batch).hidden)

    def heads(self, trunk: TrunkOutput) -> ModelOutput:
        hidden, logits = self.lm_head(trunk.hidden, self.embed.weight, trunk.logit_mask)
        # the pooled head runs at every position, so only for batches with pair labels (NSP/SOP), not MLM's
        seq_logits = self.pooler(hidden) if self.pooler is not None and trunk.pair_labels else None
        pooled = mean_pool(hidden, trunk.document_ids) if trunk.document_ids is not None else None
        return ModelOutput(logits=logits, hidden=hidden, seq_logits=seq_logits, pooled=pooled)
