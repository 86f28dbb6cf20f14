"""What a run says when no one watches a terminal: the plain progress line (logs, CI, pipes) carries the
facts the terminal bar shows, and TensorBoard asked for without its package is said once, while the
default (event files when the package is there) is silent without it."""

from __future__ import annotations

import io
import re
import sys
import types
from pathlib import Path

import pytest
from rich.console import Console

from objtrain.training.config import TrainConfig
from objtrain.training.logger import Progress, TensorBoard
from objtrain.training.loop import train


def _piped() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=False, width=200, highlight=False), buffer


def test_a_piped_run_prints_step_of_total_grad_norm_elapsed_and_eta(
    train_store: Path, tmp_path: Path, small_config
) -> None:
    console, buffer = _piped()
    cfg = small_config(train_store, budget={"steps": 4}, logging={"every": 2})
    train(cfg, tmp_path / "run", console=console)
    lines = [line for line in buffer.getvalue().splitlines() if line.startswith("step ")]
    # steps 1 (the first), 2 and 4 (every 2, and the last)
    assert [line.split()[1] for line in lines] == ["1/4", "2/4", "4/4"], lines
    for line in lines:
        assert re.search(r"grad [0-9.e+-]+", line), line
        assert re.search(r"elapsed \d+:\d\d", line), line
        assert re.search(r"ETA (\d+:\d\d|\?)", line), line
    assert lines[-1].endswith("ETA 0:00")


def test_progress_line_counts_from_a_resumed_step() -> None:
    console, buffer = _piped()
    progress = Progress(console, total=10, start=6, every=5)
    record = {"loss": 2.0, "lr": 1e-3, "tokens_per_s": 100.0, "data_wait_frac": 0.0, "grad_norm": 0.5}
    for step in (7, 8, 9, 10):
        progress.update(record | {"step": step})
    lines = buffer.getvalue().splitlines()
    # the first resumed step, then the logging interval and the last
    assert [line.split()[1] for line in lines] == ["7/10", "10/10"]
    assert "grad 0.5" in lines[0]


def test_tensorboard_on_without_its_package_is_said_once(
    train_store: Path, tmp_path: Path, small_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as without the package
    monkeypatch.setattr(TensorBoard, "_said", False)
    cfg = small_config(train_store, budget={"steps": 1}, logging={"tensorboard": True})
    console, buffer = _piped()
    train(cfg, tmp_path / "one", console=console)
    assert buffer.getvalue().count("tensorboard package is not installed") == 1
    assert "pip install 'objtrain[tensorboard]'" in buffer.getvalue()
    assert not (tmp_path / "one" / "tensorboard").exists()
    console, buffer = _piped()
    train(cfg, tmp_path / "two", console=console)  # a second run in the process (compare's next arm)
    assert "not installed" not in buffer.getvalue()
    # switched off, nothing is said
    monkeypatch.setattr(TensorBoard, "_said", False)
    console, buffer = _piped()
    train(small_config(train_store, budget={"steps": 1}), tmp_path / "three", console=console)
    assert "not installed" not in buffer.getvalue()
    # left at its default (not asked for), as in every run of an install without the extra: nothing said
    console, buffer = _piped()
    default = small_config(train_store, budget={"steps": 1}, logging={"tensorboard": None})
    assert default.logging.tensorboard is None and TrainConfig().logging.tensorboard is None
    train(default, tmp_path / "four", console=console)
    assert "note:" not in buffer.getvalue() and not (tmp_path / "four" / "tensorboard").exists()


def test_tensorboard_left_at_its_default_writes_event_files_when_the_package_is_there(
    train_store: Path, tmp_path: Path, small_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[tuple[str, float, int]] = []

    class Writer:  # stands for torch.utils.tensorboard's SummaryWriter
        def __init__(self, path: str, max_queue: int = 10) -> None:
            Path(path).mkdir(parents=True)

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            written.append((tag, value, step))

        def close(self) -> None:
            pass

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=Writer))
    console, buffer = _piped()
    train(
        small_config(train_store, budget={"steps": 2}, logging={"tensorboard": None}),
        tmp_path / "r",
        console=console,
    )
    assert (tmp_path / "r" / "tensorboard").is_dir() and "note:" not in buffer.getvalue()
    assert {step for tag, _, step in written if tag == "train/loss"} == {1, 2}
