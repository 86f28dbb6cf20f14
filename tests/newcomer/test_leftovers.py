"""Nothing half-written, nothing left behind, nothing of the user's replaced but the output itself."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from newcomer_helpers import Result, objtrain_cmd, subprocess_env

from objtrain.io import atomic_dir, atomic_file, clean_stale

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SMALL = ("--vocab-size", "800", "--doc-split", "blank-line")  # fits one small module (textwrap.py)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_force_over_a_file_leaves_no_old_copy(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_text("the user's file")
    with atomic_dir(out, force=True) as tmp:
        (tmp / "x").write_text("new")
    assert (out / "x").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_stale_temporaries_of_a_dead_process_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    stale_dir = tmp_path / f".out.{dead_pid()}-abc123xy.tmp"
    stale_dir.mkdir()
    (stale_dir / "tokens.bin").write_bytes(b"x" * 100)
    stale_file = tmp_path / f".out.{dead_pid()}-zz9.tmp"
    stale_file.write_bytes(b"x")
    live = tmp_path / f".out.{os.getppid()}-live0001.tmp"  # a process that still runs: maybe another writer
    live.mkdir()
    other = tmp_path / f".other.{dead_pid()}-abc123xy.tmp"  # another output's: not ours to touch
    other.mkdir()
    users = tmp_path / ".out.notes.tmp"  # does not follow the pattern: the user's
    users.write_text("mine")
    with atomic_dir(out) as tmp:
        (tmp / "x").write_text("new")
    assert not stale_dir.exists() and not stale_file.exists()
    assert live.exists() and other.exists() and users.read_text() == "mine"
    assert (out / "x").exists()


def test_atomic_file_cleans_its_own_stale_temporaries(tmp_path: Path) -> None:
    stale = tmp_path / f".f.json.{dead_pid()}-q1w2e3r4.tmp"
    stale.write_text("{")
    with atomic_file(tmp_path / "f.json", "w") as handle:
        handle.write("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_an_old_copy_cut_off_mid_replace_is_put_back(tmp_path: Path) -> None:
    # A replace killed between its two renames: the previous output sits at .out.old, out is missing.
    old = tmp_path / ".out.old"
    old.mkdir()
    (old / "data").write_text("the user's store")
    assert clean_stale(tmp_path / "out") == []
    assert (tmp_path / "out" / "data").read_text() == "the user's store" and not old.exists()
    # Killed after both renames: the new output is in place and the old copy goes.
    old.mkdir()
    assert clean_stale(tmp_path / "out") == [old] and not old.exists()


def _assert_refused(result: Result, fragment: str) -> None:
    code, _, err = result
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert fragment in err, err


def test_outputs_that_would_replace_the_cwd_or_inputs_are_refused(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "keep").write_text("mine")
    text = work / "sub" / "in.txt"
    text.write_text("def f(x):\n    return x\n" * 200)
    monkeypatch.chdir(work / "sub")
    _assert_refused(cli("tokenize", text, "-o", ".", "--force", "--vocab-size", "600"), "current directory")
    _assert_refused(
        cli("tokenize", text, "-o", "..", "--force", "--vocab-size", "600"), "parent of the current"
    )
    monkeypatch.chdir(tmp_path)
    _assert_refused(
        cli("tokenize", text, "-o", work, "--force", "--vocab-size", "600"), "would replace the input"
    )
    _assert_refused(cli("pack", small_store, "-o", small_store.parent, "--force"), "would replace the input")
    assert sorted(p.name for p in work.iterdir()) == ["keep", "sub"]
    assert sorted(p.name for p in (work / "sub").iterdir()) == ["in.txt"]
    assert (small_store / "meta.json").is_file()


def test_tokenize_with_force_replaces_a_store_not_a_file_and_leaves_nothing_else(
    cli: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copy(STDLIB / "textwrap.py", "in.txt")
    Path("out").write_text("a file where the store goes")
    code, _, err = cli("tokenize", "in.txt", "-o", "out", "--force", *SMALL)
    assert code == 2 and "is not an objtrain store" in err, err  # someone's file, not an earlier output
    assert Path("out").read_text() == "a file where the store goes"
    Path("out").unlink()
    for _ in range(2):  # the second run replaces the first one's store
        code, _, err = cli("tokenize", "in.txt", "-o", "out", "--force", *SMALL)
        assert code == 0, err
        assert sorted(os.listdir(".")) == ["in.txt", "out"] and Path("out/meta.json").is_file()


@pytest.mark.slow
def test_a_sigkilled_tokenize_leaves_a_temporary_that_the_next_run_removes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(
        objtrain_cmd("tokenize", "--corpus", "stdlib", "--vocab-size", "1000", "--train-bytes", "200000",
                     "--threads", "1", "-o", out),
        env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    temps: list[Path] = []
    while not temps and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
        temps = [p for p in tmp_path.iterdir() if p.name.startswith(".out.") and p.name.endswith(".tmp")]
    assert temps, "the run never started writing"
    time.sleep(0.3)  # let it write into the temporary
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert all(t.exists() for t in temps) and not out.exists()  # what SIGKILL leaves: nobody can clean up

    small = tmp_path / "small.txt"
    shutil.copy(STDLIB / "textwrap.py", small)
    done = subprocess.run(
        objtrain_cmd("tokenize", small, *SMALL, "-o", out),
        env=subprocess_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "small.txt"]


def test_a_loop_of_symbolic_links_as_output_is_one_line_for_every_command(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    quiet = ("validation.every=-1", "logging.sample=false", "workers=0")
    assert cli("train", small_store, "--objective", "clm", "--model", "debug", "--seq-len", "32",
               "--batch-size", "2", "--steps", "1", *quiet, "-o", run)[0] == 0  # fmt: skip
    text = tmp_path / "corpus.txt"
    text.write_text("def f(x):\n    return x\n", encoding="utf-8")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    commands = {
        "tokenize": ("tokenize", text, "--tokenizer", small_store),
        "pack": ("pack", small_store, "--seq-len", "64"),
        "export": ("export", run),
        "train": ("train", small_store, "--objective", "clm", "--model", "debug", "--steps", "1", *quiet),
        "compare": ("compare", "fim-vs-clm", "--budget", "tiny", "--data", small_store),
    }
    before = sorted(p.name for p in tmp_path.iterdir())
    for name, args in commands.items():
        for out in (tmp_path / "a", tmp_path / "a" / "sub"):  # the loop as the output, or above it
            for force in ((), ("--force",)):
                code, _, err = cli(*args, "-o", out, *force)
                assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, (
                    name,
                    err,
                )
                assert f"output {out} goes through a loop of symbolic links" in err, (name, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
