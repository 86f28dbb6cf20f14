"""What a run trains on: one store, or several mixed by weight (`data.sources`), all of one tokenizer.

`StoreMixture` opens the stores; each keeps its own seeded stream and the rows are shared out by a draw
from (seed, row) (`objtrain.data.stream.MixedStream`). `plan_sources` lays a run's rows out as the sampler
will, for `--dry-run`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from objtrain.data.store import PackedStore, TokenStore
from objtrain.data.store_reader import DataSource
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
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.specials import Specials


class StoreMixture:
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
    sources: StoreMixture, objective: RowObjective, model_length: int, seed: int, rows: int
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


def open_stores(store: str | None, sources: list[Any] | None) -> StoreMixture:
    """`data.store` or `data.sources` (items with `store`, `weight` and an optional `name`) opened."""
    if sources:
        return StoreMixture(
            [Path(s.store) for s in sources], [float(s.weight) for s in sources], [s.name for s in sources]
        )
    if store is None:
        raise UserError("no data: give data.store or data.sources")
    return StoreMixture([Path(store)])
