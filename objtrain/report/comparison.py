"""A comparison's report: results.json, report.md, the terminal tables and PNG plots (matplotlib, Agg).

Two tables, as an ablation in a paper would have them: what each arm cost (parameters, tokens, FLOPs,
seconds, tokens/s, peak memory) and what it learnt (the suite's metrics plus the training validation),
each `mean ± std` over seeds. Per metric the best arm is bold and `≈` marks an arm the seeds cannot tell
apart from it (`objtrain.stats.seeds`). The numbers and verdicts are `objtrain.compare.results`'; the
claims table, the report's head and writing it are `objtrain.report.tables`', shared with a sweep's report.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from objtrain.compare import suite
from objtrain.compare.experiment import REGIME_FACTOR
from objtrain.compare.regime import seeds_needed
from objtrain.compare.results import (
    COST,
    NONE,
    PROBE_ACCURACY,
    arm_pair,
    baseline_key,
    build_results,
    ordered,
    run_value,
    screened,
    summary_of,
)
from objtrain.compare.runner import Comparison, chosen_rates, metrics_records
from objtrain.report.plots import arm_colours, panel_grid, pyplot, save_png
from objtrain.report.tables import (
    claims_section,
    difference,
    heading,
    markdown_table,
    mean_cell,
    measured_text,
    normal_runs,
    plots_section,
    what_was_run,
    write_all,
)
from objtrain.stats.seeds import fmt, t975

MARK = "≈"
COST_LABELS = {"parameters": "params", "tokens": "tokens", "flops": "FLOPs", "seconds": "train s",
               "tokens_per_s": "tok/s", "mfu": "MFU", "peak_memory_bytes": "peak MiB"}  # fmt: skip


def _raised_text(results: dict[str, Any]) -> str:
    """What the Seeds line adds when seeds were raised for straddling claims (`compare --max-seeds`)."""
    raised = (results.get("plan") or {}).get("seeds_raised")
    if not raised:
        return ""
    return (
        f"; {raised['from']} at first, raised to {raised['to']} (--max-seeds {raised['max']}) because the "
        f"{raised['from']}-seed interval straddled the verdict's boundary for: {'; '.join(raised['for'])}"
    )


BASELINE_NAMES = (("random_init_accuracy", "random-init"), ("bow_accuracy", "bag-of-words"),
                  ("majority_accuracy", "majority"), ("accuracy_probe_sd", "own seed sd"))  # fmt: skip


def _rates_text(runs: list[dict[str, Any]]) -> str:
    """`, at each of 4 peak learning rates (the rate best on dev: 1e-3 in 7 runs, 3e-3 in 3)`: how many
    rates each fine-tune tried and which won; a winner at either end of the list says it should widen.
    Where the later seeds fine-tuned at their first seed's rate (`eval.finetune_rates: first_seed`), it
    says so and counts the choices of the runs that chose."""
    tried = [e[k] for e in runs for k in e if k.startswith("finetune_") and k.endswith("_lrs_tried")]
    tried = [float(t) for t in tried if isinstance(t, (int, float))]
    if not tried:
        return ""  # fine-tuned at one rate (a record from before rates were tried)
    most = max(tried)
    chosen: dict[float, int] = {}
    choosers = 0
    for e in runs:
        if not any(k.endswith("_lrs_tried") and e[k] == most for k in e if k.startswith("finetune_")):
            continue
        choosers += 1
        for rate in chosen_rates(e).values():
            chosen[rate] = chosen.get(rate, 0) + 1
    won = ", ".join(f"{lr:g} in {n} run{'s' if n > 1 else ''}" for lr, n in sorted(chosen.items()))
    if choosers == len(runs) or most == 1:
        return f", at each of {most:.0f} peak learning rates (the rate best on dev: {won})"
    return (
        f", at each of {most:.0f} peak learning rates on each arm's first seed (the rate best on dev: "
        f"{won}); the other {len(runs) - choosers} runs, and their random-init twins, at the rate their "
        "first seed's run (or twin) chose"
    )


def _tune_noise_text(runs: list[dict[str, Any]]) -> str:
    """What a fine-tune's interval holds: pretraining seeds only, or also its own noise measured apart."""
    tuned = [e for e in runs if any(k.startswith("finetune_") and k.endswith("_seeds") for k in e)]
    if not tuned:
        return (
            "Each run is fine-tuned once, with the evaluation's seed (the head's initialisation and the "
            "batch order), so a fine-tune's interval is over pretraining seeds; the fine-tune's own noise is "
            "not measured apart."
        )
    n = max(int(e[k]) for e in tuned for k in e if k.startswith("finetune_") and k.endswith("_seeds"))
    return (
        f"The fine-tune's own noise is measured apart on {len(tuned)} checkpoint(s) (each arm's first seed): "
        f"{n} fine-tunes at the rate chosen, each with its own head and batch order (own seed sd); every "
        "run's score is its first fine-tune's, so the interval is over pretraining seeds."
    )


def baseline_section(results: dict[str, Any]) -> list[str]:
    """Each probe metric beside its baselines, per arm: random-init, bag-of-words, majority, own seed sd."""
    metrics = sorted({m for a in results["arms"] for m in a["metrics"] if PROBE_ACCURACY.match(m)})
    if not metrics:
        return []
    header = ["arm", "probe", "arm's accuracy", *(label for _, label in BASELINE_NAMES)]
    rows = []
    for metric in metrics:
        for arm in results["arms"]:
            if metric not in arm["metrics"]:
                continue
            cells = [arm["name"], metric, mean_cell(arm["metrics"][metric])]
            for kind, _ in BASELINE_NAMES:
                base = arm.get("baselines", {}).get(baseline_key(metric, kind) or "")
                cells.append(mean_cell(base))
            rows.append(cells)
    measured = any(a.get("baselines") for a in results["arms"])
    tuned = any(m.startswith("finetune_") for m in metrics)
    alike = "probed (or fine-tuned) alike" if tuned else "probed alike"
    how = ""
    if tuned:  # which measurement each row is: the metric's name says it, this says what it means
        runs = [r["eval"] for a in results["arms"] for r in a.get("runs", [])]
        steps = next(
            (e[k] for e in runs for k in e if k.startswith("finetune_") and k.endswith("_steps")), None
        )
        how = (
            " probe_*: a linear probe on frozen features (layer and penalty chosen on dev); finetune_*: the "
            f"whole model fine-tuned{f' for {steps:.0f} steps' if isinstance(steps, (int, float)) else ''} "
            f"with a new linear head{_rates_text(runs)}, the weights best on dev scored on test (BERT's and "
            "T5's protocol). " + _tune_noise_text(runs)
        )
    return [
        "### Probe baselines",
        "",
        markdown_table(header, rows),
        "",
        f"Mean ± 95% interval over seeds. random-init: the same architecture untrained, {alike}; "
        "bag-of-words: a logistic regression on word counts of the same examples; majority: always the "
        "most frequent label; own seed sd: the probe's own spread over its seeds on one checkpoint (a "
        "fine-tune's: over fine-tune seeds). A classification "
        "claim is judged only when its arms beat their random-init baseline beyond its interval."
        + how
        + ("" if measured else " These results measured no baseline (— throughout): their probe verdicts "
           "cannot say whether pretraining taught the probe anything."),
        "",
    ]  # fmt: skip


def _cost_cell(key: str, value: dict[str, Any]) -> str:
    mean = value["mean"]
    if mean is None:
        return "—"
    if key == "parameters":
        return f"{mean / 1e6:.2f}M"
    if key == "tokens":
        return f"{mean:,.0f}"
    if key == "flops":
        return f"{mean:.3g}"
    if key == "mfu":
        return f"{mean:.1%}"
    if key == "peak_memory_bytes":
        return f"{mean / 2**20:,.0f}"
    text = f"{mean:,.1f}" if key == "seconds" else f"{mean:,.0f}"
    if value["n"] > 1 and value["std"] is not None:
        text += f" ± {value['std']:,.1f}" if key == "seconds" else f" ± {value['std']:,.0f}"
    return text


def metric_rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the metrics table, with the best bold (`**`) and `≈` marks."""
    metrics = ordered({m for a in results["arms"] for m in a["metrics"]})
    header = ["arm", *metrics]
    # A claim's metric at one precision in every arm (2.200 beside 2.317, not 2.2)
    claimed = {c["metric"] for c in results.get("claims", [])}
    decimals = {
        m: _fixed(
            [v["mean"] for a in results["arms"] if (v := a["metrics"].get(m)) and v.get("mean") is not None]
        )
        for m in metrics
        if m in claimed
    }
    rows = []
    for arm in results["arms"]:
        row = [arm["name"]]
        for m in metrics:
            v = arm["metrics"].get(m)
            if v is None or not v["n"]:
                row.append("—")
                continue
            text = fmt(summary_of(v))
            if m in decimals:
                text = mean_cell(v, "std", f".{decimals[m]}f")
            r = results["rankings"].get(m)
            best = next((a for a in results["arms"] if r is not None and a["name"] == r["best"]), None)
            if r is not None and r.get("tie"):  # every arm alike: nobody is best
                pass
            elif best is not None and v["mean"] == best["metrics"][m]["mean"]:  # the best, or tied with it
                text = f"**{text}**"
            elif r is not None and arm["name"] in r["within_seed_spread"]:
                text = f"{text} {MARK}"
            row.append(text)
        rows.append(row)
    return header, rows


def held_equal(results: dict[str, Any], plain: bool = False) -> str:
    """Which control the arms shared, and how far the other apart: equal tokens is not equal compute
    when the arms' model kinds or head counts differ."""
    kind = results["budget"]["kind"]

    def spread(key: str) -> tuple[float, float] | None:
        vals = [a["cost"].get(key, NONE)["mean"] for a in results["arms"]]
        vals = [v for v in vals if v is not None and v > 0]
        return (min(vals), max(vals)) if vals else None

    held = {"tokens": "tokens", "flops": "FLOPs", "seconds": "training seconds"}[kind]
    parts = [f"Held equal: {held}." if plain else f"**Held equal: {held}.**"]
    if kind == "flops" and (own := spread("flops")) is not None:
        lo, hi = own
        parts.append(
            f"Budget {results['budget']['value']:.4g} FLOPs an arm; the arms trained {lo:.4g} to {hi:.4g} "
            f"(whole steps under it, {hi / lo - 1:.2%} apart)."
        )
    for key, name in (("tokens", "tokens"), ("flops", "FLOPs")):
        if key == kind:
            continue
        r = spread(key)
        if r is None:
            continue
        lo, hi = r
        if hi > 1.05 * lo:
            parts.append(f"The arms' {name} differ {hi / lo:.2f}x ({lo:.3g} to {hi:.3g})" + (
                ": this is a comparison at equal tokens, not at equal compute." if key == "flops" else "."
            ))  # fmt: skip
        else:
            parts.append(f"Their {name} agree within 5%.")
    if precision := trained_precision(results):
        parts.append(precision)
    return " ".join(parts)


def trained_precision(results: dict[str, Any]) -> str:
    """`Trained in fp32.`, or each precision with its arms where they differ (`--dtype auto` takes the
    faster on the machine per step shape: the same FLOPs, another rounding); "" where no run recorded one."""
    arms: dict[str, list[str]] = {}
    for arm in results["arms"]:
        for dtype in dict.fromkeys(r.get("train", {}).get("dtype") for r in arm.get("runs") or []):
            if dtype:
                arms.setdefault(dtype, []).append(arm["name"])
    if len(arms) <= 1:
        return f"Trained in {next(iter(arms))}." if arms else ""
    return "Trained in " + "; ".join(f"{d} ({', '.join(names)})" for d, names in arms.items()) + "."


def cost_rows(results: dict[str, Any], spread: bool = True) -> tuple[list[str], list[list[str]]]:
    """The cost table; `spread=False` leaves out the seeds' `± std` (a narrow terminal: report.md has it)."""
    header = ["arm", "objective", "model", *(COST_LABELS[k] for k in COST)]
    rows = []
    for arm in results["arms"]:
        model = f"{arm['model_kind']} {arm['model_size']}"
        costs = (arm["cost"].get(k, NONE) for k in COST)
        rows.append(
            [
                arm["name"],
                _objective_text(arm),
                model,
                *(
                    _cost_cell(k, c if spread else c | {"std": None})
                    for k, c in zip(COST, costs, strict=True)
                ),
            ]
        )
    return header, rows


def _objective_text(arm: dict[str, Any]) -> str:
    extra = ", ".join(f"{k}={v}" for k, v in arm["objective_overrides"].items())
    return f"{arm['objective']} ({extra})" if extra else arm["objective"]


def _data_text(results: dict[str, Any]) -> str:
    if not results["arms"]:
        return "—"
    data = results["arms"][0]["runs"][0]["train"]["config"]["data"]
    if data.get("sources"):  # a mixture: each store with its weight
        return ", ".join(f"`{s['store']}` (weight {s['weight']:g})" for s in data["sources"])
    store = data.get("store")
    return f"`{store}`" if store else "the embedded standard library (Python source)"


# What the comparison's verdicts mean, under its claims table.
VERDICTS_EXPLAINED = (
    "Each claim is a paired comparison: the per-seed difference of two arms (seed k shared), its "
    "mean and the half-width of its 95% t interval. agrees / disagrees: the interval lies on the "
    "literature's side of 0 / on the other side (for a claim of no difference: inside / outside "
    "the stated margin); not resolved: the seeds cannot tell at this budget. A verdict says when "
    "one seed decides its direction (leaving that seed out moves the mean difference across 0 or "
    "the margin), and where the interval straddles the boundary, how many seeds would resolve a "
    "gap of this size at the spread measured. Scale: the paper's smallest setting over ours "
    f"(parameters, tokens, tokens per parameter); beyond {REGIME_FACTOR:g}x either way the verdict "
    "is **out of regime**: it says what holds at this scale, not whether the paper's finding does."
)


def markdown(results: dict[str, Any], plots: list[str], extra: Sequence[str] = ()) -> str:
    """The report; `extra` (a publisher's own section, such as what changed since a previous
    publication) goes after the verdicts."""
    results = screened(results)
    exp = results["experiment"]
    out = heading("Comparison", exp)
    out += claims_section(results, "Verdicts", VERDICTS_EXPLAINED)
    out += withdrawn_section(exp)
    out += list(extra)
    out += learnt_section(results)
    out += cost_section(results)
    out += what_was_run(results, run_lines(results), "comparison", on_data=True, full_machine=True)
    out += ["| arm | objective | model | seq_len x batch | steps | run |", "|---|---|---|---|---|---|"]
    for arm in results["arms"]:
        runs = ", ".join(f"`{r['run_dir']}`" for r in arm["runs"])
        overrides = ", ".join(f"{k}={v}" for k, v in arm["model_overrides"].items())
        out.append(
            f"| {arm['name']} | {_objective_text(arm)} | {arm['model_kind']} {arm['model_size']}"
            f"{' (' + overrides + ')' if overrides else ''} | {arm['seq_len']} x {arm['batch_size']} | "
            f"{arm['steps']} | {runs} |"
        )
    out += ["", *plots_section(plots), normal_runs("run"), ""]
    return "\n".join(out)


def learnt_section(results: dict[str, Any]) -> list[str]:
    """What each arm learnt: the metrics table, the probes' baselines, the verdict, the finding and what
    the table's marks mean."""
    n_seeds = len(results["seeds"])
    out = ["## What each arm learnt", "", markdown_table(*metric_rows(results)), ""]
    out += baseline_section(results)
    lines = verdict(results)
    if lines:
        out += ["**Verdict.**", "", *(f"- {line}" for line in lines), ""]
    out += [finding(results), ""]
    seeds_note = (
        f"mean ± sample std over {n_seeds} seeds ({', '.join(map(str, results['seeds']))}); **bold** = best "
        f"arm for the metric (none when every arm has the same value); {MARK} = the 95% interval of its "
        f"per-seed paired difference to the best includes 0 (not resolved at this number of seeds, which "
        f"is not the same as no difference)."
        if n_seeds > 1
        else f"one seed ({results['seeds'][0]}): no seed spread is known, so no gap is marked as resolved "
        "or not; **bold** = best arm for the metric. Run with --seeds 3 or more to measure the spread."
    )
    out += [
        seeds_note,
        "Loss, perplexity and bits: lower is better; accuracies and rates: higher is better. `val_loss` is "
        "each arm's own objective on its fixed validation rows, so it is ranked only when every arm trains "
        "the same objective; `val_bpb` and `bits_per_byte` compare across objectives (left-to-right models "
        "only).",
        "",
    ]
    return out


def cost_section(results: dict[str, Any]) -> list[str]:
    """What each arm cost: the cost table, what was held equal, a busy machine's word, what costs mean."""
    busy = seconds_note(results)
    out = ["## What each arm cost", "", markdown_table(*cost_rows(results)), "", held_equal(results), ""]
    out += [busy, ""] if busy else []
    out += [
        "FLOPs: estimated training FLOPs (6N per token plus attention, encoder and decoder counted apart). "
        "Seconds and tokens/s are training steps only, measured in this one run on the machine below; "
        "MFU is the median over the arm's steps of its FLOP rate against a matmul timed on the same "
        "machine, so it moves less than tokens/s when the machine's load changes during a comparison; "
        "peak memory is the process's resident high-water mark (CPU) or the allocator's peak (GPU) during "
        "the arm. Compare costs within one report, never across machines or runs. With several seeds a cost "
        "is mean ± sample std over them.",
        "",
    ]
    return out


def run_lines(results: dict[str, Any]) -> list[str]:
    """A comparison's own lines of what was run: the budget, the seeds, the data."""
    b = results["budget"]
    budget_text = (
        f"{b['value']:,.0f} tokens" if b["kind"] == "tokens" else
        f"{b['value']:.3g} FLOPs" if b["kind"] == "flops" else f"{b['value']:g} seconds"
    ) + (f" at size {b['size']}" if b.get("size") else "")  # fmt: skip
    return [
        f"- Budget: {budget_text} an arm ({b['name']}; every arm under the same control)",
        f"- Seeds: {', '.join(map(str, results['seeds']))} (a seed fixes init, data order and corruption; "
        "seed k is shared by every arm)" + _raised_text(results),
        f"- Data: {_data_text(results)}",
    ]


# The metrics a verdict names, in order, when the arms were ranked on them: what a left-to-right model pays
# (bits per byte), what infilling, masking and a probe gain.
HEADLINE = (
    "conditional_bpb",  # the one generation score every model kind is judged on alike
    "bits_per_byte",
    "infill_exact_match",
    "masked_accuracy",
    "span_target_accuracy",
    "probe_accuracy",
)


def gap_status(r: dict[str, Any], name: str) -> dict[str, str] | None:
    """What the seeds say of one arm's gap to the best: None where its paired 95% interval excludes 0 and
    the evaluation's own noise is smaller than the gap (or one seed gives no interval); else `head` (`not
    resolved at 2 seeds: +0.269 ± 0.677 (paired 95% interval)`), `why` (the reason that is true: the
    per-seed gaps' spread, the evaluation's own noise, its standard error over documents or tasks where
    measured, or both), `short` (the reason in a few words) and `more` (the seeds that would resolve it)."""
    g = (r.get("gaps") or {}).get(name) or {}
    d, ci, n = g.get("paired_delta"), g.get("paired_ci95"), int(g.get("paired_n") or 0)
    se = g.get("eval_se")
    if d is None or ci is None or n < 2:
        if name in (r.get("within_seed_spread") or []) and g.get("spread") is not None:
            why = f"within the pooled seed sd {g['spread']:.2g}"
            return {"head": "not resolved", "why": why, "short": why, "more": ""}
        gap = g.get("delta")
        if se is not None and gap is not None and abs(gap) <= 1.96 * se:  # one seed: the documents alone
            why = f"the evaluation's own noise (SE {se:.2g}) is as large as the gap"
            return {"head": "not resolved", "why": why, "short": "the evaluation's own noise", "more": ""}
        return None
    noisy_eval = se is not None and abs(d) <= 1.96 * se
    if abs(d) > ci and not noisy_eval:
        return None
    head = f"not resolved at {n} seeds: {d:+.3g} ± {ci:.3g} (paired 95% interval)"
    if abs(d) > ci:  # the seeds agree, the documents do not
        why = f"the evaluation's own noise (SE {se:.2g}) is as large as the gap"
        return {"head": head, "why": why, "short": "the evaluation's own noise", "more": ""}
    std = ci * math.sqrt(n) / t975(n - 1) if ci > 0 else 0.0
    why, short = f"the per-seed gaps vary (sd {std:.2g})", "the seeds' spread"
    if noisy_eval:
        why = f"both {why} and the evaluation's own noise (SE {se:.2g}) are as large as the gap"
        short = "both the seeds' spread and the evaluation's own noise"
    elif se is not None:
        why += f"; the evaluation's own noise (SE {se:.2g}) is smaller"
    need = seeds_needed(d, std, "lower", 0.0)
    more = f"--seeds {need} would resolve a gap this size at this spread" if need and need > n else ""
    return {"head": head, "why": why, "short": short, "more": more}


def gap_text(r: dict[str, Any], name: str) -> str:
    """`gap_status` in one clause ("" for a gap the seeds resolve)."""
    st = gap_status(r, name)
    if st is None:
        return ""
    return "; ".join(t for t in (st["head"], st["why"], st["more"]) if t)


def _fixed(values: list[float], digits: int = 4) -> int:
    """Decimals that print every value of one metric alike at `digits` significant digits of the largest."""
    top = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    return max(0, digits - 1 - math.floor(math.log10(top))) if top > 0 else digits - 1


def verdict(results: dict[str, Any]) -> list[str]:
    """The answer in a few lines: per claim metric and headline metric the best arm and every other arm's
    gap to it (each unresolved one said as such, with its interval), the arms a metric does not rank (at
    their baseline, or not reading left to right), the literature's expectation and each claim's verdict."""
    results = screened(results)
    arms = {a["name"]: a for a in results["arms"]}
    rankings, unranked = results["rankings"], results.get("unranked") or {}
    wanted = [c["metric"] for c in results.get("claims", [])] + list(HEADLINE)
    ranked = [m for m in dict.fromkeys(wanted) if m in rankings or m in unranked]
    ranked = ranked or list(rankings)[:2]
    lines = []
    for metric in ranked:
        r = rankings.get(metric)
        aside = unranked.get(metric) or {}
        left = "; ".join(
            f"{name} {arms[name]['metrics'][metric]['mean']:.4g} {why}" for name, why in aside.items()
        )
        if r is None:
            kept = [n for n in arms if n not in aside and arms[n]["metrics"].get(metric, {}).get("n")]
            only = "".join(
                f"only {n} ({arms[n]['metrics'][metric]['mean']:.4g}) is ranked, with no arm to rank it "
                "against; "
                for n in kept
            )
            lines.append(f"{metric}: {only}not ranked: {left}")
            continue
        best = r["best"]
        top = arms[best]["metrics"][metric]["mean"]
        others = []
        for name, arm in arms.items():
            value = arm["metrics"].get(metric, {}).get("mean")
            if name == best or value is None or name in aside:
                continue
            # a share of the best only for a metric that cannot go below 0 (a difference may cross 0)
            relative = top and metric_range(metric)[0] == 0.0
            gap = f"{(value - top) / abs(top):+.1%}" if relative else f"{value - top:+.4g}"
            note = gap_text(r, name)
            others.append(f"{name} {value:.4g} ({gap}{', ' + note if note else ''})")
        better = "lower" if r["lower_is_better"] else "higher"
        having = [a for a in arms.values() if a["metrics"].get(metric, {}).get("mean") is not None]
        values = {a["metrics"][metric]["mean"] for a in having if a["name"] not in aside}
        # Only some arms have some metrics (span-target accuracy: the span arms): say which were scored.
        which = f" ({len(having)} of {len(arms)} arms have it)" if len(having) < len(arms) else ""
        tail = f"; not ranked: {left}" if left else ""
        if len(values) == 1:  # a tie is no ranking: say so rather than crown the first arm
            who = (
                "every arm"
                if not which and not aside
                else " and ".join(a["name"] for a in having if a["name"] not in aside)
            )
            lines.append(
                f"{metric} ({better} is better){which}: {who} at {top:.4g}, no difference at this "
                f"budget{tail}"
            )
            continue
        lead = "best" if all(not gap_text(r, n) for n in r.get("gaps") or {}) else "ahead"
        lines.append(
            f"{metric} ({better} is better){which}: {best} {lead} at {top:.4g}; " + ", ".join(others) + tail
        )
    if results["experiment"].get("expect"):
        lines.append(f"the literature: {results['experiment']['expect']}")
    for c in results.get("claims", []):
        why = "; ".join(t for t in (measured_text(c), claim_measured(c, arms)) if t)
        lines.append(f"claim: {c['claim']}: {c['verdict']}" + (f" ({why})" if why else ""))
    if len(results["seeds"]) == 1:
        lines.append("one seed: how much of each gap is seed noise is not measured (--seeds 3 measures it)")
    return lines


def claim_measured(c: dict[str, Any], arms: dict[str, dict[str, Any]]) -> str:
    """What a claim's line adds: the arms' values at one precision, the paired difference with its
    interval, and a direction measured against the literature's, in evaluation standard errors, even
    where the seeds cannot resolve it."""
    p = c.get("paired") or {}
    d = p.get("delta")
    if d is None:
        return ""
    a, b = arm_pair(c["arms"])
    parts = []
    values = [(x, (arms.get(x) or {}).get("metrics", {}).get(c["metric"], {}).get("mean")) for x in (a, b)]
    values = [(x, v) for x, v in values if x is not None and v is not None]
    if len(values) == 2:
        k = _fixed([v for _, v in values])
        parts.append(" against ".join(f"{x} {v:.{k}f}" for x, v in values))
    ci = p.get("ci95")
    n = int(p.get("n") or 0)
    k = _fixed([abs(d), *([ci] if ci else [])], 3)
    seeds = f" ± {ci:.{k}f} (paired 95% interval, {n} seeds)" if ci is not None and n > 1 else " (one seed)"
    parts.append(f"{difference(c['metric'], c['arms'])} = {d:+.{k}f}{seeds}")
    se = c.get("eval_se")
    against = (c.get("expect") == "lower" and d > 0) or (c.get("expect") == "higher" and d < 0)
    if against and c.get("verdict") != "disagrees":
        size = f", {abs(d) / se:.1f} evaluation standard errors (SE {se:.2g}) from 0" if se else ""
        parts.append(f"measured the other way from the literature{size}")
    elif se:
        parts.append(f"{abs(d) / se:.1f} evaluation standard errors from 0")
    return "; ".join(parts)


WIDE = 140  # a terminal this wide shows the cost table's ± std (report.md always does)


WRAP = 100  # verdict lines wrap here (a hanging indent), piped or not


TERMINAL_METRICS = 4  # learnt-table columns on a terminal: what answers the question (the rest: report.md)


def question_metrics(results: dict[str, Any], limit: int = TERMINAL_METRICS) -> list[str]:
    """The few metrics that answer the experiment's question: its claims' metrics, then the headline
    metrics the arms were ranked on, then the rest of the ranked ones."""
    have = {m for a in results["arms"] for m in a["metrics"]}
    order = [c["metric"] for c in results.get("claims", [])]
    order += [m for m in HEADLINE if m in results.get("rankings", {})] + list(results.get("rankings", {}))
    out: list[str] = []
    for m in order:
        if m in have and m not in out:
            out.append(m)
    return out[:limit]


def finding(results: dict[str, Any]) -> str:
    """What the comparison found, in one sentence a newcomer can read: the first claim the arms measured,
    which way the numbers went and whether that settles it; without claims, the best arm on the first
    ranked metric."""
    n = len(results["seeds"])
    arms = {a["name"]: a for a in results["arms"]}
    for c in results.get("claims", []):
        p = c.get("paired") or {}
        if p.get("delta") is None:
            continue
        metric, (a, b) = c["metric"].replace("_", " "), arm_pair(c["arms"])
        d = p["delta"]
        if b is None:
            went = f"{a}'s {metric} is {d:+.3g}"
        elif c["expect"] == "equal":
            side = "within" if abs(d) <= c["margin"] else "beyond"
            allows = f"{side} the {c['margin']:g} the claim allows"
            went = f"{a} and {b} differ by {abs(d):.3g} in {metric}, {allows}"
        else:
            va, vb = (arms[x]["metrics"].get(c["metric"], {}).get("mean") for x in (a, b))
            values = f" ({va:.4g} against {vb:.4g})" if va is not None and vb is not None else ""
            went = f"{a} scores {'lower' if d < 0 else 'higher'} {metric} than {b}{values}"
        settled = {
            "agrees": "so the published finding holds at this scale",
            "disagrees": "so the published finding does not hold at this scale",
            "no published comparison": "our direction only",
        }.get(c["verdict"])
        if settled is None:
            ci = p.get("ci95")
            settled = (
                "but one seed cannot say how much of that is noise (run --seeds 3)"
                if n == 1 or ci is None
                else f"but that is not resolved at {n} seeds: the paired 95% interval {d:+.3g} ± {ci:.3g} "
                + ("reaches past the margin" if c["expect"] == "equal" else "includes 0")
            )
        said = "no paper has tested" if c["verdict"] == "no published comparison" else "the literature says"
        return f"In short: {said} {c['claim']!r}; here {went}, {settled}."
    rankings = screened(results).get("rankings", {})
    if rankings:
        metric = next((m for m in HEADLINE if m in rankings), next(iter(rankings)))
        r = rankings[metric]
        best, words = r["best"], metric.replace("_", " ")
        if r.get("tie"):
            return f"In short: the {len(arms)} arms score alike on {words}: no difference at this budget."
        open_gaps = [(name, gap_text(r, name)) for name in r.get("gaps") or {}]
        open_gaps = [(name, text) for name, text in open_gaps if text]
        if not open_gaps and n == 1:  # no interval: a lead, not a difference (run more seeds)
            return (
                f"In short: of the {len(arms)} arms, {best} scored best on {words} at one seed, which "
                "cannot say how much of that is noise (run --seeds 3)."
            )
        if not open_gaps:
            return f"In short: of the {len(arms)} arms, {best} did best on {words}, resolved at {n} seeds."
        name, _ = open_gaps[0]
        st = gap_status(r, name) or {}
        more = f" (and {len(open_gaps) - 1} more)" if len(open_gaps) > 1 else ""
        values = [arms[x]["metrics"][metric]["mean"] for x in (best, name)]
        k = _fixed(values)
        return (
            f"In short: {best} is ahead of {name}{more} on {words} ({values[0]:.{k}f} against "
            f"{values[1]:.{k}f}), but {st.get('head', 'not resolved')}, from {st.get('short', 'noise')}: "
            "not a difference yet" + (f" ({st['more']})." if st.get("more") else ".")
        )
    return "In short: no metric was measured on more than one arm, so nothing was compared."


def withdrawn_section(exp: dict[str, Any]) -> list[str]:
    """The claims an earlier publication judged that this one does not, each with its reason."""
    gone = exp.get("withdrawn") or []
    if not gone:
        return []
    return ["## Claims withdrawn", "", *(f"- **{w['claim']}**: {w['reason']}" for w in gone), ""]


def print_tables(results: dict[str, Any], console: Console, report: str = "report.md") -> None:
    """The cost table, the learnt table cut to the metrics that answer the question (the rest are in
    `report`), the verdict, and the one-sentence finding last."""
    results = screened(results)
    wide = console.width >= WIDE  # room for the seeds' ± std beside each cost
    header, rows = metric_rows(results)
    keep = [0] + [header.index(m) for m in question_metrics(results)]
    left = len(header) - len(keep)
    learnt = ([header[i] for i in keep], [[row[i] for i in keep] for row in rows])
    cost = cost_rows(results, spread=wide)
    if not wide:  # the arm's objective and model in one column, two lines: the setting is never cut
        cost = (
            ["arm", "objective / model", *cost[0][3:]],
            [[row[0], f"{row[1]}\n{row[2]}", *row[3:]] for row in cost[1]],
        )
    cost_notes = [held_equal(results, plain=True), seconds_note(results)]
    for title, (header, rows), notes in (
        ("what each arm cost", cost, cost_notes),
        ("what each arm learnt", learnt, [spread_note(results)]),
    ):
        # A narrow terminal: no outer edge, so the arm, its setting and the numbers are not cut
        table = Table(title=title, title_justify="left", show_edge=wide, pad_edge=wide)
        costs = title.endswith("cost")
        for i, h in enumerate(header):
            table.add_column(h, justify="left" if i < 1 + costs else "right", no_wrap=costs)
        for row in rows:
            table.add_row(*(_rich(cell) for cell in row))
        console.print(table)
        for note in notes:
            if note:
                console.print(escape(note), soft_wrap=False)
    if left:
        console.print(f"({left} more metrics in {escape(report)})", soft_wrap=True)
    lines = verdict(results)
    if lines:
        console.print("[bold]verdict[/]")
        width = max(min(console.width, WRAP) - 2, 40)
        for line in lines:
            for part in textwrap.wrap(line, width, subsequent_indent="    ", break_on_hyphens=False):
                console.print(f"  {escape(part)}", soft_wrap=True)
    gone = results["experiment"].get("withdrawn") or []
    if gone:
        names = "; ".join(w["claim"] for w in gone)
        console.print(escape(f"withdrawn ({len(gone)}, reasons in {report}): {names}"), soft_wrap=True)
    console.print(f"[bold]{escape(finding(results))}[/]")


def spread_note(results: dict[str, Any]) -> str:
    """What `±` means in the learnt table (a sample std over seeds, not an interval)."""
    n = len(results.get("seeds") or [])
    if n < 2:
        return ""
    return f"mean ± sample std over {n} seeds; {MARK}: its paired 95% interval to the best includes 0"


BUSY = 1.0  # load average per CPU above which the machine's seconds are said to be those of a busy machine


def seconds_note(results: dict[str, Any]) -> str:
    """Seconds and tokens/s on a busy machine (its load average, recorded with the results, above the CPU
    count) say as much of the load as of the arms: said so, pointing at MFU, timed against a matmul on
    the same machine alongside."""
    m = results.get("machine") or {}
    load, cpus = m.get("load_average"), m.get("cpu_count") or 0
    if not load or not cpus or max(load) <= BUSY * cpus:
        return ""
    mfu = any(a["cost"].get("mfu", NONE)["mean"] is not None for a in results["arms"])
    return (
        f"The machine was busy (load average {', '.join(f'{x:g}' for x in load)} on {cpus} CPUs): train s "
        "and tok/s measure the load as much as the arms, so their ratio is not a cost ratio"
        + ("; MFU, timed against a matmul on the same machine, moves less." if mfu else ".")
    )


def _rich(cell: str) -> str:
    if cell.startswith("**") and cell.endswith("**"):
        return f"[bold]{escape(cell[2:-2])}[/]"
    return escape(cell)


def curves(c: Comparison) -> dict[str, list[list[dict[str, Any]]]]:
    """Validation records per arm (one list per seed), from each run's metrics.jsonl; where a run's folder
    is gone (a comparison continued from its committed run records on another machine), from the curve its
    record kept."""
    out: dict[str, list[list[dict[str, Any]]]] = {}
    for run in c.runs:
        vals = [r for r in metrics_records(run.run_dir) if r.get("split") == "val"]
        if not vals:
            vals = list(((c.results.get(run.key) or {}).get("train") or {}).get("curve") or [])
        out.setdefault(run.arm.name, []).append(vals)
    return out


VAL_LABELS = {
    "val_loss": "validation loss, each arm's own objective",
    "val_bpb": "validation bits per byte (left to right)",
}


SEED_STYLES = ("-", "--", ":", "-.")


def val_series(
    data: dict[str, list[list[dict[str, Any]]]], results: dict[str, Any], x_key: str
) -> tuple[list[str], dict[str, dict[str, list[tuple[list[float], list[float]]]]], dict[str, list[str]]]:
    """What the validation plots draw: the panels (each arm's own objective loss, then left-to-right bits
    per byte where some arm has it), per panel each arm's (x, y) series, one a seed, and per panel the arms
    it lacks (an encoder-decoder has no left-to-right loss), said in the panel."""
    keys = [
        k for k in ("val_loss", "val_bpb") if any(k in r for runs in data.values() for v in runs for r in v)
    ]
    series: dict[str, dict[str, list[tuple[list[float], list[float]]]]] = {}
    missing: dict[str, list[str]] = {}
    for key in keys:
        series[key] = {}
        for arm, runs in data.items():
            lines = []
            for vals in runs:
                pts = [
                    (r[x_key], r[key]) for r in vals if r.get(key) is not None and r.get(x_key) is not None
                ]
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    lines.append((list(map(float, xs)), list(map(float, ys))))
            if lines:
                series[key][arm] = lines
        missing[key] = [arm for arm in data if arm not in series[key]]
    return keys, series, missing


def metric_range(metric: str) -> tuple[float, float]:
    """The values a metric can take: a difference within one model (`suffix_gain`) any, a correlation
    [-1, 1], an accuracy or rate [0, 1], a loss, bits or perplexity [0, inf)."""
    if any(w in metric for w in ("gain", "worth", "delta")):
        return -math.inf, math.inf
    if metric.endswith("mcc"):
        return -1.0, 1.0
    if any(w in metric for w in ("accuracy", "exact_match", "rate", "recall", "precision", "f1")):
        return 0.0, 1.0
    if suite.direction(metric) == "lower":
        return 0.0, math.inf
    return -math.inf, math.inf


def metric_bars(results: dict[str, Any], metric: str) -> list[dict[str, Any]]:
    """What metrics.png draws for one metric, per arm having it: its mean, the 95% interval clipped to the
    metric's range (`metric_range`), and its seeds' values."""
    lo, hi = metric_range(metric)
    out = []
    for a in results["arms"]:
        m = a["metrics"].get(metric)
        if not m or not m.get("n") or m.get("mean") is None:
            continue
        ci = m.get("ci95") or 0.0
        seeds = [v for r in a["runs"] if (v := run_value(r, metric)) is not None]
        out.append({"arm": a["name"], "mean": m["mean"], "low": max(lo, m["mean"] - ci),
                    "high": min(hi, m["mean"] + ci), "seeds": seeds if len(seeds) > 1 else []})  # fmt: skip
    return out


def metric_limits(metric: str, bars: list[dict[str, Any]], arms: list[dict[str, Any]]) -> tuple[float, float]:
    """The y-axis of one metric: its intervals and seeds (and a probe's baselines) with a margin, at least
    a tenth of the largest value wide, so a small gap with no interval does not fill the panel; inside the
    metric's range."""
    values = [v for b in bars for v in (b["low"], b["high"], *b["seeds"])]
    for a in arms:
        for kind in ("majority_accuracy", "bow_accuracy", "random_init_accuracy"):
            base = a.get("baselines", {}).get(baseline_key(metric, kind) or "")
            if base and base.get("mean") is not None:
                values += [base["mean"] - (base.get("ci95") or 0.0), base["mean"] + (base.get("ci95") or 0.0)]
    low, high = min(values), max(values)
    width = max(high - low, 0.1 * max(abs(low), abs(high)), 1e-6)
    mid = (low + high) / 2
    lo, hi = metric_range(metric)
    return max(lo, mid - 0.6 * width), min(hi, mid + 0.6 * width)


def plot(c: Comparison, results: dict[str, Any]) -> list[str]:
    """Write the PNGs; returns their file names."""
    colours = arm_colours(a.name for a in c.experiment.arms)
    names = validation_plots(curves(c), results, colours, c.report_dir)
    if metrics_plot(results, colours, c.report_dir / "metrics.png"):
        names.append("metrics.png")
    return names


def validation_plots(
    data: dict[str, list[list[dict[str, Any]]]],
    results: dict[str, Any],
    colours: dict[str, str],
    out_dir: Path,
) -> list[str]:
    """val_loss_vs_tokens.png and val_loss_vs_seconds.png: each arm's validation curves, one line a seed."""
    plt = pyplot()
    names: list[str] = []
    # Every arm on the first panel with its own objective's loss (different quantities when the arms'
    # objectives differ: each line is read against itself), left-to-right bits per byte beside it.
    same = "val_loss" in results["rankings"] or len({a["objective"] for a in results["arms"]}) < 2
    for x_key, x_label, file in (
        ("tokens", "tokens through the model", "val_loss_vs_tokens.png"),
        ("wall_time", "training seconds", "val_loss_vs_seconds.png"),
    ):
        keys, series, missing = val_series(data, results, x_key)
        if not keys:
            break
        fig, axes = plt.subplots(1, len(keys), figsize=(6.0 * len(keys), 4.4), squeeze=False)
        for ax, key in zip(axes[0], keys, strict=True):
            for arm, lines in series[key].items():
                for k, (xs, ys) in enumerate(lines):
                    seeds = (
                        f" ({len(lines)} seeds: {', '.join(SEED_STYLES[: len(lines)])})"
                        if len(lines) > 1
                        else ""
                    )
                    style = {"color": colours[arm], "alpha": 0.9 if len(lines) == 1 else 0.7}
                    ax.plot(xs, ys, marker="o", ms=3, ls=SEED_STYLES[k % len(SEED_STYLES)],
                            label=f"{arm}{seeds}" if k == 0 else None, **style)  # fmt: skip
            ax.set_xlabel(x_label)
            label = VAL_LABELS.get(key, key)
            if key == "val_loss" and not same:
                label += " (not comparable across arms)"
            ax.set_ylabel(label, fontsize=8)
            if missing[key]:
                ax.text(0.02, 0.02, f"no {key} for: {', '.join(missing[key])}" + (
                        " (not read left to right)" if key == "val_bpb" else ""),
                        transform=ax.transAxes, fontsize=7, color="0.3")  # fmt: skip
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"{results['experiment']['name']}: validation against {x_label}")
        fig.tight_layout(rect=(0, 0, 1, 0.95))
        save_png(fig, out_dir / file)
        names.append(file)
    return names


def metrics_plot(results: dict[str, Any], colours: dict[str, str], path: Path) -> bool:
    """metrics.png, where some metric ranks the arms; whether it was written."""
    # Only the metrics that rank the arms (the suite's named ones; an arm's own loss only between arms of
    # one objective), with 95% intervals of the mean, not the seed std, clipped to the metric's range.
    metrics = plotted_metrics(results)
    if not metrics or not results["arms"]:
        return False
    fig, panels, rows = panel_grid(len(metrics), 4.6, 3.4, head=0.6)
    for ax, metric in zip(panels, metrics, strict=False):
        arms = [a for a in results["arms"] if metric in a["metrics"] and a["metrics"][metric]["n"]]
        bars = metric_bars(results, metric)
        for i, b in enumerate(bars):
            yerr = [[b["mean"] - b["low"]], [b["high"] - b["mean"]]]
            ax.errorbar(i, b["mean"], yerr=yerr, fmt="o", ms=6, capsize=4, color=colours[b["arm"]])
            for value in b["seeds"]:
                ax.plot(i + 0.12, value, ".", color=colours[b["arm"]], alpha=0.5)
        if baseline_key(metric, "majority_accuracy") is None:  # a probe's axis starts at chance
            ax.set_ylim(*metric_limits(metric, bars, arms))
        _draw_baselines(ax, metric, arms)
        ax.set_xlim(-0.6, len(arms) - 0.4)
        ax.set_xticks(range(len(arms)), [a["name"] for a in arms], rotation=30, ha="right", fontsize=8)
        better = suite.direction(metric)
        ax.set_title(
            f"{metric} ({better} is better)" if better in ("lower", "higher") else metric, fontsize=9
        )
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(
        f"{results['experiment']['name']}: metrics that rank the arms\n"
        "(mean; bars: 95% interval; dots: seeds)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.7 / (3.4 * rows + 0.6)))
    save_png(fig, path)
    return True


def plotted_metrics(results: dict[str, Any]) -> list[str]:
    """The metrics the per-arm plot draws: those that rank the arms, in the report's order."""
    have = {k for a in results["arms"] for k in a["metrics"]}
    return [m for m in ordered(results["rankings"]) if m in have]


def _draw_baselines(ax: Any, metric: str, arms: list[dict[str, Any]]) -> None:
    """A probe's axis from chance (its majority baseline, else 0) with the baselines drawn: majority and
    bag-of-words as lines (the same examples for every arm), random-init per arm (its own architecture)."""
    if baseline_key(metric, "majority_accuracy") is None:
        return

    def mean(arm: dict[str, Any], kind: str) -> float | None:
        b = arm.get("baselines", {}).get(baseline_key(metric, kind) or "")
        return b["mean"] if b and b.get("mean") is not None else None

    majority = [v for a in arms if (v := mean(a, "majority_accuracy")) is not None]
    bow = [v for a in arms if (v := mean(a, "bow_accuracy")) is not None]
    if majority:
        ax.axhline(sum(majority) / len(majority), color="0.4", ls=":", lw=1, label="majority")
    if bow:
        ax.axhline(sum(bow) / len(bow), color="0.4", ls="--", lw=1, label="bag-of-words")
    for i, a in enumerate(arms):
        b = a.get("baselines", {}).get(baseline_key(metric, "random_init_accuracy") or "")
        if b and b.get("mean") is not None:
            ax.errorbar(i - 0.15, b["mean"], yerr=b.get("ci95") or 0.0, fmt="x", color="0.5", capsize=3,
                        label="random-init" if i == 0 else None)  # fmt: skip
    top = max(a["metrics"][metric]["mean"] + (a["metrics"][metric].get("ci95") or 0.0) for a in arms)
    ax.set_ylim(min(majority) if majority else 0.0, max(top, *(bow or [0.0])) * 1.02 + 1e-9)
    if majority or bow or any(a.get("baselines") for a in arms):
        ax.legend(fontsize=7)


def write_report(c: Comparison, console: Console | None = None) -> dict[str, Any]:
    """results.json, the PNGs, then report.md (each written whole or not at all)."""
    results = build_results(c)
    plots = plot(c, results)
    write_all(c.report_dir, results, plots, markdown)
    if console is not None:
        print_tables(results, console, str(c.report_dir / "report.md"))
    return results
