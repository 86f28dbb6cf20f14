"""`objtrain compare` end to end on debug-size arms: the report's contents, seeds, and resume."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from compare_helpers import FakeSuite, experiment

from objtrain.compare import load_experiment, plan_comparison, run_comparison, runner
from objtrain.compare.runner import Interrupted
from objtrain.errors import UserError
from objtrain.report.comparison import write_report
from objtrain.training import checkpoint as ckpt

PNG = b"\x89PNG\r\n\x1a\n"


def compare(path: Path, out: Path, evaluator: FakeSuite, **kwargs: Any) -> dict[str, Any]:
    c = plan_comparison(load_experiment(path), out, **kwargs)
    run_comparison(c, evaluator=evaluator, show_progress=False)
    return write_report(c)


def test_report_has_a_row_per_arm_results_json_and_png_plots(write_experiment, tmp_path: Path) -> None:
    suite = FakeSuite({("clm", 0): {"probe_accuracy": 0.4, "bits_per_byte": 3.0},
                       ("mlm", 0): {"probe_accuracy": 0.7}})  # fmt: skip
    out = tmp_path / "report"
    compare(write_experiment(), out, suite)
    md = (out / "report.md").read_text()
    # A metrics row and a cost row per arm; the best probe is bold; a missing metric is a dash.
    rows: dict[str, str] = {}
    for line in md.splitlines():
        if line.startswith("| "):
            rows.setdefault(line.split(" | ")[0][2:], line)  # the metrics table comes first
    assert rows["clm"].startswith("| clm | 3 | ") and " | 0.4 | " in rows["clm"], md
    assert rows["mlm"].startswith("| mlm | — | — | **0.7** | "), md
    assert sum(line.startswith("| clm | clm | decoder debug |") for line in md.splitlines()) == 2  # cost, run
    assert sum(line.startswith("| mlm | mlm | encoder debug |") for line in md.splitlines()) == 2
    assert "3 steps" not in md and "384 tokens" in md  # the budget is said
    results = json.loads((out / "results.json").read_text())
    for key in ("experiment", "budget", "seeds", "evaluation", "machine", "wall_seconds", "arms", "rankings"):
        assert key in results
    assert [a["name"] for a in results["arms"]] == ["clm", "mlm"]
    for arm in results["arms"]:
        assert set(arm["cost"]) == {
            "parameters",
            "tokens",
            "flops",
            "seconds",
            "tokens_per_s",
            "mfu",
            "peak_memory_bytes",
        }
        assert arm["cost"]["tokens"]["mean"] == 384 and arm["cost"]["flops"]["mean"] > 0
        assert arm["runs"][0]["train"]["steps"] == 3
    assert results["rankings"]["probe_accuracy"]["best"] == "mlm"
    assert "val_loss" not in results["rankings"]  # different objectives: their own losses are not ranked
    assert results["arms"][0]["metrics"]["val_bpb"]["n"] == 1  # the decoder's validation bits per byte
    assert len(results["arms"][0]["runs"][0]["train"]["curve"]) == 3  # validation every step
    assert results["plots"]
    for name in results["plots"]:
        assert (out / name).read_bytes()[:8] == PNG
    assert {"val_loss_vs_tokens.png", "val_loss_vs_seconds.png", "metrics.png"} <= set(results["plots"])
    # Every arm is a normal training run.
    for arm in ("clm", "mlm"):
        assert ckpt.latest_checkpoint(out / "arms" / arm) is not None
        assert (out / "arms" / arm / "metrics.jsonl").is_file()


def test_seeds_report_mean_std_and_mark_gaps_inside_the_spread(write_experiment, tmp_path: Path) -> None:
    # conditional_bpb, which every kind is scored on alike (a left-to-right score ranks decoders only)
    suite = FakeSuite(
        {
            ("clm", 0): {"probe_accuracy": 0.80, "conditional_bpb": 1.00},
            ("clm", 1): {"probe_accuracy": 0.90, "conditional_bpb": 1.01},
            ("mlm", 0): {"probe_accuracy": 0.86, "conditional_bpb": 2.00},
            ("mlm", 1): {"probe_accuracy": 0.88, "conditional_bpb": 2.01},
        }
    )
    out = tmp_path / "report"
    results = compare(write_experiment(), out, suite, seeds=2)
    assert results["seeds"] == [0, 1]
    assert (out / "arms" / "clm" / "seed-1" / "metrics.jsonl").is_file()
    clm = results["arms"][0]
    assert clm["metrics"]["probe_accuracy"]["mean"] == pytest.approx(0.85)
    assert clm["metrics"]["probe_accuracy"]["std"] == pytest.approx(0.0707107, rel=1e-5)
    assert results["rankings"]["probe_accuracy"] | {"gaps": None} == {
        "lower_is_better": False, "best": "mlm", "tie": False, "within_seed_spread": ["clm"], "gaps": None,
    }  # fmt: skip
    assert results["rankings"]["conditional_bpb"]["within_seed_spread"] == []
    md = (out / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| clm | **"))
    assert "**1.005 ± 0.0071**" in row and "0.85 ± 0.071 ≈" in row  # best bold; unresolved gap marked
    assert "mean ± sample std over 2 seeds" in md
    assert len(clm["runs"]) == 2 and clm["cost"]["seconds"]["n"] == 2


def test_an_interrupted_comparison_resumes_without_retraining_finished_arms(
    write_experiment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_experiment(train={**_train(), "checkpoint": {"every": 1}})
    out = tmp_path / "report"
    calls: list[tuple[str, bool]] = []
    real_train = runner.train

    def counting_train(cfg: Any, run_dir: Path, resume: bool = False, **kwargs: Any) -> Any:
        calls.append((run_dir.name, resume))
        hook = kwargs.get("on_record")
        if run_dir.name == "mlm" and not resume:

            def stop_at_two(record: dict[str, Any]) -> None:  # Ctrl-C in the middle of the second arm
                if record.get("step") == 2 and "loss" in record:
                    os.kill(os.getpid(), signal.SIGINT)
                if hook:
                    hook(record)

            kwargs["on_record"] = stop_at_two
        return real_train(cfg, run_dir, resume=resume, **kwargs)

    monkeypatch.setattr(runner, "train", counting_train)
    suite = FakeSuite()
    exp = load_experiment(path)
    with pytest.raises(Interrupted, match="continue with --resume"):
        run_comparison(plan_comparison(exp, out), evaluator=suite, show_progress=False)
    assert calls == [("clm", False), ("mlm", False)]
    assert (out / "results" / "clm.json").is_file() and not (out / "results" / "mlm.json").exists()
    clm_ckpt = ckpt.latest_checkpoint(out / "arms" / "clm")
    assert clm_ckpt is not None
    mtime = (clm_ckpt / "model.safetensors").stat().st_mtime_ns
    half = ckpt.latest_checkpoint(out / "arms" / "mlm")
    assert half is not None and json.loads((half / "state.json").read_text())["step"] == 2

    # Without --resume the existing report is refused; with it, only the half-trained arm trains on.
    with pytest.raises(Exception, match="--resume"):
        plan_comparison(exp, out)
    calls.clear()
    c = plan_comparison(exp, out, resume=True)
    run_comparison(c, evaluator=suite, show_progress=False)
    assert calls == [("mlm", True)]
    assert (clm_ckpt / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in suite.calls] == ["clm", "mlm"]  # clm was evaluated once, before the stop
    final = ckpt.latest_checkpoint(out / "arms" / "mlm")
    assert final is not None and json.loads((final / "state.json").read_text())["step"] == 3

    # A trained arm whose result was lost (killed between the checkpoint and the result) is evaluated
    # again, never retrained.
    (out / "results" / "clm.json").unlink()
    calls.clear()
    run_comparison(plan_comparison(exp, out, resume=True), evaluator=suite, show_progress=False)
    assert calls == [] and (out / "results" / "clm.json").is_file()
    assert (clm_ckpt / "model.safetensors").stat().st_mtime_ns == mtime
    write_report(c)
    assert (out / "report.md").is_file()


def test_resume_refuses_a_changed_plan(write_experiment, tmp_path: Path) -> None:
    out = tmp_path / "report"
    compare(write_experiment(), out, FakeSuite())
    with pytest.raises(Exception, match="--resume: the budget differs"):
        plan_comparison(load_experiment(write_experiment()), out, budget="256", resume=True)
    with pytest.raises(Exception, match="--resume: the seeds differ from those "):
        plan_comparison(load_experiment(write_experiment()), out, seeds=2, resume=True)
    # The papers' regime and named budgets not chosen judge or offer, they do not train: a change resumes.
    regime = {"source": "a paper", "parameters": 1e8, "tokens": 1e10}
    changed = write_experiment(regime=regime, budgets={"gpu": {"tokens": 10**8}})
    plan_comparison(load_experiment(changed), out, resume=True)
    # Other evaluation options: every arm is evaluated again, none retrained.
    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("arms/*/checkpoints/*/model.safetensors")}
    suite = FakeSuite()
    exp = load_experiment(write_experiment(eval={"options": {"max_docs": 3}}))
    run_comparison(plan_comparison(exp, out, resume=True), evaluator=suite, show_progress=False)
    assert sorted(p.name for p in suite.calls) == ["clm", "mlm"]
    assert mtimes and {p: p.stat().st_mtime_ns for p in mtimes} == mtimes
    assert json.loads((out / "results" / "clm.json").read_text())["eval_options"] == {"max_docs": 3}


def _train() -> dict[str, Any]:
    return experiment(Path("unused"))["train"]


def test_a_flops_budget_counts_what_each_arm_runs(write_experiment, tmp_path: Path) -> None:
    """Equal FLOPs across kinds: a contrastive row is two views with no unembedding backward, and an
    encoder-decoder's cross attention projects the encoder positions, so the arms get different steps."""
    from objtrain.training.accounting import flops_per_step

    arms = [
        {"name": "clm", "objective": "clm", "model": {"kind": "decoder", "size": "debug"}},
        {"name": "simcse", "objective": {"name": "contrastive", "overrides": {"views": "crop"}},
         "model": {"kind": "encoder", "size": "debug"}},
    ]  # fmt: skip
    c = plan_comparison(load_experiment(write_experiment(arms, budget={"flops": 1e9})), tmp_path / "r")
    clm, simcse = c.runs
    assert clm.flops_per_step == flops_per_step(clm.plan.model_cfg, 4, 32)
    two_views = flops_per_step(simcse.plan.model_cfg, 8, 32, logits_backward=False)
    assert simcse.flops_per_step == pytest.approx(two_views)
    assert simcse.steps == int(1e9 // two_views) != clm.steps


def test_the_command_ends_on_what_the_comparison_found(
    write_experiment, tmp_path: Path, monkeypatch, capsys
) -> None:
    """stdout: the tables, the verdict, then the one-sentence finding as the last line (the report's path
    is said on stderr before them), so `make demo` ends on it."""
    import sys

    from objtrain.cli import main
    from objtrain.compare import suite

    monkeypatch.setattr(suite, "default_evaluator", FakeSuite())
    monkeypatch.setattr(
        sys, "argv", ["objtrain", "compare", str(write_experiment()), "-o", str(tmp_path / "r")]
    )
    with pytest.raises(SystemExit) as exc:
        main()
    assert not exc.value.code
    out, err = capsys.readouterr()
    assert out.rstrip().splitlines()[-1].startswith("In short: ")
    assert "report: " in err and out.index("what each arm learnt") < out.index("In short: ")


def test_mtp_arms_are_parameter_matched_and_the_report_says_how(write_experiment, tmp_path: Path) -> None:
    arms = [
        {"name": f"mtp-{n}", "objective": {"name": "mtp", "overrides": {"n": n}},
         "model": {"kind": "decoder", "size": "debug"}}
        for n in (1, 2)
    ]  # fmt: skip
    path = write_experiment(arms, match_mtp_parameters=True)
    results = compare(path, tmp_path / "r", FakeSuite())
    one, two = results["arms"]
    assert one["cost"]["parameters"]["mean"] == two["cost"]["parameters"]["mean"]
    assert two["model_overrides"] == {"n_layer": 1}  # debug's 2 blocks: 1 trunk layer + 1 head layer
    assert "decoder debug (n_layer=1)" in (tmp_path / "r" / "report.md").read_text()


def test_an_mtp_arm_without_n_is_matched_at_its_yaml_default(write_experiment, tmp_path: Path) -> None:
    """An arm that names `mtp` and no n trains mtp.yaml's n = 4 heads: parameter matching takes 3 trunk
    layers for them (tiny's 4 blocks: 1 trunk layer), not none as if n were 1."""
    arms = [{"name": "mtp", "objective": "mtp", "model": {"kind": "decoder", "size": "tiny"}},
            {"name": "clm", "objective": "clm", "model": {"kind": "decoder", "size": "tiny"}}]  # fmt: skip
    c = plan_comparison(load_experiment(write_experiment(arms, match_mtp_parameters=True)), tmp_path / "r")
    layers = {run.arm.name: run.plan.model_cfg.n_layer for run in c.runs}
    assert layers == {"mtp": 1, "clm": 4}


def test_the_tiny_budget_of_a_flops_experiment_is_a_smaller_flops_budget(
    write_experiment, tmp_path: Path
) -> None:
    """`--budget tiny` on an experiment held at equal FLOPs keeps FLOPs equal (not 8,192 tokens each, which
    would part a decoder's FLOPs from an encoder-decoder's), at a budget below the experiment's own."""
    arms = [
        {"name": "clm", "objective": "clm", "model": {"kind": "decoder", "size": "debug"}},
        {"name": "span", "objective": "span", "model": {"kind": "encdec", "size": "debug"}},
    ]
    c = plan_comparison(
        load_experiment(write_experiment(arms, budget={"flops": 1e12})), tmp_path / "r", "tiny"
    )
    assert c.budget.kind == "flops" and c.budget.value < 1e12
    flops = [run.steps * run.flops_per_step for run in c.runs]
    assert max(flops) <= c.budget.value and max(flops) < 1.04 * min(flops)
    assert min(run.steps for run in c.runs) >= 32


def test_the_tiny_budget_caps_every_count_the_evaluation_takes() -> None:
    """A smoke run stays quick as parts are added: each option that counts documents, pairs, rows, tasks,
    probe seeds or fine-tuning steps is capped at `--budget tiny`, and a smaller given value is kept."""
    import dataclasses

    from objtrain.compare import suite
    from objtrain.evaluation.suite import EvalOptions

    counts = {f.name for f in dataclasses.fields(EvalOptions)
              if f.name.endswith(("_docs", "_pairs", "_rows", "_tasks", "_seeds", "_steps"))
              and (f.default is None or isinstance(f.default, int))}  # fmt: skip
    assert {"conditional_docs", "sentence_order_pairs", "probe_seeds", "middle_tasks"} <= counts
    capped = suite.options_for({}, tiny=True)
    assert counts <= set(capped) | set(suite.TINY_WHEN_GIVEN), counts - set(capped)
    defaults = EvalOptions()
    assert all(
        capped[k] < getattr(defaults, k) for k in counts & set(capped) if getattr(defaults, k) is not None
    )
    # A count whose default is the least (finetune_seeds 1) is held to its limit only where it is given.
    assert all(getattr(defaults, k) <= limit for k, limit in suite.TINY_WHEN_GIVEN.items())
    assert suite.options_for({"finetune_seeds": 5}, tiny=True)["finetune_seeds"] == 2
    assert suite.capped({"finetune_seeds": 5, "samples": 0}, tiny=True) == {"finetune_seeds": 2, "samples": 0}
    given = suite.options_for({"sentence_order_pairs": 12, "probe_seeds": 9, "middle_tasks": 0}, tiny=True)
    assert (given["sentence_order_pairs"], given["probe_seeds"], given["middle_tasks"]) == (12, 2, 0)
    assert suite.options_for({"probe_seeds": 9}, tiny=False) == {"probe_seeds": 9}
    suite.check_options(capped)  # the capped options are ones the suite accepts


def test_max_seeds_adds_seeds_while_a_claim_straddles_and_a_resume_keeps_them(
    write_experiment, tmp_path: Path, monkeypatch, capsys
) -> None:
    """Two seeds leave the claim's interval across 0 (+0.10 and -0.02): --max-seeds 3 trains seed 2 in
    every arm, and only it; the report says why; a later --resume --seeds 2 keeps all three."""
    import sys

    from objtrain.cli import main
    from objtrain.compare import suite as suite_module

    values = {("clm", 0): 0.80, ("mlm", 0): 0.70, ("clm", 1): 0.70, ("mlm", 1): 0.72}
    fake = FakeSuite({key: {"probe_accuracy": v} for key, v in values.items()})
    monkeypatch.setattr(suite_module, "default_evaluator", fake)
    claim = {"claim": "clm probes better", "literature": "a paper", "metric": "probe_accuracy",
             "arms": ["clm", "mlm"], "expect": "higher"}  # fmt: skip
    path, out = write_experiment(claims=[claim]), tmp_path / "r"
    argv = ["objtrain", "compare", str(path), "-o", str(out), "--seeds", "2", "--max-seeds", "3"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exc:
        main()
    assert not exc.value.code
    err = capsys.readouterr().err
    said = "2 seeds leave 1 claim(s) straddling their boundary (clm probes better): training seed(s) 2 in"
    assert said in err
    assert [p.name for p in fake.calls] == ["seed-0", "seed-0", "seed-1", "seed-1", "seed-2", "seed-2"]
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [0, 1, 2]
    raised = {"from": 2, "to": 3, "max": 3, "for": ["clm probes better"]}
    assert results["plan"]["seeds_raised"] == raised
    assert "2 at first, raised to 3 (--max-seeds 3)" in (out / "report.md").read_text()
    resumed = plan_comparison(load_experiment(path), out, seeds=2, resume=True)
    assert resumed.seeds == [0, 1, 2] and resumed.seeds_raised == raised
    with pytest.raises(Exception, match="--resume: the seeds differ"):  # not the seeds it was started with
        plan_comparison(load_experiment(path), out, seeds=1, resume=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "1", "--max-seeds", "3"], "needs --seeds 2 or more"),
        (["--seeds", "3", "--max-seeds", "2"], "--max-seeds 2 is below --seeds 3"),
        (["--seeds", "2", "--max-seeds", "3", "--sweep", "tokens=100,300,3000"], "a sweep trains"),
    ],
)
def test_max_seeds_refusals(args: list[str], message: str, write_experiment, tmp_path: Path, monkeypatch,
                            capsys) -> None:  # fmt: skip
    import sys

    from objtrain.cli import main

    argv = ["objtrain", "compare", str(write_experiment()), "-o", str(tmp_path / "r"), *args]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


class FailingSuite(FakeSuite):
    """A FakeSuite whose evaluation of one arm fails (picklable: it crosses into `--jobs` workers)."""

    def __init__(self, fails: str) -> None:
        super().__init__()
        self.fails = fails

    def __call__(self, run_dir: Path, data: str | None, options: dict[str, Any]) -> dict[str, Any]:
        if self.fails in run_dir.parts:
            raise ValueError(f"cannot evaluate {self.fails}")
        return super().__call__(run_dir, data, options)


def test_jobs_train_runs_at_once_alike_and_keep_what_finished(
    write_experiment, tmp_path: Path, monkeypatch
) -> None:
    """`compare --jobs 2` trains two runs at a time in processes of their own; each run trains as it does
    alone on the same number of threads, and a failure stops new runs but keeps the finished ones."""
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 2)  # one thread a worker, as below
    path = write_experiment()
    torch_threads = runner.torch.get_num_threads()
    runner.torch.set_num_threads(1)
    try:
        alone = compare(path, tmp_path / "alone", FakeSuite(), seeds=2)
    finally:
        runner.torch.set_num_threads(torch_threads)
    c = plan_comparison(load_experiment(path), tmp_path / "at-once", seeds=2)
    c.jobs = 2
    run_comparison(c, evaluator=FakeSuite(), show_progress=False)
    at_once = write_report(c)

    def curves(arm: dict[str, Any]) -> list[list[tuple[float, float]]]:
        return [[(p["tokens"], p["val_loss"]) for p in r["train"]["curve"]] for r in arm["runs"]]

    for a, b in zip(alone["arms"], at_once["arms"], strict=True):
        assert curves(a) == curves(b) and len(curves(a)[1]) == 3
        assert [r["train"]["final_loss"] for r in a["runs"]] == [r["train"]["final_loss"] for r in b["runs"]]
        assert [r["train"]["threads"] for r in b["runs"]] == [1, 1]

    c = plan_comparison(load_experiment(path), tmp_path / "failing", seeds=2)
    c.jobs = 2
    with pytest.raises(ValueError, match="cannot evaluate mlm"):
        run_comparison(c, evaluator=FailingSuite("mlm"), show_progress=False)
    done = sorted(p.name for p in (tmp_path / "failing" / "results").glob("*.json"))
    assert "clm.seed-0.json" in done and not any(name.startswith("mlm") for name in done)
    # The failed arm is trained; a resume only evaluates it again.
    c = plan_comparison(load_experiment(path), tmp_path / "failing", seeds=2, resume=True)
    c.jobs = 2
    suite = FakeSuite()
    run_comparison(c, evaluator=suite, show_progress=False)
    assert len(list((tmp_path / "failing" / "results").glob("*.json"))) == 4


def test_first_seed_options_measure_on_each_arms_first_seed_only(write_experiment, tmp_path: Path) -> None:
    """`eval.first_seed` is laid over the suite's options for each arm's first seed: a measurement's own noise
    on one checkpoint. Adding it later re-evaluates those runs alone."""
    seen: dict[str, dict[str, Any]] = {}

    def recording(run_dir: Path, data: str | None, options: dict[str, Any]) -> dict[str, Any]:
        seen[str(run_dir.relative_to(tmp_path / "report" / "arms"))] = dict(options)
        return {"probe_accuracy": 0.5}

    base = {"options": {"samples": 1}}
    out = tmp_path / "report"
    c = plan_comparison(load_experiment(write_experiment(eval=base)), out, seeds=2)
    run_comparison(c, evaluator=recording, show_progress=False)
    assert len(seen) == 4 and all(o == {"samples": 1} for o in seen.values())

    seen.clear()
    noise = {**base, "first_seed": {"finetune_seeds": 3}}
    c = plan_comparison(
        load_experiment(write_experiment(name="noise.yaml", eval=noise)), out, seeds=2, resume=True
    )
    run_comparison(c, evaluator=recording, show_progress=False)
    assert seen == {
        "clm/seed-0": {"samples": 1, "finetune_seeds": 3},
        "mlm/seed-0": {"samples": 1, "finetune_seeds": 3},
    }
    record = json.loads((out / "results" / "mlm.seed-1.json").read_text())
    assert record["eval_options"] == {"samples": 1}
    assert write_report(c)["evaluation"]["first_seed_options"] == {"finetune_seeds": 3}


class RateSuite(FakeSuite):
    """A fine-tuning FakeSuite: each arm's first seed "chooses" a rate of its own; later seeds report the rate
    their options fix (picklable: it crosses into `--jobs` workers)."""

    def __call__(self, run_dir: Path, data: str | None, options: dict[str, Any]) -> dict[str, Any]:
        chosen = options.get("finetune_lr_chosen", {})
        lr = chosen.get("sst2", 3e-3 if "clm" in run_dir.parts else 1e-3)
        return {"finetune_sst2_accuracy": 0.6, "finetune_sst2_lr": lr, "finetune_sst2_random_init_lr": 3e-4}


@pytest.mark.parametrize("jobs", [1, 2])
def test_finetune_rates_chosen_on_the_first_seed_fix_the_later_seeds(
    write_experiment, tmp_path: Path, monkeypatch, jobs: int
) -> None:
    """`eval.finetune_rates: first_seed`: a later seed is evaluated only after its arm's first seed, at the
    rate that seed chose (per task) and with the twin's rate from the first seed's twin; with --jobs the
    later seeds train beside the first and wait for its results to be evaluated."""
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 2)
    spec = {"options": {"samples": 1, "finetune": True}, "finetune_rates": "first_seed"}
    out = tmp_path / "report"
    c = plan_comparison(load_experiment(write_experiment(eval=spec)), out, seeds=2)
    c.jobs = jobs
    run_comparison(c, evaluator=RateSuite(), show_progress=False)
    options = {
        key: json.loads((out / "results" / f"{key}.json").read_text())["eval_options"]
        for key in ("clm.seed-0", "clm.seed-1", "mlm.seed-0", "mlm.seed-1")
    }
    assert options["clm.seed-0"] == options["mlm.seed-0"] == {"samples": 1, "finetune": True}
    assert options["clm.seed-1"]["finetune_lr_chosen"] == {"sst2": 3e-3}
    assert options["mlm.seed-1"]["finetune_lr_chosen"] == {"sst2": 1e-3}
    assert options["clm.seed-1"]["finetune_twin_seed"] == options["mlm.seed-1"]["finetune_twin_seed"] == 0
    # The report says where the rates were chosen; a resume keeps every result.
    results = write_report(c)
    assert results["arms"][0]["runs"][1]["eval"]["finetune_sst2_lr"] == 3e-3
    c = plan_comparison(load_experiment(write_experiment(eval=spec)), out, seeds=2, resume=True)
    suite = RateSuite()
    run_comparison(c, evaluator=suite, show_progress=False)
    assert suite.calls == []


def test_finetune_rates_must_be_named(write_experiment, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="finetune_rates must be one of"):
        load_experiment(write_experiment(eval={"finetune_rates": "every-seed-and-more"}))
