"""A claim on minimal-pair accuracy (`blimp_accuracy`) is judged against the arms' random-init twins."""

from __future__ import annotations

from objtrain.compare.results import BASELINE, baseline_gate


def _arms(twin: float, twin_hi: float) -> list[dict]:
    one = {"std": None, "n": 1, "ci95": None}
    arms = []
    for name, acc in (("gpt_bert", 0.58), ("clm", 0.55)):
        base = {
            "blimp_random_init_accuracy": {"mean": twin, **one},
            "blimp_random_init_accuracy_hi": {"mean": twin_hi, **one},
        }
        arms.append({"name": name, "metrics": {"blimp_accuracy": {"mean": acc, **one}}, "baselines": base})
    return arms


def test_blimp_baselines_are_collected_beside_the_arms() -> None:
    for key in ("blimp_random_init_accuracy", "blimp_random_init_accuracy_hi", "blimp_ngram_accuracy"):
        assert BASELINE.match(key)
    assert not BASELINE.match("blimp_accuracy") and not BASELINE.match("blimp_random_init_tie_rate")


def test_a_blimp_claim_is_judged_only_beyond_the_twins_interval() -> None:
    claim = {"claim": "hybrid beats CLM", "metric": "blimp_accuracy", "arms": ["gpt_bert", "clm"],
             "verdict": "agrees"}  # fmt: skip
    judged = baseline_gate(claim, _arms(0.46, 0.48))
    assert judged["verdict"] == "agrees" and judged["baseline"].startswith("every arm beats")
    # one seed: the twin's own Wilson interval (0.50 + 0.06) holds clm's 0.55
    near = baseline_gate(claim, _arms(0.50, 0.56))
    assert near["verdict"] == "not judged" and near["verdict_before_baseline"] == "agrees"
    assert "clm 0.55 against random-init 0.5 ± 0.06" in near["baseline"]
    assert "minimal-pair score" in near["baseline"]
