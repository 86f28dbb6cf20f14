"""Stream positions -> corrupted batches: the one way the loader, validation, evaluation and `corrupt` read
rows (`read_batch`), and the fixed leading rows of a split that validation and evaluation score."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from objtrain.batch import Batch
from objtrain.data.mixture import StoreMixture
from objtrain.data.stream import (
    Documents,
    DocumentStream,
    MixedStream,
    Position,
    RowObjective,
    as_mixed,
    layout,
    row_needs,
)
from objtrain.rng import RowRandom
from objtrain.specials import Specials


def donor_offsets(
    rows: np.ndarray, offsets: np.ndarray, width: int, seed: int, epoch_tokens: int | np.ndarray
) -> np.ndarray:
    """Stream offsets of each row's donor text (`Objective.donor_length`), as BERT draws a random document
    for a random next sentence: a place drawn from (seed, row) at least `width` tokens after the row's own
    start and less than one epoch after it, so a donor never holds the row's own text. A pure function of
    (seed, row, the row's offset): a row reads the same donor whatever batch or process reads it.
    `epoch_tokens` is one stream's, or each row's own source's (B,) in a mixture."""
    room = np.maximum(np.asarray(epoch_tokens, dtype=np.int64) - 2 * width, 1).astype(np.uint64)
    draw = RowRandom(seed, torch.from_numpy(np.asarray(rows, dtype=np.int64))).bits(1, "data/donor")[:, 0]
    return (
        np.asarray(offsets, dtype=np.int64) + width + (draw.numpy().view(np.uint64) % room).astype(np.int64)
    )


def read_batch(
    stream: DocumentStream | MixedStream,
    objective: RowObjective,
    rows: np.ndarray,
    offsets: np.ndarray,
    lengths: np.ndarray,
    width: int,
    seed: int,
    sources: np.ndarray | None = None,
) -> Batch:
    """Global rows `rows` read from `stream` at `offsets` with `lengths` raw tokens (padded to `width`), plus
    their donor text when the objective asks for it, corrupted under `seed`: the one way every caller (the
    loader, validation, evaluation, `corrupt`) turns stream positions into a batch. In a mixture each row
    reads its own source (`sources`, by default drawn again from the rows), donors included."""
    rows = np.asarray(rows, dtype=np.int64)
    mixed = as_mixed(stream)
    sources = mixed.source_of(rows) if sources is None else np.asarray(sources, dtype=np.int64)
    tokens, document_ids = mixed.rows(sources, offsets, lengths, width)
    extra = {}
    need = objective.donor_length(width)
    if need:
        at = donor_offsets(rows, offsets, need, seed, mixed.epoch_tokens[sources])
        extra["donors"] = mixed.rows(sources, at, np.full(len(rows), need, dtype=np.int64), need)
    batch = objective(tokens, document_ids, torch.from_numpy(rows), seed, **extra)
    batch.stats["raw_tokens_fed"] = float(np.sum(lengths))
    return batch.mark_layout()


@dataclass(frozen=True)
class LeadingRows:
    """Rows 0..rows-1 of a stream laid out as the loader lays them out: each row's source, stream offset and
    raw length (its need), and `n`, how many of them are read (`leading_rows`)."""

    index: np.ndarray
    sources: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    n: int


def leading_rows(
    stream: DocumentStream | MixedStream,
    objective: RowObjective,
    model_length: int,
    rows: int,
    seed: int,
    within_epoch: bool = True,
) -> LeadingRows:
    """Rows 0..rows-1 of `stream`, each of the length the objective needs under `seed`. With `within_epoch`,
    `n` counts only the rows that fit in one pass (`rows_in_one_pass`); in a mixture, the rows before the
    first that would run past one pass over its source."""
    mixed = as_mixed(stream)
    index = np.arange(rows, dtype=np.int64)
    lengths = row_needs(objective, model_length, index, seed)
    sources, offsets, _ = layout(index, lengths, Position(offsets=(0,) * len(mixed)), mixed)
    n = mixed.one_pass(sources, offsets, lengths) if within_epoch else rows
    return LeadingRows(index, sources, offsets, lengths, n)


def leading_batches(
    stream: DocumentStream | MixedStream,
    objective: RowObjective,
    model_length: int,
    rows: int,
    micro: int,
    seed: int,
    within_epoch: bool = True,
) -> list[Batch]:
    """The `leading_rows` of `stream`, corrupted under `seed`, in batches of `micro` rows (the last batch
    filled up to `micro` from the rows laid out after the `n` read)."""
    lead = leading_rows(stream, objective, model_length, rows, seed, within_epoch)
    width = objective.raw_length(model_length)
    return [
        read_batch(
            stream,
            objective,
            lead.index[lo : lo + micro],
            lead.offsets[lo : lo + micro],
            lead.lengths[lo : lo + micro],
            width,
            seed,
            lead.sources[lo : lo + micro],
        )
        for lo in range(0, lead.n, micro)
    ]


def validation_batches(
    docs: Documents | StoreMixture,
    specials: Specials,
    objective: RowObjective,
    model_length: int,
    rows: int,
    micro: int,
    split: str = "valid",
    seed: int = 0,
) -> list[Batch]:
    """A fixed held-out set: the first `rows` rows of the unshuffled `split`; of a mixture
    (`StoreMixture`), the rows of each store's unshuffled `split`, mixed by the weights at seed 0. Corrupted
    under `seed`: training validates at 0, the same rows and masks every time; `objtrain eval` passes its
    own eval seed (`objtrain.evaluation.corrupted`), so that its scores are not the validation's."""
    if isinstance(docs, StoreMixture):
        stream: DocumentStream | MixedStream = docs.stream(split, 0, shuffle=False)
    else:
        stream = DocumentStream(docs, specials.eos, specials.pad, seed=0, shuffle=False)
    return leading_batches(stream, objective, model_length, rows, micro, seed=seed)
