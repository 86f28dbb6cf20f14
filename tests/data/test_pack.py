"""Packing: concat keeps every token once and in order; bestfit never splits a document that fits; document
ids restart per row; packed stores are deterministic and read back as int64 tensors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objtrain.data.pack import (
    PackConfig,
    assemble_rows,
    best_fit,
    bestfit_layout,
    concat_rows,
    concat_window,
    pack_store,
)
from objtrain.data.store import PackedStore, TokenSplit, TokenStore
from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.errors import UserError

EOS, PAD = 3, 0


def make_split(lengths: list[int], seed: int = 0) -> TokenSplit:
    """Documents of ordinary tokens (>= 270), distinct per document so misplacements show."""
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = rng.integers(270, 4000, size=int(offsets[-1])).astype(np.uint16)
    return TokenSplit("train", tokens, offsets)


def segments(tokens: np.ndarray, docs: np.ndarray) -> list[list[int]]:
    """Per row, the runs of equal document id (padding excluded), as token lists."""
    out = []
    for row_t, row_d in zip(tokens.tolist(), docs.tolist(), strict=True):
        for d in sorted(set(row_d) - {-1}):
            idx = [i for i, x in enumerate(row_d) if x == d]
            assert idx == list(range(idx[0], idx[-1] + 1)), "a document's positions are contiguous"
            out.append([row_t[i] for i in idx])
    return out


lengths_st = st.lists(st.integers(1, 40), min_size=0, max_size=30)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, seq_len=st.integers(2, 24))
def test_concat_keeps_every_token_once_in_order(lengths: list[int], seq_len: int) -> None:
    split = make_split(lengths)
    n_rows = -(-(sum(lengths) + len(lengths)) // seq_len)
    tokens, docs = concat_rows(split, seq_len, EOS, PAD, 0, n_rows)
    stream = [t for i in range(len(split)) for t in [*split.doc(i).tolist(), EOS]]
    assert tokens.reshape(-1)[: len(stream)].tolist() == stream
    assert (tokens.reshape(-1)[len(stream) :] == PAD).all() and (docs.reshape(-1)[len(stream) :] == -1).all()
    # Row-local ids: 0 at the start of every row, +1 at each new document.
    global_ids = np.repeat(np.arange(len(lengths)), np.asarray(lengths, dtype=np.int64) + 1)
    flat = docs.reshape(-1)[: len(stream)]
    first = np.repeat(global_ids[::seq_len], seq_len)[: len(stream)]
    assert (flat == global_ids - first).all()
    # Assembling in chunks of rows gives the same rows.
    parts = [concat_rows(split, seq_len, EOS, PAD, r, min(r + 3, n_rows)) for r in range(0, n_rows, 3)]
    if parts:
        assert np.array_equal(np.concatenate([p[0] for p in parts]), tokens)
        assert np.array_equal(np.concatenate([p[1] for p in parts]), docs)


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(0, 12), min_size=1, max_size=40), data=st.data())
def test_concat_window_holds_exactly_the_documents_in_range(lengths: list[int], data: st.DataObject) -> None:
    """Packing looks documents up by binary search instead of holding every document's bounds: the window
    for [s0, s1) holds exactly the documents with a position in it (empty documents are their eos alone)."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.arange(len(lengths))
    starts, ends = offsets[:-1] + ids, offsets[1:] + ids
    total = int(ends[-1]) + 1
    s0 = data.draw(st.integers(0, total - 1))
    s1 = data.draw(st.integers(s0 + 1, total))
    a, got_starts, got_ends = concat_window(offsets, s0, s1)
    meets = np.flatnonzero((ends >= s0) & (starts < s1))
    assert a == meets[0] and len(got_starts) == len(meets)
    assert np.array_equal(got_starts, starts[meets]) and np.array_equal(got_ends, ends[meets])


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, seq_len=st.integers(2, 24), seed=st.integers(0, 3))
def test_bestfit_never_splits_a_document_that_fits(lengths: list[int], seq_len: int, seed: int) -> None:
    split = make_split(lengths, seed)
    layout = bestfit_layout(split.lengths, np.asarray(split.offsets), seq_len, seed)
    tokens, docs = assemble_rows(split, layout, seq_len, EOS, PAD, 0, layout.n_rows)
    segs = segments(tokens, docs)
    fitting = [[*split.doc(i).tolist(), EOS] for i in range(len(split)) if lengths[i] + 1 <= seq_len]
    for doc in fitting:  # whole, with its eos, inside one row
        assert doc in segs
    # Every token once: pieces of every document, in order, rebuild it exactly.
    for i in range(len(split)):
        pieces = layout.doc == i
        order = np.argsort(layout.source[pieces])
        rebuilt = [t for k in order for t in segs_of(tokens, layout, np.flatnonzero(pieces)[k], seq_len)]
        assert rebuilt == [*split.doc(i).tolist(), EOS]
    assert (tokens[docs == -1] == PAD).all() and (tokens[docs >= 0] != PAD).all()
    # Padding only at the end of a row. Any-fit packing leaves at most one row at most half full: a piece
    # that opened a second such row would have fitted in the first.
    real = docs >= 0
    assert (np.sort(real, axis=1)[:, ::-1] == real).all()
    assert int((real.sum(axis=1) * 2 <= seq_len).sum()) <= 1


def segs_of(tokens: np.ndarray, layout: object, k: int, seq_len: int) -> list[int]:
    row, offset, size = layout.row[k], layout.offset[k], layout.size[k]  # type: ignore[attr-defined]
    return tokens[row, offset : offset + size].tolist()


def test_best_fit_small_golden_case() -> None:
    # Sizes 6,5,4,3,2 into bins of 8, largest first: 6->A, 5->B, 4->C, 3->B (exact fit), 2->A (exact fit).
    bins, offsets, n = best_fit(np.array([6, 5, 4, 3, 2]), 8)
    assert n == 3
    assert bins.tolist() == [0, 1, 2, 1, 0] and offsets.tolist() == [0, 0, 0, 5, 6]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path, model_file: Path) -> Path:
    out = tmp_path_factory.mktemp("pack") / "store"
    cfg = TokenizeConfig(tokenizer=model_file, doc_split="blank-line", valid_fraction=0.2)
    tokenize_corpus([corpus_dir], out, cfg)
    return out


@pytest.mark.parametrize("mode", ["concat", "bestfit"])
def test_pack_store_reads_back(tmp_path: Path, store: Path, mode: str) -> None:
    summary = pack_store(store, tmp_path / "p", PackConfig(seq_len=64, mode=mode, seed=1))
    packed = PackedStore.open(tmp_path / "p")
    source = TokenStore.open(store)
    assert packed.seq_len == 64 and packed.specials == source.specials
    assert packed.tokenizer.hash == source.tokenizer.hash
    for name in ("train", "valid"):
        split, docs = packed.split(name), source.split(name)
        counts = summary.splits[name]
        assert len(split) == counts.rows and counts.tokens == docs.n_tokens + len(docs)
        assert counts.padding == counts.rows * 64 - counts.tokens
        tokens, ids = split.rows(0, len(split))
        assert tokens.dtype == ids.dtype == torch.int64 and tokens.shape == (len(split), 64)
        assert int((tokens == source.specials.eos).sum()) == len(docs)
        assert int((ids == -1).sum()) == counts.padding
        assert sorted(tokens[ids >= 0].tolist()) == sorted(
            np.concatenate([docs.tokens, np.full(len(docs), 3)]).tolist()
        )
    if mode == "bestfit":
        assert summary.splits["train"].documents_split == int((source.split().lengths + 1 > 64).sum())


def test_pack_is_deterministic_and_seeded(tmp_path: Path, store: Path) -> None:
    def files(path: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(path.iterdir())}

    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        pack_store(store, tmp_path / name, PackConfig(seq_len=48, mode="bestfit", seed=seed))
    assert files(tmp_path / "a") == files(tmp_path / "b")
    assert files(tmp_path / "a")["train.tokens.bin"] != files(tmp_path / "c")["train.tokens.bin"]


def test_pack_one_split_and_bad_options(tmp_path: Path, store: Path) -> None:
    pack_store(store, tmp_path / "p", PackConfig(seq_len=32, mode="concat", splits=("valid",)))
    packed = PackedStore.open(tmp_path / "p")
    assert len(packed.split("valid")) > 0
    with pytest.raises(UserError, match="no split 'train'"):
        packed.split("train")
    with pytest.raises(UserError, match="too small"):
        pack_store(store, tmp_path / "q", PackConfig(seq_len=1))
    with pytest.raises(UserError, match="already exists"):
        pack_store(store, tmp_path / "p", PackConfig(seq_len=32))
    with pytest.raises(UserError, match="describes a token store, not a packed store"):
        PackedStore.open(store)
    meta = json.loads((tmp_path / "p" / "meta.json").read_text())
    assert meta["kind"] == "packed_store" and meta["splits"]["valid"]["rows"] == len(packed.split("valid"))


def test_packing_only_an_empty_split_is_refused(tmp_path: Path, corpus_dir: Path, model_file: Path) -> None:
    store = tmp_path / "store"
    tokenize_corpus([corpus_dir], store, TokenizeConfig(tokenizer=model_file, valid_fraction=0.0))
    with pytest.raises(UserError, match="its valid split is empty, nothing to pack"):
        pack_store(store, tmp_path / "p", PackConfig(seq_len=64, splits=("valid",)))
    assert not (tmp_path / "p").exists()
    pack_store(store, tmp_path / "p", PackConfig(seq_len=64))  # train and the empty valid split: fine


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("seq_len", "x", "no usable 'seq_len'"),
        ("seq_len", 0, "no usable 'seq_len'"),
        ("doc_dtype", "zz", "no usable 'doc_dtype'"),
        ("splits", {"valid": {"rows": 149.0}}, "no usable 'rows' for split 'valid'"),
        ("splits", {"valid": {"rows": -1}}, "no usable 'rows' for split 'valid'"),
    ],
)
def test_packed_store_names_a_damaged_meta_field(
    tmp_path: Path, store: Path, key: str, value: object, fragment: str
) -> None:
    pack_store(store, tmp_path / "p", PackConfig(seq_len=32))
    meta_path = tmp_path / "p" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta[key] = value
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(UserError, match=rf"meta.json has {fragment}.*damaged.*objtrain pack"):
        PackedStore.open(tmp_path / "p").split("valid")


def test_bestfit_in_windows_keeps_every_document_whole_and_once(
    tmp_path: Path, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store past the window is packed window by window (bounded memory): still lossless, a document that
    # fits still in one row, and each window's rows its own documents.
    import objtrain.data.pack as pack

    whole = pack_store(store, tmp_path / "whole", PackConfig(seq_len=64, mode="bestfit", seed=2))
    n_docs = len(TokenStore.open(store).split("train"))
    monkeypatch.setattr(pack, "WINDOW_DOCS", n_docs // 3)
    windowed = pack_store(store, tmp_path / "win", PackConfig(seq_len=64, mode="bestfit", seed=2))
    third = n_docs // 3
    assert len(pack.windows(np.asarray(TokenStore.open(store).split("train").offsets))) == -(-n_docs // third)
    source = TokenStore.open(store).split("train")
    split = PackedStore.open(tmp_path / "win").split("train")
    tokens, ids = split.rows(0, len(split))
    got = sorted(map(tuple, segments(tokens.numpy(), ids.numpy())))
    fits = [(*source.doc(i).tolist(), EOS) for i in range(len(source)) if len(source.doc(i)) < 64]
    assert all(d in set(got) for d in fits)
    assert sum(map(len, got)) == source.n_tokens + len(source)  # every token once, nothing added
    # rows of window 0 hold only window-0 documents: its rows come first
    layout0 = bestfit_layout(source.lengths[:third], np.asarray(source.offsets[: third + 1]), 64, 2)
    first = set(map(tuple, segments(*assemble_rows(source, layout0, 64, EOS, PAD, 0, 1))))
    assert first <= set(map(tuple, segments(tokens[:1].numpy(), ids[:1].numpy())))
    assert windowed.splits["train"].tokens == whole.splits["train"].tokens
    assert windowed.splits["train"].rows >= whole.splits["train"].rows  # packing in windows fits no better
    # the unwindowed store is what it always was: one window packs exactly as before
    monkeypatch.setattr(pack, "WINDOW_DOCS", n_docs)
    pack_store(store, tmp_path / "again", PackConfig(seq_len=64, mode="bestfit", seed=2))
    assert (tmp_path / "again" / "train.tokens.bin").read_bytes() == (
        tmp_path / "whole" / "train.tokens.bin"
    ).read_bytes()


def test_packing_drops_the_pages_it_read(store: Path) -> None:
    import objtrain.data.pack as pack

    split = TokenStore.open(store).split("train")
    assert split.tokens[:100].sum() > 0
    pack.release_pages(split.tokens)  # a memory map: madvise, and the data reads back the same
    assert np.array_equal(split.tokens[:100], TokenStore.open(store).split("train").tokens[:100])
    pack.release_pages(np.zeros(4))  # not a map: nothing to do
