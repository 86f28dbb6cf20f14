"""`--time`: the steps fill the budget to within 5%, with a fake clock (the same every run), whether the
first estimate was right or not, the steps slow down midway or the first step compiles; a resumed run
replays the same schedule."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from objtrain.training import budget, loop
from objtrain.training.budget import TimeBudget, measure_step
from objtrain.training.loop import train


def simulate(
    seconds: float, first_estimate: int, cost: Callable[[int], float], every: int = 10
) -> tuple[int, float]:
    """The loop's use of `TimeBudget`: (steps trained, seconds spent) when step k costs `cost(k)`."""
    timer = TimeBudget(seconds, 0)
    total, step, spent = first_estimate, 0, 0.0
    while step < total:
        step += 1
        spent += cost(step)
        if timer.due(step) or step % every == 0 or step == 1:
            total = timer.check(step, spent, total)
    return step, spent


@pytest.mark.parametrize(
    ("name", "first", "cost"),
    [
        ("estimate right", 1000, lambda k: 0.02),
        ("estimate 3x too many", 3000, lambda k: 0.02),
        ("estimate 3x too few", 333, lambda k: 0.02),
        ("slower from midway", 1000, lambda k: 0.02 if k < 500 else 0.05),
        ("faster from midway", 1000, lambda k: 0.02 if k < 500 else 0.01),
        ("first step compiles", 1000, lambda k: 4.0 if k == 1 else 0.015),
        ("noisy", 1000, lambda k: 0.02 * (1.5 if k % 7 < 3 else 0.7)),
    ],
)
def test_the_steps_fill_the_budget(name: str, first: int, cost: Callable[[int], float]) -> None:
    steps, spent = simulate(20.0, first, cost)
    assert 0.95 * 20 <= spent <= 1.05 * 20, (name, steps, spent)


def test_a_budget_spent_before_the_first_check_ends_the_run() -> None:
    timer = TimeBudget(1.0, 0)
    assert timer.check(1, 3.0, 100) == 1


def test_checks_come_closer_towards_the_end() -> None:
    timer = TimeBudget(10.0, 0)
    assert timer.check(1, 0.1, 100) == 100 and timer.due(3) and not timer.due(2)
    total = timer.check(3, 0.3, 100)  # 0.1 s a step: 97 more
    assert total == 100 and timer.next_check == 3 + 5  # every 5% of the budget at most
    total = timer.check(96, 9.6, total)
    assert timer.next_check == 98  # half the steps left


class FakeClock:
    """Time moves only when the step's work runs: `advance` from the patched forward_backward."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_measure_step_times_finished_steps() -> None:
    clock, synced = FakeClock(), []

    def run() -> None:
        clock.now += 0.5

    budget_clock = budget.clock
    try:
        budget.clock = clock  # type: ignore[assignment]
        assert measure_step(run, lambda: synced.append(1)) == 0.5
    finally:
        budget.clock = budget_clock  # type: ignore[assignment]
    assert len(synced) == 4  # after the warm-up and after each timed step


def _timed_run(
    monkeypatch: pytest.MonkeyPatch, cost: Callable[[int], float], run: Path, small_config, store: Path, **kw
):  # type: ignore[no-untyped-def]
    clock = FakeClock()
    calls = {"n": 0}
    original = loop.forward_backward

    def costly(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        clock.now += cost(calls["n"])
        return original(*args, **kwargs)

    monkeypatch.setattr(budget, "clock", clock)
    monkeypatch.setattr(loop, "forward_backward", costly)
    cfg = small_config(store, budget={"steps": None, "seconds": 3.0}, logging={"every": 10}, **kw)
    return train(cfg, run, show_progress=False)


def test_a_time_budget_holds_when_the_steps_slow_down(
    train_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_config
) -> None:
    # The first estimate (4 probe steps at 0.03 s) says 100 steps; from the 30th the steps take 0.06 s.
    result = _timed_run(
        monkeypatch, lambda n: 0.03 if n < 34 else 0.06, tmp_path / "run", small_config, train_store
    )
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "loss" in r]
    assert 0.95 * 3.0 <= steps[-1]["wall_time"] <= 1.05 * 3.0
    assert result.step == result.total_steps == steps[-1]["step"] < 100
    state = json.loads((result.checkpoint / "state.json").read_text())  # type: ignore[operator]
    assert state["total_steps"] == result.step and len(state["schedule_totals"]) >= 2
    lrs = [r["lr"] for r in steps][2:]  # after the warmup of 2 steps: a decay that a new total stretches
    assert all(0 <= a - b < 0.1 * lrs[0] for a, b in itertools.pairwise(lrs)), lrs  # falling, no jump


def test_a_resumed_time_budget_replays_the_same_steps(
    train_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_config
) -> None:
    import shutil

    def losses(run: Path) -> dict[int, tuple[float, float]]:
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        return {r["step"]: (r["loss"], r["lr"]) for r in rows if "loss" in r}

    checkpoint = {"every": 20, "keep": 9}
    whole = _timed_run(
        monkeypatch, lambda n: 0.04, tmp_path / "whole", small_config, train_store, checkpoint=checkpoint
    )
    _timed_run(
        monkeypatch, lambda n: 0.04, tmp_path / "part", small_config, train_store, checkpoint=checkpoint
    )
    for later in (tmp_path / "part" / "checkpoints").glob("step-*"):
        if later.name != "step-00000040":
            shutil.rmtree(later)
    (tmp_path / "part" / "checkpoints" / "latest").unlink(missing_ok=True)
    monkeypatch.undo()
    clock = FakeClock()
    original = loop.forward_backward

    def costly(*args, **kwargs):  # type: ignore[no-untyped-def]
        clock.now += 0.04
        return original(*args, **kwargs)

    monkeypatch.setattr(budget, "clock", clock)
    monkeypatch.setattr(loop, "forward_backward", costly)
    cfg = small_config(
        train_store, budget={"steps": None, "seconds": 3.0}, logging={"every": 10}, checkpoint=checkpoint
    )
    resumed = train(cfg, tmp_path / "part", resume=True, show_progress=False)
    assert resumed.step == whole.step
    want, got = losses(tmp_path / "whole"), losses(tmp_path / "part")
    assert all(got[k] == want[k] for k in want)
