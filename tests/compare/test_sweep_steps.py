"""A sweep's step floor (a point under 50 optimizer steps is never trained, fitted or published, and the
plan says so) and a size grid's verdict read at each arm's own compute-optimal size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from compare_helpers import experiment
from test_refusals import refused, run_cli

from objtrain.compare import sweep as sweep_mod
from objtrain.compare.experiment import Claim, experiment_from_dict
from objtrain.compare.runner import PLAN, Interrupted
from objtrain.compare.sweep import (
    left_out_lines,
    parse_sweep,
    plan_notes,
    plan_sweep,
    sweep_plan_dict,
    thin_text,
)
from objtrain.compare.sweep_results import refit, sweep_claim
from objtrain.errors import UserError
from objtrain.io import write_json
from objtrain.report.sweep import _left_out_note
from objtrain.report.tables import paired_text

ROWS = 4 * 32  # tokens a step in the debug experiment
POINTS = f"tokens={10 * ROWS},{50 * ROWS},{400 * ROWS}"  # 10, 50 and 400 steps


def _experiment(store: Path) -> Any:
    data = experiment(
        store, [{"name": "clm", "objective": "clm", "model": {"kind": "decoder", "size": "debug"}}]
    )
    data["train"]["schedule"] = {"kind": "wsd", "warmup": 0.1, "decay_ratio": 0.25, "min_lr_ratio": 0.0}
    return experiment_from_dict(data)


def test_a_point_under_50_steps_is_left_out_of_the_plan_and_named(
    compare_store: Path, tmp_path: Path
) -> None:
    exp = _experiment(compare_store)
    spec = parse_sweep([POINTS], {}, tiny=False)
    assert spec is not None
    s = plan_sweep(exp, tmp_path / "report", spec)
    assert sorted(c.run.steps for c in s.cells) == [50, 400]  # the 10-step point is not trained
    assert s.left_out == [
        {"arm": "clm", "size": "debug", "point": "tokens-1280", "budget": 1280.0, "steps": 10}
    ]
    # the warm-up is the fraction of the shortest point trained (50 steps), not of the one left out
    assert {c.run.cfg.schedule.warmup for c in s.cells} == {5}
    notes = plan_notes(s)
    assert notes[0] == "left out: 1280 tokens would train 10 steps (clm), under 50"
    assert "clm, 2 points (6400 to 51200 tokens, 8x), too few to fit" in notes[1]
    assert sweep_plan_dict(s)["left_out"] == s.left_out and sweep_plan_dict(s)["min_steps"] == 50


def test_the_screen_names_the_points_left_out_when_a_sweep_starts(
    write_experiment, tmp_path, monkeypatch, capsys
) -> None:
    from objtrain.cli import compare as compare_cli

    def stop(*_: Any, **__: Any) -> None:
        raise Interrupted("stopped here on purpose")

    monkeypatch.setattr(compare_cli, "run_sweep", stop)
    code, _, err = run_cli(
        monkeypatch, capsys, "compare", write_experiment(), "-o", tmp_path / "r", "--sweep", POINTS
    )
    assert code == 130, err
    assert "= 4 runs" in err  # 2 arms x the 2 points kept
    assert "left out: 1280 tokens would train 10 steps (clm, mlm), under 50" in err


def test_an_arm_left_with_no_point_is_refused(write_experiment, tmp_path, monkeypatch, capsys) -> None:
    arms = [{"name": "clm", "objective": "clm", "model": {"kind": "decoder", "size": "debug"}},
            {"name": "wide", "objective": "clm", "model": {"kind": "decoder", "size": "debug"},
             "train": {"batch": {"batch_size": 32}}}]  # fmt: skip
    out = tmp_path / "r"
    args = (
        "compare",
        write_experiment(arms),
        "-o",
        out,
        "--sweep",
        f"tokens={5 * ROWS},{20 * ROWS},{160 * ROWS}",
    )
    refused(
        run_cli(monkeypatch, capsys, *args), "every point of 'wide' would train fewer than 50 optimizer steps"
    )
    assert not out.exists()


def test_a_sweep_whose_every_point_is_under_50_steps_is_a_smoke_run(
    compare_store: Path, tmp_path: Path
) -> None:
    exp = _experiment(compare_store)
    spec = parse_sweep([f"tokens={ROWS},{5 * ROWS},{30 * ROWS}"], {}, tiny=False)
    assert spec is not None
    s = plan_sweep(exp, tmp_path / "report", spec)
    assert sorted(c.run.steps for c in s.cells) == [1, 5, 30] and s.left_out == [] and s.min_steps == 0
    assert "trained as a smoke run of the machinery" in plan_notes(s)[0]
    assert sweep_plan_dict(s)["min_steps"] == 0


def test_a_smoke_run_trains_every_point(compare_store: Path, tmp_path: Path) -> None:
    exp = _experiment(compare_store)
    spec = parse_sweep(None, {"tokens": [1e4, 1e5, 1e6]}, tiny=True)
    assert spec is not None
    s = plan_sweep(exp, tmp_path / "report", spec, budget="tiny")
    assert s.left_out == [] and min(c.run.steps or 0 for c in s.cells) < 50
    assert len(s.cells) == len(spec.points)


def test_a_resume_with_other_points_left_out_is_refused(
    compare_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report planned before the floor trained its 10-step point, and its chain's warm-up from it."""
    exp = _experiment(compare_store)
    spec = parse_sweep([POINTS], {}, tiny=False)
    assert spec is not None
    report = tmp_path / "report"
    monkeypatch.setattr(sweep_mod, "MIN_STEPS", 1)
    before = plan_sweep(exp, report, spec)
    report.mkdir()
    write_json(report / PLAN, sweep_plan_dict(before))
    monkeypatch.setattr(sweep_mod, "MIN_STEPS", 50)
    with pytest.raises(UserError, match="other points left out under the 50-step floor"):
        plan_sweep(exp, report, spec, resume=True)


def test_the_sentences_group_a_point_across_arms_and_name_the_thin_chains() -> None:
    def entry(arm: str, size: str, budget: float, steps: int) -> dict[str, Any]:
        return {
            "arm": arm,
            "size": size,
            "point": f"{size}.flops-{budget:g}",
            "budget": budget,
            "steps": steps,
        }

    left = [
        entry("clm", "medium", 3e11, 5),
        entry("prefix-lm", "medium", 3e11, 5),
        entry("span", "medium", 3e11, 8),
    ]
    assert left_out_lines(left, "flops", sized=True) == [
        "medium at 3e11 FLOPs would train 5 steps (clm, prefix-lm) and 8 (span), under 50"
    ]
    points = {("clm", "nano"): [3e11, 1e12, 3e12, 1e13], ("clm", "medium"): [3e12, 1e13], ("span", "big"): []}
    text = thin_text(points, "flops", sized=True)
    assert "clm at medium, 2 points (3e12 to 1e13 FLOPs, 3.3x)" in text and "span at big, no point" in text
    assert "nano" not in text  # 4 points spanning 33x: a curve of its own
    assert thin_text({("clm", "nano"): [3e11, 1e12, 3e12, 1e13]}, "flops", sized=True) == ""


def _cell(
    label: str, size: str, budget: float, steps: int, metrics: dict[str, list[float]]
) -> dict[str, Any]:
    values = {m: {"values": v, "mean": sum(v) / 3, "std": 0.0, "n": 3} for m, v in metrics.items()}
    return {"label": label, "size": size, "budget": budget, "flops": [budget] * 3, "metrics": values,
            "tokens": [steps * 100] * 3, "parameters": 1e6, "parameters_no_embedding": 5e5, "steps": steps,
            "warmup_steps": 0, "branched_at_step": None,
            "runs": [f"arms/{label}/seed-{k}" for k in range(3)]}  # fmt: skip


def test_a_published_point_under_50_steps_leaves_the_fits_and_the_claims_on_refit() -> None:
    exp = experiment_from_dict({
        "arms": [{"name": "clm", "objective": "clm"}],
        "claims": [{"claim": "c", "literature": "p", "metric": "val_bpb", "arms": ["clm"],
                    "expect": "lower"}],
    })  # fmt: skip
    steps = [20, 60, 200, 600, 2000]
    law = {k: [3.0 / k**0.1 + d for d in (0, 0.01, 0.02)] for k in steps}
    cells = [_cell(f"tokens-{k}", "tiny", float(k), k, {"val_bpb": law[k]}) for k in steps]
    arm = {"name": "clm", "objective": "clm", "objective_overrides": {}, "cells": cells}
    old = {"sweep": {"tokens": [20.0, 2000.0], "size": []}, "seeds": [0, 1, 2], "bootstrap_replicates": 50,
           "arms": [arm]}  # fmt: skip
    # the cells are read from the run records: one value of the 600-step point differs from its cell's
    records = [{"arm": "clm", "seed": k, "run_dir": f"arms/tokens-{n}/seed-{k}", "eval": {},
                "train": {"flops": float(n), "tokens": n * 100,
                          "val_bpb": 1.0 if (n, k) == (600, 0) else law[n][k]}}
               for n in steps for k in range(3)]  # fmt: skip
    new = refit(old, exp, records=records)
    assert new["left_out"] == [
        {"arm": "clm", "size": "tiny", "point": "tokens-20", "budget": 20.0, "steps": 20}
    ]
    assert [c["label"] for c in new["arms"][0]["cells"]] == [f"tokens-{k}" for k in steps[1:]]
    assert len(new["fits"]["val_bpb"]["clm"]["points"]) == 4
    assert new["arms"][0]["cells"][2]["metrics"]["val_bpb"]["values"][0] == 1.0
    assert [p["point"] for p in new["claims"][0]["points"]] == [f"tokens-{k}" for k in steps[1:]]
    assert "20 tokens would train 20 steps (clm), under 50" in _left_out_note(new)[0]


def _grid_cell(label: str, metrics: dict[str, list[float]]) -> dict[str, Any]:
    size, budget = label.split("@")
    return {"label": label, "size": size, "budget": float(budget), "flops": [float(budget)] * 3,
            "metrics": metrics}  # fmt: skip


def test_a_size_grids_verdict_reads_each_arm_at_its_own_best_size() -> None:
    """The encoder-decoder has no val_bpb: its best size is its own conditional_bpb's, not the size CLM's
    val_bpb picks."""
    clm = {
        "nano@1e12": {"val_bpb": [2.6] * 3, "conditional_bpb": [2.5, 2.55, 2.6]},
        "medium@1e12": {"val_bpb": [2.8] * 3, "conditional_bpb": [2.7, 2.75, 2.8]},
        "nano@1e13": {"val_bpb": [2.1] * 3, "conditional_bpb": [2.0, 2.05, 2.1]},
        "medium@1e13": {"val_bpb": [2.4] * 3, "conditional_bpb": [2.5, 2.55, 2.6]},
    }
    span = {
        "nano@1e12": {"conditional_bpb": [3.0, 3.1, 3.2]},
        "medium@1e12": {"conditional_bpb": [3.2, 3.3, 3.4]},
        "nano@1e13": {"conditional_bpb": [4.0, 4.1, 3.9]},
        "medium@1e13": {"conditional_bpb": [2.9, 3.0, 2.95]},
    }
    arms = {name: {"cells": {k: _grid_cell(k, v) for k, v in cells.items()}} for name, cells in
            (("clm", clm), ("span", span))}  # fmt: skip
    claim = Claim("CLM continues better", "p", "conditional_bpb", ["clm", "span"], expect="lower")
    out = sweep_claim(claim, arms, [0, 1, 2])
    assert out["read_at"] == {"clm": "nano@1e13", "span": "medium@1e13"}
    assert out["paired"]["delta"] == pytest.approx(2.05 - 2.95)  # not 2.05 - 4.0, span read at nano
    assert out["verdict"] == "agrees" and out["paired"]["n"] == 3
    assert paired_text(out).endswith("at nano@1e13 (clm), medium@1e13 (span) (n = 3)")
    assert len(out["points"]) == 4  # the trend still pairs the arms size by size
    # CLM's own best size moves with its own metric, span's stays
    for label in ("medium@1e13",):
        arms["clm"]["cells"][label]["metrics"]["val_bpb"] = [1.9] * 3
    again = sweep_claim(claim, arms, [0, 1, 2])
    assert again["read_at"] == {"clm": "medium@1e13", "span": "medium@1e13"}
    assert again["at"] == "medium@1e13" and again["paired"]["delta"] == pytest.approx(2.55 - 2.95)


@pytest.mark.parametrize("name", ["objectives-scaling", "fim-scaling", "fim-suffix"])
def test_the_shipped_sweeps_plan_no_point_under_50_steps(
    name: str, compare_store: Path, tmp_path: Path
) -> None:
    from objtrain.compare.experiment import load_experiment

    exp = load_experiment(Path(name))
    spec = parse_sweep(None, exp.sweep, tiny=False)
    assert spec is not None
    s = plan_sweep(exp, tmp_path / "report", spec, data=str(compare_store))
    assert all((c.run.steps or 0) >= 50 for c in s.cells)
    assert all(p["steps"] < 50 for p in s.left_out)
    seeds = len(s.comparison.seeds)
    grid = len(exp.arms) * len(spec.points) * max(len(spec.sizes), 1)
    assert len(s.cells) + len(s.left_out) * seeds == grid
