"""Paired seed statistics, claims and their verdicts, and the published findings as a pure function of
their results (docs/findings: every committed report.md and the index regenerate byte for byte)."""

from __future__ import annotations

import json
import math
import shutil
import threading
from pathlib import Path

import pytest
from compare_helpers import FakeSuite, experiment  # noqa: F401  (experiment: the fixture's helper)

from objtrain.compare import load_experiment, plan_comparison, run_comparison
from objtrain.report.comparison import markdown, write_report
from objtrain.stats.seeds import Summary, paired, rank
from scripts.findings import findings

ROOT = Path(__file__).resolve().parents[2]


def test_paired_difference_and_its_interval() -> None:
    p = paired({0: 1.0, 1: 2.0, 2: 3.0}, {0: 0.5, 1: 1.0, 2: 2.5})  # diffs 0.5, 1.0, 0.5
    assert p.n == 3 and p.delta == pytest.approx(2 / 3)
    sd = math.sqrt(((0.5 - 2 / 3) ** 2 * 2 + (1 - 2 / 3) ** 2) / 2)
    assert p.ci95 == pytest.approx(4.303 * sd / math.sqrt(3))
    assert not p.resolved  # 0.667 ± 0.72 includes 0
    assert paired({0: 1.0, 1: 1.1, 5: 9.0}, {0: 0.0, 1: 0.1}).n == 2  # only the shared seeds pair up
    same = paired({0: 0.0, 1: 0.0}, {0: 0.0, 1: 0.0})
    assert same.delta == 0 and not same.resolved  # a difference of 0 is never resolved
    exact = paired({0: 1.0, 1: 2.0}, {0: 0.0, 1: 1.0})
    assert exact.ci95 == 0 and exact.resolved


def test_paired_ranking_resolves_what_overlapping_stds_cannot() -> None:
    # Seeds move both arms together: the stds overlap, yet b is below a on every seed.
    a = {0: 1.00, 1: 1.20, 2: 1.40}
    b = {0: 0.98, 1: 1.179, 2: 1.381}
    summaries = {"a": Summary(1.2, 0.2, 3, 0.5), "b": Summary(1.18, 0.195, 3, 0.48)}
    r = rank("bits_per_byte", summaries, lower=True, per_seed={"a": a, "b": b})
    assert r is not None and r.best == "b" and r.within_spread == []
    unpaired = rank("bits_per_byte", summaries, lower=True)
    assert unpaired is not None and unpaired.within_spread == ["a"]


def test_a_tie_has_no_best() -> None:
    s = {"a": Summary(0.0, 0.0, 3, 0.0), "b": Summary(0.0, 0.0, 3, 0.0)}
    r = rank("infill_exact_match", s, lower=False, per_seed={"a": {0: 0.0}, "b": {0: 0.0}})
    assert r is not None and r.tie


CLAIMS = [
    {"claim": "b below a", "literature": "L1", "metric": "bits_per_byte", "arms": ["mlm", "clm"],
     "expect": "lower"},
    {"claim": "b above a", "literature": "L2", "metric": "bits_per_byte", "arms": ["mlm", "clm"],
     "expect": "higher"},
    {"claim": "no difference", "literature": "L3", "metric": "probe_accuracy", "arms": ["mlm", "clm"],
     "expect": "equal", "margin": 0.05},
    {"claim": "noise", "literature": "L4", "metric": "noisy", "arms": ["mlm", "clm"], "expect": "lower"},
    {"claim": "tie", "literature": "L5", "metric": "infill_exact_match", "arms": ["mlm", "clm"],
     "expect": "higher"},
]  # fmt: skip


def test_claims_get_verdicts_in_results_and_report(write_experiment, tmp_path: Path) -> None:
    values = {}
    for seed, (d, noise) in enumerate([(0.10, 0.3), (0.12, -0.4), (0.11, 0.2)]):
        values[("clm", seed)] = {"bits_per_byte": 1.0 + seed, "probe_accuracy": 0.70, "noisy": 1.0,
                                 "infill_exact_match": 0.0}  # fmt: skip
        values[("mlm", seed)] = {"bits_per_byte": 1.0 + seed - d, "probe_accuracy": 0.70 + d / 10,
                                 "noisy": 1.0 + noise, "infill_exact_match": 0.0}  # fmt: skip
    path = write_experiment(claims=CLAIMS)
    c = plan_comparison(load_experiment(path), tmp_path / "r", seeds=3)
    run_comparison(c, evaluator=FakeSuite(values), show_progress=False)
    results = write_report(c)
    verdicts = {v["claim"]: v["verdict"] for v in results["claims"]}
    assert verdicts == {
        "b below a": "agrees",
        "b above a": "disagrees",
        "no difference": "agrees",
        "noise": "not resolved",
        "tie": "not resolved",
    }
    first = results["claims"][0]["paired"]
    assert first["n"] == 3 and first["delta"] == pytest.approx(-0.11)
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Verdicts" in md and "**disagrees**" in md
    row = next(line for line in md.splitlines() if line.startswith("| mlm |"))
    assert "**0 ± 0**" not in row  # a tie is not bold
    assert markdown(results, results["plots"]) == md  # the report is a function of results.json


def test_a_claim_naming_an_unknown_arm_is_refused(write_experiment) -> None:
    from objtrain.errors import UserError

    bad = [{"claim": "x", "literature": "y", "metric": "m", "arms": ["clm", "gpt"], "expect": "lower"}]
    with pytest.raises(UserError, match="gpt"):
        load_experiment(write_experiment(claims=bad))


def test_every_shipped_finding_is_an_experiment_with_claims() -> None:
    for name in [*findings.FINDINGS, *findings.SWEEPS]:
        exp = load_experiment(name)
        assert exp.claims, f"{name} states no claim"
        assert all(c.metric for c in exp.claims)
        cmd = findings.command(name)
        assert cmd[:3] == ["objtrain", "compare", name] and "--seeds" in cmd


def test_every_shipped_claim_knows_the_papers_smallest_setting() -> None:
    for name in [*findings.FINDINGS, *findings.SWEEPS]:
        exp = load_experiment(name)
        for claim in exp.claims:
            setting = claim.regime or exp.regime
            assert setting is not None and setting.source and setting.parameters, (name, claim.claim)


def test_the_index_flags_verdicts_out_of_regime() -> None:
    results = findings.read_results(ROOT / "docs" / "findings")
    if "objectives" not in results:
        pytest.skip("no published objectives results")
    claims = results["objectives"]["claims"]
    assert all(c["regime"]["out_of_regime"] for c in claims)  # 1M parameters against T5's 220M
    assert "**out of regime**" in findings.index(results)


def test_published_findings_regenerate_from_their_results() -> None:
    """Each committed docs/findings/NAME/report.md and the index are exactly what their results.json give."""
    root = ROOT / "docs" / "findings"
    published = findings.read_results(root)
    for name, results in published.items():
        committed = (root / name / "report.md").read_text(encoding="utf-8")
        assert findings.report_text(name, results) == committed, f"{name}/report.md has drifted"
        assert len(results["seeds"]) >= 3, f"{name} has fewer than three seeds"
        json.dumps(results)  # plain JSON
    index = findings.index(published)
    if (root / "README.md").is_file():
        assert (root / "README.md").read_text(encoding="utf-8") == index, (
            "docs/findings/README.md has drifted"
        )
    for name in [*findings.FINDINGS, *findings.SWEEPS]:
        assert (name in published) or f"`{name}`" in index


def test_named_probe_tasks_pass_as_eval_options(write_experiment, tmp_path: Path) -> None:
    from objtrain.cli.compare import parse_eval_options

    for rel in ("sst2/stsa.binary.train", "sst2/stsa.binary.dev", "sst2/stsa.binary.test"):
        (tmp_path / "probes" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "probes" / rel).write_text("1 a good film\n0 a bad film\n")
    options = parse_eval_options([f"probe_data={tmp_path / 'probes'}", "probe_tasks=sst2,cola"])
    assert options == {"probe_data": str(tmp_path / "probes"), "probe_tasks": ["sst2", "cola"]}
    exp = load_experiment(write_experiment())
    exp.eval.options = {"probe_data": str(tmp_path / "probes"), "probe_tasks": ["sst2"]}
    plan_comparison(exp, tmp_path / "ok")  # accepted: the files read
    exp.eval.options = options  # cola's files are not there: refused before anything trains
    from objtrain.errors import UserError

    with pytest.raises(UserError, match="cola"):
        plan_comparison(exp, tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_resume_accepts_new_claims(write_experiment, tmp_path: Path) -> None:
    out = tmp_path / "r"
    c = plan_comparison(load_experiment(write_experiment()), out)
    run_comparison(c, evaluator=FakeSuite(), show_progress=False)
    path = write_experiment(claims=CLAIMS[:1], question="a sharper question")
    c = plan_comparison(load_experiment(path), out, resume=True)
    suite = FakeSuite()
    run_comparison(c, evaluator=suite, show_progress=False)
    assert suite.calls == []  # nothing trained or evaluated again
    assert write_report(c)["claims"][0]["claim"] == "b below a"


def test_the_evaluation_standard_error_of_a_paired_difference() -> None:
    """Over the same units, the error of a difference comes from the per-unit differences alone: a shift
    proportional to each unit's bytes has none, however much the units differ from each other."""
    import numpy as np

    from objtrain.evaluation.middle import ratio_se
    from objtrain.stats.seeds import paired_eval_se

    nbytes = [10.0, 20.0, 30.0, 40.0, 25.0]
    a = {"nats": [5.0, 30.0, 12.0, 44.0, 20.0], "bytes": nbytes}
    shifted = {"nats": [x - 0.1 * n for x, n in zip(a["nats"], nbytes, strict=True)], "bytes": nbytes}
    assert paired_eval_se(a, shifted) == pytest.approx(0.0, abs=1e-12)
    b = {"nats": [4.0, 29.5, 10.0, 43.0, 19.7], "bytes": nbytes}
    diff = np.array(a["nats"]) - np.array(b["nats"])
    assert paired_eval_se(a, b) == pytest.approx(ratio_se(diff, np.array(nbytes))[1])
    assert paired_eval_se(a, {"nats": b["nats"], "bytes": [1.0] * 5}) is None  # other units


def test_claims_carry_the_evaluation_error_and_results_json_leaves_the_units_out(
    write_experiment, tmp_path: Path
) -> None:
    from objtrain.stats.seeds import paired_eval_se

    nbytes = [10.0, 20.0, 30.0, 40.0]
    values, units = {}, {}
    for seed in range(3):
        clm = {"nats": [5.0 + seed, 9.0, 16.0, 20.0 - seed], "bytes": nbytes}
        mlm = {"nats": [4.5 + seed, 8.1 - 0.1 * seed, 15.2, 19.0 - seed], "bytes": nbytes}
        units[seed] = (mlm, clm)
        for arm, u in (("clm", clm), ("mlm", mlm)):
            bpb = sum(u["nats"]) / (math.log(2) * sum(nbytes))
            values[(arm, seed)] = {"bits_per_byte": bpb, "units": {"bits_per_byte": u}}
    path = write_experiment(claims=CLAIMS[:1])
    c = plan_comparison(load_experiment(path), tmp_path / "r", seeds=3)
    run_comparison(c, evaluator=FakeSuite(values), show_progress=False)
    results = write_report(c)
    errors = [paired_eval_se(*units[s]) for s in range(3)]
    expected = math.sqrt(sum(e**2 for e in errors)) / 3  # type: ignore[operator]
    assert results["claims"][0]["eval_se"] == pytest.approx(expected) and expected > 0
    assert all("units" not in r["eval"] for arm in results["arms"] for r in arm["runs"])
    kept = json.loads((tmp_path / "r" / "results" / "mlm.seed-0.json").read_text())
    assert kept["eval"]["units"]["bits_per_byte"] == units[0][0]  # the per-run file keeps them
    assert "evaluation SE" in (tmp_path / "r" / "report.md").read_text()


def test_a_report_names_a_shipped_experiment_by_its_path_in_a_clone() -> None:
    from objtrain.report.tables import experiment_source

    for installed in (
        "/usr/lib/python3/site-packages/objtrain/configs/experiments/span-length.yaml",
        "/home/me/objtrain/objtrain/configs/experiments/span-length.yaml",
    ):
        shown = experiment_source({"name": "span-length", "source": installed})
        assert shown == "configs/experiments/span-length.yaml"
    mine = "/home/me/exps/objectives.yaml"  # a user's own file: as given
    assert experiment_source({"name": "x", "source": mine}) == mine
    assert experiment_source({"name": "x", "source": None}) == "x"
    for path in ROOT.glob("docs/findings/*/report.md"):  # what is published names no machine's paths
        line = next(x for x in path.read_text().splitlines() if x.startswith("- Experiment:"))
        assert line.startswith("- Experiment: `configs/experiments/"), (path, line)


def test_lanes_share_the_cores_and_keep_their_output_apart(monkeypatch, tmp_path: Path) -> None:
    """`findings run --jobs 2`: each experiment in turn trains two runs at once (`compare --jobs 2`; a
    sweep: two chains), the comparisons first, each worker on half the cores, each one's output in its own
    log; a failure is reported after the others end, and nothing is published."""
    calls: list[tuple[str, str, list[str]]] = []
    published: list[bool] = []
    running: set[str] = set()
    together: list[set[str]] = []
    lock = threading.Lock()

    def fake_call(cmd: list[str], stdout=None, stderr=None, env=None) -> int:
        stdout.write(b"trained\n")
        with lock:
            calls.append((cmd[2], env["OMP_NUM_THREADS"], cmd))
            running.add(cmd[2])
            together.append(set(running))
        with lock:
            running.discard(cmd[2])
        return 3 if cmd[2] == "nsp-sop" else 0

    monkeypatch.chdir(tmp_path)  # logs and report directories land here
    monkeypatch.setattr(findings.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(findings.subprocess, "call", fake_call)
    monkeypatch.setattr(findings, "publish", lambda: published.append(True) or [])

    names = ["span-length", "objectives-scaling", "objectives", "fim-scaling"]
    assert findings.main(["run", "--jobs", "2", *names]) == 0
    assert [name for name, _, _ in calls[:2]] == ["span-length", "objectives"]  # the comparisons first
    assert {name for name, _, _ in calls[2:]} == {"objectives-scaling", "fim-scaling"}
    assert all(len(now) == 1 for now in together)  # one experiment at a time
    assert {threads for _, threads, _ in calls} == {"2"}
    for _, _, cmd in calls:  # each shares its runs (a sweep's chains) out over the lanes
        assert cmd[-2:] == ["--jobs", "2"], cmd
    assert (tmp_path / findings.LOGS / "objectives.log").read_bytes() == b"trained\n"
    assert published == [True]

    calls.clear()
    assert findings.main(["run", "--jobs", "2", "nsp-sop", "span-length", "fim-rate"]) == 3
    assert [name for name, _, _ in calls] == ["nsp-sop", "span-length", "fim-rate"]  # on after a failure
    assert published == [True]  # not again


def test_a_plain_run_leaves_the_one_objective_questions_out_and_all_runs_them(
    monkeypatch, tmp_path: Path, capsys
) -> None:
    ran: list[str] = []

    def fake_call(cmd: list[str], stdout=None, stderr=None, env=None) -> int:
        ran.append(cmd[2])
        return 0

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(findings.subprocess, "call", fake_call)
    monkeypatch.setattr(findings, "publish", lambda: [])
    assert findings.main(["run"]) == 0
    assert sorted(ran) == sorted(findings.core_names())
    assert "leaving out mlm-mask-rate, span-length" in capsys.readouterr().out
    ran.clear()
    assert findings.main(["run", "--all", "fim-rate"]) == 0
    assert ran[0] == "fim-rate" and sorted(ran) == sorted([*findings.FINDINGS, *findings.SWEEPS])


def test_sweeps_run_the_most_tokens_first() -> None:
    # objectives at 1.6e13 FLOPs an arm: 1.2M to 2.6M tokens an arm, 8.1M in all; span-length: 3 x 1.5M;
    # mtp-heads at 2e13 FLOPs an arm: 2.0M + 1.5M + 1.0M (the extra heads make a token dearer)
    assert findings.most_tokens_first(["mtp-heads", "objectives", "span-length"]) == [
        "objectives",
        "span-length",
        "mtp-heads",
    ]


def test_lane_threads_never_fall_below_one(monkeypatch) -> None:
    monkeypatch.setattr(findings.os, "cpu_count", lambda: 2)
    assert [findings.lane_threads(j) for j in (1, 2, 3)] == [2, 1, 1]
    with pytest.raises(SystemExit):
        findings.main(["run", "--jobs", "0"])


def test_an_interrupt_stops_the_lanes_without_a_traceback(monkeypatch, tmp_path: Path, capsys) -> None:
    def interrupted(cmd: list[str], stdout=None, stderr=None, env=None) -> int:
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(findings.subprocess, "call", interrupted)
    monkeypatch.setattr(findings, "publish", lambda: pytest.fail("published after an interrupt"))
    assert findings.main(["run", "--jobs", "2", "span-length", "nsp-sop"]) == 130
    assert "run it again to continue" in capsys.readouterr().out


GPU = [n for n in [*findings.FINDINGS, "fim-vs-clm"] if "gpu" in load_experiment(n).budgets]


@pytest.mark.parametrize("name", GPU)
def test_the_gpu_budget_asks_the_same_question_at_10_to_100m_parameters(
    name: str, compare_store, tmp_path
) -> None:
    """A dry run on CPU: every arm of the `gpu` budget plans (the loop's own checks) at size small."""
    from objtrain.compare import plan_comparison
    from objtrain.models.zoo import build_model, count_parameters

    exp = load_experiment(name)
    c = plan_comparison(exp, tmp_path / "r", budget="gpu", data=str(compare_store))
    assert not (tmp_path / "r").exists()  # planned, nothing written
    for run in c.runs:
        assert run.cfg.model.size == exp.budgets["gpu"].size and run.cfg.precision.dtype == "bf16"
        assert 1e7 <= count_parameters(build_model(run.plan.model_cfg)) <= 1e8, run.key
    if name == "objectives":  # every arm at one seed in 10 minutes of one H100 at 40% of 989 bf16 TFLOP/s
        assert len(exp.arms) * exp.budgets["gpu"].flops <= 0.4 * 989e12 * 600


SWEEP_GPU = [n for n in findings.SWEEPS if "gpu" in load_experiment(n).budgets]


@pytest.mark.parametrize("name", SWEEP_GPU)
def test_a_sweeps_gpu_budget_is_a_grid_of_its_own_at_10_to_100m_parameters(
    name: str, compare_store, tmp_path
) -> None:
    """A dry run on CPU: the sweep's `gpu` budget replaces its grid (sizes inside 10-100M non-embedding
    parameters, or one such size) and lays its run settings over every point; every cell plans."""
    from objtrain.compare.sweep import plan_sweep, sweep_from_experiment
    from objtrain.models.zoo import build_model, count_parameters

    exp = load_experiment(name)
    spec = sweep_from_experiment(exp, None, "gpu")
    assert spec is not None and spec.points != sweep_from_experiment(exp, None, None).points  # type: ignore[union-attr]
    s = plan_sweep(exp, tmp_path / "r", spec, budget="gpu", data=str(compare_store))
    assert not (tmp_path / "r").exists() and s.comparison.budget_name == "gpu"
    sizes = set()
    for cell in s.cells:
        assert cell.run.cfg.precision.dtype == "bf16" and cell.run.cfg.batch.seq_len == 256
        sizes.add(cell.size)
    for size in sizes:  # one model of each size and kind
        cell = next(c for c in s.cells if c.size == size)
        assert 1e7 <= count_parameters(build_model(cell.run.plan.model_cfg), embeddings=False) <= 1e8, size
    assert len(sizes) == max(len(spec.sizes), 1)


def test_every_question_where_kinds_or_heads_differ_holds_flops_equal(compare_store, tmp_path) -> None:
    from objtrain.compare import plan_comparison
    from objtrain.models.zoo import build_model, count_parameters

    for name in findings.FINDINGS:
        exp = load_experiment(name)
        kinds = {(a.model.kind, a.objective.overrides.get("n", 1)) for a in exp.arms}
        assert len(kinds) == 1 or exp.budget.kind == "flops", name
    # MTP arms parameter-matched (Gloeckle et al.): within 5%, here exactly equal.
    c = plan_comparison(load_experiment("mtp-heads"), tmp_path / "r", data=str(compare_store))
    params = {r.arm.name: count_parameters(build_model(r.plan.model_cfg)) for r in c.runs}
    assert max(params.values()) <= 1.05 * min(params.values()), params
    assert [r.plan.model_cfg.n_layer for r in c.runs] == [4, 3, 1]
    tokens = findings.run_tokens("mtp-heads")
    assert tokens["mtp-1"] > tokens["mtp-2"] > tokens["mtp-4"]  # equal FLOPs: dearer tokens, fewer of them


def test_a_republication_says_what_changed_against_the_results_it_replaces(
    monkeypatch, tmp_path: Path
) -> None:
    """A redesigned experiment (its plan no longer resumes) is re-run beside the published folder (RERUNS,
    committed run by run), resumed there, and when done takes the folder's place, the published results.json
    beside the new one as previous-results.json and its paths rewritten; the report then lists the budget,
    verdicts and metrics that changed."""
    from scripts.findings.changes import diff, section

    monkeypatch.chdir(tmp_path)
    folder = findings.ROOT / "mtp-heads"
    rerun = findings.RERUNS / "mtp-heads"
    folder.mkdir(parents=True)

    def results(kind: str, value: float, verdict: str, delta: float, bpb: float) -> dict:
        claim = {"claim": "c", "metric": "bits_per_byte", "verdict": verdict, "paired": {"delta": delta}}
        metrics = {"bits_per_byte": {"mean": bpb}, "val_bpb": {"mean": 1.9}}
        return {"budget": {"name": "default", "kind": kind, "value": value}, "machine": {"commit": "abc"},
                "claims": [claim], "arms": [{"name": "mtp-1", "metrics": metrics}]}  # fmt: skip

    old = results("tokens", 2e6, "agrees", 0.1, 1.8)
    (folder / "results.json").write_text(json.dumps(old))
    (folder / "plan.json").write_text("{}")
    calls: list[list[str]] = []

    def fake_call(cmd: list[str], **_: object) -> int:
        calls.append(cmd)
        assert cmd[cmd.index("-o") + 1] == str(rerun)  # beside the published folder, which stays
        assert json.loads((folder / "results.json").read_text()) == old
        (rerun / "results").mkdir(parents=True, exist_ok=True)
        (rerun / "plan.json").write_text("{}")
        record = {"run_dir": f"{rerun}/arms/mtp-1/seed-0"}
        (rerun / "results" / "mtp-1.seed-0.json").write_text(json.dumps(record))
        if len(calls) == 1:
            return 130  # stopped part-way: the re-run stays where it is
        (rerun / "results.json").write_text(json.dumps(new))
        return 0

    new = results("flops", 2e13, "not resolved", 0.02, 1.75)
    monkeypatch.setattr(findings, "plan_changed", lambda name, folder=None: folder is None)
    monkeypatch.setattr(findings.subprocess, "call", fake_call)
    monkeypatch.setattr(findings, "publish", lambda: [])
    assert findings.main(["run", "mtp-heads"]) == 130
    assert "--force" not in calls[0] and "--resume" not in calls[0]
    assert json.loads((folder / "results.json").read_text()) == old and rerun.is_dir()
    assert findings.main(["run", "mtp-heads"]) == 0
    assert calls[1][-1] == "--resume" and calls[1][calls[1].index("-o") + 1] == str(rerun)
    assert not rerun.exists() and not findings.RERUNS.exists()
    assert json.loads((folder / "results.json").read_text()) == new
    assert json.loads((folder / "previous-results.json").read_text()) == old
    record = json.loads((folder / "results" / "mtp-1.seed-0.json").read_text())
    assert record["run_dir"] == f"{folder}/arms/mtp-1/seed-0"
    changes = diff(old, new)
    assert changes["budget"] == ["2e+06 tokens an arm", "2e+13 flops an arm"]
    assert changes["claims"][0]["verdict"] == ["agrees", "not resolved"]
    assert changes["metrics"] == [{"arm": "mtp-1", "metric": "bits_per_byte", "before": 1.8, "now": 1.75}]
    text = "\n".join(section(changes))
    assert "## Changed since the previous publication" in text and "(objtrain abc)" in text
    assert "| c | changed | agrees → not resolved | 0.1 → 0.02 |" in text
    assert "| bits_per_byte | mtp-1 | 1.8 | 1.75 |" in text and "val_bpb" not in text


def test_no_shipped_experiment_calls_equal_tokens_equal_compute() -> None:
    """'compute' in a question, expectation or claim only where FLOPs are what the arms share: a FLOPs
    budget or sweep, or arms of one model kind and head count (whose FLOPs per token agree)."""
    from objtrain.report.sweep import held_at_points

    for name in [*findings.FINDINGS, *findings.SWEEPS, "fim-vs-clm"]:
        exp = load_experiment(name)
        words = " ".join([exp.question, *(c.claim for c in exp.claims)]).lower()
        same = len({(a.model.kind, a.model.size, a.objective.overrides.get("n", 1)) for a in exp.arms}) == 1
        flops = exp.budget.kind == "flops" if not exp.sweep else "flops" in exp.sweep
        assert "compute" not in words or flops or same, name
    arms = [{"cells": [{"label": "tokens-1e6", "flops": [f]}]} for f in (2e12, 1e12)]
    text = held_at_points({"sweep": {"tokens": [1.0]}, "arms": arms})
    assert text.endswith(
        "differ up to 2.00x at one point: the claims at each point compare equal tokens, not equal compute"
    )


def test_the_shipped_nsp_sop_experiment_judges_sentence_order_for_every_arm(
    compare_store: Path, tmp_path: Path
) -> None:
    """ALBERT's asymmetry is a claim of the shipped experiment: by the heads (the arms that train one) and
    by the probe (every arm, so MLM alone is comparable), each on a metric the suite scores higher-better."""
    from objtrain.compare import suite
    from objtrain.evaluation.suite import METRICS

    exp = load_experiment("nsp-sop")
    order = {tuple(c.arms): c for c in exp.claims if c.metric == "sentence_order_accuracy"}
    assert set(order) == {("mlm-sop", "mlm-nsp")} and order["mlm-sop", "mlm-nsp"].expect == "higher"
    probed = [c for c in exp.claims if c.metric == "probe_sentence_order_accuracy"]
    assert {a for c in probed for a in c.arms} == {a.name for a in exp.arms}
    assert any(c.arms == ["mlm-sop", "mlm-nsp"] and c.expect == "higher" for c in probed)
    for c in [*order.values(), *probed]:
        assert c.metric in METRICS and suite.direction(c.metric) == "higher", c.metric
        assert c.regime is not None and "ALBERT Table 5" in c.regime.source
        assert "86.5" in c.literature or "53.3" in c.literature  # the reference's figures, cited
    # Every check compare makes before training (the eval options included) passes at both budgets.
    for budget in (None, "tiny"):
        c = plan_comparison(exp, tmp_path / str(budget), budget=budget, data=str(compare_store))
        assert [r.arm.name for r in c.runs] == ["mlm", "mlm-nsp", "mlm-sop"]
    assert c.eval_options["sentence_order_pairs"] == 32 and c.eval_options["probe_seeds"] == 2


def test_a_claim_on_a_metric_only_some_arms_have_names_the_arms_that_have_it(
    write_experiment, tmp_path: Path
) -> None:
    """sentence_order_accuracy comes from a trained pair head: the MLM arm has none, and a claim naming it
    is "not measured", saying which arms do have the metric."""
    encoder = {"kind": "encoder", "size": "debug"}
    arms = [{"name": "mlm", "objective": "mlm", "model": encoder},
            {"name": "mlm-sop", "objective": "sop", "model": encoder}]  # fmt: skip
    claims = [
        {
            "claim": "SOP orders, MLM cannot",
            "literature": "ALBERT Table 5",
            "metric": "sentence_order_accuracy",
            "arms": ["mlm-sop", "mlm"],
            "expect": "higher",
        }
    ]
    values = {
        ("mlm", 0): {"probe_sentence_order_accuracy": 0.52},
        ("mlm-sop", 0): {"sentence_order_accuracy": 0.71, "probe_sentence_order_accuracy": 0.66},
    }
    c = plan_comparison(load_experiment(write_experiment(arms, claims=claims)), tmp_path / "r")
    run_comparison(c, evaluator=FakeSuite(values), show_progress=False)
    results = write_report(c)
    (claim,) = results["claims"]
    assert claim["verdict"] == "not measured" and claim["measured_by"] == ["mlm-sop"]
    said = "sentence_order_accuracy is measured for mlm-sop only, not for mlm"
    md = (tmp_path / "r" / "report.md").read_text()
    assert f"**not measured** ({said})" in md
    assert markdown(results, results["plots"]) == md
    from objtrain.report.comparison import verdict

    assert f"claim: SOP orders, MLM cannot: not measured ({said})" in verdict(results)  # the terminal's


def test_the_index_marks_encoder_probes_measured_before_the_segment_fix() -> None:
    """Probe numbers of an encoder arm without a random-init baseline predate the fix that stopped probes
    adding the untrained segment row: the index says so until a re-run brings baselines."""

    def results(kind: str, metrics: dict[str, float], baselines: dict | None = None) -> dict[str, object]:
        return {"arms": [{"name": "a", "model_kind": kind, "metrics": metrics, "baselines": baselines or {}}]}

    old = {"probe_sst2_accuracy": 0.64}
    baselines = {"probe_sst2_random_init_accuracy": {"mean": 0.61}, "probe_sst2_bow_accuracy": {"mean": 0.7}}
    assert "untrained segment embedding" in " ".join(findings.stale_probe_lines(results("encoder", old)))
    assert findings.stale_probe_lines(results("encoder", old, baselines)) == []
    assert findings.stale_probe_lines(results("decoder", old)) == []  # no segment row to add
    assert findings.stale_probe_lines(results("encoder", {"bits_per_byte": 2.0})) == []  # nothing probed
    published = findings.read_results(ROOT / "docs" / "findings").get("objectives")
    if published is not None and any(a.get("baselines") for a in published["arms"]):  # re-run since the fix
        assert findings.stale_probe_lines(published) == []


def test_the_index_sums_what_the_published_runs_took(tmp_path: Path) -> None:
    runs = tmp_path / "results"
    runs.mkdir()
    for i, (train, ev) in enumerate([(3600.0, 1800.0), (1800.0, None)]):
        record = {"train": {"seconds": train}, **({"eval_seconds": ev} if ev is not None else {})}
        (runs / f"a.seed-{i}.json").write_text(json.dumps(record), encoding="utf-8")
    cost = findings.lane_seconds(findings.run_records(runs))
    assert cost == {"train": 5400.0, "eval": 1800.0}
    assert findings._cost_line({"lane_seconds": cost}) == [
        "- Cost: 2.0 lane-hours measured (training 1.5, evaluation 0.5), each run on one thread beside "
        "another lane"
    ]
    assert (
        findings._cost_line({"lane_seconds": findings.lane_seconds(findings.run_records(tmp_path / "none"))})
        == []
    )
    assert findings.run_seconds(findings.run_records(runs)) == [5400.0, 1800.0]
    # a sweep's points of one arm, size and seed are one chain, one lane's job
    point = {"arm": "clm", "seed": 0, "eval_seconds": 10.0}
    chains = [{**point, "train": {"seconds": t, "model_size": size}} for t, size in
              [(100.0, "nano"), (40.0, "nano"), (300.0, "tiny")]]  # fmt: skip
    chains.append({**point, "seed": 1, "train": {"seconds": 5.0}})
    assert findings.run_seconds(chains) == [310.0, 160.0, 15.0]
    hour = {"train": 3600.0, "eval": 0.0}
    total = findings._total_cost(
        {
            "objectives": {"lane_seconds": cost, "run_seconds": [5400.0, 1800.0]},
            "mtp-heads": {"lane_seconds": hour, "run_seconds": [1800.0, 1800.0]},
            "fim-scaling": {"lane_seconds": hour},
            "fim-suffix": {"lane_seconds": hour},
        }
    )
    # objectives' runs in two lanes end after 1.5 h, then mtp-heads' after 0.5 h, then fim-scaling (no
    # runs' times: one job) 1 h; all: fim-suffix's hour after it
    assert "the 3 experiments `make findings` runs took 4.0 lane-hours" in total
    assert "about 3.0 hours in two lanes; the 1 it leaves out (fim-suffix) took 1.0 more" in total
    assert "`make findings-all` takes about 4.0 hours" in total
    assert "not counted: objectives-scaling, mlm-mask-rate" in total


def test_make_findings_runs_the_comparisons_across_kinds_and_sizes_and_all_adds_the_knobs() -> None:
    core = findings.core_names()
    assert {"objectives", "mtp-heads", "objectives-scaling", "fim-scaling"} == set(core)
    assert findings.FINDINGS["objectives"].core and not findings.SWEEPS["fim-suffix"].core
    assert findings._left_out_line("objectives") == []
    assert "`python -m scripts.findings run nsp-sop`" in findings._left_out_line("nsp-sop")[0]
    assert findings.makespan([3.0, 2.0, 2.0, 1.0], 2) == 4.0  # 3+1 and 2+2
    assert findings.makespan([3.0, 2.0], 1) == 5.0


def test_the_index_says_what_holds_at_this_scale_and_what_needs_a_larger_one() -> None:
    flag = {"out_of_regime": True}

    def claim(name: str, verdict: str, delta: float, ci: float, metric: str = "bits_per_byte") -> dict:
        paired = {"delta": delta, "ci95": ci}
        return {"claim": name, "verdict": verdict, "paired": paired, "regime": flag, "arms": ["x", "y"],
                "metric": metric}  # fmt: skip

    lines = findings.regime_lines(
        {
            "claims": [
                claim("a", "agrees", -0.2, 0.1),
                claim("b", "no published comparison", 0.09, 0.003),  # the seeds tell the arms apart
                claim("e", "no published comparison", 0.09, 0.003, "probe_sst2_accuracy"),
                claim("c", "no published comparison", 0.01, 0.05),
                claim("d", "not resolved", 0.01, 0.05),
            ]
        }
    )
    assert lines[0].startswith("- Regime: 5 of 5 verdicts **out of regime**")
    assert lines[1] == "- Resolved at this scale: a (agrees)"
    assert lines[2] == (
        "- Clear at this scale, with no published comparison to judge it by: b (y better: bits_per_byte: "
        "x − y = +0.09 ± 0.003); e (x better: probe_sst2_accuracy: x − y = +0.09 ± 0.003)"
    )
    assert lines[3] == "- Would need a larger scale (or more seeds) to judge: c; d"


def test_runs_fine_tuned_at_one_rate_are_marked_until_re_evaluated(tmp_path: Path) -> None:
    runs = tmp_path / "results"
    runs.mkdir()
    old = {"finetune_sst2_accuracy": 0.7}
    new = {**old, "finetune_sst2_lr": 1e-3, "finetune_sst2_lrs_tried": 3.0}
    for i, scores in enumerate([old, new, {"bits_per_byte": 2.0}]):
        (runs / f"a.seed-{i}.json").write_text(json.dumps({"eval": scores}), encoding="utf-8")
    assert findings.one_rate_finetunes(findings.run_records(runs)) == 1
    assert "1 runs fine-tuned at one peak rate" in findings.stale_finetune_lines({"one_rate_finetunes": 1})[0]
    assert findings.stale_finetune_lines({"one_rate_finetunes": 0}) == []


def test_the_index_names_the_probe_tasks_and_pairs_a_finding_is_given() -> None:
    plain = findings.Finding("q", "prose")
    assert findings._probes_text(plain) == "; probes SST-2, TREC, CoLA"
    own = findings.Finding("q", "prose", probe_tasks="sst2,trec", blimp=True)
    assert findings._probes_text(own).startswith("; probes SST-2, TREC; BLiMP, the first 50 pairs")
    assert findings._probes_text(findings.Finding("q", "code", probes=False)) == ""


def test_a_rerun_in_progress_is_shown_beside_the_results_it_will_replace(tmp_path: Path) -> None:
    """The index keeps a redesigned experiment's published rows while its re-run (plan.json and some
    results/*.json, no results.json yet) says how far it has got; its report stays as published."""
    published = findings.read_results(ROOT / "docs" / "findings")
    name = next((n for n in findings.FINDINGS if n in published and "rerun" not in published[n]), None)
    if name is None:
        pytest.skip("no published comparison")
    root = tmp_path / "findings"
    shutil.copytree(ROOT / "docs" / "findings" / name, root / name, ignore=shutil.ignore_patterns("arms"))
    rerun = root / "rerun" / name
    (rerun / "results").mkdir(parents=True)
    plan = {"experiment": {"arms": [{"name": "a"}, {"name": "b"}]}, "seeds": [0, 1, 2]}
    (rerun / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    (rerun / "results" / "a.seed-0.json").write_text("{}", encoding="utf-8")
    results = findings.read_results(root)
    assert results[name]["rerun"] == {"done": 1, "runs": 6}
    assert "rerun" not in published[name] and results[name]["claims"] == published[name]["claims"]
    assert "**Re-run in progress** (`docs/findings/rerun/" in findings.index(results)
    assert "1 of 6 runs of the redesigned experiment finished" in findings.index(results)
    committed = (ROOT / "docs" / "findings" / name / "report.md").read_text(encoding="utf-8")
    assert findings.report_text(name, results[name]) == committed


def test_the_index_leads_with_what_is_resolved() -> None:
    """Before any experiment's section: every claim the seeds resolve (agrees or disagrees), and how many
    are not; a claim the shipped experiment has withdrawn is not listed as resolved."""
    results = {
        "mtp-heads": {
            "claims": [
                {"claim": "resolved one", "verdict": "agrees"},
                {"claim": "open one", "verdict": "not resolved"},
                {"claim": "unjudged", "verdict": "not judged"},
            ]
        },
        "objectives": {
            "claims": [
                {"claim": findings.load_experiment(findings.find_experiment("objectives")).withdrawn[0].claim,
                 "verdict": "agrees"},
                {"claim": "against the paper", "verdict": "disagrees"},
            ],
            "rerun": {"done": 1, "runs": 18},
        },
    }  # fmt: skip
    lead = findings.resolved_section(results)
    assert lead[0] == "## What is resolved at this scale"
    text = "\n".join(lead)
    assert "| resolved one | `mtp-heads` | **agrees** |" in text
    assert "| against the paper | `objectives` (being re-run) | **disagrees** |" in text
    assert "2 claims are resolved" in text and "1 not resolved, 1 not judged, 1 withdrawn" in text
    assert "open one" not in text and "unjudged" not in text
    assert findings.resolved_section({}) == []


def test_a_cola_probe_is_named_uninformative_with_its_own_numbers() -> None:
    def arm(acc: float, mcc: float) -> dict:
        return {"metrics": {"probe_cola_accuracy": {"mean": acc}, "probe_cola_mcc": {"mean": mcc}},
                "baselines": {"probe_cola_majority_accuracy": {"mean": 0.693}}}  # fmt: skip

    line = findings.cola_lines({"arms": [arm(0.69, 0.01), arm(0.692, -0.02)]})
    assert len(line) == 1 and "0.690 to 0.692, the majority class (0.693), with MCC at most 0.01" in line[0]
    assert findings.cola_lines({"arms": [{"metrics": {"probe_sst2_accuracy": {"mean": 0.6}}}]}) == []
