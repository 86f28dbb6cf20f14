"""The two structures that cross the objective/model boundary: `Batch` in, `ModelOutput` out.

Objectives produce a `Batch`; models read only these field names (as seqio's feature converters fix
`encoder_input_tokens`, `decoder_target_tokens`, ...). The attention pattern travels as data, so a model
never needs to know which objective made the batch.

Conventions
- B rows, T encoder/decoder-only positions, S decoder positions (encoder-decoder only).
- `labels[b, t]` is the target of the output at position t, already aligned: nothing downstream shifts.
  `IGNORE` (-100) marks positions without loss.
- `document_ids` number the documents of a packed row (0, 1, ...); attention never crosses them. Padding
  has id -1, so pads attend only to pads (no empty softmax rows) and no real token ever sees a pad.
- `positions` restart at 0 for every document.
- Attention: `causal` (j <= i), `bidirectional` (all j), `prefix` (j <= i, or both i and j in the
  document's prefix as given by `prefix_mask`). Always intersected with "same document".
- Encoder-decoder: decoder position s with document id d cross-attends to the encoder positions whose
  document id is d.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from objtrain import IGNORE

AttentionKind = Literal["causal", "bidirectional", "prefix"]
ModelKind = Literal["decoder", "encoder", "encdec"]
MODEL_KINDS: tuple[ModelKind, ...] = ("decoder", "encoder", "encdec")


def single_document_rows(document_ids: Tensor) -> bool:
    """True when each row (B, T) is one document with no padding (attention needs no mask)."""
    return bool(((document_ids == document_ids[:, :1]) & (document_ids >= 0)).all())


@dataclass
class Batch:
    input_ids: Tensor  # (B, T) int64: decoder-only input, or encoder input
    labels: Tensor  # (B, T) int64, or (B, S) for encoder-decoder: aligned targets, IGNORE = no loss
    positions: Tensor  # (B, T) int64, restart at 0 per document
    document_ids: Tensor  # (B, T) int64, -1 = padding
    attention: AttentionKind  # pattern of the (encoder or decoder-only) self-attention
    prefix_mask: Tensor | None = None  # (B, T) bool: in its document's bidirectional prefix (prefix only)
    segment_ids: Tensor | None = None  # (B, T) int64: sentence A = 0, B = 1 (NSP/SOP)
    decoder_input_ids: Tensor | None = None  # (B, S) int64, encoder-decoder only
    decoder_positions: Tensor | None = None  # (B, S) int64
    decoder_document_ids: Tensor | None = None  # (B, S) int64, -1 = padding
    # (B, T) int64 sequence-level labels at the positions whose pooled output they label (NSP/SOP: each
    # packed pair's [CLS]; 1 = random/swapped), IGNORE elsewhere
    seq_labels: Tensor | None = None
    mtp_labels: Tensor | None = None  # (B, n, T) int64: head k-1 predicts offset k; [:, 0] == labels
    stats: dict[str, float] = field(default_factory=dict)  # what the corruption realised (for --stats)
    # The loss's unit count where it is not the labelled tokens (contrastive: one per pair of views), so
    # the loop's global normaliser matches `LossOutput.n_targets`; None = count the labels.
    target_count: int | None = None
    # Whether every row is one whole document without padding, on the encoder (or decoder-only) side and on
    # the decoder side: attention then takes SDPA's mask-free path. Set eagerly by `mark_layout` (the loader
    # does, off the step), so a compiled forward never reads tensor values to decide (a graph break);
    # None = not known, the model checks the ids itself.
    single_document: bool | None = None
    decoder_single_document: bool | None = None
    # Sparse prediction: the model computes token logits only at the labelled positions (`ModelOutput.logits`
    # is then (N, V), N = labels != IGNORE in row-major order), as efficient BERT trainers do; a loss reads
    # them with `labelled_logits`. Set by the objective (MLM, GPT-BERT); a static flag, not tensor data.
    sparse_logits: bool = False

    @property
    def is_encdec(self) -> bool:
        return self.decoder_input_ids is not None

    @property
    def n_targets(self) -> int:
        if self.target_count is not None:
            return self.target_count
        return int((self.labels != IGNORE).sum())

    @property
    def n_pairs(self) -> int:
        """Sequence-level labels (NSP/SOP: every pair of every row), the pair term's unit."""
        return 0 if self.seq_labels is None else int((self.seq_labels != IGNORE).sum())

    def mark_layout(self) -> Batch:
        """Fill `single_document` / `decoder_single_document` from the document ids; returns self."""
        self.single_document = single_document_rows(self.document_ids)
        if self.decoder_document_ids is not None:
            self.decoder_single_document = single_document_rows(self.decoder_document_ids)
        return self

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The batch on `device`. A non-blocking copy to a GPU goes through pinned (page-locked) host memory:
        from ordinary pageable memory CUDA copies synchronously whatever `non_blocking` says, so the step
        would wait for its input."""
        pin = pins_for(torch.device(device), non_blocking)
        moved = {
            f.name: (_moved(v, device, non_blocking, pin) if isinstance(v, Tensor) else v)
            for f in dataclasses.fields(self)
            for v in [getattr(self, f.name)]
        }
        return Batch(**moved)

    def tensors(self) -> dict[str, Tensor]:
        """The tensor fields that are set, by name (for saving, printing, comparing)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), Tensor)
        }


def pins_for(device: torch.device, non_blocking: bool) -> bool:
    """Whether a host tensor is pinned before its copy to `device`: for non-blocking copies to CUDA."""
    return non_blocking and device.type == "cuda"


def _moved(value: Tensor, device: torch.device | str, non_blocking: bool, pin: bool) -> Tensor:
    if pin and value.device.type == "cpu" and not value.is_pinned():
        value = value.pin_memory()
    return value.to(device, non_blocking=non_blocking)


@dataclass
class ModelOutput:
    # (B, T, V) or (B, S, V) for encoder-decoder: next-token / masked-token logits; (N, V) at the labelled
    # positions only for a `Batch.sparse_logits` batch
    logits: Tensor
    hidden: Tensor | None = None  # (B, T, D) final hidden states (after the final norm)
    mtp_logits: list[Tensor] | None = None  # n-1 tensors (B, T, V): offsets 2..n (offset 1 is `logits`)
    seq_logits: Tensor | None = None  # (B, T, C) pooled head at every position (read where seq_labels are)
    pooled: Tensor | None = None  # (B, D) encoder: mean of `hidden` over each row's real tokens (id >= 0)


def labelled_logits(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """(N, V) logits and (N,) labels at the labelled positions (labels != IGNORE), from dense (..., V)
    logits or from the (N, V) of a sparse-prediction batch (already those positions, in row-major order)."""
    keep = labels != IGNORE
    if logits.dim() == 2 and labels.dim() > 1:
        return logits, labels[keep]
    return logits[keep], labels[keep]


def runs_of(ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Maximal runs of equal values along each row of ids (B, L), e.g. the documents of packed rows.

    Returns, per position (all (B, L)): `is_start` (bool, first position of its run), `index` (the run's
    number in its row, from 0), `start` (the run's first position) and `length` (the run's length).
    Vectorised: a cumulative max of start positions and one scatter-add, no loop over runs.
    """
    B, L = ids.shape
    idx = torch.arange(L, device=ids.device).expand(B, L)
    is_start = torch.ones_like(ids, dtype=torch.bool)
    is_start[:, 1:] = ids[:, 1:] != ids[:, :-1]
    start = torch.where(is_start, idx, 0).cummax(dim=1).values
    index = is_start.long().cumsum(dim=1) - 1
    length = torch.zeros_like(index).scatter_add_(1, index, torch.ones_like(index)).gather(1, index)
    return is_start, index, start, length


def positions_of(document_ids: Tensor) -> Tensor:
    """(B, T) position of each token inside its document: 0 at every document start. Vectorised."""
    B, T = document_ids.shape
    idx = torch.arange(T, device=document_ids.device).expand(B, T)
    is_start = torch.ones_like(document_ids, dtype=torch.bool)
    is_start[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    return idx - torch.where(is_start, idx, 0).cummax(dim=1).values
