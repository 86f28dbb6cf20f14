"""What a comparison's report and a sweep's share: the claims table (one implementation for both, so a
claim reads the same in either), its verdict and scale cells, markdown and terminal tables, the report's
head and its account of what was run, and writing it all whole.

A sweep's claim is a comparison's claim judged at every point (`objtrain.compare.sweep_results.sweep_claim`):
it carries `points` and `at`, and its row adds the verdict at each point. Both show the evaluation's
standard error where the claim has one (`objtrain.compare.results.claim_verdict` measures it from the
arms' per-unit scores).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from objtrain.compare import suite
from objtrain.compare.regime import MAX_SEEDS
from objtrain.compare.results import arm_pair
from objtrain.io import atomic_file, write_json

ONE_ARM_NOTE = [
    "A claim of one arm judges a metric that is already a difference within each model (the same model "
    "with and without the suffix, say) against 0: each seed is one pair.",
    "",
]


def difference(metric: str, arms: list[str]) -> str:
    """How a claim's difference reads: "metric: a − b", or "metric: a" for one arm against 0."""
    a, b = arm_pair(arms)
    return f"{metric}: {a} − {b}" if b is not None else f"{metric}: {a}"


def measured_text(c: dict[str, Any]) -> str:
    """For a claim not measured: which of all the arms have its metric ("" where results do not say)."""
    having = c.get("measured_by")
    if c.get("verdict") != "not measured" or having is None:
        return ""
    missing = [a for a in c["arms"] if a not in having]
    if not having:
        return f"no arm has {c['metric']}"
    return f"{c['metric']} is measured for {', '.join(having)} only, not for {', '.join(missing)}"


def verdict_cell(c: dict[str, Any]) -> str:
    """`**agrees**`, then what the verdict knows of itself: one seed deciding, seeds needed; for a claim
    not measured, which arms have its metric."""
    notes = "; ".join(n for n in (measured_text(c), notes_text(c)) if n)
    if c.get("verdict") == "not judged" or str(c.get("baseline", "")).startswith("no random-init"):
        notes = "; ".join(n for n in (c.get("baseline", ""), notes) if n)
    return f"**{c['verdict']}**" + (f" ({notes})" if notes else "")


def point_verdict(point: dict[str, Any]) -> str:
    """ "tokens-1e6: +0.012 ± 0.004, agrees": a claim's difference and verdict at one point of a sweep."""
    p = point.get("paired") or {}
    if p.get("delta") is None:
        return f"{point['point']}: {point['verdict']}"
    ci = f" ± {p['ci95']:.2g}" if p.get("ci95") is not None else ""
    return f"{point['point']}: {p['delta']:+.3g}{ci}, {point['verdict']}"


def paired_text(c: dict[str, Any]) -> str:
    """A claim's measured difference: "metric: a − b = +0.01 ± 0.02 (n = 3; evaluation SE 0.004)", at the
    point it is judged at for a sweep's claim; "—" when there is none."""
    p = c.get("paired")
    if not p or p.get("delta") is None:
        return "—"
    ci = f" ± {p['ci95']:.3g}" if p.get("ci95") is not None else ""
    at = f" at {c['at']}" if "points" in c else ""
    eval_se = f"; evaluation SE {c['eval_se']:.2g}" if c.get("eval_se") is not None else ""
    return f"{difference(c['metric'], c['arms'])} = {p['delta']:+.4g}{ci}{at} (n = {p['n']}{eval_se})"


def claim_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The claims table of a comparison or (its claims judged at every point) of a sweep."""
    claims = results.get("claims", [])
    if "sweep" in results or any("points" in c for c in claims):
        header = ["claim", "the literature", "objtrain: a − b at the largest point (95% paired interval)",
                  "verdict at each point", "verdict", "scale against the paper (largest point)"]  # fmt: skip
        trend = [["; ".join(point_verdict(pt) for pt in c.get("points", [])) or "—"] for c in claims]
    else:
        header = ["claim", "the literature", "objtrain: a − b (95% paired interval, seeds)", "verdict",
                  "scale against the paper"]  # fmt: skip
        trend = [[] for _ in claims]
    rows = [
        [c["claim"], c["literature"], paired_text(c), *t, verdict_cell(c), regime_text(c.get("regime"))]
        for c, t in zip(claims, trend, strict=True)
    ]
    return header, rows


def _x(f: float) -> str:
    """A factor, paper over ours, to two significant digits."""
    rounded = float(f"{f:.2g}")  # two significant digits: 23,000x, 150x, 3.4x, 0.25x
    return f"{rounded:,.0f}x" if rounded >= 100 else f"{rounded:g}x"


def regime_text(regime: dict[str, Any] | None, source: bool = True) -> str:
    """`**out of regime**: the paper's over ours, parameters 2e2x, tokens ... (T5 ...)` or `—`; without
    `source`, the factors alone (the findings index, whose claims cite the paper already)."""
    if not regime:
        return "—"
    parts = []
    names = {"parameters": "parameters", "tokens": "tokens", "tokens_per_parameter": "tokens per parameter"}
    for key, name in names.items():
        f = regime["factor"].get(key)
        if f is not None:
            parts.append(f"{name} {_x(f)}")
    if not parts:
        return f"no scale given ({regime['source']})"
    head = "**out of regime**" if regime["out_of_regime"] else "in regime"
    where = f" ({regime['source']})" if source else ""
    return f"{head}: the paper's over ours, {', '.join(parts)}{where}"


def notes_text(claim: dict[str, Any]) -> str:
    """What a verdict cell adds: one seed deciding, and the seeds a straddling interval would need."""
    parts = []
    one = claim.get("one_seed")
    if one:
        parts.append(f"one seed decides the direction: without seed {one['seed']} the difference is "
                     f"{one['without']:+.3g}")  # fmt: skip
    if claim.get("straddles"):
        n = claim.get("seeds_needed")
        have = claim.get("seeds") or 0
        if n is None:
            parts.append(f"the interval straddles the boundary; more than {MAX_SEEDS} seeds would be needed "
                         "at this spread")  # fmt: skip
        elif n > have:
            parts.append(f"the interval straddles the boundary: run `seeds: {n}` (--seeds {n}) to resolve a "
                         "gap this size at this spread")  # fmt: skip
    return "; ".join(parts)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def heading(title: str, exp: dict[str, Any]) -> list[str]:
    """The report's title, the experiment's question and what the literature found."""
    out = [f"# {title}: {exp['name']}", ""]
    if exp["question"]:
        out += [f"**Question.** {exp['question']}", ""]
    if exp["expect"]:
        out += [f"**What the literature found.** {exp['expect']}", ""]
    return out


def claims_section(results: dict[str, Any], title: str, explanation: str) -> list[str]:
    """The claims table under `title`, then what its verdicts mean (and, where a claim has one arm, what
    that claim judges); nothing where the experiment states no claim."""
    claims = results.get("claims")
    if not claims:
        return []
    one_arm = ONE_ARM_NOTE * any(len(c["arms"]) == 1 for c in claims)
    return [f"## {title}", "", markdown_table(*claim_rows(results)), "", explanation, "", *one_arm]


def mean_cell(value: dict[str, Any] | None, spread: str = "ci95", digits: str = ".4g") -> str:
    """`0.4832 ± 0.02`: a mean with its 95% interval (`spread="std"`: its seeds' sample std) where known;
    "—" where nothing was measured."""
    if not value or value.get("mean") is None:
        return "—"
    pm = value.get(spread)
    return f"{value['mean']:{digits}}" + (f" ± {pm:.2g}" if pm is not None else "")


def what_was_run(
    results: dict[str, Any],
    own: Sequence[str],
    whole: str,
    *,
    on_data: bool = False,
    full_machine: bool = False,
) -> list[str]:
    """The report's account of what was run: the experiment's file, the report's `own` lines, the
    evaluation (`on_data`: and what it read), the wall time of the `whole` comparison or sweep, and the
    machine (`full_machine`: with Python, GPU and load, which a comparison's costs are read against)."""
    ev, m = results["evaluation"], results["machine"]
    on = f" on {ev['data'] or 'each run store valid split'}" if on_data else ""
    machine = (
        f"{m.get('cpu') or m['platform']}, {m['cpu_count']} CPUs, {m['torch_threads']} torch threads, "
        f"torch {m['torch']}"
    )
    if full_machine:
        machine += (
            f", Python {m['python']}"
            + (f", GPU {m['cuda']}" if m.get("cuda") else "")
            + (f", load average {m['load_average']}" if m.get("load_average") else "")
        )
    machine += f", objtrain {m['commit']}" if m.get("commit") else ""
    return [
        "## What was run",
        "",
        f"- Experiment: `{experiment_source(results['experiment'])}`",
        *own,
        "- Evaluation: "
        + (
            f"the `objtrain eval` suite{on}, options {json.dumps(ev['options'])}"
            if ev["suite"]
            else suite.describe_missing()
        ),
        f"- Wall time: {results['wall_seconds']:.0f} s for the whole {whole}",
        f"- Machine: {machine}",
        "",
    ]


def plots_section(plots: list[str]) -> list[str]:
    return ["## Plots", "", *(f"![{p}]({p})" for p in plots), ""]


def normal_runs(unit: str) -> str:
    """What a reader can do with every run of the report."""
    return (
        f"Each {unit} is a normal training run: `objtrain eval RUN` and `objtrain generate RUN` work on it."
    )


def experiment_source(exp: dict[str, Any]) -> str:
    """Where the experiment came from: a shipped one as its path in a clone (`configs/experiments/X.yaml`)
    wherever the package was installed or run from, a user's file as given."""
    source = exp.get("source")
    if not source:
        return str(exp["name"])
    parts = Path(source).parts
    for i in range(len(parts) - 1):
        if parts[i : i + 2] == ("objtrain", "configs"):
            return str(Path("configs", *parts[i + 2 :]))
    return str(source)


def write_all(
    report_dir: Path,
    results: dict[str, Any],
    plots: list[str],
    markdown: Callable[[dict[str, Any], list[str]], str],
) -> None:
    """results.json (with its plots), then report.md, each written whole or not at all."""
    results["plots"] = plots
    write_json(report_dir / "results.json", results)
    with atomic_file(report_dir / "report.md", "w") as handle:
        handle.write(markdown(results, plots))


def print_table(
    console: Console, title: str, header: Sequence[str], rows: Sequence[Sequence[str]], **style: Any
) -> Table:
    """A rich table of a report's rows (a markdown table's), printed."""
    table = Table(title=title, title_justify="left", **style)
    for h in header:
        table.add_column(h)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    return table
