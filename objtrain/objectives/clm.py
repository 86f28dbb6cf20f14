"""Causal LM (Radford et al. 2018): predict every next token, inside its document.

A row of T+1 raw tokens gives T model positions: `input_ids = x[:T]`, `labels = x[1:T+1]`, aligned here
once (nothing downstream shifts: the double-shift pitfall of section 1).

Which positions carry a label is decided by `document_ids`, never by token id, so a real EOS is always a
target even where `pad_id == eos_id` (transformers#23530). Documents end with their EOS, which belongs to
the document it ends:
    x      = a b </s> | c d     (two documents, ids 0 0 0 1 1)
    input  = a b </s> c
    labels = b </s> - d
The EOS position gets no label by default: attention stays inside documents, so it cannot see the next
document and would only learn the unigram distribution of document starts (`cross_document_targets: true`
trains it anyway, as nanoGPT's unmasked stream does). Targets in padding are never trained.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import Batch, positions_of
from objtrain.objectives.base import Objective


def next_token_labels(
    rows: Tensor, document_ids: Tensor, offset: int, cross_document: bool, T: int, out: Tensor | None = None
) -> Tensor:
    """(B, T) labels `rows[:, t + offset]`, IGNORE where that target is padding, lies past the row, comes
    from another document (unless `cross_document`), or the position itself is padding.

    `rows`, `document_ids`: (B, L) with L >= T (raw rows, L = T + 1 for CLM). `out`: (B, T) to write into.
    """
    B, L = rows.shape
    labels = torch.empty((B, T), dtype=torch.int64, device=rows.device) if out is None else out
    n = max(min(T, L - offset), 0)  # positions whose target lies inside the row
    labels[:, n:] = IGNORE
    if n == 0:
        return labels
    here = document_ids[:, :n]
    there = document_ids[:, offset : offset + n]
    # Documents are contiguous runs, so equal ids mean no boundary in between.
    keep = (here >= 0) & ((there >= 0) if cross_document else (here == there))
    torch.where(keep, rows[:, offset : offset + n], rows.new_tensor(IGNORE), out=labels[:, :n])
    return labels


def causal_raw_used(document_ids: Tensor, labels: Tensor, held: Tensor | None = None) -> int:
    """Positions of (B, T+1) rows a causal batch holds: the real inputs 0..T-1 and every labelled target
    (labels[:, t] is position t+1). `held` (B, T+1) bool, if given, further restricts which positions count
    (FIM: not its sentinels or padding)."""
    T = labels.size(1)
    used = torch.zeros_like(document_ids, dtype=torch.bool)
    used[:, :T] = document_ids[:, :T] >= 0
    used[:, 1 : T + 1] |= labels != IGNORE
    if held is not None:
        used &= held
    return int(used.sum())


def causal_batch(rows: Tensor, document_ids: Tensor, cross_document: bool) -> Batch:
    """The CLM batch of (B, T+1) raw rows: T = L - 1 model positions (shared with MTP and FIM)."""
    T = max(rows.size(1) - 1, 0)
    docs = document_ids[:, :T]
    return Batch(
        input_ids=rows[:, :T],
        labels=next_token_labels(rows, document_ids, 1, cross_document, T),
        positions=positions_of(docs),
        document_ids=docs,
        attention="causal",
    )


class CausalLM(Objective):
    """Next-token prediction on packed rows; T model positions need T + 1 raw tokens."""

    name = "clm"
    model_kinds = ("decoder",)
    attention = "causal"
    scores_left_to_right = True

    @dataclass
    class Config:
        cross_document_targets: bool = False  # train a document's EOS to predict the next document's start

    def raw_length(self, model_length: int) -> int:
        return model_length + 1

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        batch = causal_batch(rows.long(), document_ids.long(), self.config.cross_document_targets)
        tokens = float((batch.document_ids >= 0).sum())
        batch.stats = {"tokens": tokens, "targets": float(batch.n_targets)}
        # Every real input is used; of the raw row only the last position can be fed and unused (a target
        # in the next document, not trained without cross_document_targets): O(B), not another (B, L) pass.
        T = batch.labels.size(1)
        last_fed = float((document_ids[:, T] >= 0).sum()) if document_ids.size(1) > T else 0.0
        last_used = float((batch.labels[:, T - 1] != IGNORE).sum()) if T else 0.0
        batch.stats.update(raw_tokens_fed=tokens + last_fed, raw_tokens_unused=last_fed - last_used)
        return batch
