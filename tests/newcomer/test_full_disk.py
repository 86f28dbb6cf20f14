"""A disk that fills while a command writes: one line and exit 2 naming what is kept (the last good
checkpoint), the run's lock let go, nothing half-written, and a new run that could not save its first
checkpoint leaves nothing behind.

The disk fills where the real one does: safetensors' writer, which reports it in its own exception type
("I/O error: No space left on device (os error 28)"), as do Hugging Face's tokenizers. As root, where a
private tmpfs can be mounted (`unshare -m`), the same is checked on a really full disk."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest
import safetensors.torch
from newcomer_helpers import Result
from safetensors import SafetensorError

from objtrain.io import OutputLock, Unwritable, atomic_dir, atomic_file, save_tensors
from objtrain.training import checkpoint as ckpt

FULL = "Error while serializing: I/O error: No space left on device (os error 28)"
TRAIN = ("--objective", "clm", "--model", "debug", "--seq-len", "64", "--batch-size", "4",
         "validation.every=-1", "logging.sample=false", "workers=0")  # fmt: skip


def fill_after(monkeypatch: pytest.MonkeyPatch, fits: int) -> None:
    """The disk fills after `fits` safetensors files were written (each checkpoint writes two)."""
    real = safetensors.torch.save_file
    calls = {"n": 0}

    def save_file(tensors, filename, metadata=None):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] > fits:
            Path(filename).write_bytes(b"\0" * 100)  # a torn file, as the real writer leaves one
            raise SafetensorError(FULL)
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)


def assert_one_line(done: Result, *words: str) -> str:
    """Exit 2 and one error line, the last (a run's progress lines come before it), without a traceback."""
    code, _, err = done
    assert code == 2, err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert "Traceback" not in err and len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
    assert "No space left on device" in err and all(w in err for w in words), err
    return err


def assert_released(run: Path) -> None:
    OutputLock(run).acquire().release()  # another process may take the run now


def test_save_tensors_gives_a_full_disk_its_errno(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fill_after(monkeypatch, 0)
    import torch

    with pytest.raises(OSError) as failed:
        save_tensors({"w": torch.zeros(3)}, tmp_path / "w.safetensors")
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(tmp_path / "w.safetensors")


def test_a_rust_librarys_full_disk_inside_an_output_is_one_line(tmp_path: Path) -> None:
    # Hugging Face's tokenizers raise a bare Exception with the errno in its text
    for make in (lambda p: atomic_dir(p), lambda p: atomic_file(p)):
        out = tmp_path / "out"
        with pytest.raises(Unwritable) as failed, make(out):
            raise Exception("No space left on device (os error 28)")
        assert str(failed.value) == f"cannot write {out}: No space left on device (nothing was written)"
        assert list(tmp_path.iterdir()) == []
    with pytest.raises(Exception, match="os error 2\\)"), atomic_dir(tmp_path / "out"):
        raise Exception("No such file or directory (os error 2)")  # not a write that cannot happen: a bug


def test_a_full_disk_mid_run_names_the_last_good_checkpoint_and_lets_the_run_go(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    fill_after(monkeypatch, 2)  # the first checkpoint (model + optimizer) fits, the second does not
    err = assert_one_line(cli("train", small_store, *TRAIN, "--steps", "6", "--save-every", "2", "-o", run))
    kept = run / "checkpoints" / "step-00000002"
    assert f"the last good checkpoint is {kept}" in err
    assert ckpt.latest_checkpoint(run) == kept and ckpt.is_complete(kept)
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")] == []
    assert_released(run)
    # --resume onto the still full disk: the same line, the same checkpoint kept
    fill_after(monkeypatch, 0)
    err = assert_one_line(cli("train", small_store, *TRAIN, "--steps", "6", "--save-every", "2", "-o", run,
                              "--resume"))  # fmt: skip
    assert f"the last good checkpoint is {kept}" in err and ckpt.latest_checkpoint(run) == kept
    assert not (run / "checkpoints" / "step-00000004").exists()
    assert_released(run)


def test_a_new_run_that_cannot_save_its_first_checkpoint_leaves_nothing(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_after(monkeypatch, 0)
    run = tmp_path / "runs" / "deep" / "run"  # runs/ and runs/deep are made for it: they go too
    err = assert_one_line(cli("train", small_store, *TRAIN, "--steps", "2", "-o", run))
    assert f"no checkpoint was saved; {run} was removed" in err
    assert list(tmp_path.iterdir()) == []
    # a run that was there before (--force) is the user's: kept, emptied of checkpoints, and let go
    existing = tmp_path / "existing"
    monkeypatch.undo()
    assert cli("train", small_store, *TRAIN, "--steps", "1", "-o", existing)[0] == 0
    fill_after(monkeypatch, 0)
    err = assert_one_line(cli("train", small_store, *TRAIN, "--steps", "2", "-o", existing, "--force"))
    assert "no checkpoint was saved" in err and "removed" not in err and existing.is_dir()
    assert_released(existing)
    # a directory made beside the failed run meanwhile is not removed with it
    beside = tmp_path / "runs" / "other"
    beside.mkdir(parents=True)
    assert_one_line(cli("train", small_store, *TRAIN, "--steps", "2", "-o", tmp_path / "runs" / "new"))
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["other"]


def test_export_onto_a_full_disk_is_one_line_and_writes_nothing(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    assert cli("train", small_store, *TRAIN, "--steps", "1", "-o", run)[0] == 0
    fill_after(monkeypatch, 0)
    out = tmp_path / "hf"
    assert_one_line(cli("export", run, "-o", out), str(out), "nothing was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_compare_onto_a_full_disk_is_one_line(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_after(monkeypatch, 0)
    report = tmp_path / "report"
    err = assert_one_line(
        cli("compare", "fim-vs-clm", "--budget", "tiny", "--data", small_store, "-o", report)
    )
    assert "--resume" in err
    assert_released(report)


# --- a really full disk (root, where a private tmpfs can be mounted) ------------------------------------


def test_train_onto_a_really_full_disk(tmp_path: Path, small_store: Path) -> None:
    from test_unwritable import run_unwritable

    disk = tmp_path / "disk"
    args = ("train", small_store, *TRAIN, "--steps", "30", "--save-every", "1", "--keep", "100")
    done = run_unwritable(disk, *args, "-o", disk / "r", size="2m")  # a few checkpoints fit, then no more
    err = assert_one_line((done.returncode, done.stdout, done.stderr), "(the last good checkpoint is")
    assert f"{disk / 'r' / 'checkpoints' / 'step-'}" in err.splitlines()[-1]
    done = run_unwritable(disk, *args, "-o", disk / "r", size="300k")  # not even the first one fits
    assert_one_line(
        (done.returncode, done.stdout, done.stderr), f"no checkpoint was saved; {disk / 'r'} was removed"
    )
