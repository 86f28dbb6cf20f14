"""The compute-curve fit: known curves recovered within their intervals, crossovers found where they are,
curves that are not power laws refused rather than drawn."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from objtrain.compare.experiment import experiment_from_dict
from objtrain.compare.sweep_results import analyse
from objtrain.report.sweep import markdown as sweep_markdown
from objtrain.stats.fit import EXTRAPOLATION, PowerLaw, crossover, fit_curve

C = np.geomspace(1e12, 1e14, 7)


def noisy(law: PowerLaw, seeds: int = 3, sigma: float = 0.01, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return law(C)[:, None] + rng.normal(0.0, sigma, size=(len(C), seeds))


@pytest.mark.parametrize(
    "law", [PowerLaw(1.5, 3e4, 0.35), PowerLaw(0.8, 2e3, 0.2), PowerLaw(2.0, 5e7, 0.6)], ids=str
)
def test_fit_recovers_a_known_curve_within_its_intervals(law: PowerLaw) -> None:
    fit = fit_curve(C, noisy(law), replicates=500, seed=0)
    assert fit.ok and fit.law is not None
    assert fit.converged > 450
    for name, true in (("E", law.E), ("A", law.A), ("alpha", law.alpha)):
        lo, hi = fit.intervals[name]
        assert lo <= true <= hi, (name, true, lo, hi)
    assert abs(fit.law.alpha - law.alpha) < 0.1 * law.alpha
    # the points scatter about the curve as the seeds do about their mean
    assert fit.seed_std is not None and 0.005 < fit.seed_std < 0.02
    assert fit.residual_rms is not None and fit.residual_rms < 2 * fit.seed_std


def test_noise_free_points_give_the_curve_back() -> None:
    law = PowerLaw(1.2, 1e4, 0.3)
    fit = fit_curve(C, law(C), replicates=0)
    assert fit.law is not None
    law_back = fit.law.to_dict()
    assert law_back["E"] == pytest.approx(1.2, rel=1e-3)
    assert law_back["alpha"] == pytest.approx(0.3, rel=1e-3)
    assert law_back["A"] == pytest.approx(1e4, rel=1e-2)


def test_higher_is_better_metrics_fit_a_rising_curve() -> None:
    law = PowerLaw(0.9, -2e3, 0.25)  # an accuracy rising towards 0.9
    fit = fit_curve(C, noisy(law, sigma=0.002), lower_is_better=False, replicates=200)
    assert fit.ok and fit.law is not None and fit.law.A < 0
    lo, hi = fit.intervals["E"]
    assert lo <= 0.9 <= hi


@pytest.mark.parametrize(
    ("values", "status"),
    [
        (np.full((7, 2), 0.5), "not_converged"),  # flat: no power law
        (np.linspace(3.0, 4.0, 7)[:, None], "not_converged"),  # a loss that rises with compute
        (np.array([[3.0], [2.5], [np.nan], [np.nan], [np.nan], [np.nan], [np.nan]]), "too_few_points"),
    ],
)
def test_a_curve_that_cannot_be_fitted_is_reported_not_drawn(values: np.ndarray, status: str) -> None:
    fit = fit_curve(C, values, replicates=50)
    assert fit.status == status and fit.law is None and fit.reason
    assert fit.to_dict()["law"] is None


def test_the_crossover_of_two_known_curves_lies_in_its_interval() -> None:
    # a is ahead at small compute, b falls faster; both are 2.5 at C* = 1e13.
    c_star = 1e13
    a = PowerLaw(2.0, 0.5 * c_star**0.3, 0.3)
    b = PowerLaw(1.5, 1.0 * c_star**0.4, 0.4)
    assert float(a(c_star)) == pytest.approx(float(b(c_star)))
    fa = fit_curve(C, noisy(a, sigma=0.005, seed=1), replicates=500, seed=7)
    fb = fit_curve(C, noisy(b, sigma=0.005, seed=2), replicates=500, seed=7)
    x = crossover("a", fa, "b", fb)
    assert x.status == "within"
    assert x.ahead_before == "a" and x.ahead_after == "b"
    assert x.c_star == pytest.approx(c_star, rel=0.3)
    assert x.interval is not None and x.interval[0] <= c_star <= x.interval[1]
    assert x.crossing_share is not None and x.crossing_share > 0.9
    assert x.resolved and "not resolved" not in x.note


def test_no_crossover_and_extrapolated_crossovers_are_said_so() -> None:
    a = PowerLaw(1.0, 1e4, 0.3)
    b = PowerLaw(1.2, 1e4, 0.3)  # b is a shifted up: never crosses
    fa = fit_curve(C, noisy(a, sigma=0.002), replicates=100)
    fb = fit_curve(C, noisy(b, sigma=0.002), replicates=100)
    x = crossover("a", fa, "b", fb)
    assert x.status == "none" and x.c_star is None
    assert "no crossover within the swept range" in x.note and x.ahead_before == "a"
    assert x.resolved and all(hi < 0 for _, _, hi in x.gap_band)  # a below b everywhere
    # b falls faster and catches a far past the largest point: an extrapolation, marked.
    c_star = C[-1] * 50
    a = PowerLaw(2.0, 0.5 * c_star**0.3, 0.3)
    b = PowerLaw(1.5, 1.0 * c_star**0.4, 0.4)
    x = crossover("a", fit_curve(C, a(C), replicates=0), "b", fit_curve(C, b(C), replicates=0))
    assert x.status == "extrapolated" and x.to_dict()["extrapolated"]
    assert x.c_star is not None and x.c_star > EXTRAPOLATION * C[-1]
    assert x.c_star == pytest.approx(c_star, rel=0.05)


def test_a_crossover_with_an_unfitted_arm_is_not_computed() -> None:
    fa = fit_curve(C, noisy(PowerLaw(1.0, 1e4, 0.3)), replicates=20)
    flat = fit_curve(C, np.full((7, 1), 2.0), replicates=20)
    x = crossover("a", fa, "flat", flat)
    assert x.status == "no_fit" and "flat" in x.note and x.c_star is None


def test_the_fit_is_deterministic_under_its_seed() -> None:
    values = noisy(PowerLaw(1.5, 3e4, 0.35))
    one, two = fit_curve(C, values, replicates=100, seed=3), fit_curve(C, values, replicates=100, seed=3)
    assert one.intervals == two.intervals


def test_two_curves_the_seeds_cannot_tell_apart_are_not_resolved() -> None:
    law = PowerLaw(1.0, 1e4, 0.3)
    fa = fit_curve(C, noisy(law, sigma=0.02, seed=1), replicates=300)
    fb = fit_curve(C, noisy(law, sigma=0.02, seed=2), replicates=300)
    x = crossover("a", fa, "b", fb)
    assert "not resolved" in x.note and x.resolved is False, x


def test_one_seed_and_three_points_give_no_interval_and_no_resolved_verdict() -> None:
    c3 = C[[0, 3, 6]]
    fa = fit_curve(c3, PowerLaw(2.0, 1e4, 0.3)(c3), replicates=100)
    fb = fit_curve(c3, PowerLaw(1.0, 1e4, 0.3)(c3), replicates=100)
    assert fa.ok and not fa.intervals and fa.no_interval and fa.replicates == 0
    x = crossover("a", fa, "b", fb)
    assert x.status == "none" and x.resolved is None and x.interval is None


def _cells(values: dict[str, list[float]]) -> dict[str, dict[str, object]]:
    return {
        label: {"label": label, "budget": float(i + 1), "flops": [10.0 ** (i + 12)], "metrics": {"bpb": vals}}
        for i, (label, vals) in enumerate(values.items())
    }


def test_a_sweep_claim_is_judged_at_every_point_and_given_the_largest_points_verdict() -> None:
    from objtrain.compare.experiment import Claim
    from objtrain.compare.sweep_results import sweep_claim
    from objtrain.report.tables import claim_rows

    seeds = [0, 1, 2]
    arms = {  # a is far below b only at the largest point; at the smallest the seeds disagree
        "a": {"cells": _cells({"small": [2.0, 2.6, 2.1], "large": [1.50, 1.52, 1.51]})},
        "b": {"cells": _cells({"small": [2.3, 2.2, 2.4], "large": [1.70, 1.71, 1.69]})},
    }
    claim = Claim("a beats b", "a paper", "bpb", ["a", "b"], expect="lower")
    out = sweep_claim(claim, arms, seeds)
    assert [p["point"] for p in out["points"]] == ["small", "large"]
    assert [p["verdict"] for p in out["points"]] == ["not resolved", "agrees"]
    assert out["verdict"] == "agrees" and out["at"] == "large"
    assert out["paired"]["delta"] == pytest.approx(-0.19, abs=1e-9)
    flipped = sweep_claim(Claim("b beats a", "a paper", "bpb", ["b", "a"], expect="lower"), arms, seeds)
    assert flipped["verdict"] == "disagrees"
    # a seed missing (NaN) in one arm drops out of the pair; an arm without the metric is not measured
    arms["a"]["cells"]["large"]["metrics"]["bpb"] = [1.50, float("nan"), 1.51]
    assert sweep_claim(claim, arms, seeds)["paired"]["n"] == 2
    missing = sweep_claim(Claim("c", "p", "other", ["a", "b"]), arms, seeds)
    assert missing["verdict"] == "not measured"
    _, rows = claim_rows({"claims": [out]})
    # each point's paired difference beside its verdict: -0.0667 (the seeds disagree) and -0.19
    assert re.fullmatch(
        r"small: -0\.0667 ± [\d.]+, not resolved; large: -0\.19 ± 0\.0[\d]+, agrees", rows[0][3]
    )
    assert rows[0][4] == "**agrees**"


def test_a_claim_of_one_arm_judges_its_within_model_difference_against_zero() -> None:
    """`suffix_worth` is already a difference within each model (with and without the suffix): a claim of
    one arm tests the seeds' mean of it against 0, in a comparison and at every point of a sweep."""
    from objtrain.compare.experiment import Claim
    from objtrain.compare.results import claim_verdict
    from objtrain.compare.sweep_results import sweep_claim
    from objtrain.report.tables import claim_rows
    from objtrain.report.tables import claim_rows as comparison_rows

    seeds = [0, 1, 2]
    arms = {"fim": {"cells": _cells({"small": [0.01, -0.02, 0.005], "large": [0.10, 0.12, 0.11]})}}
    claim = Claim("the suffix is worth something", "a paper", "bpb", ["fim"], expect="higher")
    out = sweep_claim(claim, arms, seeds)
    assert [p["verdict"] for p in out["points"]] == ["not resolved", "agrees"]
    assert out["paired"]["delta"] == pytest.approx(0.11) and out["paired"]["n"] == 3
    assert out["arms"] == ["fim"]
    _, rows = claim_rows({"claims": [out]})
    assert rows[0][2].startswith("bpb: fim = +0.11 ± ")
    below = claim_verdict(
        Claim("c", "p", "m", ["fim"], expect="higher"), {"fim": {0: -0.2, 1: -0.3, 2: -0.25}}, 3
    )
    assert below["verdict"] == "disagrees" and below["eval_se"] is None
    assert comparison_rows({"claims": [below]})[1][0][2].startswith("m: fim = -0.25 ± ")
    missing = claim_verdict(Claim("c", "p", "m", ["other"]), {"fim": {0: 1.0}}, 1)
    assert missing["verdict"] == "not measured"
    with pytest.raises(ValueError, match="one against 0"):
        Claim("c", "p", "m", ["a", "b", "c"])


def test_a_sweep_claim_shows_the_evaluations_standard_error_as_a_comparisons_does() -> None:
    """With the arms' per-unit scores at a point, a sweep's claim carries the evaluation's own standard
    error of its difference there and its row shows it, the same cell a comparison's claim gets."""
    from objtrain.compare.experiment import Claim
    from objtrain.compare.results import claim_verdict
    from objtrain.compare.sweep_results import sweep_claim
    from objtrain.report.tables import claim_rows
    from objtrain.report.tables import claim_rows as comparison_rows
    from objtrain.stats.seeds import paired_eval_se

    seeds = [0, 1, 2]
    arms = {
        "a": {"cells": _cells({"small": [2.0, 2.1, 2.05], "large": [1.50, 1.52, 1.51]})},
        "b": {"cells": _cells({"small": [2.3, 2.2, 2.4], "large": [1.70, 1.71, 1.69]})},
    }
    nbytes = [10.0, 20.0, 30.0, 40.0]
    units = {
        name: {s: {"nats": [x * (1 + 0.1 * s) + shift for x in (7.0, 13.0, 22.0, 27.0)], "bytes": nbytes}
               for s in seeds}
        for name, shift in (("a", 0.0), ("b", 1.5))
    }  # fmt: skip
    for name in arms:
        arms[name]["cells"]["large"]["units"] = {"bpb": units[name]}
    claim = Claim("a beats b", "a paper", "bpb", ["a", "b"], expect="lower")
    out = sweep_claim(claim, arms, seeds)
    errors = [paired_eval_se(units["a"][s], units["b"][s]) for s in seeds]
    expected = float(np.sqrt(sum(e**2 for e in errors))) / len(errors)  # type: ignore[operator]
    assert out["at"] == "large" and out["eval_se"] == pytest.approx(expected) and expected > 0
    assert out["points"][0]["eval_se"] is None  # no per-unit scores at the small point
    _, rows = claim_rows({"claims": [out]})
    assert rows[0][2].endswith(f"at large (n = 3; evaluation SE {expected:.2g})")
    per_seed = {
        name: dict(zip(seeds, arms[name]["cells"]["large"]["metrics"]["bpb"], strict=True)) for name in arms
    }
    same = claim_verdict(claim, per_seed, 3, units)
    assert comparison_rows({"claims": [same]})[1][0][2].endswith(f"(n = 3; evaluation SE {expected:.2g})")


def _grid(steps: list[int], warmup: int, law: PowerLaw, seeds: int = 3) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    cells = {}
    for k in steps:
        flops = 1e9 * k
        vals = [float(law(flops)) + float(rng.normal(0, 0.002)) for _ in range(seeds)]
        label = f"tokens-{k}"
        cells[label] = {"label": label, "size": "tiny", "budget": float(k), "flops": [flops] * seeds,
                        "tokens": [k * 100] * seeds, "parameters": 1e6, "parameters_no_embedding": 5e5,
                        "steps": k, "warmup_steps": warmup, "branched_at_step": None,
                        "metrics": {"val_bpb": vals}, "runs": []}  # fmt: skip
    return cells


def test_points_inside_the_warmup_are_left_out_and_the_fit_is_checked_out_of_sample() -> None:
    exp = experiment_from_dict({"arms": [{"name": "clm", "objective": "clm"}]})
    law = PowerLaw(E=1.5, A=400.0, alpha=0.2)
    cells = _grid([15, 49, 150, 500, 1500, 5000], 5, law)
    found = analyse({"clm": {"cells": cells}}, exp, "tokens", [], 200)
    assert [p["point"] for p in found["inside_warmup"]] == ["tokens-15", "tokens-49"]
    fit = found["fits"]["val_bpb"]["clm"]
    assert [p["flops"] for p in fit["points"]] == [1.5e11, 5e11, 1.5e12, 5e12]
    h = fit["holdout"]
    assert h["status"] == "ok" and h["flops"] == 5e12
    assert h["measured"] == pytest.approx(float(law(5e12)), abs=0.01)
    assert h["error"] == pytest.approx(h["predicted"] - h["measured"])
    # E is well inside the data's reach here: the free fit finds it, the clamp never acts.
    assert fit["E_identified"] is True and fit["free"]["E"] == pytest.approx(fit["law"]["E"])
    text = sweep_markdown(
        {"experiment": {"name": "x", "question": "", "expect": "", "source": None}, "sweep": {"tokens": [1.0],
         "size": [], "span": 1.0}, "seeds": [0, 1, 2], "evaluation": {"suite": True, "options": {}},
         "machine": {"platform": "p", "cpu_count": 2, "torch_threads": 2, "torch": "2"}, "wall_seconds": 1.0,
         "arms": [], "claims": [], "chinchilla_tokens_per_parameter": 20.0} | {
             k: v for k, v in found.items() if k not in ("_fits", "cells")
         }, []
    )  # fmt: skip
    assert "### Out of sample" in text and "| val_bpb | clm | 5e+12 |" in text
    assert "clm tokens-15 (15 steps, warm-up 5)" in text
    assert "| val_bpb | clm | ok | 1.5" in text and "| yes (1.5" in text


def test_a_floor_the_free_fit_puts_below_zero_is_not_identified() -> None:
    c = np.geomspace(1e10, 1e13, 6)
    pure = 3.0 * c**-0.05  # no floor: the free fit's E goes below 0, the clamp holds it at 0
    fit = fit_curve(c, np.stack([pure, pure * 1.001, pure * 0.999], axis=1), replicates=100)
    assert fit.ok and fit.free is not None
    assert fit.E_identified is False and fit.free["E"] < 0.05


def test_an_isoflop_grid_gives_a_frontier_with_seed_resampled_intervals() -> None:
    """Three sizes at each of five FLOPs budgets, loss U-shaped in size around an optimum N* = 1e3·C^0.5:
    the frontier picks the interior optimum, its exponent comes out near 0.5 with an interval from the
    seeds, and the report prints it."""
    rng = np.random.default_rng(1)
    cells = []
    budgets = [1e12, 4e12, 1.6e13, 6.4e13, 2.56e14]
    for c in budgets:
        n_opt = 1e3 * c**0.5
        for size, factor in (("small", 0.25), ("mid", 1.0), ("big", 4.0)):
            n = n_opt * factor
            loss = 1.0 + 50 * c**-0.15 + 0.3 * np.log(factor) ** 2
            vals = [float(loss + rng.normal(0, 0.002)) for _ in range(3)]
            cells.append({"label": f"{size}.flops-{c:g}", "size": size, "budget": c, "flops": [c] * 3,
                          "tokens": [c / (6 * n)] * 3, "parameters": n, "parameters_no_embedding": n,
                          "steps": 1000, "warmup_steps": 10, "metrics": {"val_bpb": vals}})  # fmt: skip
    from objtrain.compare.sweep_results import frontier_fit

    f = frontier_fit(cells, "val_bpb", True, ["small", "mid", "big"], 200, 0)
    assert f["status"] == "ok" and [p["size"] for p in f["points"]] == ["mid"] * 5
    assert f["interior"] and f["N_exponent"] == pytest.approx(0.5, abs=0.01)
    lo, hi = f["N_exponent_interval"]
    assert lo <= 0.5 + 1e-9 and hi >= 0.5 - 1e-9
    assert (
        f["points"][-1]["value_interval"][0]
        <= f["points"][-1]["value"]
        <= f["points"][-1]["value_interval"][1]
    )
    # The best size at the grid's edge: no interior optimum, and the report says so.
    edge = frontier_fit([c for c in cells if c["size"] != "big"], "val_bpb", True, ["small", "mid"], 50, 0)
    assert not edge["interior"] and {a["size"] for a in edge["at_edge"]} == {"mid"}
    assert {a["end"] for a in edge["at_edge"]} == {"largest"} and len(edge["at_edge"]) == 5
    from objtrain.report.sweep import _frontier_fit_section

    text = "\n".join(_frontier_fit_section({"frontier_fits": {"clm": edge}}))
    assert "no: the largest size (mid) at every budget: the optimum lies above the grid there" in text
    below = frontier_fit([c for c in cells if c["size"] != "small"], "val_bpb", True, ["mid", "big"], 50, 0)
    assert [a["end"] for a in below["at_edge"]] == ["smallest"] * 5


def test_a_size_whose_metric_worsens_with_training_is_named_and_the_report_says_why() -> None:
    """Span corruption's continuation score at its smallest size rises with the budget (the decoder learns
    short spans, not continuations): the frontier names that size, beyond the per-seed interval, and
    leaves out a size that improves and one whose change the seeds cannot tell from noise."""
    from objtrain.compare.sweep_results import frontier_fit
    from objtrain.report.sweep import _frontier_fit_section

    trend = {"small": [3.0, 3.4, 4.0], "mid": [3.2, 3.0, 2.9], "big": [3.3, 3.3, 3.31]}
    noise = {"small": [0.0, 0.02, -0.02], "mid": [0.01, -0.01, 0.0], "big": [0.3, -0.3, 0.0]}
    cells = []
    for i, c in enumerate([1e12, 1e13, 1e14]):
        for size, n in (("small", 1e5), ("mid", 1e6), ("big", 1e7)):
            vals = [trend[size][i] + e * (1 + i) for e in noise[size]]
            cells.append({"label": f"{size}.flops-{c:g}", "size": size, "budget": c, "flops": [c] * 3,
                          "tokens": [c / (6 * n)] * 3, "parameters": n, "parameters_no_embedding": n,
                          "steps": 1000, "warmup_steps": 10,
                          "metrics": {"conditional_bpb": vals}})  # fmt: skip
    f = frontier_fit(cells, "conditional_bpb", True, ["small", "mid", "big"], 50, 0)
    assert [w["size"] for w in f["worsens"]] == ["small"]
    assert f["worsens"][0]["values"] == pytest.approx([3.0, 4.0]) and f["worsens"][0]["n"] == 3
    text = "\n".join(_frontier_fit_section({"frontier_fits": {"span": f}}))
    assert "span: at a fixed size, conditional_bpb gets worse as the training budget grows" in text
    assert "small (3 at 1e+12 → 4 at 1e+14)" in text
    # Without the worsening size nothing is named and the report adds no sentence.
    rest = frontier_fit(
        [c for c in cells if c["size"] != "small"], "conditional_bpb", True, ["mid", "big"], 50, 0
    )
    assert rest["worsens"] == []
    assert "gets worse" not in "\n".join(_frontier_fit_section({"frontier_fits": {"span": rest}}))


def test_a_published_sweep_is_refitted_from_its_own_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """An older results.json (no free fit, no out-of-sample check, no warm-up steps in its cells): refit
    takes the warm-up from the experiment's schedule (a fraction of each chain's shortest run) and leaves
    the points under 10x it out."""
    from objtrain.compare import sweep
    from objtrain.compare.sweep_results import refit

    monkeypatch.setattr(sweep, "MIN_STEPS", 1)  # its 15- and 49-step points test the warm-up rule

    law = PowerLaw(E=1.5, A=400.0, alpha=0.2)
    cells = []
    for cell in _grid([15, 49, 150, 500, 1500, 5000], 0, law).values():
        metrics = {"val_bpb": {"values": cell["metrics"]["val_bpb"], "mean": 0.0, "std": 0.0, "n": 3}}
        cells.append({k: v for k, v in cell.items() if k != "warmup_steps"} | {"metrics": metrics})
    exp = experiment_from_dict({
        "arms": [{"name": "clm", "objective": "clm"}],
        "train": {"schedule": {"kind": "wsd", "warmup": 0.34}},  # 0.34 x 15 steps = 5 warm-up steps
    })  # fmt: skip
    arm = {"name": "clm", "objective": "clm", "objective_overrides": {}, "cells": cells}
    old = {"sweep": {"tokens": [15.0, 5000.0], "size": []}, "bootstrap_replicates": 100, "arms": [arm]}
    new = refit(old, exp)
    assert [p["point"] for p in new["inside_warmup"]] == ["tokens-15", "tokens-49"]
    assert new["fits"]["val_bpb"]["clm"]["holdout"]["status"] == "ok"
    assert all(c["warmup_steps"] == 5 for c in new["arms"][0]["cells"])
    assert "_fits" in new and "_fits" not in old


def test_a_size_grids_claim_is_judged_at_the_compute_optimal_size_of_the_largest_budget() -> None:
    from objtrain.compare.experiment import Claim
    from objtrain.compare.sweep_results import sweep_claim

    def grid(bpb: dict[str, float], gap: dict[str, float]) -> dict[str, dict[str, object]]:
        cells = {}
        for label, value in bpb.items():
            size, budget = label.split("@")
            # the big model's step rounding spends the most FLOPs at the largest budget
            flops = float(budget) * (1.001 if size == "big" else 1.0)
            cells[label] = {"label": label, "size": size, "budget": float(budget), "flops": [flops],
                            "metrics": {"val_bpb": [value] * 3,
                                        "gap": [gap[label] + d for d in (-0.01, 0.0, 0.01)]}}  # fmt: skip
        return cells

    bpb = {"small@1e12": 2.5, "big@1e12": 2.7, "small@1e13": 2.0, "big@1e13": 2.3}
    arms = {
        "a": {"cells": grid(bpb, {"small@1e12": 0.0, "big@1e12": 0.0, "small@1e13": 0.5, "big@1e13": -0.5})},
        "b": {"cells": grid(bpb, dict.fromkeys(bpb, 0.0))},
    }
    out = sweep_claim(Claim("a above b", "p", "gap", ["a", "b"], expect="higher"), arms, [0, 1, 2])
    # small is the better model at 1e13: the verdict is read there, not at big (the most FLOPs)
    assert out["at"] == "small@1e13" and out["verdict"] == "agrees"
    assert [p["point"] for p in out["points"]][-1] == "big@1e13"  # every point is still judged
    # the best size moves with the measured loss
    for arm in arms.values():
        arm["cells"]["big@1e13"]["metrics"]["val_bpb"] = [1.9] * 3
    assert sweep_claim(Claim("a above b", "p", "gap", ["a", "b"], expect="higher"), arms, [0, 1, 2])[
        "at"
    ] == ("big@1e13")
