"""Stores past 2^32 tokens: 64-bit offsets and row indices everywhere, on a sparse store (the zeros are
never written, so the test takes kilobytes of disk), opened without a pass over its tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from objtrain.data.loader import CorruptedRows, RowSampler, make_loader, received, workers_stopped
from objtrain.data.mixture import StoreMixture
from objtrain.data.pack import assemble_rows, bestfit_layout, concat_rows
from objtrain.data.store import TokenStore
from objtrain.data.store_reader import FULL_CHECK_TOKENS, DataSource
from objtrain.data.stream import MixedStream, Position
from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.errors import UserError
from objtrain.objectives.registry import build_objective

BIG = (1 << 32) + 3000  # tokens in the train split
MARK = (1 << 32) - 1000  # document 1 starts here, past what 32 bits address once counted in tokens


@pytest.fixture(scope="module")
def huge_store(
    tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path, model_file: Path
) -> tuple[Path, np.ndarray]:
    """A real store whose train split is rewritten as 2^32 + 3000 uint16 tokens in three documents:
    [0, MARK) zeros (sparse), [MARK, MARK + 2000) real text, the rest zeros. Returns (store, the text)."""
    root = tmp_path_factory.mktemp("huge")
    tokenize_corpus([corpus_dir], root / "small", TokenizeConfig(tokenizer=model_file, valid_fraction=0.3))
    store = root / "store"
    shutil.copytree(root / "small", store)
    real = np.array(TokenStore.open(store).split("train").tokens[:2000], dtype="<u2")  # a copy, not a map
    assert len(real) == 2000 and len(set(real.tolist())) > 50
    with open(store / "train.bin", "wb") as handle:
        handle.truncate(BIG * 2)  # sparse: no block is written for the zeros
        handle.seek(MARK * 2)
        handle.write(real.tobytes())
    np.array([0, MARK, MARK + 2000, BIG], dtype="<i8").tofile(store / "train.idx")
    meta = json.loads((store / "meta.json").read_text())
    meta["splits"]["train"].update(documents=3, tokens=BIG)
    meta["documents"] = 3 + meta["splits"]["valid"]["documents"]
    meta["tokens"] = BIG + meta["splits"]["valid"]["tokens"]
    (store / "meta.json").write_text(json.dumps(meta))
    return store, real


def test_a_store_past_2_32_tokens_reads_at_64_bit_offsets(huge_store: tuple[Path, np.ndarray]) -> None:
    store, real = huge_store
    split = TokenStore.open(store).split("train")
    assert split.n_tokens == BIG and split.offsets.dtype == np.int64
    assert np.array_equal(split.doc(1), real)
    assert split.lengths.tolist() == [MARK, 2000, BIG - MARK - 2000]


def test_training_opens_it_without_reading_its_tokens_and_reads_rows_past_2_32(
    huge_store: tuple[Path, np.ndarray],
) -> None:
    store, real = huge_store
    source = DataSource(store)
    docs = source.documents("train")
    assert len(docs.tokens) > FULL_CHECK_TOKENS
    assert docs.check_ids_below == source.tokenizer.vocab_size  # ids checked row by row, not at start
    stream = source.stream("train", 0, shuffle=False)
    assert stream.epoch_tokens == BIG + 3  # each document closed by an EOS
    at = MARK + 1  # after document 0 and its EOS
    tokens, doc_ids = stream.rows(np.array([at, at + 1500]), np.array([64, 64]), 64)
    assert tokens[0].tolist() == real[:64].tolist() and tokens[1].tolist() == real[1500:1564].tolist()
    assert bool((doc_ids == 0).all())
    # The sampler at a position past 2^32 rows and tokens: int64 throughout, the same rows as from anywhere.
    clm = build_objective("clm", source.specials, source.tokenizer, "decoder")
    start = Position(rows=(1 << 33) + 5, offsets=(at,))
    item = next(iter(RowSampler(clm, 63, 0, 4, 4, 0, 1, start, 0, 1, stream=stream)))
    assert item.rows.dtype == np.int64 and item.rows[0] == (1 << 33) + 5
    assert item.offsets.tolist() == [at + 64 * k for k in range(4)]
    _, batch = CorruptedRows(stream, clm, 63, 0)[item]
    assert batch.input_ids[0].tolist() == real[:63].tolist()


def test_a_damaged_id_in_a_store_too_large_to_scan_is_refused_when_read(
    huge_store: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    store, _ = huge_store
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for f in store.iterdir():  # the sparse file as a link: nothing copied
        (damaged / f.name).symlink_to(f) if f.name != "meta.json" else shutil.copy(f, damaged / f.name)
    (damaged / "train.bin").unlink()
    with open(store / "train.bin", "rb") as src, open(damaged / "train.bin", "wb") as dst:
        dst.truncate(BIG * 2)
        src.seek(MARK * 2)
        block = bytearray(src.read(4000))
        block[10:12] = (65000).to_bytes(2, "little")  # token 5 of document 1: past the vocabulary
        dst.seek(MARK * 2)
        dst.write(block)
    stream = DataSource(damaged).stream("train", 0, shuffle=False)
    stream.rows(np.array([MARK + 100]), np.array([64]), 64)  # rows without it read fine
    with pytest.raises(UserError, match=r"token id 65000, outside the tokenizer's \d+ ids"):
        stream.rows(np.array([MARK + 1]), np.array([64]), 64)
    # Read by a loader worker, the refusal reaches the training process as its own one line.
    source = DataSource(damaged)
    clm = build_objective("clm", source.specials, source.tokenizer, "decoder")
    sampler = RowSampler(clm, 63, 0, 2, 2, 0, 1, Position(0, (MARK + 1,)), 0, 1, stream=stream)
    loader = make_loader(CorruptedRows(stream, clm, 63, 0), sampler, workers=1)
    wire = iter(loader)
    with workers_stopped(wire), pytest.raises(UserError) as err:
        next(received(wire))
    assert str(err.value).startswith("the store holds token id 65000") and "\n" not in str(err.value)


def test_a_mixture_with_a_huge_store_draws_and_reads_64_bit_rows(
    huge_store: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    store, real = huge_store
    mixed = StoreMixture([store, store], [0.5, 0.5]).stream("train", 0, shuffle=False)
    assert isinstance(mixed, MixedStream)
    rows = np.arange(1 << 40, (1 << 40) + 64, dtype=np.int64)
    which = mixed.source_of(rows)
    assert set(which.tolist()) == {0, 1}
    tokens, _ = mixed.rows(which[:2], np.array([MARK + 1, MARK + 1]), np.array([8, 8]), 8)
    assert torch.equal(tokens[0], tokens[1]) and tokens[0].tolist() == real[:8].tolist()


def test_packing_reads_rows_past_2_32_tokens(huge_store: tuple[Path, np.ndarray]) -> None:
    store, real = huge_store
    split = TokenStore.open(store).split("train")
    seq_len = 1 << 16  # few pieces: the layout stays small
    # concat: the row holding document 1 (the stream adds one EOS after document 0)
    r = (MARK + 1) // seq_len
    tokens, docs = concat_rows(split, seq_len, 3, 0, r, r + 2)
    at = (MARK + 1) % seq_len
    assert tokens.reshape(-1)[at : at + 2000].tolist() == real.tolist()
    assert docs[0, at - 1] == 0 and docs[0, at] == 1  # a new document after the EOS
    # bestfit: document 1 fits a row, so it lands whole in one row
    layout = bestfit_layout(split.lengths, np.asarray(split.offsets), seq_len, seed=0)
    piece = int(np.flatnonzero(layout.doc == 1)[0])
    row, offset = int(layout.row[piece]), int(layout.offset[piece])
    tokens, _ = assemble_rows(split, layout, seq_len, 3, 0, row, row + 1)
    assert tokens[0, offset : offset + 2000].tolist() == real.tolist()
    assert tokens[0, offset + 2000] == 3
