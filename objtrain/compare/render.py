"""What a comparison's report and a sweep's share: the claims table (one implementation for both, so a
claim reads the same in either), markdown tables, the report's head and plots, and writing it all whole.

A sweep's claim is a comparison's claim judged at every point (`sweep_report.sweep_claim`): it carries
`points` and `at`, and its row adds the verdict at each point. Both show the evaluation's standard error
where the claim has one (`report.claim_verdict` measures it from the arms' per-unit scores).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from objtrain.compare.regime import notes_text, regime_text
from objtrain.io import atomic_file, write_json

ONE_ARM_NOTE = [
    "A claim of one arm judges a metric that is already a difference within each model (the same model "
    "with and without the suffix, say) against 0: each seed is one pair.",
    "",
]


def arm_pair(arms: list[str]) -> tuple[str, str | None]:
    """A claim's arms as (a, b); b is None for a claim of one arm against 0."""
    return arms[0], (arms[1] if len(arms) > 1 else None)


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


def plot_lines(plots: list[str]) -> list[str]:
    return [f"![{p}]({p})" for p in plots]


def save_png(fig: Any, path: Path) -> None:
    """A figure written whole or not at all, then closed."""
    import matplotlib.pyplot as plt

    with atomic_file(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)


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
