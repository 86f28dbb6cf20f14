"""What every zoo model shares: the trunk/heads split, per-block compilation, positions from documents.

`model(batch)` is `model.heads(model.trunk(batch))`. The split lets the training loop run the trunk once
and each head's forward/backward in turn (MTP's memory-efficient backward, Gloeckle et al. 2024).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from objtrain import IGNORE
from objtrain.batch import Batch, ModelOutput
from objtrain.models.attention import flex_attention_spec, self_attention_spec, use_flex
from objtrain.models.blocks import Block, Context, Rotary
from objtrain.models.config import ModelConfig


@dataclass
class TrunkOutput:
    """The trunk's output and the context its heads need.

    hidden (B, T, D): before the final norm (decoder: input of head 1's layer; encdec: decoder side).
    """

    hidden: Tensor
    ctx: Context
    memory: Tensor | None = None  # encdec: normed encoder output (B, T_enc, D)
    document_ids: Tensor | None = None  # encoder: the batch's document ids, for pooling over real tokens
    pair_labels: bool = False  # encoder: the batch has sequence-level labels, so run the pooled head
    logit_mask: Tensor | None = None  # (B, T) bool: logits only here (`Batch.sparse_logits`), None = all


class ZooModel(nn.Module):
    config: ModelConfig
    embed: nn.Embedding
    rotary: Rotary

    def trunk(self, batch: Batch) -> TrunkOutput:
        raise NotImplementedError

    def heads(self, trunk: TrunkOutput) -> ModelOutput:
        raise NotImplementedError

    def forward(self, batch: Batch) -> ModelOutput:
        trunk = self.trunk(batch)
        if batch.sparse_logits:
            trunk.logit_mask = batch.labels != IGNORE
        return self.heads(trunk)

    def context(
        self,
        positions: Tensor,
        document_ids: Tensor,
        attention: Any,
        prefix_mask: Tensor | None = None,
        single_document: bool | None = None,
    ) -> Context:
        """Rotary angles and the self-attention mask for one stack, built once per forward."""
        cos, sin = self.rotary(positions)
        spec = flex_attention_spec if self.uses_flex(document_ids.device) else self_attention_spec
        mask, is_causal = spec(document_ids, attention, prefix_mask, single_document)
        return Context(cos, sin, mask, is_causal)

    def uses_flex(self, device: torch.device) -> bool:
        """Whether this forward's masks are FlexAttention block masks (`attention_kernel`; never in CPU
        training, where FlexAttention has no backward)."""
        return use_flex(self.config.attention_kernel, device)  # type: ignore[arg-type]

    def compile_blocks(self, **kwargs: Any) -> None:
        """torch.compile each transformer block in place (state-dict keys unchanged).

        Mask logic reads tensor values to pick SDPA's fast path, so it stays eager outside the compiled
        regions; the blocks see only tensors and a bool, and compile without graph breaks.
        """
        for module in self.modules():
            if isinstance(module, Block):
                module.compile(**kwargs)

    def _init(self) -> None:
        cfg = self.config
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=cfg.init_std)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
        n_residual = cfg.n_layer + (cfg.decoder_layers if cfg.kind == "encdec" else 0)
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "cross.proj.weight", "mlp.w2.weight")):
                # GPT-2: residual output projections scaled by 1/sqrt(2 * layers)
                nn.init.normal_(p, mean=0.0, std=cfg.init_std / (2 * n_residual) ** 0.5)


def make_block(cfg: ModelConfig, cross: bool = False) -> Block:
    return Block(cfg.d_model, cfg.n_head, cfg.ffn_dim, cfg.norm_eps, cfg.dropout, cross, cfg.n_kv_head)
