"""`--dtype auto` on a CPU: the run's own step timed in both precisions once, cached, and kept; bf16 on a CPU
trains the curve fp32 trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from objtrain.training import plan as plan_module
from objtrain.training import precision
from objtrain.training.loop import prepare, train

SHAPE = {"model": {"d": 64}, "rows": [8, 64]}
UNITS = {"avx2", "avx512_bf16"}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "precision.json"
    monkeypatch.setenv("OBJTRAIN_PRECISION_CACHE", str(path))
    return path


def never() -> float:
    raise AssertionError("timed a step where the answer was known")


def test_without_bf16_units_nothing_is_timed_and_fp32_is_kept(cache: Path) -> None:
    choice = precision.choose_cpu_dtype(SHAPE, never, features={"avx2", "fma"})
    assert choice.dtype == "fp32" and "no bf16 units" in choice.why and not cache.exists()


@pytest.mark.parametrize(
    ("ratio", "expected"), [(1.4, "bf16"), (1.06, "bf16"), (1.02, "fp32"), (0.8, "fp32")]
)
def test_the_faster_precision_is_picked_beyond_the_margin(cache: Path, ratio: float, expected: str) -> None:
    choice = precision.choose_cpu_dtype(SHAPE, lambda: ratio, features=UNITS)
    assert choice.dtype == expected and choice.ratio == pytest.approx(ratio)
    assert f"x{ratio:.2f}" in choice.why and "measured on this CPU now" in choice.why


def test_a_measurement_is_cached_so_the_same_command_always_picks_the_same(cache: Path) -> None:
    first = precision.choose_cpu_dtype(SHAPE, lambda: 1.3, features=UNITS)
    again = [precision.choose_cpu_dtype(SHAPE, never, features=UNITS) for _ in range(3)]
    assert {c.dtype for c in again} == {first.dtype} == {"bf16"} and "cached" in again[0].why
    # another step shape is another question: measured on its own
    other = precision.choose_cpu_dtype({**SHAPE, "rows": [16, 64]}, lambda: 0.9, features=UNITS)
    assert other.dtype == "fp32" and len(json.loads(cache.read_text())) == 2


def test_a_torn_cache_is_measured_again_not_read(cache: Path) -> None:
    cache.write_text('{"abc": {"ratio": 1.')
    assert precision.choose_cpu_dtype(SHAPE, lambda: 1.5, features=UNITS).dtype == "bf16"
    assert precision.choose_cpu_dtype(SHAPE, never, features=UNITS).dtype == "bf16"


def test_a_process_that_may_not_time_takes_fp32_until_one_has(cache: Path) -> None:
    assert precision.choose_cpu_dtype(SHAPE, never, may_measure=False, features=UNITS).dtype == "fp32"
    precision.choose_cpu_dtype(SHAPE, lambda: 1.5, features=UNITS)
    assert precision.choose_cpu_dtype(SHAPE, never, may_measure=False, features=UNITS).dtype == "bf16"


def test_timing_the_step_leaves_the_runs_random_state_alone(specials) -> None:
    from objtrain.batch import Batch
    from objtrain.models.zoo import build_model, model_config
    from objtrain.objectives.registry import build_objective

    objective = build_objective("clm", specials)
    model = build_model(model_config("decoder", "debug", vocab_size=512))
    ids = torch.randint(10, 512, (2, 32))
    batch = Batch(ids, ids, torch.arange(32).expand(2, 32), torch.zeros(2, 32, dtype=torch.long), "causal")
    before = torch.get_rng_state()
    ratio = precision.time_step(model, objective, batch, rounds=1, per_round=1)
    assert ratio > 0 and torch.equal(torch.get_rng_state(), before)


def test_the_probe_times_the_runs_own_optimizer(
    train_store: Path, tmp_path: Path, small_config, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timed step is the loop's: its fused AdamW from the run's optim section."""
    seen: list[torch.optim.Optimizer | None] = []

    def timed(model, objective, batch, optimizer=None, **_: object) -> float:
        seen.append(optimizer)
        return 1.5

    monkeypatch.setattr(precision, "cpu_features", lambda: UNITS)
    monkeypatch.setattr(plan_module, "time_step", timed)
    cfg = small_config(train_store, precision={"dtype": "auto"}, optim={"lr": 0.0125})
    plan = prepare(cfg, tmp_path / "run")
    plan.release()
    (optimizer,) = seen
    assert plan.dtype == "bf16"
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["fused"]
    assert {g["lr"] for g in optimizer.param_groups} == {0.0125}


def test_a_run_records_its_choice_and_a_resume_keeps_it(
    train_store: Path, tmp_path: Path, small_config, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precision, "cpu_features", lambda: UNITS)
    monkeypatch.setattr(plan_module._StepProbe, "measure", lambda self: 1.5)
    cfg = small_config(train_store, precision={"dtype": "auto"}, budget={"steps": 2}, checkpoint={"every": 1})
    first = prepare(cfg, tmp_path / "new")
    first.release()
    assert first.dtype == "bf16" and "x1.50" in first.dtype_note
    run = tmp_path / "run"
    train(cfg, run, show_progress=False)
    # the CPU's answer changes (another torch, say): the run keeps the precision it started in
    cache.unlink()
    monkeypatch.setattr(plan_module._StepProbe, "measure", lambda self: 0.5)
    resumed = prepare(
        small_config(train_store, precision={"dtype": "auto"}, budget={"steps": 3}), run, resume=True
    )
    resumed.release()
    assert resumed.dtype == "bf16" and "precision of step-" in resumed.dtype_note


def test_bf16_on_a_cpu_trains_the_curve_fp32_trains(train_store: Path, tmp_path: Path, small_config) -> None:
    """fp32 master weights and optimizer state, bf16 matmuls under autocast: on the same seed the loss curve
    stays within 2% of fp32's at every step (measured: within 0.5% over 30 steps of the debug decoder)."""
    curves = {}
    for dtype in ("fp32", "bf16"):
        run = tmp_path / dtype
        train(
            small_config(train_store, precision={"dtype": dtype}, budget={"steps": 30}),
            run,
            show_progress=False,
        )
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        curves[dtype] = torch.tensor([r["loss"] for r in rows if "loss" in r])
    fp32, bf16 = curves["fp32"], curves["bf16"]
    assert len(fp32) == len(bf16) == 30 and fp32[-1] < fp32[0] - 1.0  # it trains
    assert ((bf16 - fp32).abs() / fp32).max() < 0.02
    from safetensors.torch import load_file

    weights = load_file(
        str(sorted((tmp_path / "bf16" / "checkpoints").glob("step-*"))[-1] / "model.safetensors")
    )
    assert {w.dtype for w in weights.values()} == {torch.float32}  # master weights stay fp32
