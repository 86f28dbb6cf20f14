"""The training data path: what the model is fed (no dropped tokens, no row read twice, same row whatever
the process and micro-batch layout), not only that a loss falls."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from objtrain.data.loader import RowSampler
from objtrain.data.store import TokenStore
from objtrain.data.store_reader import DataSource
from objtrain.data.stream import DocumentStream, Position, row_needs
from objtrain.errors import UserError
from objtrain.objectives.registry import build_objective


def _stream(store: Path, seed: int = 0, shuffle: bool = True) -> tuple[DocumentStream, DataSource]:
    source = DataSource(store)
    return source.stream("train", seed, shuffle), source


def test_an_epoch_holds_every_token_once_each_document_closed_by_eos(train_store: Path) -> None:
    stream, source = _stream(train_store, seed=3)
    split = TokenStore.open(train_store).split("train")
    T = stream.epoch_tokens
    assert split.n_tokens + len(split) == T
    # Cut the first epoch into ragged rows, as a per-row objective would.
    lengths = np.resize(np.array([57, 129, 3, 200]), 4000)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), T) + 1]
    lengths[-1] -= int(lengths.sum()) - T
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    tokens, doc_ids = stream.rows(offsets, lengths, int(lengths.max()))
    valid = doc_ids >= 0
    assert int(valid.sum()) == T  # nothing dropped, nothing repeated inside the epoch
    flat = tokens[valid].numpy()
    assert (flat == source.specials.eos).sum() == len(split)
    perm, _ = stream.order(0)
    expected = np.concatenate([np.r_[split.doc(int(d)), source.specials.eos] for d in perm])
    assert np.array_equal(flat, expected)
    # Padding is padding: pad tokens with document id -1, only after each row's length.
    assert bool((tokens[~valid] == source.specials.pad).all())
    assert bool((valid.sum(1) == torch.from_numpy(lengths)).all())


def test_document_ids_restart_per_row_and_change_after_each_eos(train_store: Path) -> None:
    stream, source = _stream(train_store)
    lengths = np.full(16, 96)
    tokens, doc_ids = stream.rows(np.arange(16) * 96, lengths, 96)
    assert bool((doc_ids[:, 0] == 0).all())
    eos = tokens == source.specials.eos
    nxt = doc_ids[:, 1:] != doc_ids[:, :-1]
    assert torch.equal(nxt, eos[:, :-1])  # a new document starts exactly after an EOS


def test_epochs_are_seeded_permutations(train_store: Path) -> None:
    a, _ = _stream(train_store, seed=1)
    b, _ = _stream(train_store, seed=1)
    c, _ = _stream(train_store, seed=2)
    assert np.array_equal(a.order(0)[0], b.order(0)[0])
    assert not np.array_equal(a.order(0)[0], a.order(1)[0])
    assert not np.array_equal(a.order(0)[0], c.order(0)[0])
    assert sorted(a.order(1)[0].tolist()) == list(range(len(a.docs)))


def _rows_of(objective_name: str, kind: str, store: Path, world: int, micro: int) -> dict[int, tuple]:
    source = DataSource(store)
    objective = build_objective(objective_name, source.specials, source.tokenizer, kind)  # type: ignore[arg-type]
    seen: dict[int, tuple] = {}
    for rank in range(world):
        sampler = RowSampler(objective, 64, 5, 16, micro, rank, world, Position(), 0, 3)
        for item in sampler:
            for g, off, n in zip(
                item.rows.tolist(), item.offsets.tolist(), item.lengths.tolist(), strict=True
            ):
                assert g not in seen, f"row {g} read twice"
                seen[g] = (off, n)
    return seen


def test_each_row_maps_to_the_same_raw_tokens_whatever_the_layout(train_store: Path) -> None:
    single = _rows_of("mlm", "encoder", train_store, world=1, micro=16)
    for world, micro in ((2, 8), (2, 2), (4, 1), (1, 4)):
        assert _rows_of("mlm", "encoder", train_store, world, micro) == single
    assert sorted(single) == list(range(48))  # three steps of 16 rows, none skipped


def test_rows_are_contiguous_in_the_stream(train_store: Path) -> None:
    rows = _rows_of("clm", "decoder", train_store, world=1, micro=8)
    ordered = [rows[g] for g in sorted(rows)]
    for (off, n), (nxt, _) in itertools.pairwise(ordered):
        assert off + n == nxt  # no raw token skipped between rows
    assert all(n == 65 for _, n in ordered)  # CLM: T + 1 raw tokens for T model positions


def test_packed_store_reads_back_the_same_documents(train_store: Path, packed_store: Path) -> None:
    docs = DataSource(packed_store).documents("train")
    split = TokenStore.open(train_store).split("train")
    # bestfit never splits a document that fits, and splits longer ones into row-size pieces
    assert docs.offsets[-1] == split.n_tokens + len(split)  # each document once, with the EOS pack wrote
    eos = DataSource(train_store).specials.eos
    short = [(*split.doc(i), eos) for i in range(len(split)) if len(split.doc(i)) < 64]
    got = {tuple(docs.tokens[docs.offsets[i] : docs.offsets[i + 1]]) for i in range(len(docs))}
    assert all(d in got for d in short)
    stream = DocumentStream(docs, eos, 0, seed=0)
    assert stream.epoch_tokens == split.n_tokens + len(split)  # no second EOS added


def test_packed_document_ids_outside_a_row_are_damage(packed_store: Path, tmp_path: Path) -> None:
    damaged = tmp_path / "packed"
    shutil.copytree(packed_store, damaged)
    ids = np.memmap(damaged / "valid.docs.bin", dtype=np.int16, mode="r+")
    ids[5] = -7  # neither padding (-1) nor a document of the row
    ids.flush()
    del ids
    with pytest.raises(UserError, match=r"valid\.docs\.bin holds document ids outside -1\.\.63.*damaged"):
        DataSource(damaged).documents("valid")


@pytest.mark.parametrize(
    ("objective_name", "kind", "length"),
    [("clm", "decoder", 64), ("ul2", "decoder", 64), ("ul2", "encdec", 12)],
)
def test_a_row_never_takes_more_raw_tokens_than_it_holds(
    objective_name: str, kind: str, length: int, train_store: Path
) -> None:
    # A need past the row's width would move the stream over text no row reads: silently trained on less.
    _, source = _stream(train_store)
    objective = build_objective(objective_name, source.specials, source.tokenizer, kind)  # type: ignore[arg-type]
    needs = row_needs(objective, length, np.arange(4096), seed=3)
    assert needs.max() <= objective.raw_length(length) and needs.min() > 0

    class Greedy(type(objective)):  # type: ignore[misc]
        def raw_lengths(self, model_length: int, row_index: torch.Tensor, seed: int) -> torch.Tensor:
            return super().raw_lengths(model_length, row_index, seed) + 1

    greedy = Greedy(objective.config, source.specials, source.tokenizer, kind)
    sampler = RowSampler(greedy, length, 0, 8, 8, 0, 1, Position(), 0, 1)
    with pytest.raises(RuntimeError, match="skipped unread"):
        next(iter(sampler))


@pytest.mark.parametrize("closed", [False, True])
def test_rows_read_per_row_equal_the_per_token_search(closed: bool) -> None:
    """The fast read (one search per row end) gives what one search per token gives: short, long and
    (closed) empty documents, rows that end exactly on a document start, rows that cross an epoch, padding."""
    from objtrain.data.stream import Documents

    rng = np.random.default_rng(7)
    sizes = rng.choice([0, 1, 2, 5, 40, 300], size=400, p=[0.05, 0.1, 0.1, 0.25, 0.3, 0.2])
    flat = rng.integers(4, 1000, size=int(sizes.sum())).astype(np.uint16)
    docs = Documents(flat, np.r_[0, np.cumsum(sizes)].astype(np.int64), closed=closed)
    stream = DocumentStream(docs, eos=3, pad=0, seed=5)
    width = 129
    for start in (0, stream.epoch_tokens - 700, 5 * stream.epoch_tokens + 11):
        lengths = rng.integers(1, width + 1, size=48)
        lengths[:3] = (width, 1, 2)
        offsets = start + np.r_[0, np.cumsum(lengths)[:-1]]
        fast = stream.rows(offsets, lengths, width)
        slow = stream._rows_general(offsets, lengths, width)
        assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])
