"""A comparison's results: everything its report says, as JSON, and the verdicts on the literature's claims.

Per arm its runs, cost and metrics over seeds (`build_results`); per metric the arms ranked
(`objtrain.stats.seeds.rank`) among those it means the same for (`not_ranked`: a left-to-right score of a
model that does not read left to right, a probe at its random-init baseline); per claim the paired
difference of its arms and the verdict (`claim_verdict`), gated on the probe's random-init baseline
(`baseline_gate`) and set against the paper's scale (`claim_regime`). A sweep judges its claims with the
same `claim_verdict` at every point (`objtrain.compare.sweep_results`). How it reads is `objtrain.report`'s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from objtrain.compare import suite
from objtrain.compare.experiment import ArmSpec, Claim, Experiment
from objtrain.compare.regime import regime_gap, seed_notes
from objtrain.compare.runner import Comparison, machine, plan_dict
from objtrain.stats.seeds import Summary, paired, paired_eval_se, rank, summarise

# Metrics first in this order, then the rest alphabetically.
ORDER = (
    "conditional_bpb",
    "bits_per_byte",
    "val_bpb",
    "loss",
    "masked_accuracy",
    "masked_loss",
    "span_target_loss",
    "span_target_accuracy",
    "infill_exact_match",
    "infill_exact_match_norm",
    "infill_parse_rate",
    "probe_accuracy",
    "probe_mcc",
    "objective_loss",
    "val_loss",
)


# What each arm cost, per run: what the report's cost table shows.
COST = ("parameters", "tokens", "flops", "seconds", "tokens_per_s", "mfu", "peak_memory_bytes")


NONE: dict[str, Any] = {"mean": None, "std": None, "n": 0}  # a cost an older results.json lacks


def arm_pair(arms: list[str]) -> tuple[str, str | None]:
    """A claim's arms as (a, b); b is None for a claim of one arm against 0."""
    return arms[0], (arms[1] if len(arms) > 1 else None)


def run_numbers(record: dict[str, Any]) -> dict[str, float]:
    """One run's metrics: the suite's rankable numbers and the training validation's loss and bits."""
    numbers = suite.numeric_metrics(record["eval"])
    for key in ("val_loss", "val_bpb"):
        if record["train"].get(key) is not None:
            numbers[key] = float(record["train"][key])
    return numbers


def experiment_entry(exp: Experiment) -> dict[str, Any]:
    """What results.json says of the experiment: its name, question, the literature's answer, its file."""
    return {"name": exp.name, "question": exp.question, "expect": exp.expect, "source": exp.source}


def one_objective(objectives: Iterable[tuple[str, dict[str, Any]]]) -> bool:
    """Whether every arm trains one objective with the same overrides: only then is each arm's own loss
    one quantity across arms (`suite.OWN_LOSSES`)."""
    return len({json.dumps(list(o), sort_keys=True) for o in objectives}) == 1


def build_results(c: Comparison) -> dict[str, Any]:
    """Everything the report says, as JSON: per arm its runs, cost and metrics over seeds; rankings."""
    arms: list[dict[str, Any]] = []
    per_metric: dict[str, dict[str, Summary]] = {}
    by_seed: dict[str, dict[str, dict[int, float]]] = {}  # metric -> arm -> seed -> value
    units: dict[str, dict[str, dict[int, Any]]] = {}  # metric -> arm -> seed -> per-unit scores
    for arm in c.experiment.arms:
        runs = [c.results[r.key] for r in c.runs if r.arm.name == arm.name and r.key in c.results]
        if not runs:
            continue
        for r in runs:
            seed = int(r.get("seed", 0))
            for metric, scores in (r["eval"].get("units") or {}).items():
                units.setdefault(metric, {}).setdefault(arm.name, {})[seed] = scores
            for key, value in run_numbers(r).items():
                by_seed.setdefault(key, {}).setdefault(arm.name, {})[seed] = value
        entry, metrics = _arm_entry(arm, runs)
        arms.append(entry)
        for k, s in metrics.items():
            per_metric.setdefault(k, {})[arm.name] = s
    exp = c.experiment
    same = one_objective((a.objective.name, a.objective.overrides) for a in exp.arms)
    rankings, unranked = _rankings(arms, per_metric, by_seed, units, same)
    claims = [
        claim_verdict(claim, by_seed.get(claim.metric, {}), len(c.seeds), units.get(claim.metric, {}))
        | {"regime": claim_regime(claim.regime or exp.regime, arms, claim.arms)}
        for claim in exp.claims
    ]
    claims = [baseline_gate(claim, arms) for claim in claims]
    return {
        "experiment": experiment_entry(exp)
        | ({"withdrawn": [dataclasses.asdict(w) for w in exp.withdrawn]} if exp.withdrawn else {}),
        "plan": plan_dict(c),
        "budget": {"name": c.budget_name, "kind": c.budget.kind, "value": c.budget.value}
        | ({"size": c.budget.size} if c.budget.size else {}),
        "seeds": c.seeds,
        "evaluation": {"suite": suite.available(), "data": c.eval_data, "options": c.eval_options}
        | ({"first_seed_options": c.first_seed_options} if c.first_seed_options else {}),
        "machine": machine(),
        "wall_seconds": c.seconds,
        "arms": arms,
        "rankings": rankings,
        "unranked": unranked,
        "claims": claims,
    }


def _arm_entry(arm: ArmSpec, runs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Summary]]:
    """One arm's entry in results.json, from its runs' records, and its metrics summarised over seeds."""
    # results.json keeps each run's record without its per-unit scores (they stay in results/)
    runs = [r | {"eval": {k: v for k, v in r["eval"].items() if k != "units"}} for r in runs]
    first = runs[0]["train"]
    values: dict[str, list[float]] = {}
    for r in runs:
        for key, value in run_numbers(r).items():
            values.setdefault(key, []).append(value)
    metrics = {k: summarise(v) for k, v in values.items()}
    cost = {k: summarise([float(r["train"][k]) for r in runs if r["train"].get(k) is not None]) for k in COST}
    found: dict[str, list[float]] = {}
    for r in runs:
        for key, value in r["eval"].items():
            if BASELINE.match(key) and isinstance(value, (int, float)) and math.isfinite(value):
                found.setdefault(key, []).append(float(value))
    entry = {
        "name": arm.name,
        "objective": arm.objective.name,
        "objective_overrides": arm.objective.overrides,
        "model_kind": first["model_kind"],
        "model_size": first["model_size"],
        # as trained: compare may add overrides of its own (match_mtp_parameters' n_layer)
        "model_overrides": ((first.get("config") or {}).get("model") or {}).get("overrides")
        or arm.model.overrides,
        "seq_len": first["seq_len"],
        "batch_size": first["batch_size"],
        "steps": first["steps"],
        "cost": {k: s.to_dict() for k, s in cost.items()},
        "baselines": {k: summarise(v).to_dict() for k, v in sorted(found.items())},
        "metrics": {k: metrics[k].to_dict() for k in ordered(metrics)},
        "runs": runs,
    }
    return entry, metrics


def _rankings(
    arms: list[dict[str, Any]],
    per_metric: dict[str, dict[str, Summary]],
    by_seed: dict[str, dict[str, dict[int, float]]],
    units: dict[str, dict[str, dict[int, Any]]],
    same_objective: bool,
) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """Per metric with a direction that two arms have: the arms ranked among those it means the same for
    (`not_ranked`), and the arms left out with why."""
    rankings: dict[str, Any] = {}
    unranked: dict[str, dict[str, str]] = {}
    by_name = {a["name"]: a for a in arms}
    for metric in ordered(per_metric):
        direction = suite.direction(metric)
        if (
            direction == "info"
            or (metric in suite.OWN_LOSSES and not same_objective)
            or len(per_metric[metric]) < 2
        ):
            continue
        # A metric is ranked among the arms it means the same for (`not_ranked`); the rest are listed.
        why = unranked_reasons([by_name[n] for n in per_metric[metric]], metric)
        if why:
            unranked[metric] = why
        kept = {n: s for n, s in per_metric[metric].items() if n not in why}
        if len(kept) < 2:
            continue
        entry = ranking_entry(metric, kept, direction == "lower", by_seed.get(metric), units.get(metric))
        if entry is not None:
            rankings[metric] = entry
    return rankings, unranked


def ranking_entry(
    metric: str,
    summaries: dict[str, Summary],
    lower: bool,
    per_seed: dict[str, dict[int, float]] | None,
    units: dict[str, dict[int, Any]] | None = None,
) -> dict[str, Any] | None:
    """results.json's ranking of one metric (`stats.rank`), each gap with the standard error the
    evaluation's own sample of documents or tasks gives it (`eval_se`, where per-unit scores were kept)."""
    r = rank(metric, summaries, lower=lower, per_seed=per_seed)
    if r is None:
        return None
    gaps = {name: g | {"eval_se": _eval_se(units, name, r.best)} for name, g in r.gaps.items()}
    return {
        "lower_is_better": r.lower_is_better,
        "best": r.best,
        "tie": r.tie,
        "within_seed_spread": r.within_spread,
        "gaps": gaps,
    }


# Scores read left to right, which only a decoder does on its own: an encoder-decoder read through its
# decoder with an empty encoder is poor by construction, an encoder reads nothing left to right (README,
# "Evaluation"). Ranked among decoders only.
LEFT_TO_RIGHT = ("loss", "perplexity", "bits_per_byte", "byte_perplexity", "word_perplexity", "val_bpb")


LEFT_TO_RIGHT_KINDS = ("decoder",)


PROBE_MCC = re.compile(r"^(probe|finetune)_(?:(\w+)_)?mcc$")


def _random_init(arm: dict[str, Any], accuracy: str) -> tuple[float, float] | None:
    """The arm's random-init baseline for a probe's (fine-tune's, minimal pairs') accuracy and the width it
    must be beaten by: the baseline's 95% interval, or its own seed sd (minimal pairs: its own binomial
    interval) where one seed leaves no interval."""
    key = baseline_key(accuracy, "random_init_accuracy") or ""
    base = arm.get("baselines", {}).get(key)
    if base is None or base.get("mean") is None:
        return None
    sd = arm["baselines"].get(baseline_key(accuracy, "accuracy_probe_sd") or "", {}).get("mean")
    hi = arm["baselines"].get(f"{key}_hi", {}).get("mean")  # minimal pairs at one seed: its Wilson interval
    own = hi - base["mean"] if hi is not None else 0.0
    width = base["ci95"] if base.get("ci95") is not None else (sd or own)
    return float(base["mean"]), float(width)


def at_baseline(arm: dict[str, Any], metric: str) -> str | None:
    """`at its random-init baseline (0.483 ± 0.02)` where the arm's probe or fine-tune (its accuracy, or
    the Matthews correlation of the same probe) does not beat the same architecture untrained beyond that
    baseline's interval; None where it does, or where no baseline was measured."""
    m = PROBE_MCC.match(metric)
    accuracy = metric[: -len("mcc")] + "accuracy" if m else metric
    if baseline_key(accuracy, "random_init_accuracy") is None:
        return None
    mean = (arm["metrics"].get(accuracy) or {}).get("mean")
    base = _random_init(arm, accuracy)
    if mean is None or base is None or mean > base[0] + base[1]:
        return None
    own = f"its accuracy {mean:.4g} against " if m else ""
    return f"at its random-init baseline ({own}{base[0]:.4g} ± {base[1]:.2g})"


def not_ranked(arm: dict[str, Any], metric: str) -> str | None:
    """Why `metric` does not mean for this arm what it means for the others, or None: a left-to-right
    score of a model that does not read left to right, a conditional score in a layout the arm's objective
    never trained on, or a probe at its random-init baseline."""
    if metric in LEFT_TO_RIGHT and arm["model_kind"] not in LEFT_TO_RIGHT_KINDS:
        kind = KIND_WORDS.get(arm["model_kind"], arm["model_kind"])
        return f"({'an' if kind[:1] in 'aeiou' else 'a'} {kind} does not read left to right)"
    if metric == "conditional_bpb" and _untrained_layout(arm):
        return UNTRAINED_LAYOUT_WHY
    return at_baseline(arm, metric)


def unranked_reasons(arms: list[dict[str, Any]], metric: str) -> dict[str, str]:
    """Arm name -> why `metric` is not ranked for it (`not_ranked`), over the arms that have it. Arms all
    scored in the same untrained layout still compare with each other: none is left out for it."""
    why = {a["name"]: w for a in arms if (w := not_ranked(a, metric))}
    if len(why) == len(arms) and all(w == UNTRAINED_LAYOUT_WHY for w in why.values()):
        return {}
    return why


UNTRAINED_LAYOUT_WHY = "(scored as one long span, a layout its objective never trained on)"


def _untrained_layout(arm: dict[str, Any]) -> bool:
    from objtrain.evaluation.conditional import untrained_layout

    notes = [(run.get("eval") or {}).get("conditional_mode") for run in arm.get("runs") or []]
    return any(isinstance(note, str) and untrained_layout(note) for note in notes)


KIND_WORDS = {"encdec": "encoder-decoder"}


def screened(results: dict[str, Any]) -> dict[str, Any]:
    """`results` with its rankings over the arms each metric means the same for (`not_ranked`) and the
    arms left out under `unranked`, as `build_results` writes them now; a results.json from before (a
    published one, say) is re-ranked from its runs' per-seed values. Returned unchanged when it has them."""
    if "unranked" in results:
        return results
    rankings: dict[str, Any] = {}
    unranked: dict[str, dict[str, str]] = {}
    for metric, r in (results.get("rankings") or {}).items():
        having = [a for a in results["arms"] if (a["metrics"].get(metric) or {}).get("n")]
        why = unranked_reasons(having, metric)
        if not why:
            rankings[metric] = r
            continue
        unranked[metric] = why
        kept = [a for a in having if a["name"] not in why]
        if len(kept) < 2:
            continue
        summaries = {a["name"]: summary_of(a["metrics"][metric]) for a in kept}
        per_seed = {a["name"]: _per_seed(a, metric) for a in kept}
        entry = ranking_entry(metric, summaries, bool(r["lower_is_better"]), per_seed)
        if entry is not None:
            rankings[metric] = entry
    return results | {"rankings": rankings, "unranked": unranked}


def _per_seed(arm: dict[str, Any], metric: str) -> dict[int, float]:
    runs = [(int(r.get("seed", 0)), run_value(r, metric)) for r in arm["runs"]]
    return {seed: v for seed, v in runs if v is not None}


def summary_of(value: dict[str, Any]) -> Summary:
    def number(key: str) -> float:
        v = value.get(key)
        return float(v) if v is not None else float("nan")

    return Summary(number("mean"), number("std"), int(value.get("n") or 0), number("ci95"))


def claim_verdict(
    claim: Claim,
    per_seed: dict[str, dict[int, float]],
    n_seeds: int,
    units: dict[str, dict[int, Any]] | None = None,
) -> dict[str, Any]:
    """The claim with our paired difference `a - b` and the verdict: agrees, disagrees or not resolved
    (the 95% interval decides; for `equal`, the interval against ±margin), or "no published comparison".
    With both arms' per-unit scores (`units`: arm -> seed -> scores), also `eval_se`: the standard error
    of the mean difference that comes from the evaluation's own sample of documents or tasks alone (each
    seed's from its per-unit differences, combined over the seeds), to set beside the seed spread."""
    a, b = arm_pair(claim.arms)
    out: dict[str, Any] = {
        "claim": claim.claim,
        "literature": claim.literature,
        "metric": claim.metric,
        "arms": list(claim.arms),
        "expect": claim.expect,
        "margin": claim.margin,
    }
    if a not in per_seed or (b is not None and b not in per_seed):
        # Some metrics exist for some arms only (sentence_order_accuracy: the arms with a trained pair
        # head): say which arms have it, so "not measured" reads as a fact of the arms, not a failure.
        return out | {"verdict": "not measured", "paired": None, "measured_by": list(per_seed)}
    base = per_seed[b] if b is not None else dict.fromkeys(per_seed[a], 0.0)
    p = paired(per_seed[a], base)
    diffs = {k: float(per_seed[a][k]) - float(base[k]) for k in sorted(set(per_seed[a]) & set(base))}
    diffs = {k: d for k, d in diffs.items() if math.isfinite(d)}
    lo, hi = p.delta - p.ci95, p.delta + p.ci95
    if not p.n or not math.isfinite(p.ci95):
        text = "not resolved"
    elif claim.expect == "none":
        text = "no published comparison"
    elif claim.expect == "equal":
        text = (
            "agrees" if max(abs(lo), abs(hi)) <= claim.margin
            else "disagrees" if min(abs(lo), abs(hi)) > claim.margin and lo * hi > 0
            else "not resolved"
        )  # fmt: skip
    else:
        below, above = hi < 0, lo > 0
        want_below = claim.expect == "lower"
        text = (
            "agrees"
            if (below if want_below else above)
            else "disagrees"
            if (above if want_below else below)
            else "not resolved"
        )
    pd = p.to_dict()
    return (
        out
        | {"verdict": text, "paired": pd, "seeds": n_seeds, "eval_se": _eval_se(units, a, b)}
        | seed_notes(text, diffs, pd, claim.expect, claim.margin)
    )


# The probe's baselines, per task (`probe_sst2_random_init_accuracy`) or for the default probe
# (`probe_random_init_accuracy`): the majority class, a bag-of-words logistic regression on the same examples,
# the same architecture at random init, and the probe's own seed-to-seed spread.
# Minimal pairs (`blimp_accuracy`): the same architecture at random init and an n-gram model, each with
# its Wilson interval's ends.
BASELINE = re.compile(
    r"^(?:probe|finetune)_(?:\w+_)?"
    r"(?:majority_accuracy|bow_accuracy|random_init_accuracy|accuracy_probe_sd|accuracy_tune_sd)$"
    r"|^blimp_(?:random_init|ngram)_accuracy(?:_lo|_hi)?$"
)


# A probe's, fine-tune's or minimal-pair accuracy (the default task or a named one), whose baselines sit
# beside it
PROBE_ACCURACY = re.compile(r"^(probe|finetune|blimp)_(?:(\w+)_)?accuracy$")


def baseline_key(metric: str, kind: str) -> str | None:
    """`probe_sst2_accuracy`, `random_init_accuracy` -> `probe_sst2_random_init_accuracy` (`finetune_...`
    alike)."""
    m = PROBE_ACCURACY.match(metric)
    if m is None:
        return None
    if m.group(1) == "finetune" and kind == "accuracy_probe_sd":
        kind = "accuracy_tune_sd"  # a fine-tune's own spread is over fine-tune seeds
    return f"{m.group(1)}_{m.group(2)}_{kind}" if m.group(2) else f"{m.group(1)}_{kind}"


def baseline_gate(claim: dict[str, Any], arms: list[dict[str, Any]]) -> dict[str, Any]:
    """A classification claim is judged only when its arms beat the random-init baseline (the same
    architecture untrained, probed alike) beyond that baseline's 95% interval (its own seed sd where one
    seed leaves no interval); otherwise its verdict is "not judged", and it says why."""
    key = baseline_key(claim["metric"], "random_init_accuracy")
    if key is None or claim.get("verdict") == "not measured":
        return claim
    by_name = {a["name"]: a for a in arms}
    short = []
    for name in claim["arms"]:
        arm = by_name.get(name)
        if arm is None or claim["metric"] not in arm["metrics"]:
            continue
        base = _random_init(arm, claim["metric"])
        if base is None:
            return claim | {"baseline": "no random-init baseline was measured: the verdict cannot say "
                            "whether pretraining taught the probe anything"}  # fmt: skip
        mean = arm["metrics"][claim["metric"]]["mean"]
        if not mean > base[0] + base[1]:
            short.append(f"{name} {mean:.3g} against random-init {base[0]:.3g} ± {base[1]:.2g}")
    if not short:
        return claim | {"baseline": "every arm beats its random-init baseline beyond its interval"}
    measure = {"finetune": "fine-tune", "blimp": "minimal-pair score"}.get(
        claim["metric"].split("_")[0], "probe"
    )
    return claim | {
        "verdict": "not judged",
        "verdict_before_baseline": claim["verdict"],
        "baseline": "not judged: the arms do not beat the same architecture at random init beyond its "
        f"interval ({'; '.join(short)}), so the {measure} does not show what pretraining taught",
    }


def claim_regime(setting: Any, arms: list[dict[str, Any]], names: list[str]) -> dict[str, Any] | None:
    """The paper's smallest setting against the claim's arms (their mean parameters and tokens)."""
    chosen = [a for a in arms if a["name"] in names]

    def mean(key: str) -> float | None:
        vals = [a["cost"][key]["mean"] for a in chosen if a["cost"].get(key, NONE)["mean"] is not None]
        return sum(vals) / len(vals) if vals else None

    return regime_gap(setting, mean("parameters"), mean("tokens"))


def _eval_se(units: dict[str, dict[int, Any]] | None, a: str, b: str | None) -> float | None:
    if not units or b is None or a not in units or b not in units:
        return None
    shared = sorted(set(units[a]) & set(units[b]))
    errors = [paired_eval_se(units[a][k], units[b][k]) for k in shared]
    if not errors or any(e is None for e in errors):
        return None
    return math.sqrt(sum(e**2 for e in errors)) / len(errors)  # type: ignore[operator]


def ordered(keys: Iterable[str], first: Sequence[str] = ORDER) -> list[str]:
    """`keys` with those in `first` first, in its order, then the rest alphabetically."""
    keys = list(keys)
    return [k for k in first if k in keys] + sorted(k for k in keys if k not in first)


def run_value(run: dict[str, Any], metric: str) -> float | None:
    value = (run.get("eval") or {}).get(metric, (run.get("train") or {}).get(metric))
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
