"""Output heads on top of a trunk: the LM head, multi-token-prediction heads, the pooled head.

- LM head: final RMSNorm, then the transposed token embedding (tied weights, stored once), or, for a
  decoder with `tie_embeddings=false`, an output matrix of its own (Llama 2's untied `lm_head`).
- MTP heads (Gloeckle et al. 2024): n heads on a shared trunk, each one
  transformer layer; all share the final norm and the unembedding. Head 1 is the next-token head.
- Pooled head (BERT): tanh(dense(hidden)) -> linear classifier at every position, for NSP/SOP (read at
  each packed pair's [CLS]) and classification (read at position 0).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from objtrain.models.blocks import RMSNorm


class LMHead(nn.Module):
    """(B, T, D) -> normed hidden (B, T, D), logits (B, T, V).

    Tied (`vocab_size` 0): the unembedding is the embedding matrix, passed in at call time so the tied
    weight has one owner and is saved once. Untied: `out` (V, D), a Linear like any other projection (so
    it takes weight decay, where the embedding does not)."""

    def __init__(self, d_model: int, eps: float, vocab_size: int = 0) -> None:
        super().__init__()
        self.norm = RMSNorm(d_model, eps)
        self.out = nn.Linear(d_model, vocab_size, bias=False) if vocab_size else None

    def unembedding(self, embedding: Tensor) -> Tensor:
        """The (V, D) matrix logits are taken against."""
        return embedding if self.out is None else self.out.weight

    def forward(self, x: Tensor, embedding: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`mask` (B, T) bool: logits (N, V) at those positions only (sparse prediction: the hidden states
        are gathered before the unembedding, so the (V, D) product runs for N rows, not B * T)."""
        h = self.norm(x)
        return h, F.linear(h if mask is None else h[mask], self.unembedding(embedding))


def mean_pool(hidden: Tensor, document_ids: Tensor) -> Tensor:
    """(B, D) mean of hidden (B, T, D) over each row's real positions (document id >= 0; padding left out).

    A row of one document gets that document's mean; a packed row the mean over all its documents. The
    sentence-embedding pooling of SimCSE's `avg` and of sentence-transformers; a row with no real token
    gets zeros."""
    real = (document_ids >= 0).to(hidden.dtype)[:, :, None]
    return (hidden * real).sum(1) / real.sum(1).clamp(min=1.0)


class Pooler(nn.Module):
    """BERT pooler + classifier at every position: tanh(W h_t + b) -> (B, T, C) logits.

    BERT pools the first position; rows that pack several pairs have a [CLS] per pair, so the head runs
    at every position and the loss reads it where the batch puts a label: one extra D x D layer per
    position (under a tenth of one block's cost) and no data-dependent shapes for compiled models."""

    def __init__(self, d_model: int, n_classes: int) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.classifier = nn.Linear(d_model, n_classes)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.classifier(self.dense(hidden).tanh())
