"""Left-to-right scoring: loss, perplexity and bits per byte over long documents with a sliding window.

Bits per byte as The Pile (Gao et al. 2020). Every document `x_1..x_N` is scored alone, behind one
context-only token `x_0` (EOS: objtrain packs documents behind EOS separators, so that is what a model
has seen before a document starts). Windows of `L` input tokens advance by stride `S`:

    e_1 = min(L, N),  e_{k+1} = min(e_k + S, N)
    window k reads x_{max(0, e_k - L)} .. x_{e_k - 1} and scores the targets (e_{k-1}, e_k]

so each target is scored exactly once, in the first window that reaches it, and every later target sees
at least `L - S + 1` tokens of context. `S = L` is the harness's disjoint windows, `S < L` the
overlapping windows of the Hugging Face perplexity guide (with the counting fixed: targets are counted,
not inferred). A trailing EOS is not scored: it has no bytes.

Totals are corpus sums (nats, targets, bytes, words); ratios are taken at the very end, never averaged
per document. `bits_per_byte = nats / (ln 2 * bytes)` is comparable across tokenizers because the
summed NLL is a code length for the whole text whatever its segmentation.

All windows of all documents are laid out at once with numpy index arithmetic and scored in batches of
rows; no Python loop runs over tokens or windows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.errors import UserError


@dataclass
class WindowPlan:
    """Every window of every document as rows of a flat token array (the documents with `x_0` in front).

    inputs:  (W, C) int64 indices into the flat array (clipped; read only where `valid`), C <= L the
             widest window read (at most the longest document)
    valid:   (W, C) bool, the window's real input positions
    scored:  (W, C) bool, positions whose next-token target is scored in this window
    doc:     (W,) int64 document of each window
    """

    inputs: np.ndarray
    valid: np.ndarray
    scored: np.ndarray
    doc: np.ndarray

    def __len__(self) -> int:
        return len(self.doc)


def window_ends(n: int, length: int, stride: int) -> np.ndarray:
    """(K,) window ends e_1..e_K for a document of n targets (module docstring)."""
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    first = min(length, n)
    extra = -(-(n - first) // stride) if n > first else 0
    return np.minimum(first + stride * np.arange(extra + 1, dtype=np.int64), n)


def plan_windows(lengths: Sequence[int] | np.ndarray, length: int, stride: int) -> WindowPlan:
    """Windows for documents of `lengths` targets each, laid out in one flat array where document d
    occupies `[start_d, start_d + n_d + 1)`: its context token, then its n_d tokens."""
    if length < 1:
        raise UserError(f"--window must be at least 1, got {length}")
    if not 1 <= stride <= length:
        raise UserError(f"--stride must be in [1, window={length}], got {stride}")
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths + 1)[:-1])).astype(np.int64)
    # Windows per document: 1 + ceil((n - L) / S) for n > L, else 1 (none for empty documents).
    first = np.minimum(length, lengths)
    extra = np.where(lengths > first, -(-(lengths - first) // stride), 0)
    counts = np.where(lengths > 0, extra + 1, 0)
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
    k = np.arange(len(doc), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)  # window index
    n = lengths[doc]
    end = np.minimum(first[doc] + stride * k, n)  # e_k: the last target of window k
    prev = np.where(k > 0, np.minimum(first[doc] + stride * (k - 1), n), 0)  # e_{k-1}
    lo = np.maximum(end - length, 0)  # first input token of the window (document-local, 0 = x_0)
    # Rows are as wide as the widest window actually read, not `length`: a huge --window over short
    # documents costs what the documents cost (padding columns are never read nor scored).
    cols = int((end - lo).max()) if len(doc) else 0
    col = np.arange(cols, dtype=np.int64)[None, :]
    width = (end - lo)[:, None]
    valid = col < width
    local = lo[:, None] + col  # input token index; its target is local + 1
    scored = valid & (local + 1 > prev[:, None]) & (local + 1 <= end[:, None])
    inputs = starts[doc][:, None] + np.minimum(local, end[:, None] - 1)
    return WindowPlan(inputs, valid, scored, doc)


@dataclass
class LMScore:
    """Corpus sums of one scoring pass; the metrics are ratios of these."""

    nats: float = 0.0
    targets: int = 0
    bytes: int = 0
    words: int = 0
    windows: int = 0
    documents: int = 0
    doc_nats: np.ndarray | None = None  # per document, for the evaluation's own standard error
    doc_bytes: np.ndarray | None = None

    def metrics(self, word_ppl: bool = False) -> dict[str, float]:
        out: dict[str, float] = {
            "loss": self.nats / max(self.targets, 1),
            "perplexity": math.exp(min(self.nats / max(self.targets, 1), 700.0)),
            "bits_per_byte": self.nats / (math.log(2) * max(self.bytes, 1)),
            "byte_perplexity": math.exp(min(self.nats / max(self.bytes, 1), 700.0)),
            "scored_tokens": float(self.targets),
            "scored_bytes": float(self.bytes),
            "windows": float(self.windows),
            "documents": float(self.documents),
        }
        if self.doc_nats is not None and self.doc_bytes is not None and len(self.doc_nats) > 1:
            # Documents are the sampling unit: the standard error of a ratio of sums (delta method).
            r = float(self.doc_nats.sum()) / max(float(self.doc_bytes.sum()), 1.0)
            k = len(self.doc_nats)
            resid = self.doc_nats - r * self.doc_bytes
            se = math.sqrt(float((resid**2).sum()) / (k * (k - 1))) / (float(self.doc_bytes.sum()) / k)
            out["bits_per_byte_se"] = se / math.log(2)
        if word_ppl:
            out["word_perplexity"] = math.exp(min(self.nats / max(self.words, 1), 700.0))
            out["scored_words"] = float(self.words)
        return out


def _lm_batch(model: nn.Module, ids: Tensor, valid: Tensor, encoder_token: int) -> Batch:
    """A left-to-right batch for rows `ids` (B, L): causal in one document per row, pads apart.

    Decoders: plain causal attention (a prefix-LM decoder gets an empty prefix: only `x_0`, which sees
    nothing but itself either way). Encoder-decoders: the encoder reads one EOS, the decoder the window.
    """
    B, L = ids.shape
    docs = torch.where(valid, 0, -1)
    positions = torch.arange(L, device=ids.device).expand(B, L)
    kind = getattr(getattr(model, "config", None), "kind", "decoder")
    if kind == "encdec":
        enc = torch.full((B, 1), encoder_token, dtype=torch.int64, device=ids.device)
        return Batch(
            enc,
            ids,
            torch.zeros_like(enc),
            torch.zeros_like(enc),
            "bidirectional",
            decoder_input_ids=ids,
            decoder_positions=positions,
            decoder_document_ids=docs,
        )
    return Batch(ids, ids, positions, docs, "causal")


@torch.no_grad()
def score_windows(
    model: nn.Module,
    flat: np.ndarray,
    plan: WindowPlan,
    byte_table: Tensor,
    encoder_token: int = 3,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
) -> tuple[float, int, int, np.ndarray]:
    """Sum the NLL (nats) of every scored target of `plan` over the flat token array `flat`.

    Returns (nats, targets, bytes by `byte_table`, per-document nats (n_docs,)) as float64 sums.
    `encoder_token` is what an encoder-decoder's encoder reads (one EOS: no conditioning text).
    """
    flat_t = torch.from_numpy(np.ascontiguousarray(flat, dtype=np.int64))
    n_docs = int(plan.doc.max()) + 1 if len(plan) else 0
    per_doc = torch.zeros(n_docs, dtype=torch.float64)
    table = byte_table.to(torch.int64)
    nats, targets, n_bytes = 0.0, 0, 0
    for lo in range(0, len(plan), batch_size):
        hi = min(lo + batch_size, len(plan))
        idx = torch.from_numpy(plan.inputs[lo:hi])
        valid = torch.from_numpy(plan.valid[lo:hi])
        scored = torch.from_numpy(plan.scored[lo:hi])
        ids = flat_t[idx]  # (b, L)
        nxt = flat_t[(idx + 1).clamp(max=len(flat_t) - 1)]
        labels = torch.where(scored, nxt, IGNORE)
        batch = _lm_batch(model, ids.to(device), valid.to(device), encoder_token)
        logits = model(batch).logits.float()  # (b, L, V)
        nll = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)),
            labels.to(device).reshape(-1),
            ignore_index=IGNORE,
            reduction="none",
        ).view(labels.shape)
        row = nll.double().sum(dim=1).cpu()
        per_doc.index_add_(0, torch.from_numpy(plan.doc[lo:hi]), row)
        nats += float(row.sum())
        targets += int(scored.sum())
        n_bytes += int(table[labels[scored]].sum())
    return nats, targets, n_bytes, per_doc.numpy()


def flatten_documents(documents: Sequence[np.ndarray], context: int) -> tuple[np.ndarray, np.ndarray]:
    """Documents -> (flat array `x_0 doc_0 x_0 doc_1 ...`, lengths (n_docs,)), as `plan_windows` expects."""
    lengths = np.array([len(d) for d in documents], dtype=np.int64)
    flat = np.empty(int((lengths + 1).sum()), dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths + 1)[:-1])).astype(np.int64)
    flat[starts] = context
    if len(documents):
        body = np.ones(len(flat), dtype=bool)
        body[starts] = False
        flat[body] = np.concatenate([np.asarray(d, dtype=np.int64) for d in documents])
    return flat, lengths


def score_documents(
    model: nn.Module,
    documents: Sequence[np.ndarray],
    byte_table: Tensor,
    context: int,
    window: int,
    stride: int | None = None,
    encoder_token: int = 3,
    batch_size: int = 16,
    device: torch.device | str = "cpu",
    text_bytes: int | None = None,
    words: int = 0,
) -> LMScore:
    """Score `documents` (token arrays without EOS) left to right; see the module docstring.

    `text_bytes`: the UTF-8 length of the text when it is known (a raw text file); otherwise bytes come
    from the per-token byte table (the same number whenever decode(encode(text)) == text).
    """
    stride = window if stride is None else stride  # 0 is refused by plan_windows, not taken as "unset"
    documents = [d for d in documents if len(d)]
    if not documents:
        raise UserError("nothing to score: the data has no tokens")
    flat, lengths = flatten_documents(documents, context)
    plan = plan_windows(lengths, window, stride)
    nats, targets, n_bytes, per_doc = score_windows(
        model, flat, plan, byte_table, encoder_token, batch_size, device
    )
    table = byte_table.to(torch.int64).numpy()
    doc_bytes = np.array([float(table[d].sum()) for d in documents], dtype=np.float64)
    return LMScore(
        nats=nats,
        targets=targets,
        bytes=text_bytes if text_bytes is not None else n_bytes,
        words=words,
        windows=len(plan),
        documents=len(documents),
        doc_nats=per_doc,
        doc_bytes=doc_bytes,
    )
