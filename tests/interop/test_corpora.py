"""Corpora as users keep them: Parquet, `datasets` save_to_disk folders, .jsonl.zst/.gz, and malformed
records skipped and counted (refused with --strict)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from objtrain.data.store import TokenStore
from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError

Cli = Callable[..., tuple[int, str, str]]
TEXTS = [
    "def f(x):\n\treturn  x\n",
    "caf\u00e9 \u4e2d\u6587 \U0001f600",
    "  lead and trail  ",
    "a\r\nb\n",
] * 30


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory, tokenizer: Tokenizer) -> Path:
    path = tmp_path_factory.mktemp("model") / "tok.model"
    path.write_bytes(tokenizer.model_proto)
    return path


def documents(path: Path) -> list[str]:
    """Every document of a store, train then valid, in stored order."""
    store = TokenStore.open(path)
    return [
        store.tokenizer.decode(s.doc(i))
        for s in (store.split("train"), store.split("valid"))
        for i in range(len(s))
    ]


def reuse(model_file: Path, **kw: object) -> TokenizeConfig:
    return TokenizeConfig(tokenizer=model_file, valid_fraction=0.0, **kw)  # type: ignore[arg-type]


def test_parquet_streamed_by_row_group_with_nulls_counted(tmp_path: Path, model_file: Path) -> None:
    pa = pytest.importorskip("pyarrow", reason="the 'parquet' extra (pyarrow) is not installed")
    import pyarrow.parquet as pq

    cells = [*TEXTS[:50], None, *TEXTS[50:]]
    pq.write_table(
        pa.table({"id": list(range(len(cells))), "body": cells}), tmp_path / "c.parquet", row_group_size=16
    )
    summary = tokenize_corpus([tmp_path / "c.parquet"], tmp_path / "s", reuse(model_file, text_field="body"))
    assert documents(tmp_path / "s") == TEXTS
    assert summary.bad_records.count == 1
    meta = TokenStore.open(tmp_path / "s").meta
    assert (
        meta["malformed_records"]["count"] == 1 and "row 51" in meta["malformed_records"]["first"][0]["where"]
    )
    with pytest.raises(UserError, match="'body' is null"):
        tokenize_corpus(
            [tmp_path / "c.parquet"], tmp_path / "t", reuse(model_file, text_field="body", strict=True)
        )


def test_parquet_without_the_field_is_one_line(tmp_path: Path, model_file: Path, objtrain_cli: Cli) -> None:
    pa = pytest.importorskip("pyarrow", reason="the 'parquet' extra (pyarrow) is not installed")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": ["x"], "n": [1]}), tmp_path / "c.parquet")
    code, _, err = objtrain_cli(
        "tokenize", tmp_path / "c.parquet", "--tokenizer", model_file, "-o", tmp_path / "s"
    )
    assert code == 2 and "no 'text' column (columns: content, n" in err and "Traceback" not in err, err
    assert not (tmp_path / "s").exists()
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "n.parquet")
    code, _, err = objtrain_cli(
        "tokenize", tmp_path / "n.parquet", "--tokenizer", model_file, "-o", tmp_path / "s"
    )
    assert code == 2 and "column 'text' holds int64, not text" in err, err
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    code, _, err = objtrain_cli(
        "tokenize", tmp_path / "bad.parquet", "--tokenizer", model_file, "-o", tmp_path / "s"
    )
    assert code == 2 and "not a readable Parquet file" in err, err
    assert not (tmp_path / "s").exists()


def test_datasets_save_to_disk_folder(tmp_path: Path, model_file: Path) -> None:
    """The layout `datasets` writes (Arrow IPC stream shards + state.json + dataset_info.json), built here
    with pyarrow alone; the shards are read in state.json's order and the JSON bookkeeping is not text."""
    pa = pytest.importorskip("pyarrow", reason="the 'parquet' extra (pyarrow) is not installed")
    folder = tmp_path / "ds" / "train"
    folder.mkdir(parents=True)
    names = ["data-00001-of-00002.arrow", "data-00000-of-00002.arrow"]  # listed out of name order on purpose
    halves = [TEXTS[:60], TEXTS[60:]]
    for name, texts in zip(names, halves, strict=True):
        table = pa.table({"text": texts, "label": [0] * len(texts)})
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=7):
                writer.write_batch(batch)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names]}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {"text": {"dtype": "string"}}}))
    (tmp_path / "ds" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    summary = tokenize_corpus([tmp_path / "ds"], tmp_path / "s", reuse(model_file))
    assert documents(tmp_path / "s") == TEXTS
    assert summary.n_sources == 2


def test_jsonl_zst_and_gz(tmp_path: Path, model_file: Path) -> None:
    zstandard = pytest.importorskip("zstandard", reason="the 'parquet' extra (zstandard) is not installed")
    body = "".join(json.dumps({"text": t}) + "\n" for t in TEXTS).encode()
    # two frames, the second with a long window: both read through
    half = len(body) // 2
    frames = zstandard.ZstdCompressor().compress(body[:half])
    frames += zstandard.ZstdCompressor(
        compression_params=zstandard.ZstdCompressionParameters.from_level(3, window_log=28)
    ).compress(body[half:])
    (tmp_path / "a.jsonl.zst").write_bytes(frames)
    with gzip.open(tmp_path / "b.jsonl.gz", "wb") as f:
        f.write(body)
    tokenize_corpus([tmp_path / "a.jsonl.zst", tmp_path / "b.jsonl.gz"], tmp_path / "s", reuse(model_file))
    assert documents(tmp_path / "s") == TEXTS + TEXTS
    (tmp_path / "c.jsonl.zst").write_bytes(b"not zstd at all")
    with pytest.raises(UserError, match="unreadable"):
        tokenize_corpus([tmp_path / "c.jsonl.zst"], tmp_path / "t", reuse(model_file))


def test_malformed_jsonl_records_skipped_counted_or_refused(
    tmp_path: Path, model_file: Path, objtrain_cli: Cli
) -> None:
    lines = [json.dumps({"text": t}) for t in TEXTS[:10]]
    lines[3] = json.dumps({"id": 3})
    lines[5] = '{"text": "broken'
    lines[7] = json.dumps({"text": None})
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    code, out, err = objtrain_cli(
        "tokenize", tmp_path / "d.jsonl", "--tokenizer", model_file, "-o", tmp_path / "s"
    )
    assert code == 0, err
    assert "skipped 3 malformed records" in out and f"{tmp_path / 'd.jsonl'}:4" in out
    kept = [t for i, t in enumerate(TEXTS[:10]) if i not in (3, 5, 7)]
    assert sorted(documents(tmp_path / "s")) == sorted(kept)
    meta = TokenStore.open(tmp_path / "s").meta["malformed_records"]
    assert meta["count"] == 3 and [r["where"].rsplit(":", 1)[1] for r in meta["first"]] == ["4", "6", "8"]
    code, _, err = objtrain_cli(
        "tokenize", tmp_path / "d.jsonl", "--tokenizer", model_file, "--strict", "-o", tmp_path / "t"
    )
    assert code == 2 and ":4: no 'text' field" in err and "--strict" in err and not (tmp_path / "t").exists()
    # only malformed records: an empty corpus, which says why
    (tmp_path / "e.jsonl").write_text(json.dumps({"id": 1}) + "\n")
    code, _, err = objtrain_cli(
        "tokenize", tmp_path / "e.jsonl", "--tokenizer", model_file, "-o", tmp_path / "u"
    )
    assert code == 2 and "1 malformed records skipped" in err


def test_did_you_mean_for_mode_format_and_doc_split(
    tmp_path: Path, model_file: Path, objtrain_cli: Cli
) -> None:
    (tmp_path / "a.txt").write_text("hello\n\nworld\n")
    code, _, err = objtrain_cli(
        "tokenize",
        tmp_path / "a.txt",
        "--tokenizer",
        model_file,
        "--doc-split",
        "blankline",
        "-o",
        tmp_path / "s",
    )
    assert code == 2 and "did you mean 'blank-line'?" in err
    assert (
        objtrain_cli("tokenize", tmp_path / "a.txt", "--tokenizer", model_file, "-o", tmp_path / "s")[0] == 0
    )
    code, _, err = objtrain_cli(
        "pack", tmp_path / "s", "--seq-len", "64", "--mode", "bestfti", "-o", tmp_path / "p"
    )
    assert code == 2 and "did you mean 'bestfit'?" in err
    code, _, err = objtrain_cli("corrupt", tmp_path / "s", "--objective", "clm", "--format", "jsnol")
    assert code == 2 and "did you mean 'jsonl'?" in err


def test_did_you_mean_for_eval_skip() -> None:
    from objtrain.evaluation.suite import EvalOptions

    with pytest.raises(UserError, match="did you mean 'probe'"):
        EvalOptions(skip=("probes",))


def test_too_small_to_split_says_the_choices(tmp_path: Path, model_file: Path, objtrain_cli: Cli) -> None:
    """One file is one document: it lands in train, valid is empty, and train says what to do."""
    (tmp_path / "one.txt").write_text("def f():\n    return 1\n\n\ndef g():\n    return 2\n" * 20)
    code, out, err = objtrain_cli(
        "tokenize", tmp_path / "one.txt", "--tokenizer", model_file, "-o", tmp_path / "s"
    )
    assert code == 0 and "valid split is empty" in out, err
    code, _, err = objtrain_cli(
        "train", tmp_path / "s", "--objective", "clm", "--steps", "1", "-o", tmp_path / "r"
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "its 1 documents are too few to split" in err
    assert "--doc-split blank-line" in err and "--doc-split line" in err and "validation.every=-1" in err
    assert not (tmp_path / "r").exists()


def test_train_help_shows_defaults(objtrain_cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # one line per option, whatever the terminal
    code, out, _ = objtrain_cli("train", "--help")
    flat = " ".join(out.split())
    assert code == 0
    assert "300 when no budget is given" in flat  # the default budget
    for shown in ("default: (tiny)", "default: (16)", "default: (0.001)", "default: (auto)"):
        assert shown in flat, shown


def test_real_datasets_save_to_disk(
    tmp_path: Path, model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    datasets = pytest.importorskip("datasets", reason="the 'datasets' package is not installed")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    train = datasets.Dataset.from_dict({"text": TEXTS, "n": list(range(len(TEXTS)))})
    datasets.DatasetDict({"train": train}).save_to_disk(str(tmp_path / "dd"), num_shards={"train": 3})
    summary = tokenize_corpus([tmp_path / "dd"], tmp_path / "s", reuse(model_file))
    assert documents(tmp_path / "s") == TEXTS and summary.n_sources == 3


def test_tokenizer_that_is_not_one_is_one_line(tmp_path: Path, objtrain_cli: Cli) -> None:
    (tmp_path / "a.txt").write_text("hello\n")
    (tmp_path / "junk.model").write_bytes(b"\x00not a model at all")
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE"}}))
    for bad, match in (
        (tmp_path / "junk.model", "is not a sentencepiece model"),
        (tmp_path / "tokenizer.json", "is not a Hugging Face tokenizer"),
    ):
        code, _, err = objtrain_cli("tokenize", tmp_path / "a.txt", "--tokenizer", bad, "-o", tmp_path / "s")
        assert code == 2 and match in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "s").exists()


def test_parquet_without_the_field_inside_a_directory_is_skipped(tmp_path: Path, model_file: Path) -> None:
    pa = pytest.importorskip("pyarrow", reason="the 'parquet' extra (pyarrow) is not installed")
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": TEXTS[:5]}), tmp_path / "in" / "a.parquet")
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "in" / "b.parquet")
    summary = tokenize_corpus([tmp_path / "in"], tmp_path / "s", reuse(model_file))
    assert documents(tmp_path / "s") == TEXTS[:5]
    assert [s.path.name for s in summary.skipped] == ["b.parquet"] and "no 'text' column" in summary.skipped[
        0
    ].reason


def test_missing_extra_is_one_line_naming_it(tmp_path: Path) -> None:
    """Without the optional packages (hidden here), the commands that need them say which extra to install."""
    import subprocess
    import sys

    (tmp_path / "a.parquet").write_bytes(b"PAR1")
    (tmp_path / "b.jsonl.zst").write_bytes(b"x")
    hide = "import sys; sys.modules.update({m: None for m in ('transformers', 'pyarrow', 'zstandard')}); "
    run = "from objtrain.cli import main; sys.argv = ['objtrain', *sys.argv[1:]]; main()"
    for args, extra in (
        (["export", str(tmp_path), "-o", str(tmp_path / "hf")], "objtrain[hf]"),
        (["tokenize", str(tmp_path / "a.parquet"), "-o", str(tmp_path / "s")], "objtrain[parquet]"),
        (["tokenize", str(tmp_path / "b.jsonl.zst"), "-o", str(tmp_path / "s")], "objtrain[parquet]"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", hide + run, *args], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 2 and extra in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["t.txt.zst", "t.jsonl.zst"])
def test_truncated_zst_is_refused_or_skipped_like_gz(
    tmp_path: Path, model_file: Path, objtrain_cli: Cli, name: str
) -> None:
    """zstandard's streaming reader stops quietly where the bytes end: a cut file must not read as a
    shorter corpus. Named, it is refused in one line (exit 2); inside a directory, skipped and listed."""
    zstandard = pytest.importorskip("zstandard", reason="the 'parquet' extra (zstandard) is not installed")
    if name.endswith(".jsonl.zst"):
        body = "".join(json.dumps({"text": f"record {i} " + TEXTS[i % 4]}) + "\n" for i in range(5000))
    else:
        body = "".join(f"Paragraph {i} of a long text file.\n\n" for i in range(5000))
    whole = zstandard.ZstdCompressor(write_checksum=True).compress(body.encode())
    for cut, where in ((len(whole) // 2, "a block"), (len(whole) - 2, "the checksum"), (3, "the header")):
        (tmp_path / name).write_bytes(whole[:cut])
        code, _, err = objtrain_cli(
            "tokenize",
            tmp_path / name,
            "--tokenizer",
            model_file,
            "--doc-split",
            "blank-line",
            "-o",
            tmp_path / "s",
        )
        assert code == 2 and "truncated zstd file" in err and where in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1 and not (tmp_path / "s").exists()
    # the gzip path, for comparison: the same refusal
    (tmp_path / "t.txt.gz").write_bytes(gzip.compress(body.encode())[:-40])
    code, _, err = objtrain_cli(
        "tokenize", tmp_path / "t.txt.gz", "--tokenizer", model_file, "-o", tmp_path / "s"
    )
    assert code == 2 and "Traceback" not in err, err

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / name).write_bytes(whole[: len(whole) // 2])
    (folder / "whole.txt.zst").write_bytes(
        whole if name.endswith(".txt.zst") else zstandard.compress(b"kept\n")
    )
    summary = tokenize_corpus([folder], tmp_path / "d", reuse(model_file))
    assert [s.path.name for s in summary.skipped] == [name]
    assert "truncated zstd file" in summary.skipped[0].reason
    assert summary.n_sources == 1
    skipped = TokenStore.open(tmp_path / "d").meta["skipped"]
    assert name in json.dumps(skipped)


def test_whole_zst_with_skippable_frames_and_checksums_reads_through(
    tmp_path: Path, model_file: Path
) -> None:
    zstandard = pytest.importorskip("zstandard", reason="the 'parquet' extra (zstandard) is not installed")
    skippable = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"meta!"
    frames = skippable + zstandard.ZstdCompressor(write_checksum=True, write_content_size=False).compress(
        "\n\n".join(TEXTS[:10]).encode()
    )
    frames += zstandard.ZstdCompressor(level=19).compress(("\n\n" + "\n\n".join(TEXTS[10:20])).encode())
    (tmp_path / "a.txt.zst").write_bytes(frames)
    tokenize_corpus([tmp_path / "a.txt.zst"], tmp_path / "s", reuse(model_file, doc_split="blank-line"))
    assert len(documents(tmp_path / "s")) == 20
    # a damaged block (reserved type 3) is unreadable, not "truncated"
    one = bytearray(zstandard.ZstdCompressor(write_content_size=False).compress(TEXTS[0].encode() * 50))
    one[6] |= 0b110  # first block header, after magic (4), descriptor (1) and window descriptor (1)
    one[8] = 0xFF  # and a size past the end of the file
    (tmp_path / "bad.txt.zst").write_bytes(bytes(one))
    with pytest.raises(UserError, match="unreadable") as refused:
        tokenize_corpus([tmp_path / "bad.txt.zst"], tmp_path / "b", reuse(model_file))
    assert "truncated" not in str(refused.value)


def test_parquet_memory_does_not_follow_the_file(tmp_path: Path) -> None:
    """pyarrow's pre_buffer (on by default) reads ahead across the whole file and keeps it: Arrow's pool
    then holds about the file's size. Streamed a row group at a time, it holds a few row groups at most."""
    pa = pytest.importorskip("pyarrow", reason="the 'parquet' extra (pyarrow) is not installed")
    import numpy as np
    import pyarrow.parquet as pq

    from objtrain.data import tables
    from objtrain.data.sources import BadRecords

    rng = np.random.default_rng(0)
    texts = ["".join(map(chr, 97 + rng.integers(0, 26, 200))) for _ in range(20_000)]
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"text": texts, "n": np.arange(len(texts))}), path, row_group_size=500, compression="none"
    )
    pool, peak, seen = pa.default_memory_pool(), 0, []
    for i, text in enumerate(tables.iter_texts(path, "parquet", "text", BadRecords())):
        seen.append(text)
        if i % 100 == 0:
            peak = max(peak, pool.bytes_allocated())
    assert seen == texts
    assert peak < path.stat().st_size / 4, (peak, path.stat().st_size)


def test_dataset_dict_keeps_its_own_splits(
    tmp_path: Path, model_file: Path, monkeypatch: pytest.MonkeyPatch, objtrain_cli: Cli
) -> None:
    """A DatasetDict's test rows must not be pooled with train and re-split by hash (they would leak into
    training): train -> train, validation (else test) -> valid, the rest listed as skipped."""
    datasets = pytest.importorskip("datasets", reason="the 'datasets' package is not installed")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    train = [f"train row {i}: " + TEXTS[i] for i in range(100)]
    test = [f"test row {i}: " + TEXTS[i] for i in range(20)]
    validation = [f"validation row {i}" for i in range(10)]
    extra = [f"unsupervised row {i}" for i in range(5)]

    def save(name: str, **splits: list[str]) -> Path:
        parts = {k: datasets.Dataset.from_dict({"text": v}) for k, v in splits.items()}
        datasets.DatasetDict(parts).save_to_disk(str(tmp_path / name))
        return tmp_path / name

    def split_docs(path: Path, split: str) -> list[str]:
        store = TokenStore.open(path)
        part = store.split(split)
        return [store.tokenizer.decode(part.doc(i)) for i in range(len(part))]

    # valid_fraction 0.5 would put half of everything in valid if the hash split were applied
    config = TokenizeConfig(tokenizer=model_file, valid_fraction=0.5)
    summary = tokenize_corpus([save("tt", train=train, test=test)], tmp_path / "s", config)
    assert split_docs(tmp_path / "s", "train") == train and split_docs(tmp_path / "s", "valid") == test
    meta = TokenStore.open(tmp_path / "s").meta
    assert meta["dataset_dicts"] == [
        {"path": str(tmp_path / "tt"), "train": "train", "valid": "test", "unused": []}
    ]
    assert {s["split"] for s in meta["sources"]} == {"train", "valid"} and not summary.skipped

    folder = save("tvu", train=train, validation=validation, test=test, unsupervised=extra)
    tokenize_corpus([folder], tmp_path / "v", config)
    assert split_docs(tmp_path / "v", "train") == train and split_docs(tmp_path / "v", "valid") == validation
    meta = TokenStore.open(tmp_path / "v").meta
    assert meta["dataset_dicts"][0]["valid"] == "validation"
    assert sorted(meta["dataset_dicts"][0]["unused"]) == ["test", "unsupervised"]
    assert not meta["skipped"]

    # only a train split: valid is cut from it by hash, as for any other input
    tokenize_corpus([save("only-train", train=train)], tmp_path / "t", config)
    assert sorted(split_docs(tmp_path / "t", "train") + split_docs(tmp_path / "t", "valid")) == sorted(train)
    assert 0 < len(split_docs(tmp_path / "t", "valid")) < len(train)

    code, out, err = objtrain_cli("tokenize", folder, "--tokenizer", model_file, "-o", tmp_path / "c")
    said = f"DatasetDict {folder}: its own splits kept, train -> train, validation -> valid; left out: test"
    assert code == 0 and said in " ".join(out.split()), out

    # no train split to map: one line
    code, _, err = objtrain_cli(
        "tokenize", save("nt", test=test), "--tokenizer", model_file, "-o", tmp_path / "n"
    )
    assert code == 2 and "without a 'train' split (splits: test)" in err and "Traceback" not in err, err
    assert not (tmp_path / "n").exists()
