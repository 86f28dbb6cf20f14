"""The published findings (docs/findings): which shipped experiments answer which question, on which data,
with which command; and the index page, a pure function of the experiments' results.json files.

    python -m scripts.findings run [--jobs N] [--all] [NAME ...]  train, evaluate, publish
    python -m scripts.findings publish                            rewrite the reports and index
    python -m scripts.findings refit [NAME ...]                   the sweeps again from their run records

Each experiment's report directory is `docs/findings/NAME/` (its arms' checkpoints under `arms/` stay out
of version control); `report.md` is regenerated from `results.json`, so the published tables cannot drift
from the numbers. The prose experiments train on Project Gutenberg books and probe on SST-2, TREC and
CoLA from `../shared/data` (`benchmarks/findings_data.py` builds the store); the code experiments train
on the embedded standard-library store. The compute sweeps (`SWEEPS`) are published the same way, in a
section of the index of their own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from objtrain.compare import suite
from objtrain.compare.experiment import (
    ArmSpec,
    Experiment,
    arm_config,
    find_experiment,
    load_experiment,
    resolve_budget,
)
from objtrain.compare.regime import regime_gap
from objtrain.compare.results import baseline_gate, claim_regime
from objtrain.compare.sweep_results import refit as sweep_refit
from objtrain.errors import UserError
from objtrain.io import read_json, write_json
from objtrain.models.zoo import model_config
from objtrain.objectives.registry import build_objective
from objtrain.report.comparison import markdown
from objtrain.report.sweep import markdown as sweep_markdown
from objtrain.report.sweep import plot as sweep_plot
from objtrain.report.tables import difference, point_verdict, regime_text, verdict_cell
from objtrain.specials import Specials
from objtrain.training.accounting import batch_flops, flops_per_step
from objtrain.training.config import ScheduleConfig

from .changes import PREVIOUS, diff, section

ROOT = Path("docs/findings")
LOGS = Path("runs/findings/logs")  # each experiment's output when several run at once
# A redesigned experiment's re-run: it trains here, beside the published folder it will replace, and is under
# version control run by run (plan.json, results/*.json; its checkpoints are not), so a re-run longer than one
# sitting continues from any clone with the same command. Until it is done the index shows the published
# results with how far the re-run has got; when it is done it takes the published folder's place.
RERUNS = ROOT / "rerun"
PROSE_STORE = "runs/findings/data/prose"
SHARED = "../shared/data"
SEEDS = 3
# 50 pairs of each of BLiMP's 67 paradigms: 3,350 pairs, a Wilson interval of about +-0.017 on an accuracy
# near 0.55; an encoder's pseudo-log-likelihood (one copy of a sentence a token) over all 33,500 would take
# most of an hour a model on one core.
BLIMP_PER_PARADIGM = 50
MAX_SEEDS = 5  # a claim whose 3-seed interval straddles its boundary gets up to 5 where that would resolve it


@dataclass(frozen=True)
class Finding:
    question: str  # the wording, as the index's section heading
    corpus: str  # "prose" or "code"
    probes: bool = True  # named probes (SST-2, TREC, CoLA) from the shared data
    probe_tasks: str = "sst2,trec,cola"
    # BLiMP's minimal pairs from the shared data, the first BLIMP_PER_PARADIGM of each paradigm
    blimp: bool = False
    # False: `make findings` (a plain `run`) leaves it out and `run --all` or its name runs it. All of them
    # together take about twice the ~6 hours a full re-run may take on 2 cores, so the plain run keeps the
    # comparisons across model kinds, heads and sizes at equal FLOPs (what a reader checks first) and the
    # questions about one objective (its knobs, fim-suffix) are run on request.
    core: bool = True


FINDINGS: dict[str, Finding] = {
    "objectives": Finding(
        "CLM vs MLM vs span corruption vs prefix LM vs UL2 vs GPT-BERT",
        "prose",
        probe_tasks="sst2,trec",
        blimp=True,
    ),
    "mlm-mask-rate": Finding("MLM mask rate 10 / 15 / 30 / 40%", "prose", core=False),
    "span-length": Finding("Span length (mean 1 / 3 / 8) for span corruption", "prose", core=False),
    "prefix-proportion": Finding("Prefix proportion in prefix LM", "prose", core=False),
    "nsp-sop": Finding("NSP ablation: MLM alone, MLM + NSP, MLM + SOP", "prose", core=False),
    "fim-rate": Finding("FIM rate 0 / 0.5 / 0.9", "code", probes=False, core=False),
    "mtp-heads": Finding("MTP heads 1 / 2 / 4", "code", probes=False),
}

# The compute sweeps (objtrain.compare.sweep), published beside the findings: each arm at every budget of the
# experiment's own `sweep:`, with the findings' seeds (a claim's paired interval at each budget needs them).
SWEEPS: dict[str, Finding] = {
    "objectives-scaling": Finding(
        "How each objective's left-to-right quality grows with compute", "code", probes=False
    ),
    "fim-scaling": Finding(
        "FIM 0.5 vs CLM as compute grows: left-to-right cost and the suffix's worth", "code", probes=False
    ),
    "fim-suffix": Finding("From which budget a FIM model uses the suffix", "code", probes=False, core=False),
    # How fast each objective learns grammar: 4 objectives x 4 budgets, each chain about one `objectives`
    # arm's training (its largest point is that comparison's budget), so about as long as `objectives`.
    "blimp-scaling": Finding(
        "How fast each objective learns grammar: BLiMP against training FLOPs",
        "prose",
        probes=False,
        blimp=True,
        core=False,
    ),
}
SWEEP_SEEDS = SEEDS

CORPUS_TEXT = {
    "prose": "247 Project Gutenberg books (`../shared/data/gutenberg-en`, bodies only), sentencepiece 8,192",
    "code": "the Python standard library's own source (the embedded store), sentencepiece 4,096",
}


def command(name: str, folder: Path | None = None) -> list[str]:
    """The one command that (re)produces an experiment's row: resumable, three seeds (a comparison: up to
    five where a claim's interval straddles its boundary and that many would resolve it); into `folder`
    (default: its published one)."""
    folder = folder or ROOT / name
    if name in SWEEPS:
        f = SWEEPS[name]
        cmd = ["objtrain", "compare", name, "--seeds", str(SWEEP_SEEDS), "-o", str(folder)]
    else:
        f = FINDINGS[name]
        cmd = ["objtrain", "compare", name, "--seeds", str(SEEDS), "--max-seeds", str(MAX_SEEDS)]
        cmd += ["-o", str(folder)]
    if f.corpus == "prose":
        cmd += ["--data", PROSE_STORE]
    if f.probes:
        cmd += ["--eval", f"probe_data={SHARED}", "--eval", f"probe_tasks={f.probe_tasks}"]
    if f.blimp:
        cmd += ["--eval", f"blimp={SHARED}/blimp/blimp-dev.jsonl.gz"]
        cmd += ["--eval", f"blimp_per_paradigm={BLIMP_PER_PARADIGM}"]
        cmd += ["--eval", f"blimp_paper={SHARED}/blimp/paper-results.jsonl"]
    return cmd


def read_results(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    out = {}
    for name in [*FINDINGS, *SWEEPS]:
        path = root / name / "results.json"
        if path.is_file():
            out[name] = with_regime(name, json.loads(path.read_text(encoding="utf-8")))
            runs = run_records(root / name / "results")
            out[name]["lane_seconds"] = lane_seconds(runs)
            out[name]["run_seconds"] = run_seconds(runs)
            out[name]["one_rate_finetunes"] = one_rate_finetunes(runs)
            previous = root / name / PREVIOUS
            if previous.is_file():  # a re-publication: what changed against what it replaced
                out[name]["changes"] = diff(json.loads(previous.read_text(encoding="utf-8")), out[name])
            rerun = root / RERUNS.relative_to(ROOT) / name
            if (rerun / "plan.json").is_file():
                out[name]["rerun"] = rerun_progress(rerun)
    return out


def rerun_progress(folder: Path) -> dict[str, int]:
    """How many of a re-run's runs are finished (their results/*.json written) of how many it plans."""
    plan = json.loads((folder / "plan.json").read_text(encoding="utf-8"))
    arms = (plan.get("experiment") or {}).get("arms") or []
    return {"done": len(list((folder / "results").glob("*.json"))), "runs": len(arms) * len(plan["seeds"])}


def rerun_lines(name: str, results: dict[str, Any]) -> list[str]:
    if "rerun" not in results:
        return []
    r = results["rerun"]
    return [
        f"- **Re-run in progress** (`{RERUNS / name}`): {r['done']} of {r['runs']} runs of the redesigned "
        f"experiment finished; `python -m scripts.findings run {name}` continues it (the heading and "
        "data line are the re-run's). The rows below are the results it will replace."
    ]


def run_records(runs: Path) -> list[dict[str, Any]]:
    """An experiment's published run records (`results/*.json`), each read once."""
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted(runs.glob("*.json"))]


def _run_costs(runs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(training seconds, evaluation seconds) of each run, from its own record."""
    return [
        (float((run.get("train") or {}).get("seconds") or 0.0), float(run.get("eval_seconds") or 0.0))
        for run in runs
    ]


def lane_seconds(runs: list[dict[str, Any]]) -> dict[str, float]:
    """What an experiment's published runs cost, from each run's own record: training seconds (a sweep's
    shorter point only its decay after the branch) and evaluation seconds, summed over runs and seeds."""
    costs = _run_costs(runs)
    return {"train": sum(t for t, _ in costs), "eval": sum(e for _, e in costs)}


def run_seconds(runs: list[dict[str, Any]]) -> list[float]:
    """The training and evaluation seconds of each job `--jobs` lanes share out, the longest first: a
    comparison's runs, a sweep's chains (the points of one arm, size and seed go one after another)."""
    jobs: dict[Any, float] = {}
    for i, (run, (t, e)) in enumerate(zip(runs, _run_costs(runs), strict=True)):
        train = run.get("train") or {}
        key = (run["arm"], train.get("model_size"), run.get("seed")) if "arm" in run else i
        jobs[key] = jobs.get(key, 0.0) + t + e
    return sorted(jobs.values(), reverse=True)


def one_rate_finetunes(runs: list[dict[str, Any]]) -> int:
    """How many of an experiment's runs were fine-tuned at one peak rate (3e-4) rather than the best on dev
    of several (`evaluation.finetune`; a run record from before carries no `finetune_*lrs_tried`)."""
    count = 0
    for run in runs:
        scores = run.get("eval") or {}
        tuned = any(k.startswith("finetune_") and k.endswith("_accuracy") for k in scores)
        count += tuned and not any(k.startswith("finetune_") and k.endswith("lrs_tried") for k in scores)
    return count


def stale_finetune_lines(results: dict[str, Any]) -> list[str]:
    if not results.get("one_rate_finetunes"):
        return []
    return [
        f"- Fine-tunes: {results['one_rate_finetunes']} runs fine-tuned at one peak rate (3e-4), which "
        "favours the random-init baseline (a pretrained span encoder scored 0.54 at 3e-4 and 0.69 at 1e-3 "
        "on SST-2); re-measured with the rate chosen on dev for every model when this experiment is "
        "re-evaluated"
    ]


TASK_NAMES = {"sst2": "SST-2", "trec": "TREC", "cola": "CoLA"}


def _probes_text(finding: Finding) -> str:
    """`; probes SST-2, TREC` from the tasks its command passes, and BLiMP where it scores minimal pairs."""
    text = ""
    if finding.probes:
        text += "; probes " + ", ".join(TASK_NAMES.get(t, t) for t in finding.probe_tasks.split(","))
    if finding.blimp:
        text += f"; BLiMP, the first {BLIMP_PER_PARADIGM} pairs of each of its 67 paradigms"
    return text


def _cost_line(results: dict[str, Any]) -> list[str]:
    cost = results.get("lane_seconds") or {}
    if not any(cost.values()):
        return []
    return [
        f"- Cost: {sum(cost.values()) / 3600:.1f} lane-hours measured (training {cost['train'] / 3600:.1f}, "
        f"evaluation {cost['eval'] / 3600:.1f}), each run on one thread beside another lane"
    ]


def core_names() -> list[str]:
    """What a plain `run` (`make findings`) runs; `run --all` adds the rest."""
    return [n for n, f in {**FINDINGS, **SWEEPS}.items() if f.core]


def makespan(hours: list[float], jobs: int) -> float:
    """When the last of `jobs` lanes ends, each taking the next job in the order given as it frees."""
    lanes = [0.0] * jobs
    for h in hours:
        lanes[lanes.index(min(lanes))] += h
    return max(lanes)


def wall_hours(all_results: dict[str, dict[str, Any]], names: list[str], jobs: int = 2) -> float:
    """How long `findings run --jobs` takes for `names`, from the runs' own records: the experiments one
    after another, each one's runs (a sweep's chains) shared out over the lanes."""
    total = 0.0
    for name in names:
        runs = [s / 3600 for s in all_results[name].get("run_seconds") or []]
        if not runs:  # a record without its runs' times: the experiment as one job
            runs = [sum(all_results[name]["lane_seconds"].values()) / 3600]
        total += makespan(runs, jobs)
    return total


def _total_cost(all_results: dict[str, dict[str, Any]]) -> str:
    """The measured cost of what `make findings` runs and of the rest, as sentences."""

    def have(names: list[str]) -> list[str]:
        return [n for n in names if any((all_results.get(n, {}).get("lane_seconds") or {}).values())]

    def lane_hours(names: list[str]) -> float:
        return sum(sum(all_results[n]["lane_seconds"].values()) for n in names) / 3600

    core = have(core_names())
    rest = have([n for n in [*FINDINGS, *SWEEPS] if n not in core_names()])
    missing = [n for n in [*core_names(), *FINDINGS, *SWEEPS] if n not in core and n not in rest]
    return (
        f"Summed from the runs' own records, the {len(core)} experiments `make findings` runs took "
        f"{lane_hours(core):.1f} lane-hours of training and evaluation, about "
        f"{wall_hours(all_results, core):.1f} hours in two lanes; the {len(rest)} it "
        f"leaves out ({', '.join(rest) or 'none'}) took {lane_hours(rest):.1f} more, so "
        f"`make findings-all` takes about {wall_hours(all_results, core + rest):.1f} hours (the comparisons "
        "one after another, then the sweeps, each one's runs (a sweep's chains) two at a time; start-up, "
        "checkpoints and reports not counted; each lane on one thread beside the other, so an idle machine "
        "is somewhat faster: `benchmarks/bench_findings.py --jobs 2` measures it alone)"
        + (f"; not counted: {', '.join(dict.fromkeys(missing))}" if missing else "")
        + ". An experiment redesigned since it was published counts at its published cost until it is re-run."
    )


def _left_out_line(name: str) -> list[str]:
    finding = {**FINDINGS, **SWEEPS}[name]
    if finding.core:
        return []
    return [
        "- `make findings` leaves it out (a question about one objective, not a comparison across kinds "
        f"or sizes): `make findings-all` or `python -m scripts.findings run {name}` runs it "
        "(resumable)"
    ]


def plan_changed(name: str, folder: Path | None = None) -> bool:
    """Whether the plan in `folder` (default: the published report's) differs from the shipped experiment's
    now (a redesign: the budget, arms or sweep changed), so a re-run must start over rather than resume."""
    folder = folder or ROOT / name
    from objtrain.compare.runner import plan_comparison
    from objtrain.compare.sweep import parse_sweep, plan_sweep

    exp = load_experiment(find_experiment(name))
    data = PROSE_STORE if (name in FINDINGS and FINDINGS[name].corpus == "prose") else None
    try:
        if name in SWEEPS:
            spec = parse_sweep(None, exp.sweep, False)
            assert spec is not None
            plan_sweep(exp, folder, spec, None, SWEEP_SEEDS, resume=True, data=data)
        else:
            plan_comparison(exp, folder, None, SEEDS, resume=True, data=data)
    except UserError as exc:
        if str(exc).startswith("--resume: the"):
            return True
        raise
    return False


def where_to_run(name: str) -> tuple[Path, str | None]:
    """The folder a `run` trains into and the flag it passes: the published folder, resumed, unless the
    experiment was redesigned since; then its re-run (RERUNS), started over once and resumed after."""
    published, rerun = ROOT / name, RERUNS / name
    if (rerun / "plan.json").is_file():
        return rerun, "--force" if plan_changed(name, rerun) else "--resume"
    if not (published / "plan.json").is_file():
        return published, "--force" if published.exists() else None
    if plan_changed(name):
        return rerun, "--force" if rerun.exists() else None
    return published, "--resume"


def promote(name: str) -> None:
    """A finished re-run takes the published folder's place, the results it replaces beside it (for the
    report's changes), its paths (run folders, checkpoints) rewritten to the published folder's."""
    published, rerun = ROOT / name, RERUNS / name
    old = published / "results.json"
    if old.is_file():
        shutil.copyfile(old, rerun / PREVIOUS)
    for path in [rerun / "plan.json", rerun / "results.json", *sorted((rerun / "results").glob("*.json"))]:
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            path.write_text(text.replace(f"{rerun}/", f"{published}/"), encoding="utf-8")
    if published.exists():
        shutil.rmtree(published)
    shutil.move(str(rerun), str(published))
    if RERUNS.is_dir() and not any(RERUNS.iterdir()):
        RERUNS.rmdir()


def with_regime(name: str, results: dict[str, Any]) -> dict[str, Any]:
    """`results` with each claim's regime (the paper's smallest setting against ours) where an older
    results.json lacks it: the setting from the shipped experiment, our scale from the results' own costs."""
    claims = results.get("claims", [])
    if name in FINDINGS:  # a classification claim without a random-init baseline says so
        results["claims"] = claims = [
            c if "baseline" in c else baseline_gate(c, results["arms"]) for c in claims
        ]
    if all("regime" in c for c in claims):
        return results
    exp = load_experiment(find_experiment(name))
    settings = {c.claim: c.regime or exp.regime for c in exp.claims}
    for c in claims:
        if "regime" in c:
            continue
        setting = settings.get(c["claim"], exp.regime)
        if name in SWEEPS:
            read_at = c.get("read_at") or dict.fromkeys(c["arms"], c.get("at"))  # each arm's own point
            cells = [cell for arm in results["arms"] if arm["name"] in c["arms"] for cell in arm["cells"]
                     if cell["label"] == read_at.get(arm["name"])]  # fmt: skip
            params = [float(cell["parameters"]) for cell in cells]
            tokens = [sum(cell["tokens"]) / len(cell["tokens"]) for cell in cells if cell["tokens"]]
            c["regime"] = regime_gap(
                setting,
                sum(params) / len(params) if params else None,
                sum(tokens) / len(tokens) if tokens else None,
            )
        else:
            c["regime"] = claim_regime(setting, results["arms"], c["arms"])
    return results


def regime_lines(results: dict[str, Any]) -> list[str]:
    """The index's word per question: whether its verdicts are out of regime, what holds at this scale
    and what would need a larger one."""
    claims = results.get("claims", [])
    flagged = [c for c in claims if (c.get("regime") or {}).get("out_of_regime")]
    if not claims or not any(c.get("regime") for c in claims):
        return []
    resolved = [f"{c['claim']} ({c['verdict']})" for c in claims if c["verdict"] in ("agrees", "disagrees")]
    # Our direction only: no paper to agree with, but the seeds may still tell the arms apart.
    clear = [c for c in claims if c["verdict"] == "no published comparison" and _excludes_zero(c)]
    larger = [c["claim"] for c in flagged if c["verdict"] not in ("agrees", "disagrees") and c not in clear]
    out = [
        f"- Regime: {len(flagged)} of {len(claims)} verdicts **out of regime** (more than 10x from the "
        "paper's smallest setting in parameters, tokens or tokens per parameter)"
        if flagged
        else "- Regime: every verdict within 10x of the paper's smallest setting"
    ]
    if resolved:
        out.append(f"- Resolved at this scale: {'; '.join(resolved)}")
    if clear:
        told = [f"{c['claim']} ({_told_apart(c)})" for c in clear]
        out.append(f"- Clear at this scale, with no published comparison to judge it by: {'; '.join(told)}")
    if larger:
        out.append(f"- Would need a larger scale (or more seeds) to judge: {'; '.join(larger)}")
    return out


def resolved_section(all_results: dict[str, dict[str, Any]]) -> list[str]:
    """The index's lead: every verdict the seeds resolve at this scale (agrees or disagrees), across the
    comparisons and sweeps, then how many claims are not resolved or not judged, and where a re-run will
    replace what is shown."""
    rows, open_claims = [], {"not resolved": 0, "not judged": 0, "no published comparison": 0, "withdrawn": 0}
    for name in [*FINDINGS, *SWEEPS]:
        if name not in all_results:
            continue
        # a claim the shipped experiment has withdrawn since (its report says why) is not a finding
        withdrawn = {w.claim for w in load_experiment(find_experiment(name)).withdrawn}
        for c in all_results[name].get("claims", []):
            verdict = "withdrawn" if c["claim"] in withdrawn else c.get("verdict") or "not judged"
            if verdict in ("agrees", "disagrees"):
                rerun = " (being re-run)" if "rerun" in all_results[name] else ""
                rows.append(f"| {c['claim']} | `{name}`{rerun} | {verdict_cell(c)} |")
            else:
                key = verdict if verdict in open_claims else "not judged"
                open_claims[key] += 1
    if not rows:
        return []
    counts = ", ".join(f"{n} {what}" for what, n in open_claims.items() if n)
    counts = counts.replace("withdrawn", "withdrawn by a redesign")
    return [
        "## What is resolved at this scale",
        "",
        f"{len(rows)} claims are resolved by their seeds at the budgets published here"
        + (f"; the other claims are {counts} (each experiment's section says why)." if counts else "."),
        "Every one is read at a few million parameters and tokens: what holds at this scale, not whether "
        "the paper's finding does (the scale column of each section).",
        "",
        "| claim | experiment | verdict |",
        "|---|---|---|",
        *rows,
        "",
    ]


def _told_apart(claim: dict[str, Any]) -> str:
    """What the seeds tell: which arm scores better (a claim of two arms), and the paired difference."""
    p, arms = claim["paired"], claim["arms"]
    told = f"{difference(claim['metric'], arms)} = {p['delta']:+.3g} ± {p['ci95']:.2g}"
    lower = suite.direction(claim["metric"])
    if len(arms) != 2 or lower == "info":
        return told
    better = arms[0] if (p["delta"] < 0) == (lower == "lower") else arms[1]
    return f"{better} better: {told}"


def _excludes_zero(claim: dict[str, Any]) -> bool:
    """Whether a claim's paired 95% interval lies on one side of 0 (the seeds tell its arms apart)."""
    p = claim.get("paired") or {}
    delta, ci = p.get("delta"), p.get("ci95")
    return delta is not None and ci is not None and abs(delta) > ci


def _summary(results: dict[str, Any], arm: str, metric: str) -> str:
    for a in results["arms"]:
        if a["name"] == arm and metric in a["metrics"]:
            m = a["metrics"][metric]
            if m["mean"] is None:
                return "—"
            std = f" ± {m['std']:.3g}" if m["std"] is not None else ""
            return f"{m['mean']:.4g}{std}"
    return "—"


def _budget(results: dict[str, Any]) -> str:
    b = results["budget"]
    amount = f"{b['value'] / 1e6:g}M tokens" if b["kind"] == "tokens" else f"{b['value']:.3g} {b['kind']}"
    arm = results["arms"][0] if results["arms"] else None
    model = f", {arm['model_size']} models, seq-len {arm['seq_len']}" if arm else ""
    return f"{amount} an arm{model}"


def stale_probe_lines(results: dict[str, Any]) -> list[str]:
    """A warning for probe numbers measured before encoder probes stopped adding the segment embedding
    that only NSP/SOP train (`evaluation.probe.trained_with_segments`). Such results predate the probe
    baselines too, so an arm with probe metrics and no random-init baseline marks them; a re-run clears it."""
    arms = results.get("arms", [])
    probed = [a for a in arms if any(k.startswith("probe_") for k in a.get("metrics", {}))]
    # the baselines sit beside an arm's metrics in results.json (`baselines`), not among them
    stale = [
        a for a in probed if not any(k.endswith("_random_init_accuracy") for k in a.get("baselines", {}))
    ]
    if not stale or not any(a.get("model_kind") == "encoder" for a in stale):
        return []
    return [
        "- Probes: measured before encoder probes stopped feeding an untrained segment embedding (every "
        "encoder arm not trained with NSP/SOP read its text shifted by that row), and without baselines; "
        "re-measured when this experiment is re-run, whose report then lists every number that changed"
    ]


def cola_lines(results: dict[str, Any]) -> list[str]:
    """Where published results carry a CoLA probe: the reason no claim rests on it."""
    arms = [a for a in results.get("arms", []) if "probe_cola_accuracy" in a.get("metrics", {})]
    if not arms:
        return []
    acc = [a["metrics"]["probe_cola_accuracy"]["mean"] for a in arms]
    mcc = [a["metrics"].get("probe_cola_mcc", {}).get("mean", 0.0) for a in arms]
    majority = arms[0].get("baselines", {}).get("probe_cola_majority_accuracy", {}).get("mean")
    at = f" ({majority:.3f})" if majority is not None else ""
    return [
        f"- CoLA: in the report's tables and uninformative at this size: every arm scores {min(acc):.3f} to "
        f"{max(acc):.3f}, the majority class{at}, with MCC at most {max(mcc):.2f}, as BERT-Tiny and -Mini "
        "do after full pre-training (MCC 0.0, Turc et al. 2019); below about 30M parameters it cannot "
        "separate models, no claim rests on it, and `objectives` has left it out since its redesign"
    ]


def index(all_results: dict[str, dict[str, Any]]) -> str:
    """docs/findings/README.md: one row per claim, in the order of FINDINGS."""
    out = [
        "# Findings",
        "",
        "What objtrain's shipped experiments found, each claim set against the literature. Every row is a "
        "paired comparison of two arms trained with the same seeds (seed k shares initialisation and data "
        "order across arms): our mean ± sample std per arm over the seeds, the per-seed difference with "
        "its 95% t interval, and the verdict: **agrees** / **disagrees** (the interval lies on the "
        "literature's side of 0 / on the other side; for a claim of no difference, inside / outside the "
        "stated margin), **not resolved** (the seeds cannot tell at this budget), or **no published "
        "comparison** (our direction only). Models here have about 1M non-embedding parameters and see a "
        "few million tokens, three orders of magnitude below the papers: read a verdict as what holds "
        "at that scale. Each experiment's full report (every metric, costs, plots) is in its folder.",
        "",
    ]
    out += resolved_section(all_results)
    pending = [n for n in FINDINGS if n not in all_results]
    for name, finding in FINDINGS.items():
        out += [f"## {finding.question} (`{name}`)", ""]
        results = all_results.get(name)
        cmd = shlex.join(command(name))
        if results is None:
            out += ["Not run yet.", "", f"Reproduce: `{cmd}`", ""]
            continue
        m = results["machine"]
        out += [
            f"- Data: {CORPUS_TEXT[finding.corpus]}" + _probes_text(finding),
            f"- Budget: {_budget(results)}; seeds {', '.join(map(str, results['seeds']))}",
            f"- Machine: {m.get('cpu') or m['platform']}, {m['cpu_count']} CPUs, torch {m['torch']}",
            f"- Report: [{name}/report.md]({name}/report.md); reproduce: `{cmd}`",
            *rerun_lines(name, results),
            *_cost_line(results),
            *_left_out_line(name),
            *regime_lines(results),
            *stale_probe_lines(results),
            *cola_lines(results),
            *stale_finetune_lines(results),
            "",
            "| claim | the literature | objtrain (mean ± std per arm) | a − b, 95% paired interval "
            "| verdict | scale against the paper |",
            "|---|---|---|---|---|---|",
        ]
        for c in results.get("claims", []):
            metric = c["metric"]
            ours = f"{metric}: " + ", ".join(f"{arm} {_summary(results, arm, metric)}" for arm in c["arms"])
            p = c.get("paired")
            eval_se = f"; evaluation SE {c['eval_se']:.2g}" if c.get("eval_se") is not None else ""
            diff = (
                f"{p['delta']:+.3g} ± {p['ci95']:.2g} (n = {p['n']}{eval_se})"
                if p and p.get("delta") is not None and p.get("ci95") is not None
                else "—"
            )
            out.append(f"| {c['claim']} | {c['literature']} | {ours} | {diff} | {verdict_cell(c)} | "
                       f"{regime_text(c.get('regime'), source=False)} |")  # fmt: skip
        out.append("")
    if pending:
        out += [f"Still to run: {', '.join(pending)}.", ""]
    out += [
        "## Reproduce",
        "",
        "`make findings` builds the prose store from `../shared/data` and runs the comparisons across "
        f"model kinds, heads and sizes ({', '.join(core_names())}), two at a time, each on one of the 2 "
        "cores (`findings run --jobs 2`; each resumable: run it again to continue), then rewrites every "
        "report and this page from the results; `make findings-all` (`findings run --all --jobs 2`) runs "
        "the questions about one objective too. " + _total_cost(all_results) + " A redesigned "
        "experiment starts over and its report "
        "says what changed against the results here. One experiment is one command, listed under its "
        "heading.",
        "",
    ]
    return "\n".join(out + _sweeps_section(all_results))


def _sweeps_section(all_results: dict[str, dict[str, Any]]) -> list[str]:
    out = [
        "# Compute-efficiency curves",
        "",
        "Each arm trained at every budget of a sweep (shorter budgets branched from the longest run's "
        "stable phase), L(C) = E + A·C^(−α) fitted per arm and metric with bootstrap intervals, and where "
        "the curves cross. A claim is judged at every budget by the same paired test; its verdict is the "
        "one at the largest budget (in a grid of sizes each arm at its own compute-optimal size there, "
        "named beside the difference), the trend beside it. No point trains fewer than 50 optimizer "
        "steps: shorter ones are left out, and each report names them.",
        "",
    ]
    for name, finding in SWEEPS.items():
        out += [f"## {finding.question} (`{name}`)", ""]
        results = all_results.get(name)
        cmd = shlex.join(command(name))
        if results is None:
            out += ["Not run yet.", "", f"Reproduce: `{cmd}`", ""]
            continue
        m, sw = results["machine"], results["sweep"]
        kind = "tokens" if "tokens" in sw else "flops"
        points = ", ".join(f"{p:.3g}" for p in sw[kind])
        seeds = ", ".join(map(str, results["seeds"]))
        out += [
            f"- Data: {CORPUS_TEXT[finding.corpus]}" + _probes_text(finding),
            f"- Sweep: {kind} {points} an arm ({sw['span']:.0f}x)"
            + (f" x sizes {', '.join(sw['size'])} (an IsoFLOP grid)" if sw.get("size") else "")
            + f"; seeds {seeds}",
            f"- Machine: {m.get('cpu') or m['platform']}, {m['cpu_count']} CPUs, torch {m['torch']}",
            f"- Report (fits, crossovers, curves): [{name}/report.md]({name}/report.md); reproduce: `{cmd}`",
            *_cost_line(results),
            *_left_out_line(name),
            *regime_lines(results),
            "",
            "| claim | the literature | a − b at the largest budget, 95% paired interval | verdict at each "
            "budget | verdict | scale against the paper (largest budget) |",
            "|---|---|---|---|---|---|",
        ]
        for c in results.get("claims", []):
            p = c.get("paired")
            diff = (
                f"{difference(c['metric'], c['arms'])} = {p['delta']:+.3g} ± {p['ci95']:.2g} (n = {p['n']}"
                + (f"; {c['at']}" if c.get("read_at") else "")
                + ")"
                if p and p.get("delta") is not None and p.get("ci95") is not None
                else "—"
            )
            trend = "; ".join(point_verdict(pt) for pt in c["points"]) or "—"
            out.append(f"| {c['claim']} | {c['literature']} | {diff} | {trend} | {verdict_cell(c)} | "
                       f"{regime_text(c.get('regime'), source=False)} |")  # fmt: skip
        out.append("")
    return out


def report_text(name: str, results: dict[str, Any]) -> str:
    """One experiment's report.md from its results (`read_results`), with what changed against the results
    it replaced."""
    write = sweep_markdown if name in SWEEPS else markdown
    return write(results, results.get("plots", []), section(results.get("changes")))


def publish(root: Path = ROOT) -> list[Path]:
    """Rewrite each report.md from its results.json and the index from all of them."""
    written = []
    all_results = read_results(root)
    for name, results in all_results.items():
        path = root / name / "report.md"
        path.write_text(report_text(name, results), encoding="utf-8")
        written.append(path)
    (root / "README.md").write_text(index(all_results), encoding="utf-8")
    written.append(root / "README.md")
    return written


def refit(root: Path = ROOT, names: list[str] | None = None) -> list[Path]:
    """Recompute each published sweep from its own run records (results.json and curves.png rewritten
    whole): each cell's numbers from its runs' records (`results/*.json`), the fits, frontier and claims
    from the cells, without training anything; what a newer report says (the free fit, the out-of-sample
    check, points inside the warm-up or under the step floor left out, each arm read at its own best size)
    reaches the published sweeps this way."""
    written = []
    for name in names or list(SWEEPS):
        path = root / name / "results.json"
        if not path.is_file():
            continue
        results = sweep_refit(read_json(path, "sweep results"), load_experiment(find_experiment(name)),
                              records=run_records(root / name / "results"))  # fmt: skip
        plots = sweep_plot(results, root / name)
        results.pop("_fits")
        results["plots"] = plots
        write_json(path, results)
        written.append(path)
    return written


def run_tokens(name: str) -> dict[str, float]:
    """Tokens each run of one seed trains at the experiment's own budget: arm -> tokens (a sweep: arm/point
    -> tokens of its chain's share: the longest point whole, each shorter one's decay after the branch)."""
    exp = load_experiment(find_experiment(name))
    if name not in SWEEPS:
        spec = resolve_budget(exp, None)[1]
        if spec.kind == "flops":  # each arm's tokens: the budget over its own FLOPs a token
            vocab = VOCAB[FINDINGS[name].corpus]
            return {arm.name: spec.value / flops_per_token(exp, arm, vocab) for arm in exp.arms}
        return {arm.name: float(spec.tokens or 0) for arm in exp.arms}
    sweep = exp.sweep or {}
    kind = "flops" if "flops" in sweep else "tokens"
    points = sorted(float(p) for p in sweep.get(kind, []))
    decay = float(exp.train.get("schedule", {}).get("decay_ratio", ScheduleConfig.decay_ratio))
    share = {p: 1.0 if p == points[-1] else decay for p in points}  # the longest whole, the others' decay
    if kind == "tokens":
        return {f"{arm.name}/{p:g}": share[p] * p for arm in exp.arms for p in points}
    out = {}
    for arm in exp.arms:  # a FLOPs point is fewer tokens for a larger size
        for size in sweep.get("size") or [arm.model.size]:
            sized = dataclasses.replace(arm, model=dataclasses.replace(arm.model, size=size))
            per_token = flops_per_token(exp, sized, VOCAB[SWEEPS[name].corpus])
            out.update({f"{arm.name}/{size}/{p:g}": share[p] * p / per_token for p in points})
    return out


VOCAB = {"prose": 8192, "code": 4096}  # the findings' tokenizers (CORPUS_TEXT)


def flops_per_token(exp: Experiment, arm: ArmSpec, vocab: int) -> float:
    """An arm's estimated training FLOPs a token at the experiment's row length, without its data: the
    model from its size and overrides (MTP heads matched as the experiment says), an encoder-decoder's
    target length from its objective's corruption of random rows (a contrastive row's two views)."""
    cfg = arm_config(exp, arm, exp.seed, {"steps": 1})
    seq_len = cfg.batch.seq_len
    model = model_config(cfg.model.kind or "decoder", cfg.model.size, cfg.model.overrides, vocab_size=vocab)
    if cfg.objective.name == "mtp":
        model = model_config(model.kind, cfg.model.size, cfg.model.overrides | {"mtp_heads": int(
            cfg.objective.overrides.get("n", 1))}, vocab_size=vocab)  # fmt: skip
    try:
        objective = build_objective(cfg.objective.name, Specials(), None, model.kind, cfg.objective.overrides)
        width = objective.raw_length(seq_len)
        rows = torch.randint(100, vocab, (2, width), generator=torch.Generator().manual_seed(0))
        batch = objective(rows, torch.zeros_like(rows), torch.arange(2), 0)
        return batch_flops(model, batch) / (2 * seq_len)
    except UserError:  # an objective that needs a tokenizer: its rows as long as the model's
        return flops_per_step(model, 1, seq_len) / seq_len


def most_tokens_first(names: list[str]) -> list[str]:
    """The order `findings run` takes the sweeps in, one after another: the most tokens a seed first."""
    return sorted(names, key=lambda n: -sum(run_tokens(n).values()))


def lane_threads(jobs: int) -> int:
    """Torch threads for each of `jobs` experiments run at once: the cores shared out, at least one."""
    return max(1, (os.cpu_count() or 1) // jobs)


def lane_env(jobs: int) -> dict[str, str]:
    threads = str(lane_threads(jobs))
    return {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}


def run(names: list[str], jobs: int = 1, everything: bool = False) -> int:
    """Run the named experiments (default: the core ones, `everything`: all), then publish.

    `jobs` > 1 shares the cores out `jobs` ways, one thread each on 2 cores, each one's output in
    `runs/findings/logs/NAME.log`: the comparisons, then the sweeps, one after another, each training `jobs`
    of its runs at once (`compare --jobs`; a sweep's chains of one arm, size and seed, whose shorter points
    branch from the longest), so the largest one no longer holds one lane while the other idles. Tiny models
    use two threads poorly: on 2 cores two one-thread lanes train 12% more tokens a second than one
    two-thread run (3,950 tok/s each against 6,880 alone, nsp-sop's encoders, measured with
    benchmarks/bench_findings.py), and the findings were published from one-thread runs.
    """
    objtrain = str(Path(sys.executable).with_name("objtrain"))
    if everything:
        names = [*names, *(n for n in [*FINDINGS, *SWEEPS] if n not in names)]
    elif not names:
        names = core_names()
        left_out = [n for n in [*FINDINGS, *SWEEPS] if n not in names]
        print(f"leaving out {', '.join(left_out)}: `run --all` or each one's name runs them", flush=True)
    for name in names:
        if name not in FINDINGS and name not in SWEEPS:
            print(f"unknown finding {name!r} (findings: {', '.join([*FINDINGS, *SWEEPS])})")
            return 2

    def one(name: str) -> int:
        folder, flag = where_to_run(name)
        cmd = command(name, folder) + ([flag] if flag else [])
        done = (lambda: promote(name)) if folder != ROOT / name else (lambda: None)
        if jobs == 1:
            print("$ " + shlex.join(cmd), flush=True)
            code = subprocess.call([objtrain, *cmd[1:]])
            if code == 0:
                done()
            return code
        env = lane_env(jobs)
        cmd += ["--jobs", str(jobs)]  # its runs (chains) `jobs` at once, each on its share of the cores
        log = LOGS / f"{name}.log"
        print(f"$ {shlex.join(cmd)}  (output: {log})", flush=True)
        started = time.perf_counter()
        with log.open("ab") as out:
            code = subprocess.call([objtrain, *cmd[1:]], stdout=out, stderr=subprocess.STDOUT, env=env)
        if code == 0:
            done()
        took = (time.perf_counter() - started) / 3600
        print(f"{name}: " + (f"done in {took:.2f} h" if code == 0 else f"failed (exit {code}), see {log}"),
              flush=True)  # fmt: skip
        return code

    if jobs == 1:
        for name in names:
            if code := one(name):
                return code
    else:
        LOGS.mkdir(parents=True, exist_ok=True)
        order = [n for n in names if n in FINDINGS] + most_tokens_first([n for n in names if n in SWEEPS])
        codes = [one(name) for name in order]  # a failure does not stop the others
        if failed := [c for c in codes if c]:
            return failed[0]
    for path in publish():
        print(f"wrote {path}")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["publish"]:
        for path in publish():
            print(f"wrote {path}")
        return 0
    if argv[:1] == ["refit"]:
        if unknown := [n for n in argv[1:] if n not in SWEEPS]:
            print(f"unknown sweep {unknown[0]!r} (sweeps: {', '.join(SWEEPS)})")
            return 2
        for path in [*refit(names=argv[1:]), *publish()]:
            print(f"wrote {path}")
        return 0
    if argv[:1] == ["run"]:
        parser = argparse.ArgumentParser(prog="python -m scripts.findings run")
        parser.add_argument("names", nargs="*", help="experiments (default: the core ones, see --all)")
        parser.add_argument(
            "--all", action="store_true", help="every experiment, with the questions about one objective"
        )
        parser.add_argument(
            "--jobs", type=int, default=1, help="experiments at once, each on its share of the cores"
        )
        args = parser.parse_args(argv[1:])
        if args.jobs < 1:
            parser.error("--jobs must be at least 1")
        try:
            return run(args.names, args.jobs, everything=args.all)
        except KeyboardInterrupt:
            print("interrupted: finished runs and checkpoints are kept; run it again to continue", flush=True)
            return 130
    print(__doc__.strip().splitlines()[3].strip())
    return 2
