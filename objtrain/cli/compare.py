"""`objtrain compare`: thin glue over `objtrain.compare` (experiment YAML -> arms -> report)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from objtrain.cli.common import interrupt_note, make_console
from objtrain.compare import load_experiment, plan_comparison, run_comparison
from objtrain.compare.regime import seeds_wanted
from objtrain.compare.runner import PLAN, Comparison, Interrupted
from objtrain.compare.sweep import (
    Sweep,
    SweepSpec,
    plan_notes,
    plan_sweep,
    run_sweep,
    sweep_from_experiment,
)
from objtrain.errors import UserError
from objtrain.io import OutputLock, Unwritable, check_writable
from objtrain.report import print_tables, write_report, write_sweep_report

HELP = """Train several arms under one equal budget, evaluate them with the same suite, report side by side.

Example: objtrain compare configs/experiments/objectives.yaml -o reports/objectives --budget tiny
"""


def run(
    experiment: Path = typer.Argument(..., help="An experiment YAML (see configs/experiments/)."),
    output: Path = typer.Option(
        ..., "--output", "-o", help="Report directory (arms train under REPORT/arms/)."
    ),
    budget: str = typer.Option(
        None,
        "--budget",
        help="tiny (a smoke run; an experiment held at equal FLOPs keeps FLOPs, a smaller budget), a name "
        "from the experiment's budgets:, or a number of tokens (default: the experiment's own budget).",
    ),
    seeds: int = typer.Option(1, "--seeds", help="Train every arm with K seeds; report mean ± std."),
    max_seeds: int = typer.Option(
        None,
        "--max-seeds",
        help="Add seeds, up to M, while a claim's interval straddles its verdict's boundary and the seed "
        "spread says a few more would resolve it (needs --seeds 2 or more).",
    ),
    data: str = typer.Option(
        None, "--data", help="Token or packed store for every arm, instead of the experiment's."
    ),
    eval_options: list[str] = typer.Option(
        None,
        "--eval",
        help="KEY=VALUE over the experiment's eval options (repeatable), e.g. probe_data=DATA_DIR "
        "or probe_tasks=sst2,trec.",
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue REPORT: finished arms are kept."),
    force: bool = typer.Option(False, "--force", help="Replace an existing REPORT."),
    sweep: list[str] = typer.Option(
        None,
        "--sweep",
        help="Train every arm at every point: tokens=2e5,6e5,2e6,6e6 or flops=..., and optionally "
        "--sweep size=debug,tiny,small; at least 3 points spanning 30x. Fits loss against FLOPs per arm.",
    ),
    jobs: int = typer.Option(
        1,
        "--jobs",
        help="Runs trained at once, each in its own process on its share of the cores (a sweep: chains of "
        "one arm, size and seed); each run trains as it would alone on as many threads.",
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Plan every run (each arm's parameters, steps, tokens and FLOPs) and stop; nothing is written.",
    ),
    peak_tflops: float = typer.Option(
        None,
        "--peak-tflops",
        min=0.001,
        help="With --dry-run: the accelerator's peak TFLOP/s (an H100's dense bf16: 989), for the time at "
        "40% of it.",
    ),
) -> None:
    console = make_console(stderr=True, highlight=False)
    exp = load_experiment(experiment)
    exp.eval.options = {**exp.eval.options, **parse_eval_options(eval_options or [])}
    spec = sweep_from_experiment(exp, sweep, budget)
    if dry_run:
        if spec is not None:
            raise UserError("--dry-run plans a comparison; a sweep's plan is printed when it starts")
        planned = plan_comparison(exp, output, budget, seeds, resume=resume, force=True, data=data)
        print_plan(planned, make_console(highlight=False), peak_tflops)
        return
    if peak_tflops is not None:
        raise UserError("--peak-tflops goes with --dry-run")
    check_jobs(jobs)
    if max_seeds is not None:
        check_max_seeds(max_seeds, seeds, spec is not None)
    if spec is not None:
        with _held_report(
            output,
            force,
            lambda: plan_sweep(
                exp, output, spec, budget, seeds, resume=resume, force=force, data=data, console=console
            ),
        ) as s:
            s.comparison.jobs = jobs
            _sweep(s, spec, output, console)
            write_sweep_report(s, make_console(highlight=False))
            console.print(
                f"report: {output / 'report.md'} (results.json and curves.png beside it)", markup=False
            )
        return
    with _held_report(
        output,
        force,
        lambda: plan_comparison(
            exp, output, budget, seeds, resume=resume, force=force, data=data, console=console
        ),
    ) as comparison:
        comparison.jobs = jobs

        def more_seeds(n: int) -> Comparison:
            more = plan_comparison(exp, output, budget, n, resume=True, data=data, console=console)
            more.jobs = jobs
            return more

        _compare(comparison, exp.name, output, console, max_seeds or 0, more_seeds)


MFU_PLANNED = 0.4  # a well-tuned small-model run's share of peak (PaLM reports 46% at 540B, Chowdhery 2022)


def print_plan(c: Comparison, console: Console, peak_tflops: float | None) -> None:
    """Each run's parameters, optimizer steps, tokens and training FLOPs, and their total."""
    from rich.table import Table

    from objtrain.models.zoo import build_model, count_parameters

    table = Table(title=f"{c.experiment.name}: {len(c.runs)} runs planned ({c.budget_name} budget)")
    for h in ("run", "model", "parameters", "steps", "tokens", "FLOPs"):
        table.add_column(h, justify="left" if h in ("run", "model") else "right")
    total = 0.0
    sizes: dict[str, int] = {}
    for run in c.runs:
        model = f"{run.plan.model_cfg.kind} {run.cfg.model.size}"
        if model not in sizes:
            sizes[model] = count_parameters(build_model(run.plan.model_cfg))
        if run.steps is None:  # a seconds budget: its steps are fixed by timing a step when it trains
            table.add_row(run.key, model, f"{sizes[model]:,}", "timed", "-", "-")
            continue
        flops = run.steps * run.flops_per_step
        total += flops
        rows = run.plan.micro_batch * run.plan.accumulation * run.plan.world.world_size
        tokens = run.steps * rows * run.plan.seq_len
        table.add_row(run.key, model, f"{sizes[model]:,}", f"{run.steps:,}", f"{tokens:,}", f"{flops:.3g}")
    console.print(table)
    line = f"total {total:.3g} training FLOPs"
    if peak_tflops is not None:
        seconds = total / (MFU_PLANNED * peak_tflops * 1e12)
        line += f": {seconds:,.0f} s at {MFU_PLANNED:.0%} of {peak_tflops:g} TFLOP/s (evaluation not counted)"
    console.print(line + "; nothing was written", markup=False)


def check_jobs(jobs: int) -> None:
    if jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {jobs}")


def check_max_seeds(max_seeds: int, seeds: int, sweep: bool) -> None:
    if sweep:
        raise UserError("--max-seeds is for a comparison: a sweep trains --seeds K at every point")
    if seeds < 2:
        raise UserError("--max-seeds needs --seeds 2 or more: one seed measures no spread to judge by")
    if max_seeds < seeds:
        raise UserError(f"--max-seeds {max_seeds} is below --seeds {seeds}")


Planned = TypeVar("Planned", Comparison, Sweep)


@contextmanager
def _held_report(output: Path, force: bool, plan: Callable[[], Planned]) -> Iterator[Planned]:
    """Plan under the report's lock and hold it while the arms train: a second compare (or sweep) into the
    same report is refused in one line instead of training the same arms twice."""
    check_writable(output)  # a read-only or full output: now, not after the first arm has trained
    lock = OutputLock(output, "-o")
    try:
        # A report is held before anything in it is read. A folder of the user's with the name is
        # refused by the plan, untouched.
        if output.is_dir() and any((output / m).exists() for m in (PLAN, OutputLock.NAME)):
            lock.acquire()
        planned = plan()
        if lock.fd is None:  # a new report: locked as it is made
            output.mkdir(parents=True, exist_ok=True)
            lock.acquire()
            if any(p.name != OutputLock.NAME for p in output.iterdir()):
                raise UserError(f"{output} was made by another comparison meanwhile (pass --resume)")
        elif force:  # --force replaces the report, every check passed; its lock stays held
            for entry in output.iterdir():
                if entry.name != OutputLock.NAME:
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        # The directory now holds only what a resume keeps (at most its lock): the runner must not
        # remove it, which it does for a report it is not resuming.
        comparison = planned.comparison if isinstance(planned, Sweep) else planned
        comparison.resume = True
        yield planned
    finally:
        lock.release()


def _compare(
    comparison: Comparison,
    name: str,
    output: Path,
    console: Console,
    max_seeds: int = 0,
    more_seeds: Callable[[int], Comparison] | None = None,
) -> None:
    exp = comparison.experiment
    n = len(comparison.runs)
    console.print(
        f"[bold]{escape(name)}[/]: {len(exp.arms)} arms x {len(comparison.seeds)} seed(s) = {n} runs, "
        f"{comparison.budget.describe()} ({comparison.budget_name}), report in {escape(str(output))}"
    )
    interrupt_note(f"interrupted; finished arms are kept in {output}: continue with --resume")
    results = _run_and_report(comparison, output, console)
    # The seeds the spread needs: while a claim's interval straddles its boundary and a few more seeds
    # would resolve a gap this size, every arm trains them (paired differences need each seed in each arm).
    while more_seeds is not None and len(comparison.seeds) < max_seeds:
        want, asking = seeds_wanted(results, max_seeds)
        if want <= len(comparison.seeds):
            break
        have = len(comparison.seeds)
        earlier = comparison.seeds_raised or {"from": have, "for": []}
        comparison = more_seeds(want)
        added = ", ".join(map(str, comparison.seeds[have:]))
        console.print(
            f"{have} seeds leave {len(asking)} claim(s) straddling their boundary ({'; '.join(asking)}): "
            f"training seed(s) {added} in every arm (--max-seeds {max_seeds})",
            markup=False,
        )
        comparison.seeds_raised = {
            "from": earlier["from"],
            "to": want,
            "max": max_seeds,
            "for": list(dict.fromkeys([*earlier["for"], *asking])),
        }
        comparison.resume = True
        results = _run_and_report(comparison, output, console)
    console.print(f"report: {output / 'report.md'} (results.json and plots beside it)", markup=False)
    # The tables, the verdict and last the one sentence of what was found: where the run ends.
    print_tables(results, make_console(highlight=False), str(output / "report.md"))


def _run_and_report(comparison: Comparison, output: Path, console: Console) -> dict[str, Any]:
    try:
        run_comparison(comparison, console=console)
    except Interrupted as exc:
        console.print(f"[bold red]{escape(str(exc))}[/]")  # the message starts with "interrupted"
        raise typer.Exit(130) from None
    except Unwritable as exc:
        raise _kept(exc, f"finished arms are kept in {output}") from None
    return write_report(comparison)


def parse_eval_options(pairs: list[str]) -> dict[str, Any]:
    """`KEY=VALUE` pairs; a value is read as YAML (numbers, booleans, lists), a bare `a,b` as a list."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--eval takes KEY=VALUE, got {pair!r}")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        if isinstance(value, str) and "," in value:
            value = [v.strip() for v in value.split(",") if v.strip()]
        out[key.strip()] = value
    return out


def _sweep(s: Sweep, spec: SweepSpec, output: Path, console: Console) -> None:
    exp = s.comparison.experiment
    console.print(
        f"[bold]{escape(exp.name)}[/]: {len(exp.arms)} arms x {escape(spec.describe())} x "
        f"{len(s.comparison.seeds)} seed(s) = {len(s.cells)} runs, report in {escape(str(output))}"
    )
    for line in plan_notes(s):
        console.print(f"  {line}", markup=False)
    interrupt_note(f"interrupted; finished points are kept in {output}: continue with --resume")
    try:
        run_sweep(s, console=console)
    except Interrupted as exc:
        console.print(f"[bold red]{escape(str(exc))}[/]")
        raise typer.Exit(130) from None
    except Unwritable as exc:
        raise _kept(exc, f"finished points are kept in {output}") from None


def _kept(exc: Unwritable, kept: str) -> Unwritable:
    """A full disk mid-comparison: the line says what is kept and how to go on once there is room."""
    before = f"{exc.kept}; " if exc.kept else ""
    return Unwritable(exc.output, exc.reason, f"{before}{kept}: free space, then continue with --resume")


run.__doc__ = HELP
