"""A sweep's report: results.json, report.md with its fitted curves, crossovers and compute-optimal
frontier, curves.png, and the terminal tables.

The numbers (the fits, the frontier, the claims at every point) are `objtrain.compare.sweep_results`'; the
claims table, the report's head and writing it are `objtrain.report.tables`', shared with a comparison's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from objtrain.compare import suite
from objtrain.compare.results import one_objective
from objtrain.compare.sweep import Sweep, left_out_lines, thin_text
from objtrain.compare.sweep_results import build_sweep_results, inside_warmup
from objtrain.report.plots import arm_colours, fit_band, panel_grid, save_png
from objtrain.report.tables import (
    claims_section,
    heading,
    markdown_table,
    mean_cell,
    normal_runs,
    plots_section,
    print_table,
    what_was_run,
    write_all,
)
from objtrain.stats import fit as fitting
from objtrain.stats.seeds import t975


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
            vals = [mean_cell(cell["metrics"].get(m), "std") for m in metrics]
            rows.append([arm["name"], cell["label"], cell["size"], str(cell["steps"]),
                         f"{np.mean(cell['tokens']):,.0f}", _g(float(np.mean(cell["flops"]))),
                         str(cell["branched_at_step"] or "—"), *vals])  # fmt: skip
    return header, rows


def markdown(results: dict[str, Any], plots: list[str], extra: Sequence[str] = ()) -> str:
    """The report; `extra` (a publisher's own section, such as what changed since a previous
    publication) goes after the verdicts."""
    sw = results["sweep"]
    kind = "tokens" if "tokens" in sw else "flops"
    out = heading("Compute sweep", results["experiment"])
    out += claims_section(results, "Against the literature", _claims_explained(bool(sw.get("size"))))
    out += list(extra)
    out += fits_section(results)
    out += frontier_section(results)
    out += ["## Points", "", markdown_table(*point_rows(results)), "", *_left_out_note(results)]
    out += plots_section(plots)
    own = [
        f"- Sweep: {kind} at {', '.join(_g(p) for p in sw[kind])} ({sw['span']:.0f}x)"
        + (f", sizes {', '.join(sw['size'])}" if sw["size"] else ""),
        f"- Held equal at each point: {held_at_points(results)}",
        f"- Seeds: {', '.join(map(str, results['seeds']))} (seed k is shared by every arm and point)",
        "- Shorter points branch from the longest run of their chain where the schedule lets them (a "
        "warmup-stable-decay run's stable phase): the branched run equals a separate run step for step "
        "(`objtrain/compare/sweep.py` says why); `branched at` in the points table names the step.",
    ]
    out += [*what_was_run(results, own, "sweep"), normal_runs("point"), ""]
    return "\n".join(out)


def _claims_explained(sized: bool) -> str:
    """What a sweep's verdicts mean, under its claims table (with a grid of sizes: where each arm is read)."""
    return (
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
            if sized
            else "."
        )
    )


def fits_section(results: dict[str, Any]) -> list[str]:
    """The fitted curves, how they were fitted and checked out of sample, and the crossovers."""
    return [
        "## Fitted curves: L(C) = E + A·C^(−α), C in training FLOPs",
        "",
        markdown_table(*fit_rows(results)),
        "",
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


def frontier_section(results: dict[str, Any]) -> list[str]:
    """In a grid of sizes, the compute-optimal frontier and its fits; nothing without one."""
    if not results["frontier"]:
        return []
    return [
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


def plot(results: dict[str, Any], out_dir: Path) -> list[str]:
    """curves.png: per metric, each arm's points (mean, seed-std bars) and fitted curve, log-log."""
    fits: dict[str, dict[str, fitting.Fit]] = results["_fits"]

    def positive(metric: str) -> bool:  # a log axis shows only positive values (exact match 0: nothing)
        return any(
            (v := cell["metrics"].get(metric)) is not None and v["mean"] is not None and v["mean"] > 0
            for arm in results["arms"]
            for cell in arm["cells"]
        )

    # An arm's own objective loss shares a panel only with arms of the same objective.
    same = one_objective((a["objective"], a["objective_overrides"]) for a in results["arms"])
    metrics = [
        m for m in results["metrics"] if m in fits and positive(m) and (same or m not in suite.OWN_LOSSES)
    ]
    if not metrics:
        return []
    colours = arm_colours(a["name"] for a in results["arms"])
    markers = ["o", "s", "^", "D", "v", "P"]
    sizes = {size: markers[i % len(markers)] for i, size in enumerate(results["sweep"].get("size") or [])}
    fig, panels, _ = panel_grid(len(metrics), 5.4, 4.2)
    for ax, metric in zip(panels, metrics, strict=False):
        _curve_panel(ax, metric, results, fits[metric], colours, sizes)
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


def _curve_panel(
    ax: Any,
    metric: str,
    results: dict[str, Any],
    fits: dict[str, fitting.Fit],
    colours: dict[str, str],
    sizes: dict[str, str],
) -> None:
    """One metric's panel: each arm's points and fitted curve (its band, then dashed past the data), the
    crossovers the seeds resolve, and the range past `fitting.EXTRAPOLATION` shaded."""
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
        f = fits.get(arm["name"])
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
        ax.axvspan(right * fitting.EXTRAPOLATION, right * fitting.EXTRAPOLATION * 3, color="grey", alpha=0.08)
    ax.set_xscale("log")
    ax.set_yscale("log")
    better = suite.direction(metric)
    ax.set_title(f"{metric} ({better} is better)", fontsize=9)
    ax.set_xlabel("training FLOPs (estimated)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)


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


__all__ = ["markdown", "plot", "write_sweep_report"]
