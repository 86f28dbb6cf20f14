"""`tokenize_corpus`: exact round trip, fixed special ids, deterministic splits, streaming, input formats."""

from __future__ import annotations

import gzip
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objtrain.data import sources
from objtrain.data.store import TokenStore, _non_decreasing, token_dtype
from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.specials import Specials


def all_docs(store: TokenStore) -> list[str]:
    tok = store.tokenizer
    splits = [store.split("train"), store.split("valid")]
    return [tok.decode(s.doc(i)) for s in splits for i in range(len(s))]


def reuse(model_file: Path, **kw: object) -> TokenizeConfig:
    return TokenizeConfig(tokenizer=model_file, **kw)  # type: ignore[arg-type]


def test_round_trip_on_standard_library_and_tricky_text(
    tmp_path: Path, corpus_dir: Path, model_file: Path, stdlib_texts: list[str], tricky: str
) -> None:
    summary = tokenize_corpus([corpus_dir], tmp_path / "s", reuse(model_file, valid_fraction=0.3))
    store = TokenStore.open(tmp_path / "s")
    assert sorted(all_docs(store)) == sorted([*stdlib_texts, tricky])
    assert summary.documents == len(stdlib_texts) + 1
    assert summary.bytes == sum(len(t.encode()) for t in [*stdlib_texts, tricky])
    assert store.split("train").n_tokens + store.split("valid").n_tokens == summary.tokens
    assert store.meta["dtype"] == "<u2" and store.split().tokens.dtype == np.uint16


def test_marker_character_round_trips(tokenizer: Tokenizer) -> None:
    # sentencepiece decodes its word-start mark ▁ as a space; the tokenizer spells it in bytes instead.
    for text in ["a▁b", "▁", "x ▁▁ y▁"]:
        assert tokenizer.decode(tokenizer.encode(text)) == text
        assert tokenizer.encode_batch([text, "plain"])[0] == tokenizer.encode(text)


def test_doc_split_modes(tmp_path: Path, model_file: Path) -> None:
    path = tmp_path / "plays.txt"
    path.write_bytes(b"A:\nHello there.\r\n\n  \nB:\n\tIndented.\n\n\n\nC: last")
    expected = {
        "file": ["A:\nHello there.\r\n\n  \nB:\n\tIndented.\n\n\n\nC: last"],
        "blank-line": ["A:\nHello there.", "B:\n\tIndented.", "C: last"],
        "line": ["A:", "Hello there.", "B:", "\tIndented.", "C: last"],
    }
    for mode, docs in expected.items():
        out = tmp_path / mode
        tokenize_corpus([path], out, reuse(model_file, doc_split=mode, valid_fraction=0.0))
        store = TokenStore.open(out)
        assert all_docs(store) == docs, mode
        assert len(store.split("valid")) == 0


def test_jsonl_and_gzip_inputs(tmp_path: Path, model_file: Path, tricky: str) -> None:
    records = [{"text": "first\tdoc\n"}, {"body": "x", "text": "ü 日本\n\n"}, {"text": ""}, {"text": "▁last"}]
    body = "".join(json.dumps(r) + "\n" for r in records) + "\n"
    (tmp_path / "a.jsonl").write_text(body, encoding="utf-8")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(body)
    with gzip.open(tmp_path / "c.txt.gz", "wb") as f:
        f.write(tricky.encode())
    out = tmp_path / "s"
    summary = tokenize_corpus(
        [tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz", tmp_path / "c.txt.gz"],
        out,
        reuse(model_file, valid_fraction=0.0),
    )
    texts = [r["text"] for r in records if r["text"]]
    assert all_docs(TokenStore.open(out)) == [*texts, *texts, tricky]
    assert summary.empty_documents == 2
    assert [s["documents"] for s in TokenStore.open(out).meta["sources"]] == [3, 3, 1]


def test_text_field_option(tmp_path: Path, model_file: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"content": "abc"}\n{"content": "def"}\n')
    tokenize_corpus([tmp_path / "a.jsonl"], tmp_path / "s", reuse(model_file, text_field="content"))
    assert sorted(all_docs(TokenStore.open(tmp_path / "s"))) == ["abc", "def"]


def test_include_exclude_and_skipped_files(tmp_path: Path, model_file: Path) -> None:
    root = tmp_path / "in"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "b.md").write_text("beta")
    (root / "sub" / "c.txt").write_text("gamma")
    (root / "sub" / "latin1.txt").write_bytes("café".encode("latin-1"))
    (root / "sub" / "blob.txt").write_bytes(b"PK\x03\x04\x00\x00binary")
    (root / ".hidden.txt").write_text("hidden")
    cfg = reuse(model_file, include=("*.txt",), valid_fraction=0.0)
    summary = tokenize_corpus([root], tmp_path / "s", cfg)
    assert sorted(all_docs(TokenStore.open(tmp_path / "s"))) == ["alpha", "gamma"]
    assert sorted(s.path.name for s in summary.skipped) == ["blob.txt", "latin1.txt"]
    skipped = TokenStore.open(tmp_path / "s").meta["skipped"]
    assert any("not UTF-8" in s["reason"] for s in skipped) and any("binary" in s["reason"] for s in skipped)

    tokenize_corpus([root], tmp_path / "t", reuse(model_file, exclude=("sub/*",), valid_fraction=0.0))
    assert sorted(all_docs(TokenStore.open(tmp_path / "t"))) == ["alpha", "beta"]
    # An output inside an input directory is not read back on a re-run.
    tokenize_corpus([root / "sub"], root / "sub" / "store", reuse(model_file))
    tokenize_corpus([root / "sub"], root / "sub" / "store", reuse(model_file), force=True)
    assert all_docs(TokenStore.open(root / "sub" / "store")) == ["gamma"]
    shutil.rmtree(root / "sub" / "store")
    # The same bad file named explicitly is refused.
    with pytest.raises(UserError, match="not UTF-8"):
        tokenize_corpus([root / "sub" / "latin1.txt"], tmp_path / "u", reuse(model_file))
    assert not (tmp_path / "u").exists()


def test_split_is_by_content_hash_and_seed(tmp_path: Path, model_file: Path) -> None:
    path = tmp_path / "lines.txt"
    lines = [f"line number {i} says {i * i}" for i in range(400)]
    path.write_text("\n".join(lines))
    cfg = reuse(model_file, doc_split="line", valid_fraction=0.25, seed=3)
    tokenize_corpus([path], tmp_path / "a", cfg)
    valid = {TokenStore.open(tmp_path / "a").tokenizer.decode(d) for d in _docs(tmp_path / "a")}
    assert 60 < len(valid) < 140  # ~100 expected
    # Reordering the input does not move any document to the other split.
    rev = tmp_path / "rev.txt"
    rev.write_text("\n".join(reversed(lines)))
    tokenize_corpus([rev], tmp_path / "b", cfg)
    assert valid == {TokenStore.open(tmp_path / "b").tokenizer.decode(d) for d in _docs(tmp_path / "b")}
    cfg.seed = 4
    tokenize_corpus([path], tmp_path / "c", cfg)
    assert valid != {TokenStore.open(tmp_path / "c").tokenizer.decode(d) for d in _docs(tmp_path / "c")}


def _docs(path: Path) -> list[np.ndarray]:
    split = TokenStore.open(path).split("valid")
    return [split.doc(i) for i in range(len(split))]


def files_of(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_deterministic_and_chunking_does_not_change_the_store(
    tmp_path: Path, corpus_dir: Path, model_file: Path
) -> None:
    cfg = reuse(model_file, valid_fraction=0.3, seed=1)
    tokenize_corpus([corpus_dir], tmp_path / "a", cfg)
    tokenize_corpus([corpus_dir], tmp_path / "b", cfg)
    cfg.chunk_bytes, cfg.num_threads = 1000, 1  # many tiny encode calls, one thread
    tokenize_corpus([corpus_dir], tmp_path / "c", cfg)
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b") == files_of(tmp_path / "c")


def test_trained_tokenizer_reserves_fixed_special_ids(tmp_path: Path, corpus_dir: Path) -> None:
    cfg = TokenizeConfig(vocab_size=400, n_sentinels=8, train_bytes=60_000, model_type="bpe", seed=5)
    summary = tokenize_corpus([corpus_dir], tmp_path / "a", cfg)
    assert summary.tokenizer_trained
    store = TokenStore.open(tmp_path / "a")
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["specials"] == Specials(n_sentinels=8).to_dict()
    assert meta["specials"]["mask"] == 4 and meta["specials"]["first_ordinary"] == 14 + 8
    assert meta["special_pieces"]["fim_middle"] == "<fim_middle>"
    assert meta["tokenizer"]["hash"] == store.tokenizer.hash and meta["vocab_size"] == 400
    tok = store.tokenizer
    assert [tok.piece(i) for i in (0, 3, 4, 13, 14, 21)] == [
        "<pad>", "</s>", "<mask>", "[S2S]", "<extra_id_7>", "<extra_id_0>",
    ]  # fmt: skip
    # Special pieces written in text are plain characters, never the control ids.
    ids = torch.tensor(tok.encode("<mask> <extra_id_0> [NLU] </s> <pad>"))
    assert not bool(store.specials.is_special(ids).any())
    # Training is deterministic too, and a store reuses its own tokenizer.
    tokenize_corpus([corpus_dir], tmp_path / "b", cfg)
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b")
    tokenize_corpus([corpus_dir], tmp_path / "c", TokenizeConfig(tokenizer=tmp_path / "a", seed=5))
    assert files_of(tmp_path / "c")["train.bin"] == files_of(tmp_path / "a")["train.bin"]
    assert TokenStore.open(tmp_path / "c").specials.n_sentinels == 8


def test_closed_alphabet_character_vocabulary(tmp_path: Path) -> None:
    """Without byte fallback a character model holds the specials and the corpus's characters only (as
    nanoGPT's character vocabulary), every training character round-trips, and an unseen one is <unk>."""
    text = "To be, or not to be: that is the question.\nWhether 'tis nobler in the mind to suffer\n" * 20
    (tmp_path / "play.txt").write_text(text, encoding="utf-8")
    base = dict(model_type="char", vocab_size=1000, n_sentinels=0, valid_fraction=0.0)
    closed = tokenize_corpus(
        [tmp_path / "play.txt"], tmp_path / "closed", TokenizeConfig(**base, byte_fallback=False)
    )  # type: ignore[arg-type]
    bytes_ = tokenize_corpus([tmp_path / "play.txt"], tmp_path / "bytes", TokenizeConfig(**base))  # type: ignore[arg-type]
    characters = len(set(text))
    assert closed.vocab_size == Specials(n_sentinels=0).first_ordinary + characters
    assert bytes_.vocab_size == closed.vocab_size - 1 + 256  # there the line break is byte piece <0x0A>
    tok = TokenStore.open(tmp_path / "closed").tokenizer
    assert not tok.byte_fallback and TokenStore.open(tmp_path / "bytes").tokenizer.byte_fallback
    assert json.loads((tmp_path / "closed" / "meta.json").read_text())["tokenizer"]["byte_fallback"] is False
    assert all_docs(TokenStore.open(tmp_path / "closed")) == [text]
    assert tok.decode(tok.encode(text)) == text and Specials(n_sentinels=0).unk not in tok.encode(text)
    assert tok.encode("bé\u2581") == [tok.encode("b")[0], tok.specials.unk, tok.specials.unk]
    assert closed.unknown == 0
    # Reused on text with characters it has no piece for: each is one <unk>, counted per split.
    (tmp_path / "accents.txt").write_text("to bé, or ñot", encoding="utf-8")
    reused = tokenize_corpus(
        [tmp_path / "accents.txt"], tmp_path / "r", reuse(tmp_path / "closed", valid_fraction=0.0)
    )
    assert reused.unknown == 2
    assert json.loads((tmp_path / "r" / "meta.json").read_text())["splits"]["train"]["unknown"] == 2
    with pytest.raises(UserError, match="use at least 15"):
        tokenize_corpus(
            [tmp_path / "play.txt"],
            tmp_path / "x",
            TokenizeConfig(**{**base, "vocab_size": 14}, byte_fallback=False),
        )  # type: ignore[arg-type]


@pytest.mark.parametrize("model_type", ["char", "unigram", "bpe"])
def test_closed_alphabet_too_small_says_the_size_that_fits(tmp_path: Path, model_type: str) -> None:
    """At the minimum the specials allow, a corpus's characters do not fit without byte fallback: the
    error names the size that does (sentencepiece's char trainer said nothing, and one piece short it
    silently dropped a character), and that size trains a lossless vocabulary."""
    text = "To be, or not to be: that is the question.\nWhether 'tis nobler\tin the mind\r\n" * 5
    (tmp_path / "play.txt").write_text(text, encoding="utf-8")
    first = Specials(n_sentinels=0).first_ordinary
    needed = first + len(set(text))
    base = dict(model_type=model_type, n_sentinels=0, valid_fraction=0.0, byte_fallback=False)
    for size in (first + 1, needed - 1):
        with pytest.raises(UserError) as refused:
            tokenize_corpus([tmp_path / "play.txt"], tmp_path / "x", TokenizeConfig(**base, vocab_size=size))  # type: ignore[arg-type]
        assert f"pass --vocab-size {needed} or more" in str(refused.value), refused.value
        assert not (tmp_path / "x").exists()
    tokenize_corpus([tmp_path / "play.txt"], tmp_path / "ok", TokenizeConfig(**base, vocab_size=needed))  # type: ignore[arg-type]
    tok = TokenStore.open(tmp_path / "ok").tokenizer
    assert tok.decode(tok.encode(text)) == text and tok.specials.unk not in tok.encode(text)


def test_sentencepiece_failure_without_a_message_still_says_something() -> None:
    from objtrain.data.tokenizer import _training_error

    said = _training_error("INTERNAL: src/char_model_trainer.cc(39) [(vocab_size) >= (0)] ", 15)
    assert said == "tokenizer training failed: sentencepiece's check (vocab_size) >= (0) failed"
    assert not _training_error("", 15).endswith(": ")


def test_token_dtype_widens_for_big_vocabularies() -> None:
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32


def test_store_open_rejects_damage(tmp_path: Path, corpus_dir: Path, model_file: Path) -> None:
    tokenize_corpus([corpus_dir], tmp_path / "s", reuse(model_file))
    with pytest.raises(UserError, match="objtrain tokenize"):
        TokenStore.open(tmp_path / "missing")
    meta_path = tmp_path / "s" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["format_version"] = 99
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"format_version 99.*objtrain tokenize"):
        TokenStore.open(tmp_path / "s")
    meta["format_version"] = 1
    meta_path.write_text(json.dumps(meta))
    bin_path = tmp_path / "s" / "train.bin"
    bin_path.write_bytes(bin_path.read_bytes()[:-2])
    with pytest.raises(UserError, match="damaged"):
        TokenStore.open(tmp_path / "s").split("train")


def documents_by_lines(text: str, mode: str) -> list[str]:
    """The definition, line by line: a document is a run of non-blank lines (`line`: one non-blank line),
    without the line break (\\n or \\r\\n) that ends its last line."""
    docs, paragraph = [], []
    for line in [*re.split(r"(?<=\n)", text), ""]:  # a final blank line ends the last paragraph
        if line.strip():
            paragraph.append(line)
            if mode == "blank-line":
                continue
        if paragraph:
            docs.append("".join(paragraph))
            paragraph = []
    out = []
    for doc in docs:
        doc = doc[:-1] if doc.endswith("\n") else doc
        out.append(doc[:-1] if doc.endswith("\r") else doc)
    return out


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="ab \t\r\n\x0c", max_size=60), block=st.integers(1, 8))
def test_block_splitting_matches_line_by_line_definition(text: str, block: int) -> None:
    for mode in ("line", "blank-line"):
        stream = io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8", newline="\n")
        assert list(sources.split_text(stream, mode, block)) == documents_by_lines(text, mode), mode  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda m: m.pop("dtype"), "no usable 'dtype'"),
        (lambda m: m.update(dtype="banana"), "no usable 'dtype'"),
        (lambda m: m.pop("splits"), "no 'splits' section"),
        (lambda m: m["splits"]["valid"].update(documents="17"), "no usable 'documents' for split 'valid'"),
        (lambda m: m["tokenizer"].pop("hash"), "no tokenizer 'hash'"),
        (lambda m: m.update(tokenizer="tok.model"), "no 'tokenizer' section"),
        (lambda m: m.pop("specials"), "no 'specials' section"),
        (lambda m: m.update(vocab_size=-1), "no usable 'vocab_size'"),
    ],
)
def test_store_open_names_a_damaged_meta_field(
    tmp_path: Path, corpus_dir: Path, model_file: Path, edit: object, fragment: str
) -> None:
    tokenize_corpus([corpus_dir], tmp_path / "s", reuse(model_file))
    meta_path = tmp_path / "s" / "meta.json"
    meta = json.loads(meta_path.read_text())
    edit(meta)  # type: ignore[operator]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(UserError, match=rf"meta.json has {re.escape(fragment)}.*damaged.*objtrain tokenize"):
        TokenStore.open(tmp_path / "s").split("valid")


def test_offsets_that_go_back_are_damage(tmp_path: Path, corpus_dir: Path, model_file: Path) -> None:
    tokenize_corpus([corpus_dir], tmp_path / "s", reuse(model_file, valid_fraction=0.3))
    idx = tmp_path / "s" / "train.idx"
    offsets = np.fromfile(idx, dtype="<i8")
    offsets[1] = -5  # first and last still right
    offsets.tofile(idx)
    with pytest.raises(UserError, match=r"train\.idx does not match its tokens"):
        TokenStore.open(tmp_path / "s").split("train")


def test_offsets_are_checked_in_chunks_without_missing_a_step_back_at_a_boundary() -> None:
    """Opening a split checks its offsets a chunk at a time (no temporary the size of millions of
    documents): a step back anywhere, across a chunk boundary too, is still found."""
    good = np.array([0, 0, 1, 5, 5, 6, 9, 9, 12, 20], dtype=np.int64)  # empty documents are fine
    assert _non_decreasing(good, chunk=4) and _non_decreasing(good, chunk=1)
    for k in range(1, len(good)):
        bad = good.copy()
        bad[k] = bad[k - 1] - 1
        assert not _non_decreasing(bad, chunk=4), k
        assert not _non_decreasing(bad, chunk=3), k


def test_pieces_join_back_and_cut_before_a_word() -> None:
    from objtrain.data.sources import pieces

    text = "alpha  beta\tgamma delta " * 50 + "x" * 300
    parts = list(pieces(text, 64))
    assert "".join(parts) == text and all(len(p) <= 64 for p in parts)
    cut_in_words = [i for i, p in enumerate(parts) if i and not p.startswith("x")]
    assert cut_in_words and all(parts[i][0] == " " and not parts[i - 1][-1].isspace() for i in cut_in_words)
    assert list(pieces("short", 64)) == ["short"]


def test_a_document_longer_than_a_piece_is_one_document_with_the_whole_texts_tokens(
    tmp_path: Path, model_file: Path, tokenizer: Tokenizer, tricky: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long document is encoded piece by piece (bounded memory), yet stored as the one document it is,
    with the tokens of the whole text where the pieces are cut before words."""
    import objtrain.data.tokenize as tokenize_module

    words = " ".join(f"word{i % 97} and more" for i in range(3000))
    (tmp_path / "long.txt").write_text(words + tricky, encoding="utf-8")
    (tmp_path / "short.txt").write_text("a short one", encoding="utf-8")
    monkeypatch.setattr(tokenize_module, "PIECE_CHARS", 500)
    store_path = tmp_path / "store"
    tokenize_corpus(
        [tmp_path / "long.txt", tmp_path / "short.txt"], store_path, reuse(model_file, valid_fraction=0)
    )
    store = TokenStore.open(store_path)
    train = store.split("train")
    assert len(train) == 2 and sorted(all_docs(store)) == sorted([words + tricky, "a short one"])
    long_doc = next(train.doc(i) for i in range(2) if len(train.doc(i)) > 100)
    assert list(long_doc[: len(tokenizer.encode(words)) - 5]) == tokenizer.encode(words)[:-5]
    assert store.meta["splits"]["train"]["bytes"] == len((words + tricky).encode()) + len("a short one")


def test_a_fifo_and_a_non_utf8_file_name_are_listed_validly(tmp_path: Path, model_file: Path) -> None:
    """A FIFO inside an input folder is listed under `skipped` (never opened: that would wait for ever), and
    a file name that is not UTF-8 is stored in meta.json as valid UTF-8 (its bytes spelled `\\xff`)."""
    import json
    import os

    root = tmp_path / "in"
    root.mkdir()
    (root / "a.txt").write_text("alpha")
    os.mkfifo(root / "pipe.txt")
    odd = os.fsdecode(b"caf\xff.txt")
    (root / odd).write_bytes(b"\xff\xfe not text")  # skipped: not UTF-8, under a name that is not either
    summary = tokenize_corpus([root], tmp_path / "s", reuse(model_file, valid_fraction=0.0))
    reasons = {s.path.name: s.reason for s in summary.skipped}
    assert "FIFO" in reasons["pipe.txt"] and odd in reasons
    raw = (tmp_path / "s" / "meta.json").read_bytes()
    meta = json.loads(raw.decode("utf-8"))
    assert "\\udcff" not in raw.decode("utf-8")
    names = [Path(s["path"]).name for s in meta["skipped"]]
    assert sorted(names) == ["caf\\xff.txt", "pipe.txt"]
