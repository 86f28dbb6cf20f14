"""What a comparison's report and a sweep's share: the claims table (one implementation for both, so a
claim reads the same in either), its verdict and scale cells, markdown and terminal tables, the report's
head and its account of what was run, and writing it all whole.

A sweep's claim is a comparison's claim judged at every point (`objtrain.compare.sweep_results.sweep_claim`):
it carries `points` and `at`, and its row adds the verdict at each point. Both show the evaluation's
standard error where the claim has one (`objtrain.compare.results.claim_verdict` measures it from the
arms' per-unit scores).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

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
