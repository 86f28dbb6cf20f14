"""`objtrain tokenize` / `objtrain pack` from the command line: bad input gives one line, exit code 2, no
traceback and no output left behind; good input prints a summary."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

Result = tuple[int, str, str]
Cli = Callable[..., Result]


def assert_refused(result: Result, fragment: str, *left_out: Path) -> None:
    code, _, err = result
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert fragment in lines[0], err
    assert "Traceback" not in err
    for path in left_out:
        assert not path.exists(), path
        assert not list(path.parent.glob(f".{path.name}.*")), "a temporary output was left behind"


@pytest.fixture
def cli(objtrain_cli: Cli) -> Cli:
    return objtrain_cli


def test_tokenize_then_pack_prints_summaries(
    cli: Cli, tmp_path: Path, corpus_dir: Path, model_file: Path
) -> None:
    code, out, err = cli("tokenize", corpus_dir, "--tokenizer", model_file, "--doc-split", "blank-line",
                         "-o", tmp_path / "s")  # fmt: skip
    assert code == 0, err
    assert "documents" in out and "bytes/token" in out and "MB/s" in out
    code, out, err = cli("pack", tmp_path / "s", "--seq-len", "64", "--mode", "concat", "-o", tmp_path / "p")
    assert code == 0, err
    assert "rows" in out and "fill" in out and "documents split" in out and "padding tokens" in out


def test_missing_path(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "s"
    assert_refused(cli("tokenize", tmp_path / "nope", "-o", out), "input not found", out)
    assert_refused(cli("pack", tmp_path / "nope", "-o", tmp_path / "p"), "not a token store", tmp_path / "p")


def test_symbolic_link_loop_or_dangling_link_as_input(
    cli: Cli, tmp_path: Path, corpus_dir: Path, model_file: Path
) -> None:
    """Named, a link that leads nowhere is one line (not Path.resolve()'s RuntimeError); inside a
    directory it is skipped and listed like any unreadable file."""
    (tmp_path / "la").symlink_to(tmp_path / "lb")
    (tmp_path / "lb").symlink_to(tmp_path / "la")
    (tmp_path / "gone").symlink_to(tmp_path / "nothing-here")
    out = tmp_path / "s"
    with_model = ("--tokenizer", model_file)
    assert_refused(cli("tokenize", tmp_path / "la", *with_model, "-o", out), "is a symbolic-link loop", out)
    assert_refused(cli("tokenize", tmp_path / "la", "-o", out), "is a symbolic-link loop", out)
    assert_refused(cli("tokenize", corpus_dir, tmp_path / "la", "-o", out), "is a symbolic-link loop", out)
    assert_refused(cli("tokenize", tmp_path / "gone", *with_model, "-o", out), "which does not exist", out)
    loop_tokenizer = ("--tokenizer", tmp_path / "la")
    assert_refused(cli("tokenize", corpus_dir, *loop_tokenizer, "-o", out), "--tokenizer", out)

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("some text\n")
    (folder / "loop.txt").symlink_to(tmp_path / "la")
    (folder / "dangling.txt").symlink_to(tmp_path / "nothing-here")
    code, _, err = cli("tokenize", folder, *with_model, "-o", out)
    assert code == 0, err
    skipped = json.loads((out / "meta.json").read_text())["skipped"]
    assert sorted(Path(s["path"]).name for s in skipped) == ["dangling.txt", "loop.txt"], skipped


def test_empty_corpus(cli: Cli, tmp_path: Path, model_file: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "empty.txt").write_text("")
    (tmp_path / "in" / "blank.jsonl").write_text("\n\n")
    out = tmp_path / "s"
    assert_refused(cli("tokenize", tmp_path / "in", "-o", out), "empty corpus", out)
    with_model = ("--tokenizer", model_file)
    assert_refused(cli("tokenize", tmp_path / "in", *with_model, "-o", out), "empty corpus", out)
    (tmp_path / "none").mkdir()
    assert_refused(cli("tokenize", tmp_path / "none", "-o", out), "empty corpus", out)


def test_binary_and_non_utf8_files(cli: Cli, tmp_path: Path, model_file: Path) -> None:
    root = tmp_path / "in"
    root.mkdir()
    (root / "good.txt").write_text("plain text")
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (root / "latin1.txt").write_bytes("naïve".encode("latin-1"))
    code, out, err = cli("tokenize", root, "--tokenizer", model_file, "-o", tmp_path / "s")
    assert code == 0, err
    assert "skipped 2" in out
    assert len(json.loads((tmp_path / "s" / "meta.json").read_text())["skipped"]) == 2
    out_path = tmp_path / "t"
    assert_refused(cli("tokenize", root / "latin1.txt", "-o", out_path), "not UTF-8", out_path)
    assert_refused(cli("tokenize", root / "image.png", "-o", out_path), "binary file", out_path)


def test_malformed_jsonl_names_file_and_line(cli: Cli, tmp_path: Path, model_file: Path) -> None:
    """With --strict; without it malformed records are skipped and counted (tests/interop)."""
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "ok"}\n\n{"text": "broken\n')
    out = tmp_path / "s"
    args = ("tokenize", path, "--tokenizer", model_file, "--strict", "-o", out)
    assert_refused(cli(*args), f"{path}:3: malformed JSON", out)
    path.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    assert_refused(cli(*args), f"{path}:2: no 'text' field", out)


def test_existing_output_needs_force(cli: Cli, tmp_path: Path, corpus_dir: Path, model_file: Path) -> None:
    out = tmp_path / "s"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert_refused(cli("tokenize", corpus_dir, "--tokenizer", model_file, "-o", out), "--force")
    assert (out / "keep.txt").read_text() == "mine"
    # --force replaces an earlier store, never a folder of the user's that happens to have the name
    store = tmp_path / "src"
    assert cli("tokenize", corpus_dir, "--tokenizer", model_file, "-o", store)[0] == 0
    for command in (("tokenize", corpus_dir, "--tokenizer", model_file), ("pack", store, "--seq-len", "64")):
        assert_refused(cli(*command, "-o", out, "--force"), "is not an objtrain store")
        assert (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    code, _, err = cli("tokenize", corpus_dir, "--tokenizer", model_file, "-o", out, "--force")  # empty: fine
    assert code == 0, err
    code, _, err = cli("tokenize", corpus_dir, "--tokenizer", model_file, "-o", out, "--force")  # a store
    assert code == 0 and (out / "meta.json").is_file(), err
    (tmp_path / "p").mkdir()
    assert_refused(cli("pack", out, "--seq-len", "64", "-o", tmp_path / "p"), "--force")


def test_vocabulary_larger_than_corpus(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "tiny.txt"
    path.write_text("a tiny corpus with few words\n" * 20)
    out = tmp_path / "s"
    assert_refused(cli("tokenize", path, "--threads", "-1", "-o", out), "--threads must be >= 0", out)
    assert_refused(cli("tokenize", path, "--vocab-size", "5000", "--valid-fraction", "0", "-o", out),
                   "the largest vocabulary it supports is", out)  # fmt: skip


def test_seq_len_too_small(cli: Cli, tmp_path: Path, corpus_dir: Path, model_file: Path) -> None:
    code, _, err = cli("tokenize", corpus_dir, "--tokenizer", model_file, "-o", tmp_path / "s")
    assert code == 0, err
    packed = tmp_path / "p"
    assert_refused(cli("pack", tmp_path / "s", "--seq-len", "1", "-o", packed), "too small", packed)


def test_installed_command_exits_2_without_traceback(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("objtrain")
    if not exe.is_file():
        pytest.skip(f"{exe} not installed")
    result = subprocess.run(
        [str(exe), "tokenize", str(tmp_path / "nope"), "-o", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: input not found: {tmp_path / 'nope'}"]
    assert not (tmp_path / "s").exists()


def test_tokenizer_options_do_not_go_with_a_reused_tokenizer(
    cli: Cli, tmp_path: Path, corpus_dir: Path, model_file: Path
) -> None:
    out = tmp_path / "s"
    for flag, value in (("--vocab-size", "1000"), ("--model-type", "bpe"), ("--train-bytes", "1000")):
        args = ("tokenize", corpus_dir, "--tokenizer", model_file, flag, value, "-o", out)
        assert_refused(cli(*args), f"{flag} shape a new tokenizer", out)
    args = ("tokenize", corpus_dir, "--tokenizer", model_file, "--no-byte-fallback", "-o", out)
    assert_refused(cli(*args), "--no-byte-fallback shape a new tokenizer", out)
    code, _, err = cli("tokenize", corpus_dir, "--tokenizer", model_file, "-o", out)  # defaults: fine
    assert code == 0, err
