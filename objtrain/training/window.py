"""The metrics window: the steps run and not read yet (`steps` module docstring).

The loop adds each step's device figures and the host side of its record (`Pending`); at log points,
validations, checkpoints, --time checks and the run's end it reads the window with one transfer, so that
the GPU runs ahead of the host in between. Reading writes the steps' records (`run_log.RunLog`) in step
order; a non-finite loss or gradient norm stops the run there, naming its step and the last checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from objtrain.training import budget
from objtrain.training.records import RunState
from objtrain.training.run_log import RunLog
from objtrain.training.steps import NonFiniteLoss, Pending, StepOutcome, non_finite

Reader = Callable[[list[Pending]], list[StepOutcome]]


class MetricsWindow:
    """The pending steps, and what reading them leaves: the last loss and each step's MFU.

    `reader` takes the window's figures off the device (`steps.read_window`). On a GPU a step's host
    time is only until its kernels were queued: a read shares the window's real time (since `start`, the
    first pending step's start) over its steps in proportion and adds the difference to `state.seconds`."""

    def __init__(
        self,
        reader: Reader,
        state: RunState,
        run_log: RunLog,
        *,
        queued: bool,
        tokens_per_step: int,
        world_size: int,
        peak_flops: float,
        compile_mode: str | None,
    ) -> None:
        self.reader = reader
        self.state = state
        self.run_log = run_log
        self.queued = queued  # the host only queues the work (CUDA): the real time comes at the read
        self.tokens_per_step = tokens_per_step
        self.world_size = world_size
        self.peak_flops = peak_flops
        self.compile_mode = compile_mode  # None: eager; else the first step's time is noted
        self.pending: list[Pending] = []
        self.start = 0.0
        self.last_loss = float("nan")
        self.mfus: list[float] = []

    def add(self, pending: Pending, started: float) -> None:
        """A step that ran, `started` at that clock reading (`budget.clock`)."""
        if not self.pending:
            self.start = started
        self.pending.append(pending)

    def read(self, checkpoint: Path | None) -> None:
        """Read the window's steps and write their records; a non-finite one stops the run, naming it and
        `checkpoint`, the last good one."""
        outcomes = self.reader(self.pending)
        state, scale = self.state, 1.0
        if self.queued and self.pending:  # the host only queued the work: share the window's real time
            real, queued = budget.clock() - self.start, sum(p.seconds for p in self.pending)
            scale = real / max(queued, 1e-9)
            state.seconds += real - queued
        wall = state.seconds - sum(p.seconds * scale for p in self.pending)
        pending, self.pending = self.pending, []
        for p, out in zip(pending, outcomes, strict=True):
            bad = non_finite(out, p.figures.check_grad)
            if bad is not None:
                where = f"; the last good checkpoint is {checkpoint}" if checkpoint else ""
                raise NonFiniteLoss(f"the {bad} at step {p.record['step']}{where}")
            seconds = p.seconds * scale
            wall = p.timing["wall_time"] if scale == 1.0 else wall + seconds
            state.target_tokens += int(out.n_targets)
            self._write(p, out, self._record(p, out, seconds, wall), seconds)

    def _record(self, p: Pending, out: StepOutcome, seconds: float, wall: float) -> dict[str, Any]:
        """A step's metrics.jsonl record: its keys in this order."""
        return {
            **p.record,
            "target_tokens": self.state.target_tokens,
            "loss": out.loss,
            "lr": out.lr,
            "grad_norm": out.grad_norm,
            "tokens_per_s": self.tokens_per_step / seconds,
            "mfu": p.flops / seconds / self.world_size / self.peak_flops,
            "data_wait_frac": p.wait / seconds,
            **p.timing,
            "wall_time": wall,
            **out.metrics,
            **p.tail,
        }

    def _write(self, p: Pending, out: StepOutcome, record: dict[str, Any], seconds: float) -> None:
        """The step's events and notes, then its record; after the first step, what compiling cost."""
        for event in p.events:
            self.run_log.event(event)
        for note in p.notes:
            self.run_log.note(note)
        self.last_loss = out.loss
        self.mfus.append(record["mfu"])
        self.run_log.step(record)
        if p.record["step"] == self.run_log.first_step and self.compile_mode is not None:
            self.run_log.compiled(self.compile_mode, seconds, p.record["step"])
