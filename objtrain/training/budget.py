"""A run's length: `--steps`, `--tokens` or `--time` turned into the run's step count.

`--time S` is S seconds of training steps (`wall_time` in metrics.jsonl: the steps' own time, the first
steps' compilation included; start-up, validation and checkpoints not). The learning-rate schedule needs
the step count from the first step, so the count is estimated before the run and then corrected from the
run's own steps (`TimeBudget`):

1. Before the run, full steps (every micro-batch's forward and backward, clipping, the optimizer step) run
   on a throwaway copy of the model and timed synchronised (`measure_step`): the first estimate. It times
   the eager model, so a compiled run (faster once compiled) is corrected upwards at its first checks.
2. At checks during the run, the step count is re-derived from the seconds left and the measured
   seconds per step since warm-up (the first step, which holds compilation, is not a rate). A change of
   more than 1% of the budget becomes the run's new total, the schedule's decay stretched or shortened
   from where it stands without a jump (`optim.extended_lr_factor`); every total is recorded in the
   checkpoints (`schedule_totals`), so a resumed run replays the same schedule exactly.
3. Checks come at least every 5% of the budget and twice as often as the steps left towards the end, so
   the last estimate is made with few steps to go. Spent time at or past the budget ends the run.

Why not a plain wall-clock stop: the schedule would not end where the run ends (no decay), and the step
count would depend on when a signal arrived. Why not a single estimate (as before): steps change speed
(compilation, warm caches, other programs on a shared machine), and the estimate timed only forwards and
backwards, unsynchronised on a GPU, so runs stopped at 0.8-2x their budget. Each check's decision is
taken on the main process and shared, so every rank trains the same steps.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from objtrain.training.config import DEFAULT_STEPS, TrainConfig

HOLD = 0.01  # a new estimate within this share of the budget keeps the current total
CHECK_EVERY = 0.05  # the longest stretch between checks, as a share of the budget


def clock() -> float:
    """The clock of `--time` (a module function, so that tests can put a fake clock in its place)."""
    return time.perf_counter()


def total_steps(cfg: TrainConfig, plan: Any, step_seconds: Callable[[], float] | None = None) -> int:
    """The run's steps from its budget; `--time` asks `step_seconds` for a first estimate."""
    b = cfg.budget
    if b.steps is not None:
        return b.steps
    if b.tokens is not None:
        return max(math.ceil(b.tokens / (cfg.batch.batch_size * plan.seq_len)), 1)
    if b.seconds is not None:
        assert step_seconds is not None
        return max(int(b.seconds / max(step_seconds(), 1e-6)), 1)
    return DEFAULT_STEPS


def measure_step(
    run_step: Callable[[], None], sync: Callable[[], None], warmup: int = 1, times: int = 3
) -> float:
    """Median seconds of `run_step` (a full step) after `warmup` untimed ones, each finished (`sync`)
    before the clock is read: on a GPU an unsynchronised clock times the launches, not the work."""
    for _ in range(warmup):
        run_step()
    sync()
    seconds = []
    for _ in range(times):
        t0 = clock()
        run_step()
        sync()
        seconds.append(clock() - t0)
    return statistics.median(seconds)


class TimeBudget:
    """The checks of `--time` (module docstring): `due(step)` says when, `check` gives the new total."""

    def __init__(self, seconds: float, start_step: int) -> None:
        self.seconds = seconds
        self.next_check = start_step + 1  # the first step: it ends the warm-up
        self.warm: tuple[int, float] | None = None  # (step, spent) where the rate starts

    def due(self, step: int) -> bool:
        return step >= self.next_check

    def check(self, step: int, spent: float, total: int) -> int:
        """The run's total steps after `step` steps and `spent` seconds of them (`total` when it holds)."""
        left = self.seconds - spent
        if left <= 0:
            return step
        if self.warm is None or step <= self.warm[0]:  # no rate yet: the steps so far held the warm-up
            self.warm = self.warm or (step, spent)
            self.next_check = step + 2
            return total
        rate = max((spent - self.warm[1]) / (step - self.warm[0]), 1e-9)  # seconds per step since warm-up
        estimate = step + round(left / rate)
        if abs(estimate - total) * rate > HOLD * self.seconds:
            total = estimate
        if total <= step:
            return step
        self.next_check = step + max(
            1, min(math.ceil(CHECK_EVERY * self.seconds / rate), (total - step) // 2)
        )
        return total
