"""An output that cannot be written (a read-only mount, no permission, a full disk) is one line and exit 2
in every command that writes, before any long work where it can be known then, and nothing half-written.

As root, permissions do not stop a write: the directory becomes a private read-only (or tiny) tmpfs
through `unshare -m`, as a user meets a read-only mount; otherwise it is made read-only with chmod."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from newcomer_helpers import objtrain_cmd, subprocess_env

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _mount_works(directory: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = f"mount -t tmpfs -o ro tmpfs {shlex.quote(str(directory))}"
    return subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True).returncode == 0


def run_unwritable(directory: Path, *args: object, size: str | None = None) -> subprocess.CompletedProcess:
    """`objtrain ARGS` with `directory` unwritable: read-only, or (`size`, root only) a tmpfs that small."""
    directory.mkdir(parents=True, exist_ok=True)
    cmd = objtrain_cmd(*args)
    if ROOT:
        if not _mount_works(directory):
            pytest.skip(
                "running as root, and `unshare -m` cannot mount here: no way to make a directory unwritable"
            )
        options = f"size={size}" if size else "ro"
        script = f"mount -t tmpfs -o {options} tmpfs {shlex.quote(str(directory))} && exec {shlex.join(cmd)}"
        return subprocess.run(
            ["unshare", "-m", "sh", "-c", script],
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
    if size:
        pytest.skip("a full disk is made with a tiny tmpfs, which needs root")
    directory.chmod(0o555)
    try:
        return subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    finally:
        directory.chmod(0o755)


def assert_one_line(done: subprocess.CompletedProcess, *words: str) -> None:
    err = done.stderr
    assert done.returncode == 2, err[-3000:]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-3000:]
    assert "cannot write" in err and all(w in err for w in words), err


@pytest.fixture
def text(tmp_path: Path, stdlib_texts: list[str]) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(stdlib_texts[:3]), encoding="utf-8")
    return path


def test_tokenize_into_a_read_only_directory(tmp_path: Path, text: Path, small_store: Path) -> None:
    ro = tmp_path / "ro"
    done = run_unwritable(ro, "tokenize", text, "--tokenizer", small_store, "-o", ro / "store")
    assert_one_line(done, str(ro / "store"))
    assert not (ro / "store").exists() and list(ro.iterdir()) == []


def test_tokenize_onto_a_full_disk_leaves_nothing_half_written(tmp_path: Path, small_store: Path) -> None:
    # The store's files outgrow a 64 KiB filesystem part way: the temporary directory goes with the error.
    full = tmp_path / "full"
    big = tmp_path / "big.txt"
    big.write_text("def f(x):\n    return x + 1\n\n" * 40_000, encoding="utf-8")
    done = run_unwritable(full, "tokenize", big, "--tokenizer", small_store, "-o", full / "store", size="64k")
    assert_one_line(done, "No space left on device", "nothing was written")
    assert list(full.iterdir()) == []


def test_pack_into_a_read_only_directory(tmp_path: Path, small_store: Path) -> None:
    ro = tmp_path / "ro"
    done = run_unwritable(ro, "pack", small_store, "--seq-len", "64", "-o", ro / "packed")
    assert_one_line(done, str(ro / "packed"))
    assert list(ro.iterdir()) == []


def test_train_into_a_read_only_directory_is_refused_before_the_model_is_built(
    tmp_path: Path, small_store: Path
) -> None:
    ro = tmp_path / "ro"
    done = run_unwritable(
        ro, "train", small_store, "--objective", "clm", "--model", "debug", "--steps", "2", "--seq-len", "64",
        "--device", "cpu", "-o", ro / "run",
    )  # fmt: skip
    assert_one_line(done, str(ro / "run"), "nothing was written")
    assert list(ro.iterdir()) == []


def test_compare_into_a_read_only_directory(tmp_path: Path, small_store: Path) -> None:
    ro = tmp_path / "ro"
    done = run_unwritable(
        ro, "compare", "fim-vs-clm", "--budget", "tiny", "--data", small_store, "-o", ro / "report"
    )
    assert_one_line(done, str(ro / "report"))
    assert list(ro.iterdir()) == []


def test_results_to_a_full_disk_are_one_line(small_store: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full to stand for a full disk")
    for extra in ([], ["--stats", "--format", "json"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run(
                objtrain_cmd("corrupt", small_store, "--objective", "span", "--n", "2", *extra),
                env=subprocess_env(), stdout=full, stderr=subprocess.PIPE, text=True, timeout=300,
            )  # fmt: skip
        assert_one_line(done, "No space left on device")
