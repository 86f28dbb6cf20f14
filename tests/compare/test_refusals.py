"""Bad input to `objtrain compare`: one line, exit 2, nothing written; an existing report is kept."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from objtrain.cli import main
from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.data.tokenizer import train_sentencepiece
from objtrain.specials import Specials

DEBUG = {"kind": "decoder", "size": "debug"}


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: object) -> tuple:
    monkeypatch.setattr(sys, "argv", ["objtrain", *map(str, args)])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def refused(result: tuple, fragment: str) -> None:
    code, _, err = result
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert fragment in lines[0], err
    assert "Traceback" not in err


def test_unknown_key_is_refused_with_a_hint(write_experiment, tmp_path, monkeypatch, capsys) -> None:
    path = write_experiment(budjet={"tokens": 10})
    out = tmp_path / "report"
    result = run_cli(monkeypatch, capsys, "compare", path, "-o", out)
    refused(result, "unknown key 'budjet'")
    assert "did you mean 'budget'" in result[2] and not out.exists()
    arm = {"name": "a", "objective": "clm", "modle": DEBUG}
    refused(
        run_cli(monkeypatch, capsys, "compare", write_experiment([arm]), "-o", out), "unknown key 'modle'"
    )
    arm = {"name": "a", "objective": {"name": "mlm", "overrides": {"selection_rat": 0.2}}}
    refused(run_cli(monkeypatch, capsys, "compare", write_experiment([arm]), "-o", out), "selection_rat")
    assert not out.exists()


def test_an_arm_its_model_kind_cannot_train_is_refused(
    write_experiment, tmp_path, monkeypatch, capsys
) -> None:
    arms = [
        {"name": "clm", "objective": "clm", "model": DEBUG},
        {"name": "mlm-on-decoder", "objective": "mlm", "model": DEBUG},
    ]
    out = tmp_path / "report"
    result = run_cli(monkeypatch, capsys, "compare", write_experiment(arms), "-o", out)
    refused(result, "arm 'mlm-on-decoder'")
    assert "cannot train a decoder" in result[2] and not out.exists()


def test_arms_that_disagree_on_data_or_tokenizer_are_refused(
    write_experiment, compare_store: Path, stdlib_texts: list[str], tmp_path, monkeypatch, capsys
) -> None:
    out = tmp_path / "report"
    same = {"name": "b", "objective": "clm", "model": DEBUG, "data": {"store": str(compare_store)}}
    agree = write_experiment([{"name": "a", "objective": "clm", "model": DEBUG}, same])
    from objtrain.compare import load_experiment, plan_comparison

    plan_comparison(load_experiment(agree), out)  # the same store named twice: agreed, nothing written
    assert not out.exists()

    copy = tmp_path / "copy-store"
    shutil.copytree(compare_store, copy)
    arms = [{"name": "a", "objective": "clm", "model": DEBUG}, {**same, "data": {"store": str(copy)}}]
    result = run_cli(monkeypatch, capsys, "compare", write_experiment(arms), "-o", out)
    refused(result, "arms disagree on data: 'a' uses")
    assert "copy-store" in result[2] and not out.exists()

    # Another tokenizer: the same text tokenized differently.
    proto = train_sentencepiece(
        [line for text in stdlib_texts for line in text.splitlines(keepends=True)],
        vocab_size=700,
        model_type="unigram",
        specials=Specials(),
    )
    (tmp_path / "other.model").write_bytes(proto)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.py").write_text("\n\n".join(stdlib_texts[:2]), encoding="utf-8")
    config = TokenizeConfig(tokenizer=tmp_path / "other.model", doc_split="blank-line", valid_fraction=0.1)
    tokenize_corpus([tmp_path / "corpus"], tmp_path / "other-store", config)
    arms = [arms[0], {**same, "data": {"store": str(tmp_path / "other-store")}}]
    refused(run_cli(monkeypatch, capsys, "compare", write_experiment(arms), "-o", out), "tokenizer and data")
    assert not out.exists()

    # Data belongs to the experiment or the arm, never under an arm's train: section.
    bad = [arms[0], {"name": "c", "objective": "clm", "model": DEBUG, "train": {"seed": 3}}]
    refused(run_cli(monkeypatch, capsys, "compare", write_experiment(bad), "-o", out), "arms share it")


def test_an_existing_report_is_refused_unless_resume_or_force(
    write_experiment, tmp_path, monkeypatch, capsys
) -> None:
    out = tmp_path / "report"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    path = write_experiment()
    refused(run_cli(monkeypatch, capsys, "compare", path, "-o", out), "already exists (pass --resume")
    # Not a report: even --force keeps the user's directory.
    refused(run_cli(monkeypatch, capsys, "compare", path, "-o", out, "--force"), "is not a comparison report")
    assert (out / "notes.txt").read_text() == "mine"
    (out / "plan.json").write_text("[1]\n")  # a report's plan, damaged: --resume says so
    refused(run_cli(monkeypatch, capsys, "compare", path, "-o", out, "--resume"), "is not a comparison plan")
    assert (out / "notes.txt").read_text() == "mine"


def test_resume_and_force_together_are_refused(write_experiment, tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "report"
    path = write_experiment()
    both = ("--budget", "tiny", "--resume", "--force")
    refused(run_cli(monkeypatch, capsys, "compare", path, "-o", out, *both), "--resume continues REPORT")
    assert not out.exists()


def test_bad_budget_and_seeds_are_refused(write_experiment, tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "report"
    path = write_experiment()
    refused(run_cli(monkeypatch, capsys, "compare", path, "-o", out, "--budget", "huge"), "--budget 'huge'")
    refused(run_cli(monkeypatch, capsys, "compare", path, "-o", out, "--seeds", "0"), "--seeds must be")
    refused(run_cli(monkeypatch, capsys, "compare", path, "-o", out, "--jobs", "0"), "--jobs must be")
    sweep = ("--sweep", "tokens=200,2000,20000", "--jobs", "0")
    refused(run_cli(monkeypatch, capsys, "compare", path, "-o", out, *sweep), "--jobs must be")
    refused(run_cli(monkeypatch, capsys, "compare", tmp_path / "none.yaml", "-o", out), "not found")
    nan = write_experiment(name="nan.yaml", budget={"seconds": float("nan")})
    refused(run_cli(monkeypatch, capsys, "compare", nan, "-o", out), "a budget must be positive and finite")
    assert not out.exists()


@pytest.mark.parametrize(
    ("eval_spec", "fragment"),
    [
        ({"options": {"max_docs": "two"}}, "eval.options.max_docs must be an integer, got 'two'"),
        ({"options": {"probe_train": "missing.tsv"}}, "probe file not found"),
        ({"options": {"infill_file": "missing.jsonl"}}, "--infill file not found"),
        ({"data": "missing.txt"}, "eval data not found: missing.txt"),
    ],
)
def test_eval_settings_are_checked_before_any_arm_trains(
    eval_spec, fragment, write_experiment, tmp_path, monkeypatch, capsys
) -> None:
    # the suite reads these only after training: found then, every arm's training would be lost
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "report"
    path = write_experiment(eval=eval_spec)
    refused(run_cli(monkeypatch, capsys, "compare", path, "-o", out, "--budget", "tiny"), fragment)
    assert not out.exists()


def test_an_experiment_without_arms_says_so(tmp_path, monkeypatch, capsys) -> None:
    for name, text in (("empty.yaml", ""), ("no-arms.yaml", "name: x\narms: []\n")):
        (tmp_path / name).write_text(text)
        result = run_cli(
            monkeypatch, capsys, "compare", tmp_path / name, "-o", tmp_path / "r", "--budget", "tiny"
        )
        refused(result, f"{name}: the experiment has no arms")
    assert not (tmp_path / "r").exists()


def test_a_misspelt_arms_key_is_named_with_a_suggestion(tmp_path, monkeypatch, capsys) -> None:
    (tmp_path / "typo.yaml").write_text("name: x\narmz:\n  - {name: a, objective: clm}\n")
    result = run_cli(monkeypatch, capsys, "compare", tmp_path / "typo.yaml", "-o", tmp_path / "r")
    refused(result, "unknown key 'armz' in typo.yaml; did you mean 'arms'?")
    assert not (tmp_path / "r").exists()


def test_shipped_experiment_names_match_case_insensitively_with_a_suggestion(
    tmp_path, monkeypatch, capsys
) -> None:
    from objtrain.compare import load_experiment

    assert load_experiment(Path("Objectives")).name == "objectives"
    assert load_experiment(Path("FIM-RATE.yaml")).name == "fim-rate"
    out = tmp_path / "report"
    refused(run_cli(monkeypatch, capsys, "compare", "objectivs", "-o", out), "did you mean 'objectives'?")
    refused(run_cli(monkeypatch, capsys, "compare", "zzz", "-o", out), "experiment not found: zzz (shipped: ")
    (tmp_path / "mine.yaml").write_text("arms: []\n")
    refused(
        run_cli(monkeypatch, capsys, "compare", tmp_path / "mnie.yaml", "-o", out), "did you mean 'mine'?"
    )
    assert not out.exists()


def test_an_interrupted_comparison_says_interrupted_once(
    write_experiment, tmp_path, monkeypatch, capsys
) -> None:
    from objtrain.cli import compare as compare_cli
    from objtrain.compare.runner import Interrupted

    def stop(*args: object, **kwargs: object) -> None:
        raise Interrupted("interrupted during 'clm' (checkpoint saved at step 2); continue with --resume")

    monkeypatch.setattr(compare_cli, "run_comparison", stop)
    code, _, err = run_cli(monkeypatch, capsys, "compare", write_experiment(), "-o", tmp_path / "r")
    last = err.strip().splitlines()[-1]
    assert code == 130 and last.startswith("interrupted during 'clm'") and last.count("interrupted") == 1, err


def test_dry_run_plans_every_run_and_writes_nothing(write_experiment, tmp_path, monkeypatch, capsys) -> None:
    path = write_experiment(budget={"flops": 2.0e10})
    out_dir = tmp_path / "report"
    code, out, err = run_cli(monkeypatch, capsys, "compare", path, "-o", out_dir, "--seeds", "2", "--dry-run",
                             "--peak-tflops", "1")  # fmt: skip
    assert code == 0, err
    assert not out_dir.exists()
    runs = [line for line in out.splitlines() if ".seed-" in line]
    assert len(runs) == 2 * len(yaml.safe_load(path.read_text())["arms"]), out
    flops = sum(float(line.split("│")[-2]) for line in runs)
    assert 0.5 * 2.0e10 * len(runs) <= flops <= 2.0e10 * len(runs)  # each run near, at most, its budget
    total = float(out.split("total ")[1].split(" training FLOPs")[0])
    assert total == pytest.approx(flops, rel=0.01)
    assert f"{total / (0.4 * 1e12):,.0f} s at 40% of 1 TFLOP/s" in out and "nothing was written" in out


def test_peak_tflops_without_dry_run_is_refused(write_experiment, tmp_path, monkeypatch, capsys) -> None:
    path = write_experiment()
    refused(run_cli(monkeypatch, capsys, "compare", path, "-o", tmp_path / "r", "--peak-tflops", "9"),
            "--peak-tflops goes with --dry-run")  # fmt: skip
    assert not (tmp_path / "r").exists()
