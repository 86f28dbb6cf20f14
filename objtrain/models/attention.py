"""Attention masks from the batch's attention pattern (see the `objtrain.batch` docstring).

The rule, for query i and key j of one row: `doc[i] == doc[j]` and
- causal:        j <= i
- bidirectional: always
- prefix:        j <= i, or both i and j are in the document's prefix (`prefix_mask`)

Padding has document id -1, so pads see only pads: no softmax row is ever empty. When every row holds
exactly one document and no padding, the mask is dropped and SDPA's own causal / full path is used
(`is_causal=True` or no mask), which is the common case for plain CLM on unpacked rows.

The fast-path test reads tensor values. The loader makes it once per batch (`Batch.mark_layout`), so a
compiled forward sees a Python bool and traces as one graph; a batch without the flag is checked here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from objtrain.batch import AttentionKind, single_document_rows


def self_attention_mask(
    document_ids: Tensor, attention: AttentionKind, prefix_mask: Tensor | None = None
) -> Tensor:
    """document_ids (B, T) -> allowed (B, 1, T, T) bool, True where query i may attend to key j."""
    T = document_ids.size(1)
    allowed = document_ids[:, :, None] == document_ids[:, None, :]  # (B, T, T) same document
    if attention != "bidirectional":
        causal = torch.ones(T, T, dtype=torch.bool, device=document_ids.device).tril()
        if attention == "prefix":
            if prefix_mask is None:
                raise ValueError("prefix attention needs batch.prefix_mask")
            causal = causal | (prefix_mask[:, :, None] & prefix_mask[:, None, :])  # (B, T, T)
        allowed = allowed & causal
    return allowed[:, None]


def self_attention_spec(
    document_ids: Tensor,
    attention: AttentionKind,
    prefix_mask: Tensor | None = None,
    single_document: bool | None = None,
) -> tuple[Tensor | None, bool]:
    """(mask or None, is_causal) for `attend`: no mask on the one-document-per-row fast path.
    `single_document` is `Batch.single_document` when known (then no tensor value is read here)."""
    if single_document is None:
        single_document = single_document_rows(document_ids)
    if attention != "prefix" and single_document:
        return None, attention == "causal"
    return self_attention_mask(document_ids, attention, prefix_mask), False


def cross_attention_mask(
    decoder_document_ids: Tensor, encoder_document_ids: Tensor, single_documents: bool | None = None
) -> Tensor | None:
    """(B, S) decoder x (B, T) encoder document ids -> allowed (B, 1, S, T) bool, or None if all may see all.

    Decoder position s sees encoder positions of its own document. A decoder position whose document has
    no encoder tokens (only possible for padding) sees every encoder position instead of none, so its
    softmax row is not empty; no real position ever reads a padded decoder position's output. So when both
    sides' rows are one document each (`single_documents`, from `Batch.mark_layout` when known), every
    decoder position sees all of its row's encoder positions, whatever the ids: no mask.
    """
    if single_documents is None:
        single_documents = single_document_rows(decoder_document_ids) and single_document_rows(
            encoder_document_ids
        )
    if single_documents:
        return None
    allowed = decoder_document_ids[:, :, None] == encoder_document_ids[:, None, :]  # (B, S, T)
    allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
    return allowed[:, None]


def causal_chunk_mask(n_new: int, n_total: int, device: torch.device) -> Tensor | None:
    """Mask for `n_new` queries appended after `n_total - n_new` cached keys (one document): (1, 1, n, S).

    A single new query sees every cached key, so it needs no mask.
    """
    if n_new == 1:
        return None
    q = torch.arange(n_total - n_new, n_total, device=device)[:, None]
    k = torch.arange(n_total, device=device)[None, :]
    return (k <= q)[None, None]
