"""A document longer than a piece is read in pieces, never whole: the same pieces, tokens and splits as
the whole text cut at once (`sources.pieces`), whatever the read blocks; characters are never split."""

from __future__ import annotations

import gzip
import hashlib
import io
import itertools
import random
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import objtrain.data.tokenize as tokenize_module
from objtrain.data import sources
from objtrain.data.sources import pieces, repiece
from objtrain.data.store import TokenStore
from objtrain.data.tokenize import TokenizeConfig, _keys, sample_for_training, tokenize_corpus
from objtrain.data.tokenizer import Tokenizer

WORDS = ["alpha", "beta", "naïve", "日本語", "🎉x", "e\u0301", "tab\tbed", "two  spaces", "crlf\r"]


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def expected_pieces(document: str, limit: int) -> list[str]:
    """What the encoder cut before documents were read in pieces: the whole text, cut by index."""
    return list(pieces(document, limit)) if len(document) > limit else [document]


@settings(max_examples=300, deadline=None)
@given(
    documents=st.lists(st.text(alphabet="ab \t\n日🎉", max_size=40), min_size=1, max_size=4),
    limit=st.integers(1, 9),
    data=st.data(),
)
def test_pieces_found_while_reading_are_those_of_the_whole_text(
    documents: list[str], limit: int, data: st.DataObject
) -> None:
    fragments: list[tuple[str, bool]] = []
    for document in documents:  # each document cut into fragments at arbitrary places, empty ones too
        cuts = sorted(data.draw(st.lists(st.integers(0, len(document)), max_size=6)))
        *middle, (a, b) = itertools.pairwise([0, *cuts, len(document)])
        fragments += [(document[i:j], False) for i, j in middle]
        fragments.append((document[a:b], True))
    got = list(repiece(fragments, limit))
    want = [
        (p, i == len(ps) - 1)
        for d in documents
        for ps in [expected_pieces(d, limit)]
        for i, p in enumerate(ps)
    ]
    assert got == want


def test_a_long_line_streams_in_fragments_no_larger_than_a_block_or_two() -> None:
    text = "short\n" + words(3000, 0).replace("\r", "") + "\r\n\nnext one\n"
    block = 64
    for mode in ("line", "blank-line"):
        stream = io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8", newline="\n")
        fragments = list(sources.split_fragments(stream, mode, block))  # type: ignore[arg-type]
        assert max(len(t) for t, _ in fragments) <= 2 * block
        docs, held = [], []
        for t, end in fragments:
            held.append(t)
            if end:
                docs.append("".join(held))
                held = []
        long = words(3000, 0).replace("\r", "")
        assert docs == (["short", long, "next one"] if mode == "line" else ["short\n" + long, "next one"])


def store_docs(path: Path) -> dict[str, list[list[int]]]:
    store = TokenStore.open(path)
    return {
        name: [list(store.split(name).doc(i)) for i in range(len(store.split(name)))]
        for name in ("train", "valid")
    }


@pytest.mark.parametrize("doc_split", ["file", "line", "blank-line"])
def test_long_documents_read_in_pieces_get_the_whole_reads_tokens_and_splits(
    tmp_path: Path, model_file: Path, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch, doc_split: str
) -> None:
    """Documents of up to 20 pieces, read 97 characters at a time (plain and gzip), store exactly the
    tokens of their whole text cut by index and land in the split of their whole bytes' hash; long ones
    fall in both splits, so some wait in the spool for their last piece."""
    limit = 300
    monkeypatch.setattr(tokenize_module, "PIECE_CHARS", limit)
    monkeypatch.setattr(sources, "BLOCK", 97)
    if doc_split == "file":
        documents = [words(40 * (k + 1) + k, k) for k in range(12)]
        files = [(f"d{k}.txt", d) for k, d in enumerate(documents)]
    else:
        documents = [words(n, k) for k, n in enumerate([3, 900, 5, 600, 700, 1, 800, 400, 2, 500])]
        sep = "\n" if doc_split == "line" else "\n  \n"
        # a \r inside a line is kept; in a paragraph it becomes a line break of it
        documents = [
            d.rstrip("\r") if doc_split == "line" else d.rstrip("\r").replace("\r", "\n") for d in documents
        ]
        files = [("all.txt", sep.join(documents) + "\n")]
    inputs = []
    for name, text in files:
        (tmp_path / name).write_text(text, encoding="utf-8")
        (tmp_path / (name + ".gz")).write_bytes(gzip.compress(text.encode()))
        inputs.append(tmp_path / name)

    def split(d: str, seed: int) -> str:
        return "valid" if _keys(d.encode(), seed)[0] < 0.5 else "train"

    # a seed that puts at least two long documents in each split
    seed = next(
        s
        for s in range(100)
        if all(
            sum(split(d, s) == name for d in documents if len(d) > limit) >= 2 for name in ("train", "valid")
        )
    )
    expected: dict[str, list[list[int]]] = {"train": [], "valid": []}
    for d in documents:
        ids = [t for p in expected_pieces(d, limit) for t in tokenizer.encode(p)]
        expected[split(d, seed)].append(ids)
    assert any(len(d) > 5 * limit for d in documents)
    # one piece a chunk, two chunks in flight: a long document's first pieces are written before its last
    # is read, so they wait in the spool
    spooled = []
    append = tokenize_module._Spool.append
    monkeypatch.setattr(
        tokenize_module._Spool, "append", lambda self, *a: spooled.append(a) or append(self, *a)
    )
    config = TokenizeConfig(
        tokenizer=model_file,
        valid_fraction=0.5,
        seed=seed,
        doc_split=doc_split,
        chunk_bytes=1,
        num_threads=1,  # type: ignore[arg-type]
    )
    tokenize_corpus(inputs, tmp_path / "plain", config)
    assert store_docs(tmp_path / "plain") == expected
    assert spooled
    tokenize_corpus([Path(str(p) + ".gz") for p in inputs], tmp_path / "gz", config)
    assert store_docs(tmp_path / "gz") == expected
    meta = TokenStore.open(tmp_path / "gz").meta
    assert meta["bytes"] == sum(len(d.encode()) for d in documents)
    assert meta["splits"]["train"]["tokens"] == sum(map(len, expected["train"]))
    assert sorted(p.name for p in (tmp_path / "gz").iterdir()) == sorted(
        p.name for p in (tmp_path / "plain").iterdir()
    )  # the spool leaves nothing behind


def test_a_multibyte_character_at_a_read_boundary_is_never_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read 8 KiB bytes at a time by the decoder and 1,000 characters at a time by the reader (plain,
    gzip and zstd), 2- to 4-byte characters fall on every kind of boundary; a piece without a space is
    cut at a character."""
    rng = random.Random(0)
    text = "".join(rng.choice("é日🎉a ") for _ in range(40_000))
    monkeypatch.setattr(sources, "BLOCK", 1000)
    files = [("m.txt", text.encode()), ("m.txt.gz", gzip.compress(text.encode()))]
    try:
        import zstandard

        files.append(("m.txt.zst", zstandard.ZstdCompressor().compress(text.encode())))
    except ImportError:  # an optional extra: .zst files need it
        pass
    for name, data in files:
        (tmp_path / name).write_bytes(data)
        source = sources.scan(tmp_path / name, explicit=True)
        assert isinstance(source, sources.Source)
        got = list(sources.iter_pieces(source, "file", 700))
        assert "".join(p for p, _ in got) == text and [last for _, last in got][-1] and len(got) > 50
        assert all(len(p) <= 700 for p, _ in got) and [p for p, _ in got] == expected_pieces(text, 700)
    (tmp_path / "emoji.txt").write_text("🎉" * 1000, encoding="utf-8")
    source = sources.scan(tmp_path / "emoji.txt", explicit=True)
    assert isinstance(source, sources.Source)
    got = [p for p, _ in sources.iter_pieces(source, "file", 7)]
    assert all(p == "🎉" * 7 for p in got[:-1]) and "".join(got) == "🎉" * 1000


def test_a_gzip_document_streams_in_memory_far_below_its_size(tmp_path: Path) -> None:
    """One 20 MB line in a .gz file: reading it in pieces holds a few blocks, not the document (ASCII, so
    a character is a byte in memory as on disk)."""
    rng = random.Random(1)
    line = " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(200_000)) * 20
    size = len(line.encode())
    digest = hashlib.sha256(line.encode()).hexdigest()
    (tmp_path / "one.txt.gz").write_bytes(gzip.compress(line.encode(), compresslevel=1))
    del line
    source = sources.scan(tmp_path / "one.txt.gz", explicit=True)
    assert isinstance(source, sources.Source)
    got = hashlib.sha256()
    n = 0
    tracemalloc.start()
    try:
        for piece, _ in sources.iter_pieces(source, "file", tokenize_module.PIECE_CHARS):
            got.update(piece.encode())
            n += 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.hexdigest() == digest and n > 10
    assert size > 19e6 and peak < size / 3, (peak, size)


def test_the_tokenizer_sample_keeps_a_long_document_whole_or_its_first_train_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tokenize_module, "PIECE_CHARS", 100)
    text = words(2000, 5)
    (tmp_path / "long.txt").write_text(text, encoding="utf-8")
    source = sources.scan(tmp_path / "long.txt", explicit=True)
    assert isinstance(source, sources.Source)
    fits = TokenizeConfig(valid_fraction=0.0, train_bytes=len(text.encode()))
    assert sample_for_training([source], fits, tokenize_module.Progress()) == [text]
    small = TokenizeConfig(valid_fraction=0.0, train_bytes=1000)
    (kept,) = sample_for_training([source], small, tokenize_module.Progress())
    assert text.startswith(kept) and 1000 <= len(kept.encode()) < 1000 + 4 * 100
    parts, k, n = expected_pieces(text, 100), 0, 0
    while n < 1000:  # the pieces up to the first that reaches train_bytes
        n += len(parts[k].encode())
        k += 1
    assert kept == "".join(parts[:k])
