"""Run a comparison: check every arm, train each as a normal run under REPORT/arms/, evaluate, report.

    REPORT/plan.json               what is being compared (experiment, budget, seeds): --resume checks it
    REPORT/arms/NAME/              one `objtrain train` run per arm (NAME/seed-S/ with --seeds K > 1)
    REPORT/results/NAME[.seed-S].json   that run's cost and metrics, written once it is trained and evaluated
    REPORT/report.md, results.json, *.png

Resume: a run with a results file is done; a run whose newest checkpoint is at its last step is trained
(only evaluated again); any other run continues from its newest checkpoint through the training loop's
own exact resume. Refusals (bad experiment, arms that disagree on data or tokenizer, an existing report,
--resume with --force) happen before the first file is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import multiprocessing
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from objtrain.compare import suite
from objtrain.compare.experiment import (
    TINY,
    ArmSpec,
    BudgetSpec,
    Experiment,
    arm_config,
    experiment_dict,
    resolve_budget,
)
from objtrain.compare.progress import ArmsProgress
from objtrain.data.batches import leading_batches
from objtrain.errors import UserError
from objtrain.io import read_json, write_json
from objtrain.models.zoo import build_model, count_parameters
from objtrain.training import accounting
from objtrain.training import checkpoint as ckpt
from objtrain.training.config import TrainConfig, config_dict
from objtrain.training.loop import Plan, prepare, train

PLAN = "plan.json"
SHARED_BASELINES = ".baselines"  # under REPORT/arms/: the suite's baselines shared by `--jobs` processes


class Interrupted(UserError):
    """Ctrl-C or SIGTERM during an arm: its checkpoint is saved, finished arms are kept."""


@dataclass
class Run:
    """One arm at one seed."""

    arm: ArmSpec
    seed: int
    key: str  # NAME, or NAME.seed-S with several seeds
    run_dir: Path
    cfg: TrainConfig
    plan: Plan
    target_len: int | None  # decoder length of one encoder-decoder batch (FLOPs)
    flops_per_step: float
    steps: int | None  # None: fixed by timing a step (seconds budget)


@dataclass
class Comparison:
    experiment: Experiment
    report_dir: Path
    budget_name: str
    budget: BudgetSpec
    seeds: list[int]
    runs: list[Run]
    tiny: bool
    data: str | None
    resume: bool
    eval_data: str | None
    eval_options: dict[str, Any]
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # run key -> results file contents
    seconds: float = 0.0
    # {"from": K, "to": N, "max": M, "for": [claims]}: seeds added because claims' intervals straddled
    seeds_raised: dict[str, Any] | None = None
    # Runs trained at once, each in a process of its own on its share of the cores (`compare --jobs`); how
    # the work is spread, not what is compared, so not part of the plan a resume checks.
    jobs: int = 1
    first_seed_options: dict[str, Any] = field(default_factory=dict)  # the experiment's eval.first_seed


def plan_comparison(
    exp: Experiment,
    report_dir: Path,
    budget: str | None = None,
    seeds: int = 1,
    resume: bool = False,
    force: bool = False,
    data: str | None = None,
    console: Console | None = None,
) -> Comparison:
    """Every check, nothing written (the embedded store may be built once into the user's cache)."""
    report_dir = Path(report_dir)
    check_report_dir(report_dir, seeds, resume, force)
    budget_name, spec = resolve_budget(exp, budget)
    tiny = budget_name == "tiny"
    seed_list = [exp.seed + k for k in range(seeds)]
    scratch = Path(tempfile.gettempdir()) / "objtrain-compare-check-does-not-exist"
    if tiny and exp.budget.kind == "flops":
        spec = tiny_flops(exp, seed_list[0], data, scratch, console)
    saved = _saved_plan(report_dir) if resume else None
    if saved is not None:
        seed_list = _resumed_seeds(saved.get("seeds"), seed_list)
    eval_options = suite.options_for(exp.eval.options, tiny)
    suite.check_options({**eval_options, **exp.eval.first_seed})
    if exp.eval.data is not None and not Path(exp.eval.data).exists():
        raise UserError(f"eval data not found: {exp.eval.data} (the experiment's eval.data)")

    runs: list[Run] = []
    identity: tuple[str, str, str] | None = None  # (arm, data, tokenizer hash) of the first arm
    for seed in seed_list:
        for arm in exp.arms:
            one = len(seed_list) == 1
            key = arm.name if one else f"{arm.name}.seed-{seed}"
            run_dir = report_dir / "arms" / arm.name / ("" if one else f"seed-{seed}")
            cfg, plan, target_len, per_step, steps = _check_arm(
                exp, arm, seed, spec, tiny, data, scratch, console
            )
            here = (arm.name, plan.source.identity, _tokenizer_hash(plan))
            if identity is None:
                identity = here
            elif here[1:] != identity[1:]:
                what = "tokenizer and data" if here[2] != identity[2] else "data"
                raise UserError(
                    f"arms disagree on {what}: {identity[0]!r} uses {identity[1]}, "
                    f"{arm.name!r} uses {here[1]}; arms of one comparison train on the same store"
                )
            runs.append(Run(arm, seed, key, Path(run_dir), cfg, plan, target_len, per_step, steps))

    comparison = Comparison(
        exp, report_dir, budget_name, spec, seed_list, runs, tiny, data, resume, exp.eval.data, eval_options
    )
    comparison.first_seed_options = suite.capped(exp.eval.first_seed, tiny)
    if saved is not None:
        now = plan_dict(comparison)
        # What the arms train on must match; the evaluation may change (finished arms are re-evaluated).
        for part in (saved, now):
            if isinstance(part.get("experiment"), dict):
                # what is measured and how it is judged (eval, claims, the papers' regime) may change; the
                # question and the words around it too, and the named budgets not chosen (`budget` is
                # compared below)
                part["experiment"] = {k: v for k, v in part["experiment"].items() if k not in JUDGING_KEYS}
                # A setting added since the report was planned reads as absent while it is unset
                part["experiment"] = _without_unset(part["experiment"])
        for key in ("experiment", "budget", "seeds", "data"):
            if key == "seeds" and _extends(saved.get(key), now[key]):
                continue  # more seeds for the same arms: the finished ones are kept
            if saved.get(key) != now[key]:
                what = "seeds differ from those" if key == "seeds" else f"{key} differs from the one"
                raise UserError(
                    f"--resume: the {what} {report_dir} was started with; "
                    "use the same settings, another -o, or --force to start over"
                )
        raised = saved.get("seeds_raised")  # kept while the report still has the seeds added
        if isinstance(raised, dict) and len(comparison.seeds) > int(raised.get("from", len(seed_list))):
            comparison.seeds_raised = raised
    return comparison


TINY_STEPS = 32  # the fewest steps the dearest arm takes under a tiny FLOPs budget


def tiny_flops(
    exp: Experiment, seed: int, data: str | None, scratch: Path, console: Console | None
) -> BudgetSpec:
    """`--budget tiny` on an experiment held at equal FLOPs: still FLOPs, the smoke run's tokens
    (`experiment.TINY`) at the cheapest arm's FLOPs per token, raised to `TINY_STEPS` of the dearest arm's
    steps (an arm's FLOPs are whole steps under the budget: with fewer, one step's rounding would part the
    arms' FLOPs by more than 3%), never more than the experiment's own budget."""
    per_token, per_step = arm_flops(exp, seed, data, scratch, console)
    flops = max(float(TINY.value) * min(per_token), TINY_STEPS * max(per_step))
    return BudgetSpec(
        flops=min(readable_flops(flops), float(exp.budget.value)), size=TINY.size, train=dict(TINY.train)
    )


def arm_flops(
    exp: Experiment, seed: int, data: str | None, scratch: Path, console: Console | None
) -> tuple[list[float], list[float]]:
    """Each arm's training FLOPs per token and per step at the smoke run's settings (`--budget tiny`)."""
    per_token, per_step_all = [], []
    for arm in exp.arms:
        cfg, plan, _, per_step = _placeholder_plan(exp, arm, seed, TINY, True, data, scratch, console)
        per_token.append(per_step / (cfg.batch.batch_size * plan.seq_len))
        per_step_all.append(per_step)
    return per_token, per_step_all


def readable_flops(flops: float) -> float:
    """`flops` rounded up to three significant digits: a budget a reader can type."""
    unit = 10.0 ** (math.floor(math.log10(flops)) - 2)
    return float(f"{math.ceil(flops / unit) * unit:.6g}")


def _saved_plan(report_dir: Path) -> dict[str, Any] | None:
    """The plan a report was started with (None: a new report); refused if it is not a JSON object."""
    path = report_dir / PLAN
    if not (report_dir.is_dir() and path.is_file()):
        return None
    saved = read_json(path, "comparison plan")
    if not isinstance(saved, dict):
        raise UserError(
            f"{path} is not a comparison plan (not a JSON object): use another -o, or --force to start over"
        )
    return saved


def _extends(saved: Any, now: list[int]) -> bool:
    """Whether `now` is `saved` with seeds added after it. From one seed it is not: a one-seed report keeps
    its arms in arms/NAME/, a several-seed one in arms/NAME/seed-S/."""
    return isinstance(saved, list) and 2 <= len(saved) < len(now) and now[: len(saved)] == saved


def _resumed_seeds(saved: Any, asked: list[int]) -> list[int]:
    """A report whose seeds were raised (`--max-seeds`) resumes with all of them when asked for its first."""
    if isinstance(saved, list) and _extends(asked, saved):
        return [int(s) for s in saved]
    return asked


# Experiment keys that judge or describe the runs, or name budgets not chosen: a resume may change them.
JUDGING_KEYS = ("eval", "claims", "withdrawn", "question", "expect", "source", "regime", "budgets")


def check_report_dir(report_dir: Path, seeds: int, resume: bool, force: bool) -> None:
    """The refusals about REPORT itself and --seeds, shared by a comparison and a sweep."""
    if resume and force:  # which one was meant is a guess either way: an arm's training or its deletion
        raise UserError("--resume continues REPORT and --force replaces it: give one of them")
    if seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    if report_dir.exists():
        if not (resume or force):
            raise UserError(
                f"{report_dir} already exists (pass --resume to continue it or --force to replace it)"
            )
        if not report_dir.is_dir():
            raise UserError(f"{report_dir} exists and is not a directory")
        if any(report_dir.iterdir()) and not (report_dir / PLAN).is_file():
            raise UserError(f"{report_dir} exists and is not a comparison report; choose another -o")


def _placeholder_plan(
    exp: Experiment,
    arm: ArmSpec,
    seed: int,
    spec: BudgetSpec,
    tiny: bool,
    data: str | None,
    scratch: Path,
    console: Console | None,
) -> tuple[TrainConfig, Plan, int | None, float]:
    """The arm planned with a placeholder budget of one step (its refusal named by the arm): the plan gives
    seq_len, model and objective, and so the decoder length and FLOPs of a step (`_target_len_and_flops`)."""
    cfg = arm_config(exp, arm, seed, {"steps": 1}, tiny, data, scale=spec)
    try:
        plan = prepare(cfg, scratch, console=console)
    except UserError as exc:
        raise UserError(f"arm {arm.name!r}: {exc}") from None
    target_len, per_step = _target_len_and_flops(plan, cfg.batch.batch_size)
    return cfg, plan, target_len, per_step


def _check_arm(
    exp: Experiment,
    arm: ArmSpec,
    seed: int,
    spec: BudgetSpec,
    tiny: bool,
    data: str | None,
    scratch: Path,
    console: Console | None,
) -> tuple[TrainConfig, Plan, int | None, float, int | None]:
    """The arm's config and the loop's own checks; the budget turned into this arm's steps."""
    cfg, plan, target_len, per_step = _placeholder_plan(exp, arm, seed, spec, tiny, data, scratch, console)
    rows = cfg.batch.batch_size
    steps: int | None
    if spec.kind == "tokens":
        steps = max(math.ceil(spec.value / (rows * plan.seq_len)), 1)
        budget: dict[str, Any] = {"tokens": int(spec.value)}
    elif spec.kind == "flops":
        steps = max(int(spec.value // per_step), 1)
        budget = {"steps": steps}
    else:
        steps = None
        budget = {"seconds": spec.value}
    overrides: dict[str, Any] = {}
    if "every" not in exp.train.get("validation", {}) and "every" not in arm.train.get("validation", {}):
        # Enough validations for a loss curve: about eight points a run.
        overrides["validation"] = {"every": max((steps or 80) // (4 if tiny else 8), 1)}
    cfg = arm_config(exp, arm, seed, budget, tiny, data, defaults=overrides, scale=spec)
    plan.cfg = cfg
    return cfg, plan, target_len, per_step, steps


def _target_len_and_flops(plan: Plan, rows: int) -> tuple[int | None, float]:
    """Decoder positions of an encoder-decoder batch (None otherwise) and the training FLOPs of a step of
    `rows` rows, both from two real corrupted rows: the batch says what the model runs (a contrastive
    row's two views, an unembedding no loss reads), `accounting.batch_flops`."""
    stream = plan.source.stream("train", plan.cfg.seed)
    (batch,) = leading_batches(stream, plan.objective, plan.seq_len, 2, 2, plan.cfg.seed, within_epoch=False)
    target_len = int(batch.labels.size(1)) if plan.model_cfg.kind == "encdec" else None
    return target_len, accounting.batch_flops(plan.model_cfg, batch) * rows / 2


def _tokenizer_hash(plan: Plan) -> str:
    return hashlib.sha256(plan.source.tokenizer.model_proto).hexdigest()


def plan_dict(c: Comparison) -> dict[str, Any]:
    return {
        "experiment": json.loads(json.dumps(experiment_dict(c.experiment))),
        "budget": {"name": c.budget_name, c.budget.kind: c.budget.value}
        | ({"size": c.budget.size} if c.budget.size else {})
        | ({"train": c.budget.train} if c.budget.train else {}),
        "seeds": c.seeds,
        "data": c.data,
    } | ({"seeds_raised": c.seeds_raised} if c.seeds_raised else {})


def run_comparison(
    c: Comparison,
    evaluator: suite.Evaluator | None = None,
    console: Console | None = None,
    show_progress: bool = True,
) -> Comparison:
    """Train and evaluate every run not done yet, then return with `results` filled (see the module doc)."""
    console = console or Console(stderr=True, highlight=False)
    evaluator = evaluator or suite.default_evaluator
    started = time.perf_counter()
    if c.report_dir.exists() and not c.resume:  # --force: every check has passed
        shutil.rmtree(c.report_dir)
    c.report_dir.mkdir(parents=True, exist_ok=True)
    previous = read_json(c.report_dir / PLAN, "comparison plan") if (c.report_dir / PLAN).is_file() else {}
    write_json(c.report_dir / PLAN, plan_dict(c) | {"seconds": float(previous.get("seconds", 0.0))})
    progress = ArmsProgress(console, [(r.key, r.steps) for r in c.runs], enabled=show_progress)
    try:
        with progress:
            todo = []
            for run in c.runs:
                kept = kept_result(c, run)  # else not run yet, or evaluated with other options: again
                if kept is not None:
                    c.results[run.key] = kept
                    progress.skip(run.key, "done")
                else:
                    todo.append(run)
            if c.jobs > 1 and len(todo) > 1:
                _run_at_once(c, todo, evaluator, progress)
            else:
                for run in todo:
                    _run_here(c, run, evaluator, progress, console)
    finally:
        c.seconds = float(previous.get("seconds", 0.0)) + time.perf_counter() - started
        if c.report_dir.is_dir():
            write_json(c.report_dir / PLAN, plan_dict(c) | {"seconds": c.seconds})
    return c


def _run_here(
    c: Comparison, run: Run, evaluator: suite.Evaluator, progress: ArmsProgress, console: Console
) -> None:
    """Train (or resume) the run in this process unless it is trained, then evaluate it."""
    if finished_checkpoint(run.run_dir) is None:
        progress.start(run.key)
        train_to_end(run.key, run.cfg, run.run_dir, console, on_record=progress.record)
    else:
        progress.skip(run.key, "trained; evaluating")
    evaluate_run(c, run, evaluator, progress)


def train_to_end(
    key: str,
    cfg: TrainConfig,
    run_dir: Path,
    console: Console,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    save_at: Collection[int] = (),
    kept: str = "arms",
) -> None:
    """Train a run of a comparison (or sweep) to its last step, resuming it where it stopped; Ctrl-C or
    SIGTERM ends it at a checkpoint and raises Interrupted, which says that the finished `kept` stay."""
    result = train(cfg, run_dir, resume=run_dir.exists(), console=console, show_progress=False,
                   on_record=on_record, save_at=save_at)  # fmt: skip
    if result.stopped:
        raise Interrupted(
            f"interrupted during {key!r} (checkpoint saved at step {result.step}); "
            f"finished {kept} are kept: continue with --resume"
        )


def run_options(c: Comparison, run: Run) -> dict[str, Any] | None:
    """The suite's options for one run: the experiment's, with `eval.first_seed` laid over them for each
    arm's first seed (the runs whose checkpoints a measurement's own noise is measured on). With
    `eval.finetune_rates: first_seed` a later seed fine-tunes at the rates its arm's first seed chose, so
    its options wait on that seed's results: None until they are in."""
    first = c.seeds[0]
    if run.seed == first:
        return {**c.eval_options, **c.first_seed_options} if c.first_seed_options else c.eval_options
    if c.experiment.eval.finetune_rates != "first_seed" or not c.eval_options.get("finetune"):
        return c.eval_options
    lead = next(r for r in c.runs if r.arm.name == run.arm.name and r.seed == first)
    record = c.results.get(lead.key)
    if record is None:
        return None
    return c.eval_options | later_seed_rates(record.get("eval", {}), lead.cfg.seed)


CHOSEN_RATE = re.compile(r"^finetune_(?:(\w+)_)?lr$")


def chosen_rates(scores: dict[str, Any]) -> dict[str, float]:
    """The peak rate each fine-tuned task chose (`finetune_TASK_lr`; "" for the default probe's task), the
    random-init twins' (`..._random_init_lr`) left out."""
    out = {}
    for key, value in scores.items():
        m = CHOSEN_RATE.match(key)
        if m and "random_init" not in key and isinstance(value, (int, float)):
            out[m.group(1) or ""] = float(value)
    return out


def later_seed_rates(scores: dict[str, Any], twin_seed: int) -> dict[str, Any]:
    """A first seed's fine-tune rates as suite options for the arm's other seeds: each task's rate, and the
    training seed whose random-init twin chose the twins' rate."""
    chosen = chosen_rates(scores)
    return {"finetune_lr_chosen": chosen, "finetune_twin_seed": twin_seed} if chosen else {}


def kept_result(c: Comparison, run: Run) -> dict[str, Any] | None:
    """The run's results file if it was evaluated with the comparison's evaluation, else None."""
    path = result_path(c.report_dir, run.key)
    options = run_options(c, run)
    if not path.is_file() or options is None:
        return None
    kept = read_json(path, "arm result")
    same = kept.get("eval_data") == c.eval_data and kept.get("eval_options") == _jsonable(options)
    return kept if same else None


def evaluate_run(c: Comparison, run: Run, evaluator: suite.Evaluator, progress: ArmsProgress) -> None:
    """Evaluate a trained run and write its results file (which marks it done)."""
    options = run_options(c, run)
    if options is None:  # runs go seed by seed: the first seed's are evaluated before
        raise RuntimeError(f"{run.key} evaluated before its arm's first seed")
    progress.evaluating(run.key)
    t0 = time.perf_counter()
    metrics = evaluator(run.run_dir, c.eval_data, options)
    _record(c, run, metrics, time.perf_counter() - t0, progress)


def _record(
    c: Comparison, run: Run, metrics: dict[str, Any], eval_seconds: float, progress: ArmsProgress
) -> None:
    record = {
        "arm": run.arm.name,
        "seed": run.seed,
        "run_dir": str(run.run_dir),
        "train": train_summary(run),
        "eval": _jsonable(metrics),
        "eval_seconds": eval_seconds,
        "eval_data": c.eval_data,
        "eval_options": _jsonable(run_options(c, run)),
    }
    write_json(result_path(c.report_dir, run.key), record)
    c.results[run.key] = record
    progress.done(run.key, record)


def _run_at_once(c: Comparison, todo: list[Run], evaluator: suite.Evaluator, progress: ArmsProgress) -> None:
    """Train and evaluate `todo`, `c.jobs` runs at a time, each in a fresh process on its share of the
    cores; the results files are written here as each run ends. Runs are independent and seeded, so a run
    trains alike whichever process takes it (on the same number of threads). Tiny models use threads
    poorly: two one-thread runs on 2 cores train about 12% more tokens a second than one two-thread run
    (benchmarks/bench_findings.py). A run whose evaluation waits on its arm's first seed (`run_options`)
    is trained, then evaluated once that seed's results are in. After a failure or Ctrl-C no further run
    starts; the running ones end at a checkpoint of their own (the training loop's SIGINT handling), and
    what finished is kept."""
    threads = max(1, (os.cpu_count() or 1) // c.jobs)
    shared = c.report_dir / "arms" / SHARED_BASELINES  # with the runs' state, never published
    by_future: dict[Future[tuple[dict[str, Any] | None, float]], Run] = {}
    waiting: list[Run] = []  # trained; evaluated once their arm's first seed is
    failure: BaseException | None = None
    # spawn, not fork: a forked child would inherit the parent's torch threads and locks mid-use.
    with ProcessPoolExecutor(c.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:

        def submit(run: Run) -> None:
            job = pool.submit(_train_and_evaluate, run.key, run.cfg, run.run_dir, c.eval_data,
                              run_options(c, run), evaluator, threads, shared)  # fmt: skip
            by_future[job] = run

        try:
            for run in todo:
                submit(run)
            progress.skip(f"{len(todo)} runs", f"{c.jobs} at once, {threads} thread(s) each")
            while by_future:
                done, _ = wait(by_future, return_when=FIRST_COMPLETED)
                for job in done:
                    run = by_future.pop(job)
                    if job.cancelled():
                        continue
                    try:
                        metrics, eval_seconds = job.result()
                    except BaseException as exc:  # the first failure is raised once the running runs end
                        failure = failure or exc
                        for other in by_future:
                            other.cancel()
                        continue
                    if metrics is None:
                        waiting.append(run)
                    else:
                        _record(c, run, metrics, eval_seconds, progress)
                ready = [r for r in waiting if run_options(c, r) is not None] if failure is None else []
                for run in ready:
                    waiting.remove(run)
                    submit(run)
        except BaseException:  # Ctrl-C here: start nothing more; the running runs stop at a checkpoint
            for other in by_future:
                other.cancel()
            raise
    if failure is not None:
        raise failure


def _train_and_evaluate(
    key: str,
    cfg: TrainConfig,
    run_dir: Path,
    eval_data: str | None,
    eval_options: dict[str, Any] | None,
    evaluator: suite.Evaluator,
    threads: int,
    shared: Path,
) -> tuple[dict[str, Any] | None, float]:
    """One run in a worker process of `_run_at_once`: trained (or resumed) to its last step unless it is
    already there, then evaluated: (metrics, evaluation seconds); (None, 0) where `eval_options` is None
    (its evaluation waits on another run's results)."""
    torch.set_num_threads(threads)
    suite.share_baselines(shared)
    if finished_checkpoint(run_dir) is None:  # the parent says when each run ends
        train_to_end(key, cfg, run_dir, Console(stderr=True, quiet=True))
    if eval_options is None:
        return None, 0.0
    t0 = time.perf_counter()
    metrics = evaluator(run_dir, eval_data, eval_options)
    return metrics, time.perf_counter() - t0


def result_path(report_dir: Path, key: str) -> Path:
    return report_dir / "results" / f"{key}.json"


def finished_checkpoint(run_dir: Path) -> Path | None:
    """The run's newest complete checkpoint if it is at the run's last step, else None."""
    if not run_dir.is_dir():
        return None
    latest = ckpt.latest_checkpoint(run_dir)
    if latest is None:
        return None
    state = json.loads((latest / ckpt.STATE).read_text(encoding="utf-8"))
    return latest if int(state["step"]) >= int(state["total_steps"]) else None


def metrics_records(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl, keeping the last record per (kind, step): a resumed run re-logs steps it redid."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        if "step" not in record or "event" in record:
            continue
        kind = "val" if record.get("split") == "val" else "train"
        latest[(kind, int(record["step"]))] = record
    return [latest[k] for k in sorted(latest, key=lambda k: (k[1], k[0]))]


def train_summary(run: Run) -> dict[str, Any]:
    """What the run cost and its last validation, read back from its files (same for resumed runs)."""
    final = finished_checkpoint(run.run_dir)
    if final is None:
        raise UserError(f"{run.run_dir} has no checkpoint at its last step")
    state = json.loads((final / ckpt.STATE).read_text(encoding="utf-8"))
    records = metrics_records(run.run_dir)
    steps = [r for r in records if r.get("split") != "val" and "loss" in r]
    vals = [r for r in records if r.get("split") == "val"]
    model = build_model(run.plan.model_cfg)
    tokens, seconds, step = int(state["tokens"]), float(state["seconds"]), int(state["step"])
    out: dict[str, Any] = {
        "objective": run.cfg.objective.name,
        "model_kind": run.plan.model_cfg.kind,
        "model_size": run.cfg.model.size,
        "parameters": count_parameters(model),
        "parameters_no_embedding": count_parameters(model, embeddings=False),
        "seq_len": run.plan.seq_len,
        "batch_size": run.cfg.batch.batch_size,
        "steps": step,
        "tokens": tokens,
        "target_tokens": int(state.get("target_tokens", 0)),
        "flops": run.flops_per_step * step,
        "seconds": seconds,
        "tokens_per_s": tokens / max(seconds, 1e-9),
        "peak_memory_bytes": max((int(r.get("peak_mem_bytes") or 0) for r in steps), default=0),
        "threads": int(state.get("threads", torch.get_num_threads())),
        "dtype": state.get("dtype"),
        "final_loss": steps[-1]["loss"] if steps else None,
        # Throughput as a share of the machine's measured matmul rate: steadier than tokens/s when the
        # machine's load changes during a comparison (the median over the arm's steps).
        "mfu": _median([float(r["mfu"]) for r in steps if isinstance(r.get("mfu"), (int, float))]),
        "checkpoint": str(final),
        "config": config_dict(run.cfg),
    }
    if vals:
        out.update({k: v for k, v in vals[-1].items() if k.startswith("val_")})
    out["curve"] = [
        {k: r.get(k) for k in ("step", "tokens", "wall_time", "val_loss", "val_bpb") if k in r} for r in vals
    ]
    return out


def _without_unset(value: Any) -> Any:
    """`value` with every mapping entry that is None or an empty mapping left out, recursively."""
    if isinstance(value, dict):
        kept = {k: _without_unset(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v is not None and v != {}}
    if isinstance(value, list):
        return [_without_unset(v) for v in value]
    return value


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return str(value)


def machine() -> dict[str, Any]:
    """Where the comparison ran: costs are only comparable within one machine and one run."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": accounting.processor_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    with contextlib.suppress(OSError):
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    try:
        root = Path(__file__).resolve().parents[2]
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        if commit.returncode == 0:
            info["commit"] = commit.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info
