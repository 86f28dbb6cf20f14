"""The document stream: a split's documents in a seeded order, cut into rows of exactly the length each row
needs.

Position as a pure function (`Position`, in each checkpoint). Epoch e is the split's documents in the
order `permutation(seed, e)`, each followed by EOS, back to back: a virtual stream of `T` tokens. Global row
g takes the next `need(g)` tokens, where `need = objective.raw_lengths(model_length, g, seed)`; so the data
position after g rows is `(rows, stream offset)`, both functions of (seed, rows consumed), and the
checkpoint only records them. Step b owns rows [b*GB, (b+1)*GB); rank r, micro-step m reads the `mb` rows
starting at b*GB + m*W*mb + r*mb (`objtrain.data.loader.RowSampler`), so a row index always maps to the
same raw tokens and corruption, whatever the number of processes or micro-batches, and no row is read
twice.

Mixtures (`data.sources`, `objtrain.data.mixture`): each store keeps its own seeded stream and its own
offset; which source global row g reads is drawn from (seed, g) alone, with the normalised weights as
probabilities (`MixedStream.source_of`), and row g takes its need from that source's stream, after the
rows before it that drew the same source. The position becomes (rows, one offset per source), still a
function of (seed, rows consumed), so exact resume, any process or micro-batch layout and "no row read
twice" hold per source. A source that reaches the end of its stream starts its next shuffled epoch,
independently of the others. With one source no draw is made and everything is as it was.

The objectives sit above this layer (they import its tokenizer): the stream sees an objective only as a
`RowObjective`, what the data path asks of one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from objtrain.batch import Batch, runs_of
from objtrain.errors import UserError
from objtrain.rng import RowRandom


class RowObjective(Protocol):
    """What the data path asks of an objective (`objtrain.objectives.base.Objective` provides it): the raw
    tokens each row takes, the donor text it reads from elsewhere, and the corruption of raw rows."""

    name: str

    def raw_length(self, model_length: int) -> int: ...

    def raw_lengths(self, model_length: int, row_index: torch.Tensor, seed: int) -> torch.Tensor: ...

    def donor_length(self, width: int) -> int: ...

    def __call__(
        self, rows: torch.Tensor, document_ids: torch.Tensor, row_index: torch.Tensor, seed: int, **extra: Any
    ) -> Batch: ...


@dataclass
class Documents:
    """Documents of one split as a flat token array and offsets (n_docs + 1), like a token-store split."""

    tokens: np.ndarray
    offsets: np.ndarray
    closed: bool = False  # documents end with their EOS already (packed stores); else the stream adds it
    # Ids not checked when the store was opened (a store past `FULL_CHECK_TOKENS`): every row read is
    # checked against this vocabulary size instead. None = checked already.
    check_ids_below: int | None = None

    @classmethod
    def of(cls, documents: list[np.ndarray]) -> Documents:
        """Documents from one int64 token array each (encoded text, say), none ending in EOS."""
        offsets = np.zeros(len(documents) + 1, dtype=np.int64)
        np.cumsum([len(d) for d in documents], out=offsets[1:])
        return cls(np.concatenate(documents), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets).astype(np.int64)


class DocumentStream:
    """The seeded, endless stream of one split's documents, each ending in EOS (see module docstring)."""

    def __init__(self, docs: Documents, eos: int, pad: int, seed: int, shuffle: bool = True) -> None:
        self.docs = docs
        self.eos = eos
        self.pad = pad
        self.seed = seed
        self.shuffle = shuffle
        self.added = 0 if docs.closed else 1  # the EOS the stream appends to each document
        self.sizes = docs.lengths + self.added
        self.epoch_tokens = int(self.sizes.sum())
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(document order, cumulative start of each slot (n + 1,)) of `epoch`, cached for two epochs."""
        if epoch not in self._epochs:
            n = len(self.docs)
            if self.shuffle:
                perm = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(n)
            else:
                perm = np.arange(n)
            cum = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(self.sizes[perm], out=cum[1:])
            if len(self._epochs) >= 2:
                self._epochs.pop(min(self._epochs))
            self._epochs[epoch] = (perm, cum)
        return self._epochs[epoch]

    def rows(self, offsets: np.ndarray, lengths: np.ndarray, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows starting at stream `offsets` (B,) with `lengths` (B,) tokens, padded to `width`.

        Returns tokens and row-local document ids (B, width), int64; positions past a row's length are
        padding (pad token, document id -1).
        """
        offsets = np.asarray(offsets, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        last = offsets + np.maximum(lengths - 1, 0)
        epoch = offsets // self.epoch_tokens
        simple = len(offsets) and len(self.docs.tokens) and bool((lengths <= width).all())
        if simple and bool((epoch == last // self.epoch_tokens).all()):
            return self._rows_within_epochs(offsets, lengths, width, epoch)
        return self._rows_general(offsets, lengths, width)

    def _rows_within_epochs(
        self, offsets: np.ndarray, lengths: np.ndarray, width: int, epoch: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`rows` where no row crosses an epoch: one binary search per row end instead of one per token,
        then each row's document changes are marked at the documents' starts and summed along the row."""
        B = len(offsets)
        col = np.minimum(np.arange(width)[None, :], np.maximum(lengths - 1, 0)[:, None])
        valid = np.arange(width)[None, :] < lengths[:, None]
        run = np.empty((B, width), dtype=np.int64)
        tokens = np.empty((B, width), dtype=np.int64)
        for e in np.unique(epoch):
            perm, cum = self.order(int(e))
            sel = np.flatnonzero(epoch == e)
            w0 = offsets[sel] - int(e) * self.epoch_tokens
            first = np.searchsorted(cum, w0, side="right") - 1
            final = np.searchsorted(cum, w0 + np.maximum(lengths[sel] - 1, 0), side="right") - 1
            # every document start inside a row (empty documents count but start no run of their own)
            n = final - first
            r = np.repeat(np.arange(len(sel)), n)
            k = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + np.repeat(first, n) + 1
            marks = np.zeros((len(sel), width), dtype=np.int64)
            np.add.at(marks, (r, cum[k] - w0[r]), 1)
            slot_e = first[:, None] + np.cumsum(marks, axis=1)
            run[sel] = np.cumsum(marks > 0, axis=1)
            within = w0[:, None] + col[sel]
            doc = perm[slot_e]
            local = within - cum[slot_e]
            inside = local < self.sizes[doc] - self.added
            # the EOS the stream appends reads one token past its document: clipped, then replaced
            at = np.minimum(self.docs.offsets[doc] + local, len(self.docs.tokens) - 1)
            values = np.where(inside, self.docs.tokens[at], self.eos)
            self._check_ids(values)
            tokens[sel] = values
        tokens[~valid] = self.pad
        document_ids = np.where(valid, run, -1)
        return torch.from_numpy(tokens), torch.from_numpy(document_ids)

    def _check_ids(self, values: np.ndarray) -> None:
        below = self.docs.check_ids_below
        if below is not None and values.size and values.max() >= below:
            raise UserError(
                f"the store holds token id {int(values.max())}, outside the tokenizer's "
                f"{self.docs.check_ids_below} ids: the store is damaged; re-tokenize it"
            )

    def _rows_general(
        self, offsets: np.ndarray, lengths: np.ndarray, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`rows` by one binary search per token: any rows, also those that cross an epoch."""
        B = len(offsets)
        col = np.arange(width)
        valid = col[None, :] < lengths[:, None]
        pos = offsets[:, None] + np.minimum(col[None, :], np.maximum(lengths[:, None] - 1, 0))
        epoch, within = np.divmod(pos, self.epoch_tokens)
        tokens = np.full((B, width), self.pad, dtype=np.int64)
        slot_key = np.zeros((B, width), dtype=np.int64)
        for e in np.unique(epoch):
            perm, cum = self.order(int(e))
            sel = epoch == e
            slot = np.searchsorted(cum, within[sel], side="right") - 1
            doc = perm[slot]
            local = within[sel] - cum[slot]
            inside = local < self.sizes[doc] - self.added
            start = self.docs.offsets[doc]
            values = np.full(slot.shape, self.eos, dtype=np.int64)
            values[inside] = self.docs.tokens[start[inside] + local[inside]]
            self._check_ids(values)
            tokens[sel] = values
            slot_key[sel] = e * (len(self.docs) + 1) + slot
        tokens[~valid] = self.pad
        keys = torch.from_numpy(np.where(valid, slot_key, -1))
        _, index, _, _ = runs_of(keys)
        document_ids = torch.where(torch.from_numpy(valid), index, torch.full_like(index, -1))
        return torch.from_numpy(tokens), document_ids


class MixedStream:
    """Several document streams (one per source, each with its own seeded epochs) and the weights that
    decide, row by row, which one a global row reads (see the module docstring)."""

    def __init__(
        self, streams: list[DocumentStream], weights: np.ndarray, names: list[str], seed: int
    ) -> None:
        self.streams = streams
        self.weights = np.asarray(weights, dtype=np.float64)
        self.cumulative = np.cumsum(self.weights)
        self.cumulative[-1] = 1.0  # rounding never leaves a draw past the last source
        self.names = names
        self.seed = seed
        self.epoch_tokens = np.array([s.epoch_tokens for s in streams], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.streams)

    def source_of(self, rows: np.ndarray) -> np.ndarray:
        """(B,) int64 source of each global row: a uniform draw from (seed, row) against the cumulative
        weights, so each row's source is independent of every other row and of the batch layout."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(self.streams) == 1:
            return np.zeros(len(rows), dtype=np.int64)
        bits = RowRandom(self.seed, torch.from_numpy(rows)).bits(1, "data/source")[:, 0].numpy()
        uniform = (bits.view(np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        return np.minimum(np.searchsorted(self.cumulative, uniform, side="right"), len(self.streams) - 1)

    def layout(
        self, rows: np.ndarray, needs: np.ndarray, start: Position
    ) -> tuple[np.ndarray, np.ndarray, Position]:
        """(source, stream offset) of consecutive global `rows` taking `needs` raw tokens each from
        `start`, and the position after them: each source's rows lie back to back in its own stream."""
        return layout(rows, needs, start, self)

    def rows(
        self, sources: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`DocumentStream.rows` of each row in its own source's stream."""
        if len(self.streams) == 1:
            return self.streams[0].rows(offsets, lengths, width)
        tokens = torch.empty((len(offsets), width), dtype=torch.int64)
        document_ids = torch.empty((len(offsets), width), dtype=torch.int64)
        for k in np.unique(sources):
            sel = sources == k
            t, d = self.streams[int(k)].rows(offsets[sel], lengths[sel], width)
            where = torch.from_numpy(np.flatnonzero(sel))
            tokens[where] = t
            document_ids[where] = d
        return tokens, document_ids

    def one_pass(self, sources: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> int:
        """How many leading rows end within one pass over their own source (at least one)."""
        ok = offsets + lengths <= self.epoch_tokens[sources]
        return max(len(ok) if ok.all() else int(np.argmin(ok)), 1)

    def figures(self, position: Position, seq_len: int) -> dict[str, float]:
        """Per-source metrics after `position`: rows, model tokens, raw tokens read, epochs (passes over
        the source's stream, fractional) and the share of rows."""
        out: dict[str, float] = {}
        offsets, counts = position.per_source(len(self.streams))
        for k, name in enumerate(self.names):
            out[f"source/{name}/rows"] = counts[k]
            out[f"source/{name}/tokens"] = counts[k] * seq_len
            out[f"source/{name}/raw_tokens"] = offsets[k]
            out[f"source/{name}/epochs"] = offsets[k] / int(self.epoch_tokens[k])
            out[f"source/{name}/share"] = counts[k] / max(position.rows, 1)
        return out

    def epochs_started(self, before: Position, after: Position) -> list[tuple[str, int]]:
        """(source name, epoch) of each source whose stream moved into a new epoch between the two."""
        a, _ = before.per_source(len(self.streams))
        b, _ = after.per_source(len(self.streams))
        return [
            (name, int(b[k] // self.epoch_tokens[k]))
            for k, name in enumerate(self.names)
            if b[k] // self.epoch_tokens[k] > a[k] // self.epoch_tokens[k]
        ]


def as_mixed(stream: DocumentStream | MixedStream) -> MixedStream:
    """A stream as a mixture (one source, no draw, the same rows as the stream itself)."""
    if isinstance(stream, MixedStream):
        return stream
    return MixedStream([stream], np.ones(1), [""], stream.seed)


@dataclass(frozen=True)
class Position:
    """Where the data stands (saved in checkpoints): rows consumed and each source's stream offset after
    them; with several sources, also the rows each has given."""

    rows: int = 0
    offsets: tuple[int, ...] = (0,)
    source_rows: tuple[int, ...] = ()  # () = one source, every row

    @property
    def offset(self) -> int:
        """The stream offset of a single-source run."""
        return self.offsets[0]

    def per_source(self, n: int) -> tuple[list[int], list[int]]:
        """(offsets, rows) of each of `n` sources (a fresh position counts zero for each)."""
        offsets = list(self.offsets) + [0] * (n - len(self.offsets))
        rows = list(self.source_rows) if self.source_rows else [self.rows] + [0] * (n - 1)
        return offsets[:n], rows + [0] * (n - len(rows))

    def to_dict(self) -> dict[str, Any]:
        if len(self.offsets) == 1 and not self.source_rows:  # as single-store checkpoints always were
            return {"rows": self.rows, "offset": self.offsets[0]}
        return {"rows": self.rows, "offsets": list(self.offsets), "source_rows": list(self.source_rows)}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> Position:
        if "offsets" in saved:
            return cls(
                int(saved["rows"]), tuple(map(int, saved["offsets"])), tuple(map(int, saved["source_rows"]))
            )
        return cls(int(saved.get("rows", 0)), (int(saved.get("offset", 0)),))


def layout(
    rows: np.ndarray, needs: np.ndarray, start: Position, mixed: MixedStream | None = None
) -> tuple[np.ndarray, np.ndarray, Position]:
    """(source of each row, its stream offset, the position after them) for consecutive global `rows` that
    take `needs` raw tokens each from `start`; one source (`mixed` None or of one stream): the rows lie
    back to back in the stream."""
    needs = np.asarray(needs, dtype=np.int64)
    if mixed is None or len(mixed) == 1:
        offsets = row_starts(needs, start.offsets[0])
        after = Position(start.rows + len(rows), (int(start.offsets[0] + needs.sum()),))
        return np.zeros(len(rows), dtype=np.int64), offsets, after
    sources = mixed.source_of(rows)
    before, counts = start.per_source(len(mixed))
    offsets = np.empty(len(rows), dtype=np.int64)
    for k in range(len(mixed)):
        sel = sources == k
        n = needs[sel]
        if n.size:
            offsets[sel] = row_starts(n, before[k])
        before[k] += int(n.sum())
        counts[k] += int(sel.sum())
    return sources, offsets, Position(start.rows + len(rows), tuple(before), tuple(counts))


def row_needs(objective: RowObjective, model_length: int, rows: np.ndarray, seed: int) -> np.ndarray:
    """(B,) raw tokens each of global `rows` takes from the stream (`Objective.raw_lengths`), checked against
    the row's width: a need past it would move the stream over text that no row reads."""
    needs = objective.raw_lengths(model_length, torch.from_numpy(np.asarray(rows, dtype=np.int64)), seed)
    needs = needs.numpy().astype(np.int64)
    width = objective.raw_length(model_length)
    if needs.size and (int(needs.max()) > width or int(needs.min()) < 0):
        raise RuntimeError(
            f"{objective.name}: a row asked for {int(needs.max())} raw tokens, more than the {width} a row "
            f"holds at model length {model_length} (or a negative count): text would be skipped unread"
        )
    return needs


def row_starts(lengths: np.ndarray, start: int = 0) -> np.ndarray:
    """Stream offsets of rows of `lengths` raw tokens laid back to back from offset `start`."""
    return start + np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)


def rows_in_one_pass(offsets: np.ndarray, lengths: np.ndarray, epoch_tokens: int) -> int:
    """How many leading rows end within one pass over the stream (at least one): a held-out token is never
    read twice, however small the split."""
    return max(int((offsets + lengths <= epoch_tokens).sum()), 1)
