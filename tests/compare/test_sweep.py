"""`objtrain compare --sweep`: refused sweeps, branched runs equal to separate ones, a resumed sweep that
trains no step twice, and a report that fits what it can and says what it cannot."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from compare_helpers import FakeSuite, experiment
from safetensors.torch import load_file
from test_refusals import refused, run_cli

from objtrain.compare import runner
from objtrain.compare import sweep as sweep_mod
from objtrain.compare.experiment import experiment_from_dict, load_experiment
from objtrain.compare.runner import Interrupted
from objtrain.compare.sweep import parse_sweep, plan_sweep, run_sweep
from objtrain.compare.sweep_results import _frontier
from objtrain.errors import UserError
from objtrain.report.sweep import write_sweep_report
from objtrain.training import checkpoint as ckpt
from objtrain.training.loop import train

ROWS = 4 * 32  # tokens a step in the debug experiment
WSD = {"kind": "wsd", "warmup": 1, "decay_ratio": 0.25, "min_lr_ratio": 0.0}


def sweep_experiment(store: Path, arms: list[dict[str, Any]] | None = None, **train: Any) -> dict[str, Any]:
    data = experiment(
        store, arms or [{"name": "clm", "objective": "clm", "model": {"kind": "decoder", "size": "debug"}}]
    )
    data["train"]["schedule"] = dict(WSD)
    data["train"].update(train)
    return data


@pytest.fixture(autouse=True)
def _every_point_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    """The debug sweeps here train 1 to 128 steps a point to stay fast: the 50-step floor is lifted for
    them (test_sweep_steps.py tests the floor itself)."""
    monkeypatch.setattr(sweep_mod, "MIN_STEPS", 1)


def final_weights(run_dir: Path) -> dict[str, Any]:
    return load_file(str(ckpt.latest_checkpoint(run_dir) / "model.safetensors"))


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--sweep", "tokens=1e4,1e6"], "at least 3 points"),
        (["--sweep", "tokens=1e4,5e4,1e5"], "spans 10x; a sweep must span at least 30x"),
        (["--sweep", "seconds=1,10,100"], "seconds are no FLOPs count"),
        (["--sweep", "tokenz=1e4,1e5,1e6"], "did you mean 'tokens'"),
        (["--sweep", "tokens=1e4,1e5,1e6", "--sweep", "flops=1e9,1e10,1e11"], "one budget axis"),
        (["--sweep", "tokens=1e4,1e4,1e6"], "given twice"),
        (["--sweep", "tokens=1e4,-5,1e6"], "positive"),
        (["--sweep", "tokens=1e4,1e5,1e6", "--sweep", "size=debug,huge"], "unknown model size 'huge'"),
        (["--sweep", "size=debug,tiny"], "name the budget axis"),
        (["--sweep", "tokens=1e4,1e5,1e6", "--budget", "500"], "only --budget tiny"),
    ],
)
def test_a_refused_sweep_exits_2_with_one_line_and_writes_nothing(
    write_experiment, tmp_path, monkeypatch, capsys, args: list[str], fragment: str
) -> None:
    out = tmp_path / "report"
    refused(run_cli(monkeypatch, capsys, "compare", write_experiment(), "-o", out, *args), fragment)
    assert not out.exists()


def test_a_sweep_refuses_fine_tune_rates_chosen_on_the_first_seed(
    write_experiment, tmp_path, monkeypatch, capsys
) -> None:
    out = tmp_path / "report"
    path = write_experiment(eval={"finetune_rates": "first_seed"})
    args = ("--sweep", "tokens=1e4,1e5,1e6")
    refused(
        run_cli(monkeypatch, capsys, "compare", path, "-o", out, *args), "finetune_rates: first_seed is for"
    )
    assert not out.exists()


def test_the_experiment_file_carries_a_sweep_and_the_command_line_replaces_its_axis() -> None:
    spec = parse_sweep(None, {"tokens": [2e5, 6e5, 2e6, 6e6], "size": ["debug", "tiny"]}, tiny=False)
    assert spec is not None and spec.kind == "tokens" and spec.points[-1] == 6e6
    assert spec.sizes == ["debug", "tiny"]
    spec = parse_sweep(["flops=1e12,1e13,1e14"], {"tokens": [2e5, 6e5, 2e6], "size": "debug"}, tiny=False)
    assert spec is not None and spec.kind == "flops" and spec.sizes == ["debug"]
    assert parse_sweep(None, {}, tiny=False) is None
    with pytest.raises(UserError, match="30x"):
        parse_sweep(None, {"tokens": "1000,2000,3000"}, tiny=False)


def test_budget_tiny_keeps_a_flops_sweep_at_equal_flops(compare_store: Path, tmp_path: Path) -> None:
    """`--budget tiny` shrinks a sweep over FLOPs to the smoke sweep's tokens priced at the cheapest arm's
    FLOPs a token: the points stay FLOPs, so every arm at a point trains the same compute."""
    assert parse_sweep(None, {"tokens": [2e5, 2e6, 2e7]}, tiny=True).kind == "tokens"
    spec = parse_sweep(None, {"flops": [1e12, 1e13, 1e14]}, tiny=True)
    assert spec is not None and spec.kind == "flops" and spec.tiny_tokens
    arms = [
        {"name": "clm", "objective": "clm", "model": {"kind": "decoder", "size": "debug"}},
        {"name": "mlm", "objective": "mlm", "model": {"kind": "encoder", "size": "debug"}},
    ]
    exp = experiment_from_dict(sweep_experiment(compare_store, arms))
    s = plan_sweep(exp, tmp_path / "report", spec, budget="tiny")
    assert s.spec.kind == "flops" and not s.spec.tiny_tokens
    per_token = min(runner.arm_flops(exp, exp.seed, None, tmp_path / "scratch", None)[0])
    assert s.spec.points == [runner.readable_flops(t * per_token) for t in sweep_mod.TINY_POINTS]
    assert {c.label for c in s.cells} == {sweep_mod.point_label("flops", p, None) for p in s.spec.points}


def test_a_branched_point_ends_bit_identical_to_a_separate_run(compare_store: Path, tmp_path: Path) -> None:
    exp = experiment_from_dict(sweep_experiment(compare_store))
    spec = parse_sweep([f"tokens={ROWS},{8 * ROWS},{32 * ROWS}"], {}, tiny=False)
    assert spec is not None
    s = plan_sweep(exp, tmp_path / "report", spec)
    run_sweep(s, evaluator=FakeSuite(), show_progress=False)
    by_steps = {cell.run.steps: cell for cell in s.cells}
    middle = by_steps[8]
    assert middle.source is not None and middle.branch_step == 6  # decay over its last 2 steps
    assert by_steps[32].branch_step == 0 and by_steps[32].source is None
    separate = tmp_path / "separate"
    train(middle.run.cfg, separate, show_progress=False)
    branched, alone = final_weights(middle.run.run_dir), final_weights(separate)
    assert branched.keys() == alone.keys()
    for name in alone:
        assert branched[name].equal(alone[name]), name
    # The branched run reads as a whole run: its metrics start at step 1 and name the branch.
    lines = [json.loads(x) for x in (middle.run.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in lines if "loss" in r and "event" not in r]
    assert steps == list(range(1, 9))
    assert any(r.get("event") == "branch" and r["step"] == 6 for r in lines)


def test_a_resumed_sweep_whose_arms_are_gone_trains_the_missing_points_from_scratch(
    compare_store: Path, tmp_path: Path
) -> None:
    """A published sweep keeps its results files, not its arms: resumed on a fresh clone, a shorter point
    whose chain's longest run is gone trains from step 0 and ends where its branch did."""
    exp = experiment_from_dict(sweep_experiment(compare_store))
    spec = parse_sweep([f"tokens={ROWS},{8 * ROWS},{32 * ROWS}"], {}, tiny=False)
    assert spec is not None
    report = tmp_path / "report"
    s = plan_sweep(exp, report, spec)
    run_sweep(s, evaluator=FakeSuite(), show_progress=False)
    middle = next(cell for cell in s.cells if cell.run.steps == 8)
    assert middle.source is not None
    branched = final_weights(middle.run.run_dir)
    # what a clone holds: the results of the longest and shortest points, no arms
    (report / "results" / f"{middle.run.key}.json").unlink()
    shutil.rmtree(report / "arms")
    suite = FakeSuite()
    run_sweep(plan_sweep(exp, report, spec, resume=True), evaluator=suite, show_progress=False)
    assert len(suite.calls) == 1  # only the missing point
    again = final_weights(middle.run.run_dir)
    lines = (middle.run.run_dir / "metrics.jsonl").read_text().splitlines()
    assert not any(json.loads(x).get("event") == "branch" for x in lines)  # trained, not branched
    for name in branched:
        assert again[name].equal(branched[name]), name


def test_a_size_sweep_resumed_with_a_new_size_trains_only_its_chains(
    compare_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An IsoFLOP grid extended below its smallest size (its optimum sat at the edge) keeps every run done;
    dropping a size or moving a budget point still refuses to resume."""
    exp = experiment_from_dict(sweep_experiment(compare_store))
    points = f"tokens={ROWS},{4 * ROWS},{32 * ROWS}"
    report = tmp_path / "report"
    first = parse_sweep([points, "size=debug"], {}, tiny=False)
    assert first is not None and first.sizes == ["debug"]
    run_sweep(plan_sweep(exp, report, first), evaluator=FakeSuite(), show_progress=False)
    done = {p.name: p.read_bytes() for p in (report / "results").iterdir()}

    grown = parse_sweep([points, "size=pico,debug"], {}, tiny=False)
    assert grown is not None
    trained: dict[Path, int] = {}
    monkeypatch.setattr(runner, "train", _trained_steps(trained))
    suite = FakeSuite()
    s = plan_sweep(exp, report, grown, resume=True)
    run_sweep(s, evaluator=suite, show_progress=False)
    assert len(suite.calls) == 3  # the new size's three points, nothing evaluated twice
    for cell in s.cells:  # the new chain trains its longest run and branches the rest; the old one nothing
        own = cell.run.steps - cell.branch_step if cell.size == "pico" else 0
        assert trained.get(cell.run.run_dir, 0) == own, cell.run.key
    for name, content in done.items():
        assert (report / "results" / name).read_bytes() == content, name

    for other in ([points, "size=pico"], [f"tokens={ROWS},{8 * ROWS},{32 * ROWS}", "size=pico,debug"]):
        spec = parse_sweep(other, {}, tiny=False)
        assert spec is not None
        with pytest.raises(UserError, match="sweep differs"):
            plan_sweep(exp, report, spec, resume=True)


def test_a_sweep_with_jobs_trains_its_chains_at_once_as_one_process_would(
    compare_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--jobs 2` on a sweep: the chains (arm, size, seed) two at a time in processes of their own, each
    point branched from its own chain; every point ends with the weights and results of one process."""
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 2)  # one thread a worker, as below
    exp = experiment_from_dict(sweep_experiment(compare_store))
    spec = parse_sweep([f"tokens={ROWS},{4 * ROWS},{32 * ROWS}"], {}, tiny=False)
    assert spec is not None
    threads = runner.torch.get_num_threads()
    runner.torch.set_num_threads(1)
    try:
        alone = run_sweep(plan_sweep(exp, tmp_path / "alone", spec, seeds=2), evaluator=FakeSuite(),
                          show_progress=False)  # fmt: skip
    finally:
        runner.torch.set_num_threads(threads)
    s = plan_sweep(exp, tmp_path / "at-once", spec, seeds=2)
    s.comparison.jobs = 2
    run_sweep(s, evaluator=FakeSuite(), show_progress=False)
    assert sorted(s.comparison.results) == sorted(alone.comparison.results) and len(s.comparison.results) == 6
    for a, b in zip(alone.cells, s.cells, strict=True):
        assert a.run.key == b.run.key and b.branch_step == a.branch_step
        for name, tensor in final_weights(a.run.run_dir).items():
            assert final_weights(b.run.run_dir)[name].equal(tensor), (b.run.key, name)
        curve = [(p["tokens"], p["val_loss"]) for p in s.comparison.results[b.run.key]["train"]["curve"]]
        assert curve == [
            (p["tokens"], p["val_loss"]) for p in alone.comparison.results[a.run.key]["train"]["curve"]
        ]
    # resumed, nothing is trained or evaluated again
    again = plan_sweep(exp, tmp_path / "at-once", spec, seeds=2, resume=True)
    again.comparison.jobs = 2
    suite = FakeSuite()
    run_sweep(again, evaluator=suite, show_progress=False)
    assert suite.calls == []


def test_a_cosine_schedule_shares_only_its_warmup(compare_store: Path, tmp_path: Path) -> None:
    data = sweep_experiment(compare_store, schedule={"kind": "cosine", "warmup": 2})
    exp = experiment_from_dict(data)
    spec = parse_sweep([f"tokens={ROWS * 4},{8 * ROWS},{128 * ROWS}"], {}, tiny=False)
    assert spec is not None
    s = plan_sweep(exp, tmp_path / "report", spec)
    # Warmup (2 steps) and the first step of the decay, whose cosine starts at 1.0 in any horizon.
    assert sorted(c.branch_step for c in s.cells) == [0, 3, 3]


def _trained_steps(record: dict[Path, int]) -> Any:
    """A `train` that adds the steps each call trained to `record[run_dir]`."""

    def counting(cfg: Any, run_dir: Path, **kwargs: Any) -> Any:
        latest = ckpt.latest_checkpoint(run_dir) if run_dir.exists() else None
        start = json.loads((latest / ckpt.STATE).read_text())["step"] if latest is not None else 0
        result = train(cfg, run_dir, **kwargs)
        record[run_dir] = record.get(run_dir, 0) + result.step - start
        return result

    return counting


def test_a_sweep_interrupted_and_resumed_trains_no_step_twice(
    compare_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arms = [
        {"name": "clm", "objective": "clm", "model": {"kind": "decoder", "size": "debug"}},
        {"name": "mlm", "objective": "mlm", "model": {"kind": "encoder", "size": "debug"}},
    ]
    exp = experiment_from_dict(sweep_experiment(compare_store, arms))
    spec = parse_sweep([f"tokens={ROWS},{4 * ROWS},{32 * ROWS}"], {}, tiny=False)
    assert spec is not None
    report = tmp_path / "report"
    trained: dict[Path, int] = {}
    monkeypatch.setattr(runner, "train", _trained_steps(trained))  # the sweep trains through runner

    # Ctrl-C at step 20 of mlm's longest run, after clm's whole chain is done.
    real = sweep_mod.ArmsProgress.record

    def record(self: Any, rec: dict[str, Any]) -> None:
        real(self, rec)
        if self.current and self.current.startswith("mlm.") and rec.get("step") == 20 and "loss" in rec:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(sweep_mod.ArmsProgress, "record", record)
    suite = FakeSuite()
    with pytest.raises(Interrupted, match=r"interrupted during 'mlm\.tokens-4096'"):
        run_sweep(plan_sweep(exp, report, spec), evaluator=suite, show_progress=False)
    monkeypatch.setattr(sweep_mod.ArmsProgress, "record", real)
    assert len(suite.calls) == 3  # clm's three points

    with pytest.raises(UserError, match="--resume"):
        plan_sweep(exp, report, spec)
    other = parse_sweep([f"tokens={ROWS},{8 * ROWS},{32 * ROWS}"], {}, tiny=False)
    assert other is not None
    with pytest.raises(UserError, match="sweep differs"):
        plan_sweep(exp, report, other, resume=True)
    # New claims, a papers' regime or another named budget judge the runs, they do not train them.
    judged = sweep_experiment(compare_store, arms) | {
        "regime": {"source": "a paper", "parameters": 1e8},
        "budgets": {"gpu": {"tokens": 10**8}},
        "claims": [{"claim": "c", "literature": "l", "metric": "val_bpb", "arms": ["clm", "mlm"]}],
    }
    plan_sweep(experiment_from_dict(judged), report, spec, resume=True)
    s = plan_sweep(exp, report, spec, resume=True)
    run_sweep(s, evaluator=suite, show_progress=False)
    assert len(suite.calls) == 6  # nothing evaluated twice
    for cell in s.cells:
        own = cell.run.steps - cell.branch_step  # what the cell trains itself; the rest is its chain's
        assert trained.get(cell.run.run_dir, 0) == own, cell.run.key
    # A second resume finds everything done: no training, no evaluation.
    before = dict(trained)
    run_sweep(plan_sweep(exp, report, spec, resume=True), evaluator=suite, show_progress=False)
    assert trained == before and len(suite.calls) == 6


def test_the_report_fits_what_it_can_and_reports_what_it_cannot(compare_store: Path, tmp_path: Path) -> None:
    # No warm-up: every point counts (a point under 10x the warm-up steps is left out of the fits).
    exp = experiment_from_dict(sweep_experiment(compare_store, schedule=dict(WSD, warmup=0)))
    spec = parse_sweep([f"tokens={ROWS},{4 * ROWS},{16 * ROWS},{32 * ROWS}"], {}, tiny=False)
    assert spec is not None
    s = plan_sweep(exp, tmp_path / "report", spec)
    run_sweep(s, evaluator=FakeSuite(), show_progress=False)  # probe_accuracy: 0.5 at every point
    results = write_sweep_report(s, replicates=50)
    flat = results["fits"]["probe_accuracy"]["clm"]
    assert flat["status"] == "not_converged" and flat["law"] is None
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| probe_accuracy | clm | not converged:" in report
    assert (tmp_path / "report" / "curves.png").stat().st_size > 0
    saved = json.loads((tmp_path / "report" / "results.json").read_text())
    assert saved["sweep"]["tokens"] == spec.points and saved["plots"] == ["curves.png"]
    cells = saved["arms"][0]["cells"]
    assert [c["label"] for c in cells] == ["tokens-128", "tokens-512", "tokens-2048", "tokens-4096"]
    assert all(len(c["flops"]) == 1 and c["flops"][0] > 0 for c in cells)
    assert yaml.safe_load((s.cells[0].run.run_dir / "config.yaml").read_text())["seed"] == 0


def test_a_sweep_of_several_arms_reports_every_arm(compare_store: Path, tmp_path: Path) -> None:
    arms = [{"name": "clm", "objective": "clm", "model": {"kind": "decoder", "size": "debug"}},
            {"name": "mlm", "objective": "mlm", "model": {"kind": "encoder", "size": "debug"}}]  # fmt: skip
    exp = experiment_from_dict(sweep_experiment(compare_store, arms))
    spec = parse_sweep([f"tokens={ROWS},{4 * ROWS},{32 * ROWS}"], {}, tiny=False)
    assert spec is not None
    s = plan_sweep(exp, tmp_path / "report", spec)
    run_sweep(s, evaluator=FakeSuite(), show_progress=False)
    results = write_sweep_report(s, replicates=20)
    assert [a["name"] for a in results["arms"]] == ["clm", "mlm"]
    assert all(len(a["cells"]) == 3 for a in results["arms"])


def test_a_size_sweep_reports_its_frontier(compare_store: Path, tmp_path: Path) -> None:
    exp = experiment_from_dict(sweep_experiment(compare_store))
    spec = parse_sweep([f"tokens={ROWS},{4 * ROWS},{32 * ROWS}", "size=debug,tiny"], {}, tiny=False)
    assert spec is not None
    s = plan_sweep(exp, tmp_path / "report", spec)
    assert {c.run.run_dir.name for c in s.cells} >= {"debug.tokens-128", "tiny.tokens-4096"}
    run_sweep(s, evaluator=FakeSuite(), show_progress=False)
    results = write_sweep_report(s, replicates=20)
    frontier = results["frontier"]
    assert frontier and all(r["metric"] == "val_bpb" for r in frontier)
    assert all(r["tokens_per_parameter"] == pytest.approx(r["tokens"] / r["parameters"]) for r in frontier)
    assert "Chinchilla" in (tmp_path / "report" / "report.md").read_text()
    assert set(results["frontier_fits"]) == {"clm"} and results["frontier_fits"]["clm"]["metric"] == "val_bpb"


@pytest.mark.parametrize("name", ["objectives-scaling", "fim-scaling", "fim-suffix"])
def test_the_shipped_sweeps_plan_with_every_shorter_point_branched(
    name: str, compare_store: Path, tmp_path: Path
) -> None:
    exp = load_experiment(Path(name))
    spec = parse_sweep(None, exp.sweep, tiny=False)
    assert spec is not None and spec.points[-1] / spec.points[0] >= 30
    s = plan_sweep(exp, tmp_path / "report", spec, data=str(compare_store))
    assert len(s.cells) == len(exp.arms) * len(spec.points) * max(len(spec.sizes), 1)
    for cell in s.cells:
        longest = cell.source is None
        assert longest == (cell.value == spec.points[-1]), cell.run.key
        if not longest:  # branched where its own decay begins: it trains a fifth of its steps itself
            assert cell.run.steps - cell.branch_step == max(round(0.2 * cell.run.steps), 1), cell.run.key


def test_the_frontier_is_the_best_size_per_budget_or_the_points_no_cheaper_run_beats() -> None:
    def cell(size: str, budget: float, flops: float, value: float) -> dict[str, Any]:
        return {"size": size, "budget": budget, "flops": [flops], "metrics": {"val_bpb": [value, value]}}

    cells = [
        cell("debug", 1e12, 1.0e12, 3.0),
        cell("tiny", 1e12, 0.9e12, 3.2),  # cheaper, worse: not the best at its budget
        cell("debug", 1e13, 1.0e13, 2.8),
        cell("tiny", 1e13, 0.95e13, 2.5),
    ]
    best = _frontier(cells, "val_bpb", lower=True, by_budget=True)
    assert [(c["size"], c["budget"]) for c in best] == [("debug", 1e12), ("tiny", 1e13)]
    # By compute alone (a tokens sweep) the cheaper tiny point at 0.9e12 is on the envelope too.
    envelope = _frontier(cells, "val_bpb", lower=True, by_budget=False)
    assert [(c["size"], c["flops"][0]) for c in envelope] == [
        ("tiny", 0.9e12),
        ("debug", 1.0e12),
        ("tiny", 0.95e13),
    ]


def test_a_sweep_holds_its_report_and_a_second_one_into_it_is_refused(
    write_experiment, tmp_path, monkeypatch, capsys
) -> None:
    from objtrain.cli import compare as compare_cli
    from objtrain.io import OutputLock

    out = tmp_path / "report"
    held: list[str] = []

    def probe_lock(s: Any, **_: Any) -> Any:  # stands in for the training: is the report held meanwhile?
        try:
            OutputLock(out).acquire()
        except UserError as exc:
            held.append(str(exc))
        raise Interrupted("interrupted here on purpose")

    monkeypatch.setattr(compare_cli, "run_sweep", probe_lock)
    args = ("compare", write_experiment(), "-o", out, "--sweep", "tokens=1e4,1e5,1e6")
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 130, err
    assert held and "in use by another objtrain process" in held[0]
    with OutputLock(out):  # as a sweep still running in it holds it
        for extra in (["--resume"], ["--force"]):
            refused(run_cli(monkeypatch, capsys, *args, *extra), "in use by another objtrain process")
