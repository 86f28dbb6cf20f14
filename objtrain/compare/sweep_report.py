"""A sweep's report: fitted compute curves, crossovers, the compute-optimal frontier; results.json,
report.md, curves.png.

Per arm and metric (validation bits per byte and the arm's own loss from training, every suite metric with
a direction) the points are the runs' values at their training FLOPs (the estimate compare uses: 6N per
token plus attention, encoder and decoder apart); `objtrain.stats.fit` fits E + A·C^(-α) with bootstrap
intervals. With a size sweep, an arm's curve is fitted over its frontier: at each FLOPs budget the best
size (FLOPs sweep), or the points no cheaper run beats (tokens sweep, where sizes differ in compute at
equal tokens). The frontier is chosen on the seed means and held fixed in the bootstrap (a simplification:
a replicate does not re-choose it). The claims table, the report's head and writing it are
`objtrain.compare.render`'s, shared with a comparison's report.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from objtrain.compare import suite
from objtrain.compare import sweep as planning
from objtrain.compare.experiment import Claim, Experiment, PaperSetting
from objtrain.compare.regime import regime_gap
from objtrain.compare.render import (
    ONE_ARM_NOTE,
    arm_pair,
    claim_rows,
    heading,
    markdown_table,
    plot_lines,
    print_table,
    save_png,
    write_all,
)
from objtrain.compare.report import claim_verdict, experiment_source
from objtrain.compare.runner import machine
from objtrain.compare.sweep import Sweep, left_out_lines, sweep_plan_dict, thin_text
from objtrain.stats import fit as fitting
from objtrain.stats.seeds import paired, t975
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


def _ordered(metrics: set[str]) -> list[str]:
    return [m for m in PRIMARY if m in metrics] + sorted(m for m in metrics if m not in PRIMARY)


def _run_metrics(record: dict[str, Any]) -> dict[str, float]:
    numbers = suite.numeric_metrics(record["eval"])
    for key in ("val_loss", "val_bpb"):
        if record["train"].get(key) is not None:
            numbers[key] = float(record["train"][key])
    return {k: v for k, v in numbers.items() if suite.direction(k) in ("lower", "higher")}


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
    metrics = _ordered({m for a in arms.values() for cell in a["cells"].values() for m in cell["metrics"]})
    fits: dict[str, dict[str, fitting.Fit]] = {}
    frontiers: dict[str, list[dict[str, Any]]] = {}
    excluded: list[dict[str, Any]] = []
    ordered: dict[str, list[dict[str, Any]]] = {}
    size_order = {size: i for i, size in enumerate(sizes)}
    for spec_arm in exp.arms:
        if spec_arm.name not in arms:
            continue
        cells = sorted(
            arms[spec_arm.name]["cells"].values(), key=lambda c: (size_order.get(c["size"], 0), c["budget"])
        )
        ordered[spec_arm.name] = cells
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
    crossovers = []
    same_objective = (
        len({json.dumps([a.objective.name, a.objective.overrides], sort_keys=True) for a in exp.arms}) == 1
    )
    for metric in metrics:
        if metric in suite.OWN_LOSSES and not same_objective:
            continue  # each arm's own objective: not one quantity across arms
        for a, b in combinations([n for n in (x.name for x in exp.arms) if n in fits.get(metric, {})], 2):
            x = fitting.crossover(a, fits[metric][a], b, fits[metric][b])
            crossovers.append({"metric": metric, "arms": [a, b], **x.to_dict()})
    frontier_rows = []
    for arm, cells in frontiers.items():
        metric = _primary(list(arms[arm]["cells"].values()))
        for cell in cells:
            tokens = float(np.mean(cell["tokens"]))
            frontier_rows.append(
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
    frontier_fits = {
        arm: frontier_fit(cells, _primary(list(arms[arm]["cells"].values())), kind == "flops", sizes,
                          replicates, exp.seed)
        for arm, cells in ordered.items()
        if arm in frontiers
    }  # fmt: skip
    return {
        "metrics": metrics,
        "cells": ordered,
        "frontier_fits": frontier_fits,
        "fits": {m: {a: f.to_dict() for a, f in per.items()} for m, per in fits.items()},
        "crossovers": crossovers,
        "frontier": frontier_rows,
        "inside_warmup": excluded,
        "warmup_factor": WARMUP_FACTOR,
        "bootstrap_replicates": replicates,
        "_fits": fits,  # dropped before writing: the objects the plot draws
    }


def frontier_fit(
    cells: list[dict[str, Any]], metric: str, by_budget: bool, sizes: list[str], replicates: int, seed: int
) -> dict[str, Any]:
    """The compute-optimal frontier of one arm with intervals that resample seeds: each replicate draws seed
    columns with replacement (the same draw for every cell), re-chooses the best size at each budget on the
    drawn means, and refits. Per budget L* and N* (parameters of the best size) with 95% percentile
    intervals; N*(C) = K·C^b by least squares in log-log (b with its interval);
    L*(C) = E + A·C^(-α) (`fit_curve`, E held at or above 0) with the replicates' α interval. `interior`:
    no budget's best size lies at an end of the size grid (else the optimum is outside the grid)."""
    lower = suite.direction(metric) == "lower"
    cells = [c for c in cells if not inside_warmup(c) and metric in c["metrics"]]
    values = np.array([c["metrics"][metric] for c in cells], dtype=float)  # (cells, seeds)
    if not len(cells):
        return {"metric": metric, "status": "no_points"}

    def choose(means: np.ndarray) -> list[int]:
        scored = [dict(c, metrics={metric: [m]}) for c, m in zip(cells, means, strict=True)]
        best = _frontier(scored, metric, lower, by_budget)
        index = {id(c): i for i, c in enumerate(scored)}
        return [index[id(c)] for c in best]

    def n_fit(idx: list[int]) -> float:
        if len({cells[i]["parameters"] for i in idx}) < 2:
            return math.nan  # one size on the whole frontier: no slope
        x = np.log([float(np.mean(cells[i]["flops"])) for i in idx])
        y = np.log([float(cells[i]["parameters"]) for i in idx])
        return float(np.polyfit(x, y, 1)[0])

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
            slopes.append(n_fit(idx))
            f = fitting.fit_curve([float(np.mean(cells[i]["flops"])) for i in idx], [means[i] for i in idx],
                                  lower_is_better=lower, replicates=0)  # fmt: skip
            alphas.append(f.law.alpha if f.ok and f.law is not None else math.nan)
    main = fitting.fit_curve(
        [float(np.mean(cells[i]["flops"])) for i in best], [values[i] for i in best], lower_is_better=lower,
        replicates=0,
    )  # fmt: skip

    def pct(vals: list[float]) -> list[float] | None:
        good = [v for v in vals if math.isfinite(v)]
        return [float(np.percentile(good, 2.5)), float(np.percentile(good, 97.5))] if len(good) >= 2 else None

    points = []
    for i in best:
        drawn = per_budget.get(float(cells[i]["budget"]), [])
        flops = float(np.mean(cells[i]["flops"]))
        points.append({
            "budget": cells[i]["budget"], "size": cells[i]["size"], "flops": flops,
            "value": float(np.nanmean(values[i])), "value_interval": pct([d[0] for d in drawn]),
            "parameters": cells[i]["parameters"], "parameters_interval": pct([d[1] for d in drawn]),
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
        "N_exponent": n_fit(best),
        "N_exponent_interval": pct(slopes),
        "L": main.to_dict(),
        "alpha_interval": pct(alphas),
        "interior": bool(points) and not at_edge,
        "at_edge": at_edge,
        "replicates": replicates,
        "worsens": worsens_with_budget(cells, metric, lower),
    }


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
        "experiment": {
            "name": exp.name,
            "question": exp.question,
            "expect": exp.expect,
            "source": exp.source,
        },
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
    holds the fit objects for `plot`, to be dropped before writing. A cell
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


def _g(x: float | None, digits: int = 3) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.{digits}g}"


def _interval(fit: dict[str, Any], key: str) -> str:
    iv = fit["intervals"].get(key)
    return f" [{_g(iv[0])}, {_g(iv[1])}]" if iv else ""


def fit_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["metric", "arm", "fit", "E [95%]", "E identified? (free fit's E)", "A [95%]", "α [95%]",
              "points", "residual rms (seed std)", "replicates converged"]  # fmt: skip
    rows = []
    for metric in results["metrics"]:
        for arm, f in results["fits"].get(metric, {}).items():
            if f["status"] == "ok":
                law = f["law"]
                e = (
                    _g(law["E"])
                    + _interval(f, "E")
                    + (" (held at 0: no-offset law)" if f["E_at_bound"] else "")
                )
                rows.append([metric, arm, "ok", e, _identified(f), _g(law["A"]) + _interval(f, "A"),
                             _g(law["alpha"]) + _interval(f, "alpha"), str(len(f["points"])),
                             f"{_g(f['residual_rms'], 2)} ({_g(f['seed_std'], 2)})",
                             f"{f['converged_replicates']}/{f['replicates']}" if f["replicates"]
                             else f"no interval: {f['no_interval']}"])  # fmt: skip
            else:
                what = "too few points" if f["status"] == "too_few_points" else "not converged"
                rows.append(
                    [
                        metric,
                        arm,
                        f"{what}: {f['reason']}",
                        "—",
                        "—",
                        "—",
                        "—",
                        str(len(f["points"])),
                        "—",
                        "—",
                    ]
                )
    return header, rows


def _identified(f: dict[str, Any]) -> str:
    """`yes (1.32)` / `no (-0.16)`: whether the floor E is pinned down, the free fit's E beside."""
    known = f.get("E_identified")
    if known is None:  # a results.json from before the free fit was reported
        return "—"
    free = f.get("free")
    beside = f" ({_g(free['E'])})" if free else ""
    return ("yes" if known else "no") + beside


def holdout_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["metric", "arm", "held-out point (FLOPs)", "predicted", "measured", "error (relative)",
              "seed std there"]  # fmt: skip
    rows = []
    for metric in results["metrics"]:
        for arm, f in results["fits"].get(metric, {}).items():
            h = f.get("holdout")
            if not h:
                continue
            if h["status"] != "ok":
                rows.append([metric, arm, f"not checked: {h['reason']}", "—", "—", "—", "—"])
                continue
            rel = f" ({h['relative_error']:+.1%})" if h.get("relative_error") is not None else ""
            rows.append([metric, arm, _g(h["flops"]), _g(h["predicted"], 4), _g(h["measured"], 4),
                         f"{h['error']:+.3g}{rel}", _g(h["seed_std"], 2)])  # fmt: skip
    return header, rows


def crossover_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["metric", "arms", "crossover (FLOPs)", "95% interval", "where", "replicates crossing"]
    rows = []
    for x in results["crossovers"]:
        a, b = x["arms"]
        iv = x["interval"] if x["flops"] is not None else None  # replicates' crossings: results.json
        interval = f"[{_g(iv[0])}, {_g(iv[1])}]" if iv else "—"
        share = (
            "—"
            if x["crossing_share"] is None
            else f"{x['crossing_share']:.0%} (inside the range {x['within_range_share']:.0%})"
        )
        if x["status"] in ("within", "near", "extrapolated"):
            where = f"{x['ahead_after']} overtakes {x['ahead_before']}: {x['note']}"
            c_star = _g(x["flops"]) + (" (extrapolated)" if x["extrapolated"] else "")
        else:
            where, c_star = x["note"], "—"
        rows.append([x["metric"], f"{a} vs {b}", c_star, interval, where, share])
    return header, rows


def frontier_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["arm", "metric", "budget", "best size", "params", "tokens", "FLOPs", "value", "tokens/param",
              "tokens/non-emb. param"]  # fmt: skip
    rows = []
    for r in results["frontier"]:
        rows.append([r["arm"], r["metric"], _g(r["budget"]), r["size"], f"{r['parameters'] / 1e6:.2f}M",
                     f"{r['tokens']:,.0f}", _g(r["flops"]), _g(r["value"], 4),
                     f"{r['tokens_per_parameter']:.2g}",
                     f"{r['tokens_per_non_embedding_parameter']:.2g}"])  # fmt: skip
    return header, rows


def point_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    metrics = results["metrics"][:4]
    header = ["arm", "point", "size", "steps", "tokens", "FLOPs", "branched at", *metrics]
    rows = []
    for arm in results["arms"]:
        for cell in sorted(arm["cells"], key=lambda c: float(np.mean(c["flops"]))):
            vals = []
            for m in metrics:
                v = cell["metrics"].get(m)
                if v is None or v["mean"] is None:
                    vals.append("—")
                else:
                    vals.append(f"{v['mean']:.4g}" + (f" ± {v['std']:.2g}" if v["std"] is not None else ""))
            rows.append([arm["name"], cell["label"], cell["size"], str(cell["steps"]),
                         f"{np.mean(cell['tokens']):,.0f}", _g(float(np.mean(cell["flops"]))),
                         str(cell["branched_at_step"] or "—"), *vals])  # fmt: skip
    return header, rows


def markdown(results: dict[str, Any], plots: list[str], extra: Sequence[str] = ()) -> str:
    """The report; `extra` (a publisher's own section, such as what changed since a previous
    publication) goes after the verdicts."""
    exp, m = results["experiment"], results["machine"]
    sw = results["sweep"]
    kind = "tokens" if "tokens" in sw else "flops"
    out = heading("Compute sweep", exp)
    if results.get("claims"):
        out += [
            "## Against the literature",
            "",
            markdown_table(*claim_rows(results)),
            "",
            "Each claim is a paired comparison of two arms over the shared seeds at every point of the sweep "
            "(per-seed difference, 95% t interval): **agrees** / **disagrees** when the interval lies on the "
            "literature's side of 0 / the other side (for a claim of no difference, inside / outside the "
            "margin), **not resolved** when the seeds cannot tell. The verdict is the one at the largest "
            "point, the nearest these budgets come to the papers'"
            + (
                " (in a grid of sizes: at the largest budget, each arm at its own compute-optimal size "
                "there, the one with the best mean of its frontier metric: val_bpb for a decoder, "
                "conditional_bpb for an encoder-decoder; the sizes may differ between arms, and the "
                "verdict names the point each arm is read at)."
                if (results.get("sweep") or {}).get("size")
                else "."
            ),
            "",
            *ONE_ARM_NOTE * any(len(c["arms"]) == 1 for c in results["claims"]),
        ]
    out += list(extra)
    out += [
        "## Fitted curves: L(C) = E + A·C^(−α), C in training FLOPs",
        "",
        markdown_table(*fit_rows(results)),
        "",
    ]
    out += [
        f"Fitted on the mean over seeds at each point; 95% intervals are percentiles of "
        f"{results['bootstrap_replicates']} bootstrap refits that resample seeds and points. A fit marked "
        "not converged or too few points is not drawn. A residual rms well above the seed std means the "
        "points bend in a way the power law cannot follow (early training, say): read its exponent with "
        "care. Expect α of roughly 0.1 to 0.2 where E is identified "
        "(Hoffmann et al. 2022, section 3.3: exponents 0.34 on parameters and 0.28 on tokens, about 0.14 "
        "to 0.17 on compute along the compute-optimal frontier); these budgets lie far below every "
        "published scaling study, so no published exponent is a target here. E identified: the free fit "
        "(E not held at 0) converges with E > 0 and the bootstrap interval of E stays above 0; where it "
        "does not, the floor is an artefact of the clamp and only the exponent of the no-offset law is "
        "read.",
        "",
        *_holdout_section(results),
        *_warmup_note(results),
        "## Crossovers",
        "",
        markdown_table(*crossover_rows(results))
        if results["crossovers"]
        else "No pair of arms shares a metric with fitted curves.",
        "",
        "A crossover is where one arm's fitted curve overtakes the other's, looked for from the smallest "
        f"shared compute up to {fitting.SEARCH:g}x past the largest; past {fitting.EXTRAPOLATION:g}x the "
        "largest measured point it is an extrapolation (marked, and dashed in the plot). The interval is "
        "over paired replicates (the same seeds and points drawn for both arms) that cross. Each arm's own "
        "loss is compared only between arms of the same objective.",
        "",
    ]
    if results["frontier"]:
        out += [
            "## Compute-optimal frontier",
            "",
            markdown_table(*frontier_rows(results)),
            "",
            f"Chinchilla's compute-optimal ratio is about {results['chinchilla_tokens_per_parameter']:g} "
            "training tokens per parameter (Hoffmann et al. 2022, total parameters). Tokens here are model "
            "input positions; parameters include the embeddings (and non-embedding beside). A best size at "
            "the smallest or largest size of the grid means the optimum lies outside it: extend the grid "
            "before reading the ratio.",
            "",
            *_frontier_fit_section(results),
        ]
    out += ["## Points", "", markdown_table(*point_rows(results)), "", *_left_out_note(results)]
    out += ["## Plots", "", *plot_lines(plots), ""]
    out += [
        "## What was run",
        "",
        f"- Experiment: `{experiment_source(exp)}`",
        f"- Sweep: {kind} at {', '.join(_g(p) for p in sw[kind])} ({sw['span']:.0f}x)"
        + (f", sizes {', '.join(sw['size'])}" if sw["size"] else ""),
        f"- Held equal at each point: {held_at_points(results)}",
        f"- Seeds: {', '.join(map(str, results['seeds']))} (seed k is shared by every arm and point)",
        "- Shorter points branch from the longest run of their chain where the schedule lets them (a "
        "warmup-stable-decay run's stable phase): the branched run equals a separate run step for step "
        "(`objtrain/compare/sweep.py` says why); `branched at` in the points table names the step.",
        "- Evaluation: "
        + (
            f"the `objtrain eval` suite, options {json.dumps(results['evaluation']['options'])}"
            if results["evaluation"]["suite"]
            else suite.describe_missing()
        ),
        f"- Wall time: {results['wall_seconds']:.0f} s for the whole sweep",
        f"- Machine: {m.get('cpu') or m['platform']}, {m['cpu_count']} CPUs, {m['torch_threads']} torch "
        f"threads, torch {m['torch']}" + (f", objtrain {m['commit']}" if m.get("commit") else ""),
        "",
        "Each point is a normal training run: `objtrain eval RUN` and `objtrain generate RUN` work on it.",
        "",
    ]
    return "\n".join(out)


def _iv(iv: list[float] | None, digits: int = 3) -> str:
    return f" [{_g(iv[0], digits)}, {_g(iv[1], digits)}]" if iv else ""


def held_at_points(results: dict[str, Any]) -> str:
    """Which control a point holds equal across arms, and how far apart the other is at the same point:
    a claim judged at a tokens point compares equal tokens, which is equal compute only where the arms'
    FLOPs agree."""
    sw = results["sweep"]
    kind = "tokens" if "tokens" in sw else "flops"
    other, other_name = ("flops", "FLOPs") if kind == "tokens" else ("tokens", "tokens")
    by_label: dict[str, list[float]] = {}
    for arm in results["arms"]:
        for cell in arm["cells"]:
            if cell.get(other):
                by_label.setdefault(cell["label"], []).append(float(np.mean(cell[other])))
    ratios = [max(v) / min(v) for v in by_label.values() if len(v) > 1 and min(v) > 0]
    spread = max(ratios) if ratios else 1.0
    held = "tokens" if kind == "tokens" else "training FLOPs"
    if spread <= 1.05:
        return f"{held}; the arms' {other_name} agree within 5% at every point"
    tail = (": the claims at each point compare equal tokens, not equal compute"
            if kind == "tokens" else "")  # fmt: skip
    return f"{held}; the arms' {other_name} differ up to {spread:.2f}x at one point{tail}"


def _frontier_fit_section(results: dict[str, Any]) -> list[str]:
    fits = results.get("frontier_fits") or {}
    rows = []
    for arm, f in fits.items():
        if f.get("status") != "ok":
            continue
        law = f["L"].get("law") if f["L"]["status"] == "ok" else None
        last = f["points"][-1]
        rows.append([
            arm, f["metric"], f"{_g(f['N_exponent'])}{_iv(f['N_exponent_interval'])}",
            (f"α {_g(law['alpha'])}{_iv(f['alpha_interval'])}" if law else f"not fitted: {f['L']['reason']}"),
            f"{_g(last['value'], 4)}{_iv(last['value_interval'], 4)} at {_g(last['flops'])}",
            f"{last['size']} ({last['parameters'] / 1e6:.2f}M){_iv(last['parameters_interval'])}",
            "yes" if f["interior"] else f"no: {_edge_text(f)}",
        ])  # fmt: skip
    if not rows:
        return []
    worse = []
    for arm, f in fits.items():
        if f.get("status") == "ok" and f.get("worsens"):
            at = ", ".join(
                f"{w['size']} ({_g(w['values'][0], 4)} at {_g(w['budgets'][0])} → {_g(w['values'][1], 4)} at "
                f"{_g(w['budgets'][1])})"
                for w in f["worsens"]
            )
            why = " (why its frontier does not improve with compute)" if f["L"]["status"] != "ok" else ""
            worse += [
                f"{arm}: at a fixed size, {f['metric']} gets worse as the training budget grows, beyond the "
                f"seeds' 95% interval of the per-seed change, at {at}: training longer on this objective "
                f"moves a model of that size away from this metric{why}.",
                "",
            ]
    header = ["arm", "metric", "N*(C) ∝ C^b: b [95%]", "L*(C) = E + A·C^(−α)",
              "L* at the largest budget [95%]", "N* there [95%]", "optimum inside the grid"]  # fmt: skip
    return [
        "### Frontier fits",
        "",
        markdown_table(header, rows),
        "",
        "Intervals resample the seeds: each replicate redraws the seeds of every cell (one draw for all), "
        f"re-chooses the best size per budget and refits ({next(iter(fits.values()))['replicates']} "
        "replicates). Chinchilla's N*(C) exponent is about 0.5; an optimum at the grid's edge says "
        "nothing about the exponent.",
        "",
        *worse,
    ]


def _edge_text(f: dict[str, Any]) -> str:
    """Where the optimum leaves the size grid, e.g. 'the smallest size (pico) at 3 of 4 budgets: the
    optimum lies below the grid there'; an older results.json without `at_edge` gets the plain words."""
    at = f.get("at_edge")
    if not at:
        return "a best size at the grid's edge"
    parts = []
    for end, beyond in (("smallest", "below"), ("largest", "above")):
        here = [a for a in at if a["end"] == end]
        if here:
            count = (
                "every budget"
                if len(here) == len(f["points"])
                else f"{len(here)} of {len(f['points'])} budgets"
            )
            parts.append(
                f"the {end} size ({here[0]['size']}) at {count}: the optimum lies {beyond} the grid there"
            )
    return "; ".join(parts)


def _holdout_section(results: dict[str, Any]) -> list[str]:
    header, rows = holdout_rows(results)
    if not rows:
        return [
            "### Out of sample",
            "",
            f"No curve was fitted, so none was checked out of sample (a check needs {fitting.MIN_POINTS + 1} "
            "compute points past the warm-up: one held out, the rest fitted).",
            "",
        ]
    return [
        "### Out of sample",
        "",
        markdown_table(header, rows),
        "",
        "Each curve refitted without its largest compute point, its prediction there set against the "
        "measured mean: an out of sample error well above the seed std says the law does not extrapolate "
        "even one step, so its crossovers past the data are not to be read.",
        "",
    ]


def _left_out_note(results: dict[str, Any]) -> list[str]:
    """The points the step floor kept from training (or, refitted, from the published cells), and the
    chains it leaves short of a curve of their own; a smoke run's word that it is no finding."""
    smoke = [note[0].upper() + note[1:] + ".\n" for note in results.get("plan_notes") or []]
    left = results.get("left_out") or []
    if not left:
        return smoke
    sw = results["sweep"]
    kind, sized = ("tokens" if "tokens" in sw else "flops"), bool(sw.get("size"))
    points: dict[tuple[str, str], list[float]] = {}
    for arm in results["arms"]:
        for p in left:
            if p["arm"] == arm["name"]:
                points.setdefault((arm["name"], p["size"]), [])
        for cell in arm["cells"]:
            points.setdefault((arm["name"], cell["size"]), []).append(float(cell["budget"]))
    thin = thin_text(points, kind, sized)
    return [
        f"Left out of the points, the fits, the frontier and the claims: every point under "
        f"{results['min_steps']} optimizer steps (a warm-up and a decay need steps to mean anything; "
        "under that a point measures where the schedule cut training, not the budget): "
        + "; ".join(left_out_lines(left, kind, sized))
        + ".",
        "",
        *([thin[0].upper() + thin[1:] + ".", ""] if thin else []),
        *smoke,
    ]


def _warmup_note(results: dict[str, Any]) -> list[str]:
    points = results.get("inside_warmup") or []
    if not points:
        return []
    named = ", ".join(f"{p['arm']} {p['point']} ({p['steps']} steps, warm-up {p['warmup']})" for p in points)
    return [
        f"Left out of every fit and the frontier, inside the warm-up (fewer than "
        f"{results['warmup_factor']}x the warm-up steps): {named}.",
        "",
    ]


def fit_band(f: fitting.Fit, c: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The 2.5-97.5% band of the fitted curve at `c` over the bootstrap replicates that converged."""
    if f.boot is None:
        return None
    good = f.boot[np.isfinite(f.boot[:, 0])]
    if len(good) < 20:
        return None
    curves = np.stack([fitting.PowerLaw(*row)(c) for row in good])
    lo, hi = np.percentile(curves, [2.5, 97.5], axis=0)
    return lo, hi


def plot(results: dict[str, Any], out_dir: Path) -> list[str]:
    """curves.png: per metric, each arm's points (mean, seed-std bars) and fitted curve, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fits: dict[str, dict[str, fitting.Fit]] = results["_fits"]

    def positive(metric: str) -> bool:  # a log axis shows only positive values (exact match 0: nothing)
        return any(
            (v := cell["metrics"].get(metric)) is not None and v["mean"] is not None and v["mean"] > 0
            for arm in results["arms"]
            for cell in arm["cells"]
        )

    # An arm's own objective loss shares a panel only with arms of the same objective.
    same = len(
        {json.dumps([a["objective"], a["objective_overrides"]], sort_keys=True) for a in results["arms"]}
    )
    metrics = [
        m
        for m in results["metrics"]
        if m in fits and positive(m) and (same == 1 or m not in suite.OWN_LOSSES)
    ]
    if not metrics:
        return []
    colours = {a["name"]: f"C{i % 10}" for i, a in enumerate(results["arms"])}
    markers = ["o", "s", "^", "D", "v", "P"]
    sizes = {size: markers[i % len(markers)] for i, size in enumerate(results["sweep"].get("size") or [])}
    cols = min(len(metrics), 3)
    nrows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.4 * cols, 4.2 * nrows), squeeze=False)
    for ax in axes.flat[len(metrics) :]:
        ax.axis("off")
    for ax, metric in zip(axes.flat, metrics, strict=False):
        right = 0.0
        for arm in results["arms"]:
            colour = colours[arm["name"]]
            for cell in arm["cells"]:
                v = cell["metrics"].get(metric)
                if v is None or v["mean"] is None or v["mean"] <= 0:
                    continue
                x = float(np.mean(cell["flops"]))
                n = v.get("n") or 1
                ci = t975(n - 1) * v["std"] / math.sqrt(n) if v["std"] is not None and n > 1 else 0.0
                hollow = "warmup_steps" in cell and inside_warmup(cell)  # left out of the fits
                ax.errorbar(x, v["mean"], yerr=ci, fmt=sizes.get(cell["size"], "o"), ms=5, capsize=3,
                            color=colour, alpha=0.9, mfc="none" if hollow else colour)  # fmt: skip
                right = max(right, x)
            f = fits[metric].get(arm["name"])
            if f is not None and f.ok and f.law is not None:
                solid = np.geomspace(f.c_min, f.c_max, 100)
                ax.plot(solid, f.law(solid), "-", color=colour, label=f"{arm['name']} (α={f.law.alpha:.2g})")
                band = fit_band(f, solid)
                if band is not None:
                    ax.fill_between(solid, band[0], band[1], color=colour, alpha=0.15, lw=0)
                dashed = np.geomspace(f.c_max, f.c_max * fitting.EXTRAPOLATION * 3, 60)
                ax.plot(dashed, f.law(dashed), "--", color=colour, alpha=0.7)
            elif any(metric in cell["metrics"] for cell in arm["cells"]):
                ax.plot([], [], "o", color=colour, label=f"{arm['name']} (no fit)")
        for x in results["crossovers"]:  # only those the seeds resolve: the table has them all
            near = x["flops"] is not None and x["flops"] <= right * fitting.EXTRAPOLATION * 3
            if x["metric"] == metric and near and x["resolved"]:
                ax.axvline(x["flops"], color="grey", lw=0.8, ls="-" if not x["extrapolated"] else "--")
        if right > 0:
            ax.axvspan(
                right * fitting.EXTRAPOLATION, right * fitting.EXTRAPOLATION * 3, color="grey", alpha=0.08
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        better = suite.direction(metric)
        ax.set_title(f"{metric} ({better} is better)", fontsize=9)
        ax.set_xlabel("training FLOPs (estimated)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    marks = f"; markers: {', '.join(f'{m} {k}' for k, m in sizes.items())}" if sizes else ""
    fig.suptitle(
        f"{results['experiment']['name']}: metric vs training FLOPs (points: mean, bars: 95% interval; "
        "solid: fit over the measured range, band: its 95% bootstrap interval; dashed: extrapolation; "
        f"shaded: past {fitting.EXTRAPOLATION:g}x; hollow: inside the warm-up, not fitted; grey lines: "
        f"crossovers the seeds resolve{marks})",
        fontsize=9,
    )
    fig.tight_layout()
    save_png(fig, out_dir / "curves.png")
    return ["curves.png"]


def write_sweep_report(s: Sweep, console: Console | None = None, replicates: int = 1000) -> dict[str, Any]:
    """results.json, curves.png, then report.md (each written whole or not at all)."""
    results = build_sweep_results(s, replicates)
    plots = plot(results, s.comparison.report_dir)
    results.pop("_fits")
    write_all(s.comparison.report_dir, results, plots, markdown)
    if console is not None:
        print_table(console, "fitted curves", *fit_rows(results))
        print_table(console, "crossovers", *crossover_rows(results))
    return results


__all__ = ["build_sweep_results", "write_sweep_report"]
