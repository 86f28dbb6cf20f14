"""Hand-built batches and a naive attention reference for the model tests."""

from __future__ import annotations

import torch
from torch import Tensor

from objtrain.batch import Batch, positions_of
from objtrain.models import build_model, model_config
from objtrain.models.base import ZooModel

VOCAB = 97


def tiny_model(kind: str, **overrides: object) -> ZooModel:
    """A `debug`-size model with a large init, so random logits are far from ties."""
    torch.manual_seed(0)
    cfg = model_config(kind, "debug", {"init_std": 0.3, **overrides}, vocab_size=VOCAB)
    return build_model(cfg).eval()  # type: ignore[return-value]


def docs_row(lengths: list[int], total: int) -> list[int]:
    """Document ids for one row: documents of the given lengths, then -1 padding up to `total`."""
    ids = [d for d, n in enumerate(lengths) for _ in range(n)]
    return ids + [-1] * (total - len(ids))


def make_batch(
    doc_rows: list[list[int]],
    attention: str,
    seed: int = 0,
    prefix_len: int = 2,
    decoder_doc_rows: list[list[int]] | None = None,
) -> Batch:
    """A batch with random ids; prefix_mask covers the first `prefix_len` tokens of every document."""
    g = torch.Generator().manual_seed(seed)
    docs = torch.tensor(doc_rows)
    ids = torch.randint(0, VOCAB, docs.shape, generator=g)
    positions = positions_of(docs)
    prefix = (positions < prefix_len) & (docs >= 0) if attention == "prefix" else None
    batch = Batch(
        ids,
        ids.clone(),
        positions,
        docs,
        attention,
        prefix_mask=prefix,  # type: ignore[arg-type]
        segment_ids=torch.zeros_like(ids),
    )
    if decoder_doc_rows is not None:
        ddocs = torch.tensor(decoder_doc_rows)
        batch.decoder_input_ids = torch.randint(0, VOCAB, ddocs.shape, generator=g)
        batch.decoder_document_ids = ddocs
        batch.decoder_positions = positions_of(ddocs)
        batch.labels = batch.decoder_input_ids.clone()
    return batch


def reference_mask(docs: Tensor, attention: str, prefix: Tensor | None) -> Tensor:
    """The rule of objtrain.batch, position by position (slow and obvious): (B, 1, T, T) bool."""
    B, T = docs.shape
    out = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(T):
                if docs[b, i] != docs[b, j]:
                    continue
                in_prefix = attention == "prefix" and prefix is not None and prefix[b, i] and prefix[b, j]
                out[b, 0, i, j] = attention == "bidirectional" or j <= i or bool(in_prefix)
    return out


def naive_attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(K) with -inf off the mask) v, written out."""
    scores = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


def change_tokens(batch: Batch, where: Tensor, seed: int = 1) -> Batch:
    """A copy of `batch` with fresh random input ids (different from the old ones) at `where` (B, T)."""
    g = torch.Generator().manual_seed(seed)
    new = batch.input_ids.clone()
    shift = torch.randint(1, VOCAB, new.shape, generator=g)
    new[where] = (new[where] + shift[where]) % VOCAB
    return Batch(**{**batch.__dict__, "input_ids": new})
