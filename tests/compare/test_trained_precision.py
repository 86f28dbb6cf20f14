"""The cost section names the precision the arms trained in, each arm's where `--dtype auto` picked apart."""

from __future__ import annotations

from objtrain.report.comparison import held_equal, trained_precision


def results(*dtypes_per_arm: tuple[str, ...]) -> dict:
    arms = []
    for i, dtypes in enumerate(dtypes_per_arm):
        runs = [{"train": {"dtype": d}} for d in dtypes]
        cost = {"tokens": {"mean": 1000.0}, "flops": {"mean": 1e9}}
        arms.append({"name": f"arm{i}", "runs": runs, "cost": cost})
    return {"arms": arms, "budget": {"kind": "tokens", "value": 1000}}


def test_one_precision_for_every_arm_is_said_once() -> None:
    assert trained_precision(results(("fp32", "fp32"), ("fp32",))) == "Trained in fp32."
    assert held_equal(results(("bf16",), ("bf16",)), plain=True).endswith("Trained in bf16.")


def test_arms_that_trained_apart_are_named_with_their_precision() -> None:
    text = trained_precision(results(("bf16",), ("fp32",), ("bf16",)))
    assert text == "Trained in bf16 (arm0, arm2); fp32 (arm1)."


def test_runs_that_recorded_no_precision_say_nothing() -> None:
    assert trained_precision(results((), ())) == ""
    assert "Trained" not in held_equal(results((), ()), plain=True)
