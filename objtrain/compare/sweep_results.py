"""A sweep's results: fitted compute curves, crossovers, the compute-optimal frontier and the claims
judged at every point.

Per arm and metric (validation bits per byte and the arm's own loss from training, every suite metric with
a direction) the points are the runs' values at their training FLOPs (the estimate compare uses: 6N per
token plus attention, encoder and decoder apart); `objtrain.stats.fit` fits E + A·C^(-α) with bootstrap
intervals. With a size sweep, an arm's curve is fitted over its frontier: at each FLOPs budget the best
size (FLOPs sweep), or the points no cheaper run beats (tokens sweep, where sizes differ in compute at
equal tokens). The frontier is chosen on the seed means and held fixed in the bootstrap (a simplification:
a replicate does not re-choose it); `frontier_fit` re-chooses it per replicate for the frontier's own
intervals. A claim is a comparison's claim (`results.claim_verdict`) judged at every point (`sweep_claim`).
How it reads is `objtrain.report.sweep`'s.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from itertools import combinations
from typing import Any

import numpy as np

from objtrain.compare import suite
from objtrain.compare import sweep as planning
from objtrain.compare.experiment import Claim, Experiment, PaperSetting
from objtrain.compare.regime import regime_gap
from objtrain.compare.results import (
    arm_pair,
    claim_verdict,
    experiment_entry,
    one_objective,
    ordered,
    run_numbers,
)
from objtrain.compare.runner import machine
from objtrain.compare.sweep import Sweep, sweep_plan_dict
from objtrain.stats import fit as fitting
from objtrain.stats.seeds import paired
from objtrain.training.config import ScheduleConfig
from objtrain.training.optim import warmup_steps

# Differences within one model (with and without the suffix, say): they start at 0 and may change sign.
DIFFERENCES = ("suffix_gain", "suffix_worth", "far_prefix_worth")


# Metrics first in this order, then alphabetically; the first an arm has is its frontier's. An
# encoder-decoder has no val_bpb, and its left-to-right bits_per_byte (an empty encoder) is not its own
# measure: conditional_bpb is.
PRIMARY = ("val_bpb", "conditional_bpb", "bits_per_byte", "val_loss")


WARMUP_FACTOR = 10  # a fitted point trains at least this many times its warm-up steps


CHINCHILLA_TOKENS_PER_PARAMETER = 20.0  # Hoffmann et al. 2022: compute-optimal tokens per parameter


def inside_warmup(cell: dict[str, Any]) -> bool:
    """Fewer than `WARMUP_FACTOR` times the warm-up's steps: too early in training to fit."""
    return int(cell["steps"]) < WARMUP_FACTOR * int(cell.get("warmup_steps") or 0)


def _run_metrics(record: dict[str, Any]) -> dict[str, float]:
    """A run's metrics with a direction (`results.run_numbers`): the ones a curve can be fitted to."""
    return {k: v for k, v in run_numbers(record).items() if suite.direction(k) in ("lower", "higher")}


def collect(s: Sweep) -> dict[str, Any]:
    """Per arm, per (size, point) cell: compute, tokens, parameters and each metric per seed."""
    c = s.comparison
    seeds = c.seeds
    arms: dict[str, dict[str, Any]] = {}
    for cell in s.cells:
        record = c.results.get(cell.run.key)
        if record is None:
            continue
        arm = arms.setdefault(cell.run.arm.name, {"cells": {}})
        key = cell.label
        entry = arm["cells"].setdefault(
            key,
            {
                "label": cell.label,
                "size": cell.size,
                "budget": cell.value,
                "flops": [],
                "tokens": [],
                "parameters": record["train"]["parameters"],
                "parameters_no_embedding": record["train"]["parameters_no_embedding"],
                "steps": record["train"]["steps"],
                "warmup_steps": warmup_steps(cell.run.cfg.schedule, int(record["train"]["steps"])),
                "branched_at_step": cell.branch_step or None,
                "metrics": {},
                "runs": [],
            },
        )
        entry["flops"].append(float(record["train"]["flops"]))
        entry["tokens"].append(int(record["train"]["tokens"]))
        entry["runs"].append(record["run_dir"])
        k = seeds.index(cell.run.seed)
        for metric, value in _run_metrics(record).items():
            entry["metrics"].setdefault(metric, [math.nan] * len(seeds))[k] = value
        for metric, scores in (record["eval"].get("units") or {}).items():  # for a claim's evaluation SE
            entry.setdefault("units", {}).setdefault(metric, {})[cell.run.seed] = scores
    return arms


def _frontier(cells: list[dict[str, Any]], metric: str, lower: bool, by_budget: bool) -> list[dict[str, Any]]:
    """The cells on the compute-optimal frontier for `metric` (module doc)."""
    scored = []
    for cell in cells:
        vals = [v for v in cell["metrics"].get(metric, []) if math.isfinite(v)]
        if vals:
            scored.append((float(np.mean(cell["flops"])), float(np.mean(vals)), cell))
    sign = 1.0 if lower else -1.0
    if by_budget:
        best: dict[float, tuple[float, float, dict[str, Any]]] = {}
        for item in scored:
            b = item[2]["budget"]
            if b not in best or sign * item[1] < sign * best[b][1]:
                best[b] = item
        return [best[b][2] for b in sorted(best)]
    out, record = [], math.inf
    for _, value, cell in sorted(scored, key=lambda t: t[0]):
        if sign * value < record:
            out.append(cell)
            record = sign * value
    return out


def analyse(
    arms: dict[str, Any], exp: Experiment, kind: str, sizes: list[str], replicates: int
) -> dict[str, Any]:
    """Fits, crossovers, the frontier and the points left out inside the warm-up, from the cells of
    `collect` (or of a results.json, `refit`): a pure function of the measured points."""
    sized = bool(sizes)
    have = {m for a in arms.values() for cell in a["cells"].values() for m in cell["metrics"]}
    metrics = ordered(have, PRIMARY)
    fits: dict[str, dict[str, fitting.Fit]] = {}
    frontiers: dict[str, list[dict[str, Any]]] = {}
    excluded: list[dict[str, Any]] = []
    arm_cells: dict[str, list[dict[str, Any]]] = {}
    size_order = {size: i for i, size in enumerate(sizes)}
    for spec_arm in exp.arms:
        if spec_arm.name not in arms:
            continue
        cells = sorted(
            arms[spec_arm.name]["cells"].values(), key=lambda c: (size_order.get(c["size"], 0), c["budget"])
        )
        arm_cells[spec_arm.name] = cells
        # A point still near its warm-up measures the schedule, not the budget:
        # the fits and the frontier leave it out, and the report names it.
        fitted = [cell for cell in cells if not inside_warmup(cell)]
        excluded += [
            {"arm": spec_arm.name, "point": c["label"], "steps": c["steps"], "warmup": c["warmup_steps"]}
            for c in cells
            if inside_warmup(c)
        ]
        for metric in metrics:
            if metric.startswith(DIFFERENCES):
                continue  # no saturating power law describes them: the claims give them point by point
            lower = suite.direction(metric) == "lower"
            chosen = _frontier(fitted, metric, lower, kind == "flops") if sized else fitted
            chosen = [cell for cell in chosen if metric in cell["metrics"]]
            if not chosen:
                continue  # the arm has no such metric (a decoder's validation bpb for an encoder)
            compute = [float(np.mean(cell["flops"])) for cell in chosen]
            values = [cell["metrics"][metric] for cell in chosen]
            fits.setdefault(metric, {})[spec_arm.name] = fitting.fit_curve(
                compute, values, lower_is_better=lower, replicates=replicates, seed=exp.seed
            )
            if sized and metric == _primary(cells):
                frontiers[spec_arm.name] = chosen
    same = one_objective((a.objective.name, a.objective.overrides) for a in exp.arms)
    crossovers = _crossovers(metrics, fits, [a.name for a in exp.arms], same)
    frontier_rows = [row for arm, cells in frontiers.items() for row in _frontier_rows(arm, cells, arms)]
    frontier_fits = {
        arm: frontier_fit(cells, _primary(list(arms[arm]["cells"].values())), kind == "flops", sizes,
                          replicates, exp.seed)
        for arm, cells in arm_cells.items()
        if arm in frontiers
    }  # fmt: skip
    return {
        "metrics": metrics,
        "cells": arm_cells,
        "frontier_fits": frontier_fits,
        "fits": {m: {a: f.to_dict() for a, f in per.items()} for m, per in fits.items()},
        "crossovers": crossovers,
        "frontier": frontier_rows,
        "inside_warmup": excluded,
        "warmup_factor": WARMUP_FACTOR,
        "bootstrap_replicates": replicates,
        "_fits": fits,  # dropped before writing: the objects the plot draws
    }


def _crossovers(
    metrics: list[str], fits: dict[str, dict[str, fitting.Fit]], names: list[str], same_objective: bool
) -> list[dict[str, Any]]:
    """Where each pair of arms' fitted curves cross, per metric both have a curve of."""
    crossovers = []
    for metric in metrics:
        if metric in suite.OWN_LOSSES and not same_objective:
            continue  # each arm's own objective: not one quantity across arms
        for a, b in combinations([n for n in names if n in fits.get(metric, {})], 2):
            x = fitting.crossover(a, fits[metric][a], b, fits[metric][b])
            crossovers.append({"metric": metric, "arms": [a, b], **x.to_dict()})
    return crossovers


def _frontier_rows(arm: str, cells: list[dict[str, Any]], arms: dict[str, Any]) -> list[dict[str, Any]]:
    """The frontier table's rows of one arm: per budget its best size, with tokens per parameter."""
    metric = _primary(list(arms[arm]["cells"].values()))
    rows = []
    for cell in cells:
        tokens = float(np.mean(cell["tokens"]))
        rows.append(
            {
                "arm": arm,
                "metric": metric,
                "budget": cell["budget"],
                "size": cell["size"],
                "flops": float(np.mean(cell["flops"])),
                "tokens": tokens,
                "parameters": cell["parameters"],
                "tokens_per_parameter": tokens / cell["parameters"],
                "tokens_per_non_embedding_parameter": tokens / max(cell["parameters_no_embedding"], 1),
                "value": float(np.nanmean(cell["metrics"][metric])),
            }
        )
    return rows


def frontier_fit(
    cells: list[dict[str, Any]], metric: str, by_budget: bool, sizes: list[str], replicates: int, seed: int
) -> dict[str, Any]:
    """The compute-optimal frontier of one arm with intervals that resample seeds: each replicate draws seed
    columns with replacement (the same draw for every cell), re-chooses the best size at each budget on the
    drawn means, and refits. Per budget L* and N* (parameters of the best size) with 95% percentile
    intervals; N*(C) = K·C^b by least squares in log-log (b with its interval);
    L*(C) = E + A·C^(-α) (`fitting.fit_curve`, E held at or above 0) with the replicates' α interval.
    `interior`: no budget's best size lies at an end of the size grid (else the optimum lies outside it)."""
    lower = suite.direction(metric) == "lower"
    cells = [c for c in cells if not inside_warmup(c) and metric in c["metrics"]]
    values = np.array([c["metrics"][metric] for c in cells], dtype=float)  # (cells, seeds)
    if not len(cells):
        return {"metric": metric, "status": "no_points"}

    def choose(means: np.ndarray) -> list[int]:
        return _chosen(cells, means, metric, lower, by_budget)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        best = choose(np.nanmean(values, axis=1))
        rng = np.random.default_rng(seed)
        draws = rng.integers(0, values.shape[1], size=(replicates, values.shape[1]))
        per_budget: dict[float, list[tuple[float, float]]] = {}
        slopes, alphas = [], []
        for draw in draws:
            means = np.nanmean(values[:, draw], axis=1)
            idx = choose(means)
            for i in idx:
                per_budget.setdefault(float(cells[i]["budget"]), []).append(
                    (float(means[i]), float(cells[i]["parameters"]))
                )
            slopes.append(_size_slope(cells, idx))
            f = fitting.fit_curve([float(np.mean(cells[i]["flops"])) for i in idx], [means[i] for i in idx],
                                  lower_is_better=lower, replicates=0)  # fmt: skip
            alphas.append(f.law.alpha if f.ok and f.law is not None else math.nan)
    main = fitting.fit_curve(
        [float(np.mean(cells[i]["flops"])) for i in best], [values[i] for i in best], lower_is_better=lower,
        replicates=0,
    )  # fmt: skip

    points = []
    for i in best:
        drawn = per_budget.get(float(cells[i]["budget"]), [])
        flops = float(np.mean(cells[i]["flops"]))
        points.append({
            "budget": cells[i]["budget"], "size": cells[i]["size"], "flops": flops,
            "value": float(np.nanmean(values[i])), "value_interval": _percentiles([d[0] for d in drawn]),
            "parameters": cells[i]["parameters"], "parameters_interval": _percentiles([d[1] for d in drawn]),
        })  # fmt: skip
    edge = {sizes[0]: "smallest", sizes[-1]: "largest"} if len(sizes) > 1 else {}
    # which end of the size grid the optimum sits at, per budget: the way to extend the grid
    at_edge = [
        {"budget": p["budget"], "size": p["size"], "end": edge[p["size"]]}
        for p in points
        if p["size"] in edge
    ]
    return {
        "metric": metric,
        "status": "ok",
        "points": points,
        "N_exponent": _size_slope(cells, best),
        "N_exponent_interval": _percentiles(slopes),
        "L": main.to_dict(),
        "alpha_interval": _percentiles(alphas),
        "interior": bool(points) and not at_edge,
        "at_edge": at_edge,
        "replicates": replicates,
        "worsens": worsens_with_budget(cells, metric, lower),
    }


def _chosen(
    cells: list[dict[str, Any]], means: np.ndarray, metric: str, lower: bool, by_budget: bool
) -> list[int]:
    """Which of `cells` stand on the frontier when each scores its entry of `means`."""
    scored = [dict(c, metrics={metric: [m]}) for c, m in zip(cells, means, strict=True)]
    best = _frontier(scored, metric, lower, by_budget)
    index = {id(c): i for i, c in enumerate(scored)}
    return [index[id(c)] for c in best]


def _size_slope(cells: list[dict[str, Any]], idx: list[int]) -> float:
    """b of N*(C) = K·C^b over the frontier's cells `idx`, by least squares in log-log."""
    if len({cells[i]["parameters"] for i in idx}) < 2:
        return math.nan  # one size on the whole frontier: no slope
    x = np.log([float(np.mean(cells[i]["flops"])) for i in idx])
    y = np.log([float(cells[i]["parameters"]) for i in idx])
    return float(np.polyfit(x, y, 1)[0])


def _percentiles(vals: list[float]) -> list[float] | None:
    """The 95% percentile interval of the finite values; None with fewer than two."""
    good = [v for v in vals if math.isfinite(v)]
    return [float(np.percentile(good, 2.5)), float(np.percentile(good, 97.5))] if len(good) >= 2 else None


def worsens_with_budget(cells: list[dict[str, Any]], metric: str, lower: bool) -> list[dict[str, Any]]:
    """The sizes at which `metric` is worse at the largest budget than at the smallest beyond the 95% t
    interval of the per-seed difference (a seed's points are one chain: the same initialisation and data):
    training longer on the objective moves a model of that size away from the metric (span corruption's
    conditional bits per byte: the decoder learns short spans between sentinels, not continuations)."""
    out = []
    for size in dict.fromkeys(c["size"] for c in cells):
        own = sorted((c for c in cells if c["size"] == size), key=lambda c: c["budget"])
        if len(own) < 2:
            continue
        first, last = (dict(enumerate(c["metrics"][metric])) for c in (own[0], own[-1]))
        change = paired(last, first) if lower else paired(first, last)  # > 0: worse at the larger budget
        if change.n >= 2 and change.delta - change.ci95 > 0:
            out.append({
                "size": size, "budgets": [own[0]["budget"], own[-1]["budget"]],
                "values": [float(np.nanmean(list(v.values()))) for v in (first, last)], "n": change.n,
            })  # fmt: skip
    return out


def build_sweep_results(s: Sweep, replicates: int = 1000) -> dict[str, Any]:
    c, spec, exp = s.comparison, s.spec, s.comparison.experiment
    arms = collect(s)
    found = analyse(arms, exp, spec.kind, spec.sizes, replicates)
    ordered = found.pop("cells")  # once, not per arm: every arm's cells, keyed by arm
    out_arms = []
    for spec_arm in exp.arms:
        if spec_arm.name not in arms:
            continue
        kinds = {c.results[cell.run.key]["train"]["model_kind"] for cell in s.cells
                 if cell.run.arm.name == spec_arm.name and cell.run.key in c.results}  # fmt: skip
        out_arms.append(
            {
                "name": spec_arm.name,
                "objective": spec_arm.objective.name,
                "objective_overrides": spec_arm.objective.overrides,
                "model_kind": ", ".join(sorted(kinds)),
                "cells": [_cell_dict(cell) for cell in ordered[spec_arm.name]],
            }
        )
    claims = [sweep_claim(claim, arms, c.seeds, claim.regime or exp.regime) for claim in exp.claims]
    return {
        "experiment": experiment_entry(exp),
        "plan": sweep_plan_dict(s),
        "sweep": spec.to_dict() | dict(span=spec.points[-1] / spec.points[0]),
        "seeds": c.seeds,
        "evaluation": {"suite": suite.available(), "data": c.eval_data, "options": c.eval_options},
        "machine": machine(),
        "wall_seconds": c.seconds,
        "arms": out_arms,
        "claims": claims,
        "chinchilla_tokens_per_parameter": CHINCHILLA_TOKENS_PER_PARAMETER,
        "min_steps": s.min_steps,
        "plan_notes": s.notes,
        "left_out": s.left_out,
    } | found


def refit(
    results: dict[str, Any],
    exp: Experiment,
    replicates: int | None = None,
    records: Sequence[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A published sweep's results.json with its fits, crossovers and frontier recomputed from its own
    points (older files lack the free fit, the out-of-sample check and the warm-up exclusion); `_fits`
    holds the fit objects for `objtrain.report.sweep.plot`, to be dropped before writing. A cell
    without its warm-up steps gets the sweep's: the schedule's warm-up of the chain's shortest run.

    A cell under `sweep.MIN_STEPS` optimizer steps, trained before the step floor, leaves the cells, the fits
    and the claims and joins `left_out`. With the sweep's run records (`results/*.json`, each run's own
    record) each cell's numbers are read from its runs' records, the per-unit scores with them, and the
    claims are judged again (`sweep_claim`) from the cells kept."""
    sw = results["sweep"]
    kind = "tokens" if "tokens" in sw else "flops"
    by_run = {r["run_dir"]: r for r in records or []}
    seeds = list(results.get("seeds") or [])
    arms: dict[str, Any] = {}
    left_out = list(results.get("left_out") or [])
    for arm in results["arms"]:
        cells = {}
        shortest: dict[str, int] = {}
        for cell in arm["cells"]:
            shortest[cell["size"]] = min(shortest.get(cell["size"], cell["steps"]), cell["steps"])
        schedule = ScheduleConfig(**exp.train.get("schedule", {}))
        for cell in arm["cells"]:
            if int(cell["steps"]) < planning.MIN_STEPS:
                left_out.append({"arm": arm["name"], "size": cell["size"], "point": cell["label"],
                                 "budget": cell["budget"], "steps": cell["steps"]})  # fmt: skip
                continue
            raw = dict(cell)
            raw["metrics"] = {m: [math.nan if x is None else float(x) for x in v["values"]]
                              for m, v in cell["metrics"].items()}  # fmt: skip
            raw.setdefault("warmup_steps", warmup_steps(schedule, shortest[cell["size"]]))
            if records is not None:
                _from_records(raw, [by_run[r] for r in cell["runs"] if r in by_run], seeds)
            cells[cell["label"]] = raw
        arms[arm["name"]] = {"cells": cells}
    found = analyse(
        arms, exp, kind, list(sw.get("size") or []), replicates or results["bootstrap_replicates"]
    )
    ordered = found.pop("cells")
    out = dict(results) | found
    out["arms"] = [dict(arm, cells=[_cell_dict(c) for c in ordered[arm["name"]]]) for arm in results["arms"]]
    out["min_steps"], out["left_out"] = planning.MIN_STEPS, left_out
    if records is not None:
        out["claims"] = [sweep_claim(claim, arms, seeds, claim.regime or exp.regime) for claim in exp.claims]
    return out


def _from_records(cell: dict[str, Any], records: list[dict[str, Any]], seeds: list[int]) -> None:
    """A cell's per-seed numbers (as `collect` reads them) from its runs' records, in the seeds' order."""
    if not records:
        return
    ordered = sorted(records, key=lambda r: seeds.index(r["seed"]))
    cell["flops"] = [float(r["train"]["flops"]) for r in ordered]
    cell["tokens"] = [int(r["train"]["tokens"]) for r in ordered]
    cell["runs"] = [r["run_dir"] for r in ordered]
    cell["metrics"] = {}
    for record in ordered:
        k = seeds.index(record["seed"])
        for metric, value in _run_metrics(record).items():
            cell["metrics"].setdefault(metric, [math.nan] * len(seeds))[k] = value
        for metric, scores in (record["eval"].get("units") or {}).items():
            cell.setdefault("units", {}).setdefault(metric, {})[record["seed"]] = scores


NOTES = ("one_seed", "seeds_needed", "straddles", "eval_se")  # what a point's verdict knows of itself


def sweep_claim(
    claim: Claim, arms: dict[str, Any], seeds: list[int], regime: PaperSetting | None = None
) -> dict[str, Any]:
    """A claim of the literature checked at every point both arms share (the same paired test as a
    single-budget comparison), its verdict the one at the largest shared point: the closest these budgets
    come to the papers' regime. The verdicts at the smaller points say whether the answer holds, appears
    or fades as compute grows. In a grid of sizes the verdict pairs each arm at its own compute-optimal
    size of the largest budget (`own_best_sizes`), which `read_at` names per arm."""
    a, b = arm_pair(claim.arms)
    cells_a = arms.get(a, {}).get("cells", {})
    cells_b = cells_a if b is None else arms.get(b, {}).get("cells", {})
    # By compute, then label: in a size sweep several sizes share a budget, and the verdict at "the
    # largest point" must not depend on set order.
    shared = sorted(set(cells_a) & set(cells_b), key=lambda k: (float(np.mean(cells_a[k]["flops"])), k))
    points = []
    for label in shared:
        pair = [(a, cells_a[label]), *([(b, cells_b[label])] if b is not None else [])]
        points.append({"point": label, "budget": cells_a[label]["budget"], **_judged(claim, pair, seeds)})
    last = points[-1] if points else {"point": None, "verdict": "not measured", "paired": None}
    read_at = {name: last["point"] for name in claim.arms} if points else {}
    own = own_best_sizes(shared, {a: cells_a, **({b: cells_b} if b is not None else {})})
    if own is not None:
        read_at = own
        if len(set(own.values())) == 1:
            last = next(pt for pt in points if pt["point"] == own[a])
        else:
            pair = [(a, cells_a[own[a]]), *([(b, cells_b[own[b]])] if b is not None else [])]
            at = ", ".join(f"{label} ({name})" for name, label in own.items())
            last = {"point": at, "budget": cells_a[own[a]]["budget"], **_judged(claim, pair, seeds)}
    scale = last.get("scale") or {}
    return claim_verdict(claim, {}, len(seeds)) | {  # the claim's own fields, as a comparison gives them
        "verdict": last["verdict"],
        "paired": last["paired"],
        "at": last["point"],
        "read_at": read_at,
        "seeds": len(seeds),
        "points": points,
        "regime": regime_gap(regime, scale.get("parameters"), scale.get("tokens")),
        **{k: last[k] for k in NOTES if k in last},
    }


def _judged(claim: Claim, pair: list[tuple[str, dict[str, Any]]], seeds: list[int]) -> dict[str, Any]:
    """The claim's paired test over the seeds of `pair` [(arm, its cell)]: verdict, paired difference,
    the cells' mean scale and what the verdict knows of itself."""
    per_seed = {
        name: {s: v for s, v in zip(seeds, cell["metrics"].get(claim.metric, []), strict=False)
               if math.isfinite(v)}
        for name, cell in pair
    }  # fmt: skip
    per_seed = {name: vals for name, vals in per_seed.items() if vals}
    # per-unit scores (where the runs kept them): the evaluation's own standard error, as a comparison's
    m = claim.metric
    units = {name: cell["units"][m] for name, cell in pair if m in cell.get("units", {})}
    v = claim_verdict(claim, per_seed, len(seeds), units)
    params = [float(cell["parameters"]) for _, cell in pair if cell.get("parameters")]
    tokens = [float(np.mean(cell["tokens"])) for _, cell in pair if cell.get("tokens")]
    scale = {
        "parameters": float(np.mean(params)) if params else None,
        "tokens": float(np.mean(tokens)) if tokens else None,
    }
    notes = {k: v[k] for k in NOTES if k in v}
    return {"verdict": v["verdict"], "paired": v["paired"], "scale": scale, **notes}


def own_best_sizes(labels: list[str], arm_cells: dict[str, dict[str, Any]]) -> dict[str, str] | None:
    """In a size grid, the point each arm of a claim is read at: of the sizes trained at the largest
    budget, that arm's compute-optimal one, the best mean over seeds of the arm's own frontier metric
    (`_primary`: val_bpb for a decoder, conditional_bpb for an encoder-decoder), so no arm is read at the
    size another arm's metric picks, nor at the size whose step rounding spends the most FLOPs. None
    outside a size grid, or where an arm has no such metric there."""
    first = next(iter(arm_cells.values()))
    if not labels or len({first[label].get("size") for label in labels}) < 2:
        return None
    top = max(float(first[label]["budget"]) for label in labels)
    out = {}
    for name, cells in arm_cells.items():
        metric = _primary(list(cells.values()))
        sign = -1.0 if suite.direction(metric) == "higher" else 1.0
        scored = []
        for label in labels:
            vals = [v for v in cells[label]["metrics"].get(metric, []) if math.isfinite(v)]
            if float(cells[label]["budget"]) == top and vals:
                scored.append((sign * float(np.mean(vals)), label))
        if not scored:
            return None
        out[name] = min(scored)[1]
    return out


def _primary(cells: list[dict[str, Any]]) -> str:
    have = {m for cell in cells for m in cell["metrics"]}
    return next((m for m in PRIMARY if m in have), sorted(have)[0] if have else "val_loss")


def _cell_dict(cell: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in cell.items() if k != "units"}  # per-unit scores stay in each run's results/
    out["metrics"] = {
        m: {"values": [v if math.isfinite(v) else None for v in vals], **_mean_std(vals)}
        for m, vals in cell["metrics"].items()
    }
    return out


def _mean_std(vals: list[float]) -> dict[str, float | int | None]:
    finite = [v for v in vals if math.isfinite(v)]
    if not finite:
        return {"mean": None, "std": None, "n": 0}
    std = float(np.std(finite, ddof=1)) if len(finite) > 1 else None
    return {"mean": float(np.mean(finite)), "std": std, "n": len(finite)}
