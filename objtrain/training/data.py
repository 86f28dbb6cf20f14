"""The training data path: a seeded document stream cut into rows of exactly the length each row needs.

Position as a pure function (`Position`, in each checkpoint). Epoch e is the split's documents in the
order `permutation(seed, e)`, each followed by EOS, back to back: a virtual stream of `T` tokens. Global row
g takes the next `need(g)` tokens, where `need = objective.raw_lengths(model_length, g, seed)`; so the data
position after g rows is `(rows, stream offset)`, both functions of (seed, rows consumed), and the
checkpoint only records them. Step b owns rows [b*GB, (b+1)*GB); rank r, micro-step m reads the `mb` rows
starting at b*GB + m*W*mb + r*mb, so a row index always maps to the same raw tokens and corruption, whatever
the number of processes or micro-batches, and no row is read twice.

Mixtures (`data.sources`): each store keeps its own seeded stream and its own offset; which source
global row g reads is drawn from (seed, g) alone, with the normalised weights as probabilities
(`MixedStream.source_of`), and row g takes its need from that source's stream, after the rows before it
that drew the same source. The position becomes (rows, one offset per source), still a function of
(seed, rows consumed), so exact resume, any process or micro-batch layout and "no row read twice" hold per
source. A source that reaches the end of its stream starts its next shuffled epoch, independently of the
others. With one source no draw is made and everything is as it was.

Corpus scale: stores are memory maps read at 64-bit offsets; opening one reads its meta, its document
offsets and, for stores up to `FULL_CHECK_TOKENS`, every token once to check ids; larger stores check the
ids of each row as it is read instead, so a rank touches only the pages of its own rows.

A packed store is read as a document stream too (its rows, without padding, split at document changes):
the loader cuts rows of the length the objective needs, so model rows always fill `seq_len`.

Corruption runs in DataLoader worker processes (`workers`), so the step does not wait for data: the
sampler (in the training process) hands each worker a work item (rows, offsets, lengths), the worker
reads the raw tokens and applies the objective.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import multiprocessing
import os
import signal
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from objtrain.batch import Batch, runs_of
from objtrain.data.store import PackedStore, TokenStore
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.objectives.base import Objective
from objtrain.rng import RowRandom
from objtrain.specials import Specials
from objtrain.training.cores import unpin_this_process
from objtrain.training.lifetime import die_with_parent

# Up to this many tokens a split's ids are all checked against the vocabulary when it is opened (~0.1 s);
# a larger split is checked row by row as it is read, so opening it touches no token pages.
FULL_CHECK_TOKENS = 1 << 27


@dataclass
class Documents:
    """Documents of one split as a flat token array and offsets (n_docs + 1), like a token-store split."""

    tokens: np.ndarray
    offsets: np.ndarray
    closed: bool = False  # documents end with their EOS already (packed stores); else the stream adds it
    # Ids not checked when the store was opened (a store past `FULL_CHECK_TOKENS`): every row read is
    # checked against this vocabulary size instead. None = checked already.
    check_ids_below: int | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets).astype(np.int64)


class DataSource:
    """A token store or packed store: its specials, tokenizer, model-length hint and split documents."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise UserError(f"data not found: {self.path}")
        if (self.path / "meta.json").is_file() and _kind(self.path) == "packed_store":
            self.store: TokenStore | PackedStore = PackedStore.open(self.path)
            self.packed_length: int | None = self.store.seq_len
        else:
            self.store = TokenStore.open(self.path)
            self.packed_length = None
        self._documents: dict[str, Documents] = {}

    @property
    def specials(self) -> Specials:
        return self.store.specials

    @property
    def tokenizer(self) -> Tokenizer:
        return self.store.tokenizer

    def has_split(self, name: str) -> bool:
        return name in self.store.meta["splits"] and self._count(name) > 0

    def _count(self, name: str) -> int:
        info = self.store.meta["splits"][name]
        return int(info.get("documents", info.get("rows", 0)))

    def stream(self, split: str, seed: int, shuffle: bool = True) -> DocumentStream:
        """The seeded document stream of `split`, closed by this store's EOS, padded with its pad."""
        return DocumentStream(self.documents(split), self.specials.eos, self.specials.pad, seed, shuffle)

    def documents(self, split: str) -> Documents:
        """The split's documents, read and checked once: every token id inside the tokenizer's range."""
        if split in self._documents:
            return self._documents[split]
        rerun = self.store.rerun_template.format(path=self.path)
        if isinstance(self.store, TokenStore):
            s = self.store.split(split)
            docs = Documents(s.tokens, np.asarray(s.offsets, dtype=np.int64))
        else:
            docs = _packed_documents(self.store, split, rerun)
        if len(docs) == 0 or docs.offsets[-1] == 0:
            raise UserError(f"{self.path} has no tokens in its {split!r} split")
        # An id past the vocabulary would fail deep inside the model's embedding (or index another row's
        # weights on a GPU): one pass over the split here names the store instead. A split too large to
        # scan at start is checked as its rows are read (`DocumentStream.rows`).
        vocab = self.tokenizer.vocab_size
        if len(docs.tokens) > FULL_CHECK_TOKENS and np.iinfo(docs.tokens.dtype).max >= vocab:
            docs.check_ids_below = vocab
        elif len(docs.tokens):
            largest = int(np.max(docs.tokens))
            if largest >= vocab:
                raise UserError(
                    f"{self.path}: its {split!r} split holds token id {largest}, outside the tokenizer's "
                    f"{vocab} ids: the store is damaged; re-run {rerun}"
                )
        self._documents[split] = docs
        return docs


class Sources:
    """What a run trains on: one store, or several mixed by weight (`data.sources`), all of one tokenizer.

    With one store it reads as that `DataSource`. `stream` gives a `DocumentStream` for one store and a
    `MixedStream` for several; `documents` checks the split of every store and returns the first's.
    """

    def __init__(
        self, paths: list[Path], weights: list[float] | None = None, names: list[str | None] | None = None
    ) -> None:
        if not paths:
            raise UserError("data.sources is empty: give at least one {store: PATH, weight: W}")
        self.members = [DataSource(Path(p)) for p in paths]
        weights = list(weights) if weights is not None else [1.0] * len(paths)
        if any(not (np.isfinite(w) and w > 0) for w in weights):
            raise UserError(f"data.sources: every weight must be a positive number, got {weights}")
        self.weights = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
        self.names = _source_names([Path(p) for p in paths], names or [None] * len(paths))
        first = self.members[0]
        for other in self.members[1:]:
            if other.tokenizer.hash != first.tokenizer.hash or other.specials != first.specials:
                raise UserError(
                    f"data.sources: {other.path} was tokenized with another tokenizer "
                    f"({other.tokenizer.hash}) than {first.path} ({first.tokenizer.hash}); a mixture trains "
                    f"one vocabulary: tokenize it with --tokenizer {first.path}"
                )

    @property
    def mixture(self) -> bool:
        return len(self.members) > 1

    @property
    def path(self) -> Path:
        """The first store's path (the only one's, without a mixture)."""
        return self.members[0].path

    @property
    def identity(self) -> str:
        """What the run reads, as text: the store's resolved path, or each store with its weight."""
        if not self.mixture:
            return str(self.path.resolve())
        return ", ".join(
            f"{m.path.resolve()} ({w:.4g})" for m, w in zip(self.members, self.weights, strict=True)
        )

    @property
    def specials(self) -> Specials:
        return self.members[0].specials

    @property
    def tokenizer(self) -> Tokenizer:
        return self.members[0].tokenizer

    @property
    def store(self) -> TokenStore | PackedStore:
        return self.members[0].store

    @property
    def packed_length(self) -> int | None:
        """The packed stores' row length when every packed store of the mixture agrees on one."""
        lengths = {m.packed_length for m in self.members if m.packed_length is not None}
        return lengths.pop() if len(lengths) == 1 else None

    def has_split(self, name: str) -> bool:
        return self.lacking(name) is None

    def lacking(self, name: str) -> Path | None:
        """The first store without (tokens in) split `name`, or None when every store has it."""
        return next((m.path for m in self.members if not m.has_split(name)), None)

    def documents(self, split: str) -> Documents:
        for member in self.members[1:]:
            member.documents(split)  # each store's split read and checked once
        return self.members[0].documents(split)

    def stream(self, split: str, seed: int, shuffle: bool = True) -> DocumentStream | MixedStream:
        streams = [m.stream(split, seed, shuffle) for m in self.members]
        if not self.mixture:
            return streams[0]
        return MixedStream(streams, self.weights, self.names, seed)


@dataclass(frozen=True)
class SourcePlan:
    """What a run will read from one source: its share of the run's rows as drawn, the raw tokens they
    take and the passes over the source's stream that makes."""

    name: str
    path: Path
    weight: float
    epoch_tokens: int
    rows: int
    raw_tokens: int

    @property
    def epochs(self) -> float:
        return self.raw_tokens / max(self.epoch_tokens, 1)


def plan_sources(
    sources: Sources, objective: Objective, model_length: int, seed: int, rows: int
) -> list[SourcePlan]:
    """Each source's rows and raw tokens over the run's first `rows` global rows, laid out exactly as
    the sampler will (`layout`): what `--dry-run` shows. Past 2^22 rows, the counts of the first 2^22
    are scaled up."""
    stream = sources.stream("train", seed)
    mixed = as_mixed(stream)
    n = min(rows, 1 << 22)
    index = np.arange(n, dtype=np.int64)
    needs = row_needs(objective, model_length, index, seed)
    _, _, after = layout(index, needs, Position(offsets=(0,) * len(mixed)), mixed)
    offsets, counts = after.per_source(len(mixed))
    scale = rows / max(n, 1)
    return [
        SourcePlan(
            name or m.path.name,
            m.path,
            float(w),
            int(mixed.epoch_tokens[k]),
            round(counts[k] * scale),
            round(offsets[k] * scale),
        )
        for k, (name, m, w) in enumerate(zip(sources.names, sources.members, sources.weights, strict=True))
    ]


def _source_names(paths: list[Path], given: list[str | None]) -> list[str]:
    """Each source's name in metrics: its own `name`, else its directory's, made unique by a suffix."""
    names: list[str] = []
    for path, name in zip(paths, given, strict=True):
        base = name or path.resolve().name or "store"
        candidate, n = base, 2
        while candidate in names:
            candidate, n = f"{base}-{n}", n + 1
        names.append(candidate)
    return names


def open_sources(store: str | None, sources: list[Any] | None) -> Sources:
    """`data.store` or `data.sources` (items with `store`, `weight` and an optional `name`) opened."""
    if sources:
        return Sources(
            [Path(s.store) for s in sources], [float(s.weight) for s in sources], [s.name for s in sources]
        )
    if store is None:
        raise UserError("no data: give data.store or data.sources")
    return Sources([Path(store)])


def _kind(path: Path) -> str:
    import json

    try:
        return str(json.loads((path / "meta.json").read_text(encoding="utf-8")).get("kind"))
    except (OSError, ValueError, AttributeError):
        return ""


def _packed_documents(store: PackedStore, split: str, rerun: str) -> Documents:
    """Packed rows back to documents: the non-padding positions, split where the row or document changes."""
    s = store.split(split)
    docs = np.asarray(s.document_ids)
    # `pack` numbers a row's documents 0, 1, 2.. and its padding -1; anything else would cut documents
    # in the wrong places without a word
    if docs.size and (docs.min() < -1 or docs.max() >= store.seq_len):
        raise UserError(
            f"{store.path / split}.docs.bin holds document ids outside -1..{store.seq_len - 1}: "
            f"the store is damaged; re-run {rerun}"
        )
    keep = docs >= 0
    tokens = np.asarray(s.tokens)[keep]
    rows = np.broadcast_to(np.arange(docs.shape[0])[:, None], docs.shape)[keep]
    ids = docs[keep]
    starts = np.flatnonzero(np.r_[True, (rows[1:] != rows[:-1]) | (ids[1:] != ids[:-1])])
    # `pack` wrote each document's EOS; a long document's pieces (shuffled apart by bestfit) are documents
    # of their own, the last one ending in EOS.
    return Documents(tokens, np.r_[starts, len(tokens)].astype(np.int64), closed=True)


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


@dataclass(frozen=True)
class WorkItem:
    """One micro-batch of one rank: global row indices, their stream offsets and raw lengths."""

    step: int
    micro: int
    rows: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    after: Position  # the data position once this step's last micro-batch is consumed
    sources: np.ndarray | None = None  # each row's source in a mixture (None: the one store)


def row_needs(objective: Objective, model_length: int, rows: np.ndarray, seed: int) -> np.ndarray:
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


class RowSampler(Sampler[WorkItem]):
    """Yields this rank's work items step by step, from a `Position`; runs in the training process."""

    def __init__(
        self,
        objective: Objective,
        model_length: int,
        seed: int,
        global_batch: int,
        micro_batch: int,
        rank: int,
        world_size: int,
        start: Position,
        first_step: int,
        steps: int,
        stream: DocumentStream | MixedStream | None = None,
    ) -> None:
        self.objective = objective
        self.model_length = model_length
        self.seed = seed
        self.global_batch = global_batch
        self.micro_batch = micro_batch
        self.rank = rank
        self.world_size = world_size
        self.start = start
        self.first_step = first_step
        self.steps = steps
        self.mixed = as_mixed(stream) if stream is not None else None  # None: one source

    def __len__(self) -> int:
        return max(self.steps - self.first_step, 0) * self.accumulation

    @property
    def accumulation(self) -> int:
        return self.global_batch // (self.world_size * self.micro_batch)

    def __iter__(self) -> Iterator[WorkItem]:
        position = self.start
        for step in range(self.first_step, self.steps):
            rows = np.arange(position.rows, position.rows + self.global_batch, dtype=np.int64)
            lengths = row_needs(self.objective, self.model_length, rows, self.seed)
            sources, offsets, after = layout(rows, lengths, position, self.mixed)
            mb, W = self.micro_batch, self.world_size
            for m in range(self.accumulation):
                lo = m * W * mb + self.rank * mb
                sl = slice(lo, lo + mb)
                yield WorkItem(step, m, rows[sl], offsets[sl], lengths[sl], after, sources[sl])
            position = after


class CorruptedRows(Dataset[tuple[WorkItem, Batch]]):
    """Work item -> (item, Batch): read the raw rows from the stream and apply the objective."""

    def __init__(
        self, stream: DocumentStream | MixedStream, objective: Objective, model_length: int, seed: int
    ) -> None:
        self.stream = stream
        self.objective = objective
        self.width = objective.raw_length(model_length)
        self.seed = seed

    def __len__(self) -> int:  # pragma: no cover - indexed by work items, never by position
        raise TypeError("CorruptedRows is indexed by WorkItem")

    def __getitem__(self, item: WorkItem) -> tuple[WorkItem, Batch]:  # type: ignore[override]
        batch = read_batch(
            self.stream,
            self.objective,
            item.rows,
            item.offsets,
            item.lengths,
            self.width,
            self.seed,
            item.sources,
        )
        return item, batch


class Wire:
    """A batch's fields as numpy arrays, for the trip from a worker: pickled through the pipe, a
    micro-batch costs ~1.5 ms to receive, against ~5 ms for torch's shared-memory handoff of each tensor
    (a file descriptor per tensor), which on a small model is several percent of the step. Bound for a
    GPU, the DataLoader's pinning thread calls `pin_memory`: the arrays become page-locked tensors there,
    off the training thread, ready for a copy that does not wait (PyTorch's pin_memory tutorial)."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def pin_memory(self, device: Any = None) -> Wire:
        return Wire(
            {
                k: torch.from_numpy(v).pin_memory() if isinstance(v, np.ndarray) else v
                for k, v in self.fields.items()
            }
        )


def _to_wire(pair: tuple[WorkItem, Batch]) -> tuple[WorkItem, Wire]:
    """A batch as numpy arrays (`Wire`)."""
    item, batch = pair
    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    return item, Wire({k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in fields.items()})


def received(wire: Iterator[tuple[WorkItem, Wire]]) -> Iterator[tuple[WorkItem, Batch]]:
    """The loader's (item, batch) pairs back as tensors (views of the received arrays, no copy; pinned
    tensors as they are). A refusal raised in a worker (a damaged id in a store too large to check at
    start) comes back as its own one line, not as the worker's traceback torch wraps it in."""
    try:
        for item, fields in wire:
            yield (
                item,
                Batch(
                    **{
                        k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                        for k, v in fields.fields.items()
                    }
                ),
            )
    except UserError as exc:
        last = str(exc).strip().splitlines()[-1]
        raise UserError(last.split("UserError: ", 1)[-1]) from None


def _leave_signals_to_the_trainer(worker_id: int, trainer: int = 0) -> None:
    """Loader workers ignore Ctrl-C and SIGTERM. `timeout`, `kill -- -PGID`, Slurm and systemd signal the
    whole process group: a worker dying of it made the DataLoader raise in the training process before the
    loop could save. The training process saves, then shuts its workers down; if it dies instead (SIGKILL,
    OOM), its workers die with it (`objtrain.training.lifetime`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    unpin_this_process()  # a worker forked while the trainer's threads were packed gets every core back
    if trainer:
        die_with_parent(trainer)


@contextlib.contextmanager
def workers_stopped(wire: Iterator[Any]) -> Iterator[None]:
    """Shut the loader's worker processes down when the block ends, by an exception too. They ignore SIGTERM
    (`_leave_signals_to_the_trainer`), so left to interpreter exit, which terminates and then joins them,
    they would keep the process alive forever after an error."""
    try:
        yield
    finally:
        shutdown = getattr(wire, "_shutdown_workers", None)  # torch's own cleanup, what its __del__ calls
        if shutdown is not None:
            shutdown()


_WORKERS: weakref.WeakSet[multiprocessing.process.BaseProcess] = weakref.WeakSet()


def _kill_leftover_workers() -> None:
    """At interpreter exit, SIGKILL the loader workers still alive (a loader dropped after an error, its
    iterator kept alive by the traceback). multiprocessing's own exit handler, which runs after this one,
    sends them SIGTERM, which they ignore, and then joins them: the process would never exit."""
    for worker in list(_WORKERS):
        if worker.is_alive():
            worker.kill()
            worker.join(timeout=5)


class _Loader(DataLoader):
    """A DataLoader that remembers its worker processes, for `_kill_leftover_workers`."""

    def _get_iterator(self) -> Any:
        wire = super()._get_iterator()
        _WORKERS.update(getattr(wire, "_workers", ()))
        return wire


def make_loader(dataset: CorruptedRows, sampler: RowSampler, workers: int, pin: bool = False) -> DataLoader:
    """Work items through `workers` processes (0 = in this process), a few micro-batches ahead; iterate it
    through `received`. `pin`: batches come page-locked (for a GPU), pinned by the loader's own thread."""
    init = functools.partial(_leave_signals_to_the_trainer, trainer=os.getpid())  # forked from this process
    if workers:
        # Registered after multiprocessing's exit handler, so run before it (atexit is last in, first out).
        atexit.unregister(_kill_leftover_workers)
        atexit.register(_kill_leftover_workers)
    return _Loader(
        dataset,  # type: ignore[arg-type]
        sampler=sampler,
        batch_size=None,
        num_workers=workers,
        collate_fn=_to_wire,
        pin_memory=pin,
        prefetch_factor=4 if workers else None,
        persistent_workers=False,
        worker_init_fn=init if workers else None,
        # Each iterator draws a base seed from the global RNG unless given a generator: keep the training
        # RNG (dropout) untouched by data loading (`checkpoint.restore_rng`).
        generator=torch.Generator().manual_seed(0),
    )


def auto_workers(device_type: str, processes_per_host: int, cores: int | None = None) -> int:
    """Loader worker processes for `workers: auto`, from the cores this process may use and the training
    processes on this host. On a GPU: each process's share of the cores less 2 (its own training thread
    and the pinning thread), between 1 and 4 (torchtitan's example and litgpt use 4 and 8; one worker
    left the GPU waiting 4-6% of a small model's step on a 16-core H200 host; 8-GPU hosts have 13-14
    cores a GPU). On a CPU the training's own threads need the cores: 1
    worker, none where a process has a single core (a worker would only take turns with it)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    share = cores // max(processes_per_host, 1)
    if device_type == "cuda":
        return max(1, min(4, share - 2))
    return 1 if share >= 2 else 0


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
    objective: Objective,
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


def leading_batches(
    stream: DocumentStream | MixedStream,
    objective: Objective,
    model_length: int,
    rows: int,
    micro: int,
    seed: int,
    within_epoch: bool = True,
) -> list[Batch]:
    """Rows 0..rows-1 of `stream`, each of the length the objective needs, corrupted under `seed`, in batches
    of `micro` rows. With `within_epoch`, only the rows that fit in one pass (`rows_in_one_pass`); in a
    mixture, the rows before the first that would run past one pass over its source."""
    mixed = as_mixed(stream)
    index = np.arange(rows, dtype=np.int64)
    lengths = row_needs(objective, model_length, index, seed)
    sources, offsets, _ = layout(index, lengths, Position(offsets=(0,) * len(mixed)), mixed)
    n = mixed.one_pass(sources, offsets, lengths) if within_epoch else rows
    width = objective.raw_length(model_length)
    return [
        read_batch(
            stream,
            objective,
            index[lo : lo + micro],
            offsets[lo : lo + micro],
            lengths[lo : lo + micro],
            width,
            seed,
            sources[lo : lo + micro],
        )
        for lo in range(0, n, micro)
    ]


def validation_batches(
    docs: Documents | Sources,
    specials: Specials,
    objective: Objective,
    model_length: int,
    rows: int,
    micro: int,
    split: str = "valid",
) -> list[Batch]:
    """The fixed validation set: the first `rows` rows of the unshuffled valid split, seed 0, every time;
    of a mixture (`Sources`), the rows of each store's unshuffled `split`, mixed by the weights at seed 0."""
    if isinstance(docs, Sources):
        stream: DocumentStream | MixedStream = docs.stream(split, 0, shuffle=False)
    else:
        stream = DocumentStream(docs, specials.eos, specials.pad, seed=0, shuffle=False)
    return leading_batches(stream, objective, model_length, rows, micro, seed=0)
