"""Compute sweeps: every arm trained at every budget point (and model size), then curves fitted over FLOPs.

    objtrain compare EXPERIMENT --sweep tokens=2e5,6e5,2e6,6e6 [--sweep size=debug,tiny,small]

    REPORT/arms/NAME/<point>/[seed-S/]   one ordinary training run per arm, point (and seed):
                                         `objtrain eval` and `objtrain generate` work on each
    REPORT/results/NAME.<point>[.seed-S].json   its cost and metrics, written once trained and evaluated

A point is `tokens-2e5` (or `flops-1e13`), prefixed by its model size in a size sweep (`tiny.tokens-2e5`).
A budget sweep has at least 3 points spanning at least 30x; anything less is refused before any work.

Points too short to train. A cell (arm x size x budget) whose budget gives fewer than `MIN_STEPS`
optimizer steps is left out of the plan: never trained, fitted or published. The plan says which and why
(`left_out_lines`: "medium at 3e11 FLOPs would train 5 steps (clm), under 50"), on the screen when the
sweep starts, in plan.json and in the report. The 3-points-30x rule holds for the grid as asked; a chain
(arm, size) the floor leaves with fewer points, or a narrower span, keeps what it has and is named
(`thin_text`): its points still stand on the size grid's frontier at their budgets, and a curve of its
own (a sweep without sizes) reports too few points rather than failing. An arm left with no point while
others keep theirs is refused before any work. `--budget tiny`, and a sweep none of whose points reaches
the floor (nothing would be left to fit), are smoke runs of the machinery: every point trains, and the plan
and the report say it is no finding.

Branching instead of retraining. Within one chain (arm, size, seed) the runs differ only in their budget,
so they see the same initial weights, the same rows in the same order and the same corruptions (all pure
functions of the seed and the rows consumed). What differs is the learning rate, a pure function of
(step, total steps). The sweep computes, for each shorter point, the longest prefix of steps over which
its schedule gives exactly the learning rate of the chain's longest run at every step; with a
warmup-stable-decay schedule that is the whole warmup and stable phase, up to where the shorter run's
decay begins (with `constant`, the whole run). The longest run saves a checkpoint at each such step; the
shorter run is started from a copy of it whose `state.json` says what the shorter run's own checkpoint at
that step would say (its total steps and its config: nothing else in the checkpoint depends on the
budget), and the training loop's exact resume trains its decay. A resumed run is bit-identical to the run
never stopped (the loop's guarantee: weights, Adam moments, data position and RNG states are restored),
so the branched run ends where a separate run from scratch would, step for step; a test checks the final
weights are equal. Where the schedules differ from the first steps (cosine over different horizons) the
prefix is just the warmup, and where it is empty the point trains from scratch. So that warmups line up,
a fractional warmup becomes a fixed number of steps in a sweep: the fraction of the shortest point's run,
of the points trained (Porian et al. 2024 keep warmup short against the shortest run for the same reason).

Resume: a point with a results file is done; a trained point is only evaluated; a half-trained one
continues through the loop's own resume; a point to branch whose source checkpoint exists is branched,
never retrained. So Ctrl-C and `--resume` anywhere in a sweep train no step twice. A report whose results
files were kept but whose `arms/` were not (a fresh clone of a published sweep) resumes too: a point whose
chain's longest run is gone trains from step 0, which ends where the branch would have. A size sweep resumed
with more sizes (the same budget points, every saved size kept) trains only the new sizes' chains: a chain
branches only from itself, so the runs done stay what they were.
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Collection
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from rich.console import Console

from objtrain.compare import suite
from objtrain.compare.experiment import ArmSpec, BudgetSpec, Experiment
from objtrain.compare.progress import ArmsProgress
from objtrain.compare.runner import (
    JUDGING_KEYS,
    PLAN,
    SHARED_BASELINES,
    Comparison,
    Run,
    _check_arm,
    _record,
    _tokenizer_hash,
    _without_unset,
    arm_flops,
    check_report_dir,
    evaluate_run,
    finished_checkpoint,
    kept_result,
    plan_dict,
    readable_flops,
    train_to_end,
)
from objtrain.errors import UserError, did_you_mean
from objtrain.io import atomic_dir, atomic_file, read_json, write_json
from objtrain.models.checkpoint import mark_latest
from objtrain.models.zoo import model_sizes
from objtrain.training import checkpoint as ckpt
from objtrain.training.config import ScheduleConfig, config_dict
from objtrain.training.optim import lr_factor, warmup_steps

MIN_POINTS = 3
MIN_SPAN = 30.0
MIN_STEPS = 50  # a warm-up and a decay need steps to mean anything: a point under 50 is not trained
KINDS = ("tokens", "flops")
# `--budget tiny` with a sweep and no budget axis given: a smoke sweep spanning 32x, in tokens; a sweep over
# FLOPs stays over FLOPs, these tokens' worth at the cheapest arm's FLOPs a token (`runner.arm_flops`), so a
# smoke run of an equal-compute sweep is still at equal compute.
TINY_POINTS = (2048.0, 8192.0, 65536.0)


@dataclass
class SweepSpec:
    kind: str  # tokens | flops
    points: list[float]  # ascending
    sizes: list[str] = field(default_factory=list)  # [] = each arm's own size
    tiny_tokens: bool = False  # flops points still in tokens (`TINY_POINTS`), to be priced per arm

    def to_dict(self) -> dict[str, Any]:
        return {self.kind: self.points, "size": self.sizes}

    def describe(self) -> str:
        span = self.points[-1] / self.points[0]
        first, last = self.points[0], self.points[-1]
        text = f"{len(self.points)} {self.kind} budgets from {first:.3g} to {last:.3g} ({span:.0f}x)"
        return text + (f" x sizes {', '.join(self.sizes)}" if self.sizes else "")


def _values(key: str, raw: Any) -> list[Any]:
    if isinstance(raw, str):
        parts = [p.strip() for p in raw.split(",")]
    elif isinstance(raw, (list, tuple)):
        parts = list(raw)
    else:
        parts = [raw]
    if not parts or any(p == "" for p in parts):
        raise UserError(f"--sweep {key}=: give comma-separated values, e.g. {key}=2e5,6e5,2e6")
    return parts


def _numbers(kind: str, raw: Any) -> list[float]:
    out = []
    for p in _values(kind, raw):
        try:
            v = float(str(p).replace("_", ""))
        except ValueError:
            raise UserError(f"--sweep {kind}=: {p!r} is not a number") from None
        if not (math.isfinite(v) and v > 0):
            raise UserError(f"--sweep {kind}=: every point must be positive and finite, got {p!r}")
        if kind == "tokens" and v != int(v):
            raise UserError(f"--sweep tokens=: {p!r} is not a whole number of tokens")
        out.append(v)
    if len(set(out)) != len(out):
        raise UserError(f"--sweep {kind}=: a point is given twice")
    return sorted(out)


def parse_sweep(cli: list[str] | None, configured: dict[str, Any], tiny: bool) -> SweepSpec | None:
    """The sweep from the experiment's `sweep:` with `--sweep KEY=V1,V2,...` options laid over it per key
    (None when neither gives one). Refused in one line: an unknown key, a seconds sweep, two budget axes,
    fewer than 3 points, a span under 30x, an unknown or repeated size."""
    given: dict[str, Any] = dict(configured)
    from_cli: dict[str, Any] = {}
    for item in cli or []:
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep:
            raise UserError(f"--sweep {item!r}: write KEY=V1,V2,... (tokens=, flops= or size=)")
        if key in from_cli:
            raise UserError(f"--sweep {key}= is given twice")
        from_cli[key] = value
    if any(k in KINDS for k in from_cli):  # a budget axis on the command line replaces the file's
        given = {k: v for k, v in given.items() if k not in KINDS}
    given.update(from_cli)
    if not given:
        return None
    for key in given:
        if key == "seconds":
            raise UserError(
                "--sweep seconds=: a sweep is over compute (tokens= or flops=); seconds are no FLOPs count"
            )
        if key not in (*KINDS, "size"):
            raise UserError(
                f"--sweep: unknown key {key!r}{did_you_mean(key, (*KINDS, 'size'))} (tokens, flops, size)"
            )
    axes = [k for k in KINDS if k in given]
    if len(axes) > 1:
        raise UserError("--sweep: give one budget axis, tokens= or flops=, not both")
    tiny_tokens = False
    if tiny and not any(k in KINDS for k in from_cli):
        axis = "flops" if axes == ["flops"] else "tokens"
        given = {k: v for k, v in given.items() if k not in KINDS} | {axis: list(TINY_POINTS)}
        axes, tiny_tokens = [axis], axis == "flops"
    if not axes:
        raise UserError(
            "--sweep: name the budget axis, e.g. tokens=2e5,6e5,2e6,6e6 (size= alone sweeps nothing)"
        )
    kind = axes[0]
    points = _numbers(kind, given[kind])
    text = ",".join(f"{p:g}" for p in points)
    if len(points) < MIN_POINTS:
        raise UserError(
            f"--sweep {kind}={text}: a sweep needs at least {MIN_POINTS} points to fit a curve, "
            f"got {len(points)}"
        )
    span = points[-1] / points[0]
    if span < MIN_SPAN:
        raise UserError(
            f"--sweep {kind}={text}: spans {span:.3g}x; a sweep must span at least {MIN_SPAN:g}x "
            "(a power law's exponent is not measurable over less)"
        )
    sizes: list[str] = []
    if "size" in given:
        known = model_sizes()
        for s in _values("size", given["size"]):
            name = next((k for k in known if k.lower() == str(s).lower()), None)
            if name is None:
                raise UserError(
                    f"--sweep size=: unknown model size {s!r}{did_you_mean(str(s), known)} "
                    f"({', '.join(known)})"
                )
            if name in sizes:
                raise UserError(f"--sweep size=: {name!r} is given twice")
            sizes.append(name)
    return SweepSpec(kind, points, sizes, tiny_tokens)


def point_label(kind: str, value: float, size: str | None) -> str:
    """`tokens-2e5`, `tokens-4096`, `flops-1.5e13`, `tiny.tokens-2e5`: short, exact to 7 digits."""
    mantissa, exponent = f"{value:.6e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    short = f"{mantissa}e{int(exponent)}"
    plain = str(int(value)) if value == int(value) else short  # 4096 reads better than 4.096e3
    text = f"{kind}-{min(short, plain, key=len)}"
    return f"{size}.{text}" if size else text


@dataclass
class Cell:
    """One arm at one point and seed: an ordinary run, perhaps branched from its chain's longest run."""

    run: Run
    label: str
    size: str  # the model size trained
    value: float  # the point's budget (tokens or FLOPs)
    chain: tuple[str, str, int]  # (arm, size, seed)
    branch_step: int = 0  # > 0: starts from the chain's longest run's checkpoint at this step
    source: Run | None = None  # that longest run


@dataclass
class Sweep:
    comparison: Comparison
    spec: SweepSpec
    cells: list[Cell]  # in training order: per chain the longest run first, then the others ascending
    # the points under `MIN_STEPS`, not trained: {arm, size, point, budget, steps}, one per (arm, size, point)
    left_out: list[dict[str, Any]] = field(default_factory=list)
    min_steps: int = MIN_STEPS  # the floor applied: 0 for a smoke run (`--budget tiny`, or every point short)
    notes: list[str] = field(default_factory=list)  # what the plan says of itself beyond the points left out


def shared_prefix(schedule: ScheduleConfig, steps: int, longest: int) -> int:
    """How many first steps a `steps`-step run shares with a `longest`-step run of the same schedule: the
    longest prefix over which their learning rates are equal at every step (see the module doc)."""
    for s in range(steps):
        if lr_factor(s, steps, schedule) != lr_factor(s, longest, schedule):
            return s
    return steps


def plan_sweep(
    exp: Experiment,
    report_dir: Path,
    spec: SweepSpec,
    budget: str | None = None,
    seeds: int = 1,
    resume: bool = False,
    force: bool = False,
    data: str | None = None,
    console: Console | None = None,
) -> Sweep:
    """Every check, nothing written: the report directory, each arm at each point, the sweep itself."""
    report_dir = Path(report_dir)
    check_report_dir(report_dir, seeds, resume, force)
    named = grid_budget(exp, budget)  # its grid is `spec`
    if budget not in (None, "default", "tiny") and named is None:
        raise UserError(
            f"--budget {budget}: a sweep sets each point's budget itself; only --budget tiny (smoke-run "
            "settings) or a named budget with a grid of its own (`sweep:`) goes with --sweep"
        )
    if exp.eval.finetune_rates == "first_seed":
        raise UserError(
            "eval.finetune_rates: first_seed is for a comparison; a sweep's points each choose their own"
        )
    train_over = named.train if named is not None else {}
    size_over = named.size if named is not None else None  # where the grid has no sizes
    tiny = budget == "tiny"
    seed_list = [exp.seed + k for k in range(seeds)]
    eval_options = suite.options_for(exp.eval.options, tiny)
    suite.check_options(eval_options)
    if exp.eval.data is not None and not Path(exp.eval.data).exists():
        raise UserError(f"eval data not found: {exp.eval.data} (the experiment's eval.data)")
    scratch = Path(tempfile.gettempdir()) / "objtrain-compare-check-does-not-exist"
    if spec.tiny_tokens:
        per_token = min(arm_flops(exp, seed_list[0], data, scratch, console)[0])
        spec = dataclasses.replace(
            spec, points=[readable_flops(t * per_token) for t in spec.points], tiny_tokens=False
        )
    identity: tuple[str, str, str] | None = None
    chains: list[list[Cell]] = []
    sizes: list[str | None] = list(spec.sizes) or [None]
    for seed in seed_list:
        for arm in exp.arms:
            for size in sizes:
                sized = arm if size is None else dataclasses.replace(
                    arm, model=dataclasses.replace(arm.model, size=size)
                )  # fmt: skip
                chain: list[Cell] = []
                for value in spec.points:
                    point = BudgetSpec(
                        **{spec.kind: int(value) if spec.kind == "tokens" else value},
                        train=train_over,
                        size=size_over if size is None else None,
                    )
                    cfg, plan, target_len, per_step, steps = _check_arm(
                        exp, sized, seed, point, tiny, data, scratch, console
                    )
                    here = (arm.name, str(plan.source.path.resolve()), _tokenizer_hash(plan))
                    if identity is None:
                        identity = here
                    elif here[1:] != identity[1:]:
                        raise UserError(
                            f"arms disagree on data: {identity[0]!r} uses {identity[1]}, {arm.name!r} uses "
                            f"{here[1]}; arms of one comparison train on the same store"
                        )
                    label = point_label(spec.kind, value, size)
                    key = f"{arm.name}.{label}" + ("" if seeds == 1 else f".seed-{seed}")
                    run_dir = report_dir / "arms" / arm.name / label / ("" if seeds == 1 else f"seed-{seed}")
                    run = Run(sized, seed, key, Path(run_dir), cfg, plan, target_len, per_step, steps)
                    chain.append(Cell(run, label, cfg.model.size, value, (arm.name, cfg.model.size, seed)))
                chains.append(chain)
    left_out = _too_short(chains, 0 if tiny else MIN_STEPS)
    # Every point of every arm under the floor: nothing left to fit, so the sweep is a smoke run of the
    # machinery, as `--budget tiny` is: every point trains and the plan and report say it is no finding.
    floor = (
        0 if tiny or len(left_out) == len({(c.chain[0], c.label) for ch in chains for c in ch}) else MIN_STEPS
    )
    short_run = floor == 0 and not tiny
    left_out = [] if floor == 0 else left_out
    short = {(p["arm"], p["point"]) for p in left_out}
    cells: list[Cell] = []
    for chain in chains:
        kept = [c for c in chain if (c.chain[0], c.label) not in short]
        cells += _link_chain(kept) if kept else []
    empty = [a.name for a in exp.arms if not any(c.chain[0] == a.name for c in cells)]
    if empty:
        longest = max((p for p in left_out if p["arm"] == empty[0]), key=lambda p: p["steps"])
        raise UserError(
            f"--sweep: every point of {empty[0]!r} would train fewer than {MIN_STEPS} optimizer steps (at "
            f"most {longest['steps']}, {longest['point']}); raise the budgets or choose smaller sizes"
        )
    budget_spec = BudgetSpec(
        **{spec.kind: int(spec.points[-1]) if spec.kind == "tokens" else spec.points[-1]}, train=train_over
    )
    comparison = Comparison(
        exp,
        report_dir,
        budget if named is not None and budget else "sweep",
        budget_spec,
        seed_list,
        [c.run for c in cells],
        tiny,
        data,
        resume,
        exp.eval.data,
        eval_options,
    )
    sweep = Sweep(comparison, spec, cells, left_out, floor)
    if short_run:
        most = max(c.run.steps or 1 for c in cells)
        sweep.notes.append(
            f"every point would train fewer than {MIN_STEPS} optimizer steps (at most {most}): all are "
            "trained as a smoke run of the machinery; its fits and claims are no finding"
        )
    if report_dir.exists() and resume and (report_dir / PLAN).is_file():
        saved = read_json(report_dir / PLAN, "comparison plan")
        now = sweep_plan_dict(sweep)
        if not isinstance(saved, dict):
            raise UserError(f"{report_dir / PLAN} is not a comparison plan: use another -o, or --force")
        for part in (saved, now):
            if isinstance(part.get("experiment"), dict):
                # As a comparison's resume (runner.plan_comparison): what judges the runs or names other
                # budgets may change; what trains them may not (the sweep itself is compared below).
                part["experiment"] = _without_unset({
                    k: v for k, v in part["experiment"].items() if k not in (*JUDGING_KEYS, "sweep")
                })  # fmt: skip
        for key in ("experiment", "sweep", "seeds", "data", "tiny"):
            if key == "sweep" and _grown_by_sizes(saved.get(key), now[key]):
                continue  # new sizes are chains of their own; the saved chains stay as they are
            if saved.get(key) != now.get(key):
                raise UserError(
                    f"--resume: the {key} differs from the one {report_dir} was started with; "
                    "use the same settings, another -o, or --force to start over"
                )
        if not _same_left_out(saved, now):
            raise UserError(
                f"--resume: {report_dir} was started with other points left out under the {MIN_STEPS}-step "
                "floor (a chain's warm-up follows its shortest point trained); use --force or another -o"
            )
    return sweep


def _same_left_out(saved: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether the saved plan left out the points the plan now leaves out (none in a plan from before the
    step floor), the points of sizes a resumed sweep adds (chains of their own) taken as they now are."""
    sizes = (saved.get("sweep") or {}).get("size") or []
    added = [p for p in now["left_out"] if sizes and p["size"] not in sizes]

    def keys(points: list[dict[str, Any]]) -> set[str]:
        return {json.dumps(p, sort_keys=True) for p in points}

    return keys([*(saved.get("left_out") or []), *added]) == keys(now["left_out"])


def _grown_by_sizes(saved: Any, now: dict[str, Any]) -> bool:
    """The same budget points with every saved size still in the grid (and at least one size before):
    each (arm, size, seed) chain branches only from itself, so the runs done stay valid."""
    if not isinstance(saved, dict) or not saved.get("size"):
        return False
    points = {k: v for k, v in saved.items() if k != "size"}
    return points == {k: v for k, v in now.items() if k != "size"} and set(saved["size"]) <= set(now["size"])


def _too_short(chains: list[list[Cell]], floor: int) -> list[dict[str, Any]]:
    """The points under `floor` optimizer steps, one entry per (arm, size, point) whatever the seed (a
    point short at one seed is left out at every seed, so the seeds stay paired), in plan order."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for chain in chains:
        for c in chain:
            steps = c.run.steps or 1
            if steps >= floor:
                continue
            entry = out.setdefault((c.chain[0], c.label), {
                "arm": c.chain[0], "size": c.size, "point": c.label, "budget": c.value, "steps": steps,
            })  # fmt: skip
            entry["steps"] = min(entry["steps"], steps)
    return list(out.values())


def left_out_lines(left_out: list[dict[str, Any]], kind: str, sized: bool) -> list[str]:
    """What the step floor left out, one sentence a point across the arms: "medium at 3e11 FLOPs would
    train 5 steps (clm, prefix-lm) and 8 (span), under 50"."""
    unit = "tokens" if kind == "tokens" else "FLOPs"
    order = list(dict.fromkeys(p["size"] for p in left_out))
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in sorted(left_out, key=lambda p: (order.index(p["size"]), float(p["budget"]))):
        groups.setdefault(p["point"], []).append(p)
    out = []
    for entries in groups.values():
        first = entries[0]
        where = f"{_short(first['budget'])} {unit}"
        by_steps: dict[int, list[str]] = {}
        for e in entries:
            by_steps.setdefault(int(e["steps"]), []).append(e["arm"])
        parts = [f"{steps}{' steps' if i == 0 else ''} ({', '.join(arms)})"
                 for i, (steps, arms) in enumerate(sorted(by_steps.items()))]  # fmt: skip
        text = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
        out.append(f"{first['size'] + ' at ' if sized else ''}{where} would train {text}, under {MIN_STEPS}")
    return out


def thin_text(points: dict[tuple[str, str], list[float]], kind: str, sized: bool) -> str:
    """The chains (arm, size) the step floor leaves short of a curve of their own (fewer than `MIN_POINTS`
    points or a span under `MIN_SPAN`), each with what it keeps, as one sentence ("" where none is);
    `points` holds every chain's remaining budgets, an empty list for a chain with none left."""
    unit = "tokens" if kind == "tokens" else "FLOPs"
    items = []
    for (arm, size), values in points.items():
        vals = sorted(set(values))
        who = f"{arm} at {size}" if sized else arm
        if not vals:
            items.append(f"{who}, no point")
            continue
        span = vals[-1] / vals[0]
        if len(vals) >= MIN_POINTS and span >= MIN_SPAN:
            continue
        kept = f"{len(vals)} point{'s' if len(vals) > 1 else ''} ({_short(vals[0])}" + (
            f" to {_short(vals[-1])} {unit}, {span:.2g}x)" if len(vals) > 1 else f" {unit})"
        )
        if not sized:
            kept += ", too few to fit" if len(vals) < MIN_POINTS else ", fitted over that span"
        items.append(f"{who}, {kept}")
    if not items:
        return ""
    then = ": their points still stand on the frontier at their budgets" if sized else ""
    return (
        f"left short of a curve of its own ({MIN_POINTS} points spanning {MIN_SPAN:g}x) by the "
        f"{MIN_STEPS}-step floor: {'; '.join(items)}{then}"
    )


def _short(value: float) -> str:
    """3e11, 1.5e12, 6400: a budget as the sweep's grid reads, to 3 digits (`point_label` is exact)."""
    text = f"{value:.3g}"
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent)}"
    plain = str(int(value)) if value == int(value) else text
    return min(text, plain, key=len)


def plan_notes(s: Sweep) -> list[str]:
    """What the plan leaves out and what that leaves thin, for the screen when a sweep starts."""
    sized = bool(s.spec.sizes)
    points: dict[tuple[str, str], list[float]] = {}
    first = s.comparison.seeds[0]
    for arm in s.comparison.experiment.arms:
        for p in s.left_out:
            if p["arm"] == arm.name:
                points.setdefault((arm.name, p["size"]), [])
        for c in s.cells:
            if c.chain[0] == arm.name and c.chain[2] == first:
                points.setdefault((arm.name, c.size), []).append(c.value)
    lines = [f"left out: {line}" for line in left_out_lines(s.left_out, s.spec.kind, sized)]
    thin = thin_text(points, s.spec.kind, sized)
    return s.notes + lines + ([thin] if thin else [])


def _link_chain(chain: list[Cell]) -> list[Cell]:
    """Fix the chain's warmup in steps, pick each shorter point's branch step; longest run first."""
    steps = [c.run.steps or 1 for c in chain]
    first = chain[0].run.cfg.schedule
    warm = warmup_steps(first, min(steps))
    for cell in chain:
        cell.run.cfg.schedule.warmup = warm  # the same warmup in steps at every point (module doc)
        # Every branch checkpoint, the final one and one saved on Ctrl-C stay until the sweep is done.
        cell.run.cfg.checkpoint.keep = max(cell.run.cfg.checkpoint.keep, len(chain) + 2)
    order = sorted(range(len(chain)), key=lambda i: (steps[i], i))
    longest = chain[order[-1]]
    total = steps[order[-1]]
    for i in order[:-1]:
        cell = chain[i]
        shared = shared_prefix(cell.run.cfg.schedule, steps[i], total)
        if shared > 0:
            cell.branch_step, cell.source = shared, longest.run
    return [longest] + [chain[i] for i in order[:-1]]


def sweep_plan_dict(s: Sweep) -> dict[str, Any]:
    return plan_dict(s.comparison) | {
        "sweep": s.spec.to_dict(),
        "tiny": s.comparison.tiny,
        "min_steps": s.min_steps,
        "left_out": s.left_out,
    }


def run_sweep(
    s: Sweep,
    evaluator: suite.Evaluator | None = None,
    console: Console | None = None,
    show_progress: bool = True,
) -> Sweep:
    """Train (or branch) and evaluate every cell not done yet; see the module doc."""
    c = s.comparison
    console = console or Console(stderr=True, highlight=False)
    evaluator = evaluator or suite.default_evaluator
    started = time.perf_counter()
    if c.report_dir.exists() and not c.resume:  # --force: every check has passed
        shutil.rmtree(c.report_dir)
    c.report_dir.mkdir(parents=True, exist_ok=True)
    previous = read_json(c.report_dir / PLAN, "comparison plan") if (c.report_dir / PLAN).is_file() else {}
    write_json(c.report_dir / PLAN, sweep_plan_dict(s) | {"seconds": float(previous.get("seconds", 0.0))})
    saves: dict[Path, set[int]] = {}
    for cell in s.cells:
        if cell.source is not None and cell.branch_step < (cell.source.steps or 0):
            saves.setdefault(cell.source.run_dir, set()).add(cell.branch_step)
    progress = ArmsProgress(
        console, [(cell.run.key, cell.run.steps) for cell in s.cells], enabled=show_progress
    )
    try:
        with progress:
            todo: list[Cell] = []
            for cell in s.cells:
                kept = kept_result(c, cell.run)
                if kept is not None:
                    c.results[cell.run.key] = kept
                    progress.skip(cell.run.key, "done")
                else:
                    todo.append(cell)
            if c.jobs > 1 and len({cell.chain for cell in todo}) > 1:
                _chains_at_once(s, todo, saves, evaluator, progress)
            else:
                for cell in todo:
                    _train_cell(cell, saves.get(cell.run.run_dir, ()), console, progress)
                    evaluate_run(c, cell.run, evaluator, progress)
    finally:
        c.seconds = float(previous.get("seconds", 0.0)) + time.perf_counter() - started
        if c.report_dir.is_dir():
            write_json(c.report_dir / PLAN, sweep_plan_dict(s) | {"seconds": c.seconds})
    return s


def _train_cell(
    cell: Cell, save_at: Collection[int], console: Console, progress: ArmsProgress | None = None
) -> None:
    """Train the cell's run to its end unless it is there: branched from its chain's longest run where that
    run's checkpoint is at hand, else from step 0 (module doc)."""
    run = cell.run
    if finished_checkpoint(run.run_dir) is not None:
        if progress is not None:
            progress.skip(run.key, "trained; evaluating")
        return
    if not run.run_dir.exists() and cell.source is not None:
        if cell.source.run_dir.exists():
            branch(cell)
            if progress is not None:
                progress.skip(run.key, f"branched at step {cell.branch_step} from {cell.source.key}")
        elif progress is not None:  # its chain's longest run was evaluated and its arms since removed (they
            # stay out of version control): the same run, trained from step 0
            progress.skip(run.key, f"{cell.source.key} is gone: training from step 0")
    on_record = None
    if progress is not None:
        progress.start(run.key)
        on_record = progress.record
    train_to_end(run.key, run.cfg, run.run_dir, console, on_record=on_record, save_at=save_at, kept="points")


def _chains_at_once(
    s: Sweep,
    todo: list[Cell],
    saves: dict[Path, set[int]],
    evaluator: suite.Evaluator,
    progress: ArmsProgress,
) -> None:
    """`--jobs N`: the chains (arm, size, seed) N at a time, each in a fresh process on its share of the
    cores, the longest chains first. Within a chain the points go one after another, the longest run first
    (the shorter ones branch from its checkpoints), so each trains exactly as in one process; chains share
    nothing. A chain's results files are written here when the chain ends (a point trained but not yet
    recorded when a run stops is only evaluated again on resume). As `compare --jobs`, after a failure or
    Ctrl-C no further chain starts and the running ones stop at a checkpoint."""
    c = s.comparison
    chains: dict[tuple[str, str, int], list[Cell]] = {}
    for cell in todo:
        chains.setdefault(cell.chain, []).append(cell)
    order = sorted(chains.values(), key=lambda cells: -max(cell.run.steps or 0 for cell in cells))
    threads = max(1, (os.cpu_count() or 1) // c.jobs)
    shared = c.report_dir / "arms" / SHARED_BASELINES
    by_future: dict[Future[list[tuple[str, dict[str, Any], float]]], list[Cell]] = {}
    failure: BaseException | None = None
    with ProcessPoolExecutor(c.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            for cells in order:
                # a sweep's points are all evaluated alike (no first-seed options: plan_sweep)
                work = [(cell, sorted(saves.get(cell.run.run_dir, ())), c.eval_options) for cell in cells]
                by_future[pool.submit(_run_chain, work, c.eval_data, evaluator, threads, shared)] = cells
            progress.skip(f"{len(order)} chains", f"{c.jobs} at once, {threads} thread(s) each")
            for job in as_completed(by_future):
                if job.cancelled():
                    continue
                try:
                    done = job.result()
                except BaseException as exc:  # the first failure is raised once the running chains end
                    failure = failure or exc
                    for other in by_future:
                        other.cancel()
                    continue
                runs = {cell.run.key: cell.run for cell in by_future[job]}
                for key, metrics, eval_seconds in done:
                    _record(c, runs[key], metrics, eval_seconds, progress)
        except BaseException:
            for other in by_future:
                other.cancel()
            raise
    if failure is not None:
        raise failure


def _run_chain(
    work: list[tuple[Cell, list[int], dict[str, Any]]],
    eval_data: str | None,
    evaluator: suite.Evaluator,
    threads: int,
    shared: Path,
) -> list[tuple[str, dict[str, Any], float]]:
    """One chain in a worker process of `_chains_at_once`: each point trained (or branched) and evaluated,
    in order: [(key, metrics, evaluation seconds)]."""
    torch.set_num_threads(threads)
    suite.share_baselines(shared)
    quiet = Console(stderr=True, quiet=True)
    out = []
    for cell, save_at, options in work:
        _train_cell(cell, save_at, quiet)
        t0 = time.perf_counter()
        metrics = evaluator(cell.run.run_dir, eval_data, options)
        out.append((cell.run.key, metrics, time.perf_counter() - t0))
    return out


def branch(cell: Cell) -> None:
    """Create the cell's run directory from its chain's longest run at `branch_step` (module doc): the
    checkpoint copied with the state the cell's own run would have saved there, `latest` naming it, the
    longest run's metrics up to that step, the cell's config. The directory appears whole or not at all."""
    assert cell.source is not None
    step = cell.branch_step
    src = ckpt.checkpoints_dir(cell.source.run_dir) / ckpt.step_name(step)
    if not ckpt.is_complete(src):
        raise UserError(
            f"{cell.run.key}: the checkpoint at step {step} of {cell.source.run_dir} it branches from is "
            "missing or damaged; start the sweep again with --force"
        )
    state = json.loads((src / ckpt.STATE).read_text(encoding="utf-8"))
    # Only the schedule's length and the config depend on the budget; everything else (weights, Adam
    # moments, data position, counters, RNG states) is what the cell's own run holds at this step.
    state["total_steps"] = cell.run.steps
    state["schedule_totals"] = [[0, cell.run.steps]]  # the schedule's history: one total since step 0
    state["config"] = config_dict(cell.run.cfg)
    with atomic_dir(cell.run.run_dir) as tmp:
        shutil.copytree(src, tmp / "checkpoints" / src.name)
        with open(tmp / "checkpoints" / src.name / ckpt.STATE, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(state, indent=2, allow_nan=False) + "\n")
        mark_latest(tmp, src.name)
        lines = []
        metrics = cell.source.run_dir / "metrics.jsonl"
        if metrics.is_file():
            for line in metrics.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if "event" not in record and int(record.get("step", step + 1)) <= step:
                    lines.append(line)
        lines.append(json.dumps({"event": "branch", "step": step, "from": str(src)}))
        with atomic_file(tmp / "metrics.jsonl", "w") as handle:
            handle.write("\n".join(lines) + "\n")
        with atomic_file(tmp / "config.yaml", "w") as handle:
            yaml.safe_dump(config_dict(cell.run.cfg) | {"branched_from": str(src)}, handle, sort_keys=False)


def sweep_from_experiment(exp: Experiment, cli: list[str] | None, budget: str | None) -> SweepSpec | None:
    """The sweep `objtrain compare` runs, or None for an ordinary comparison: the grid of a named budget
    that has one (`budgets: {gpu: {sweep: ...}}`) in place of the experiment's own."""
    named = grid_budget(exp, budget)
    return parse_sweep(cli, named.sweep if named is not None else exp.sweep, budget == "tiny")


def grid_budget(exp: Experiment, budget: str | None) -> BudgetSpec | None:
    """The named budget if it brings a grid of its own (`budgets: {gpu: {sweep: ...}}`), else None."""
    named = exp.budgets.get(budget or "")
    return named if named is not None and named.sweep else None


__all__ = [
    "ArmSpec",
    "Cell",
    "Sweep",
    "SweepSpec",
    "branch",
    "grid_budget",
    "left_out_lines",
    "parse_sweep",
    "plan_sweep",
    "run_sweep",
    "thin_text",
]
