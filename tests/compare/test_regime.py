"""Verdicts that know their regime: the paper's smallest setting against ours, one seed deciding a
verdict, and the seeds a straddling interval would need."""

from __future__ import annotations

import pytest

from objtrain.compare.experiment import Claim, PaperSetting, experiment_from_dict
from objtrain.compare.regime import one_seed, regime_gap, seeds_needed
from objtrain.compare.results import claim_regime, claim_verdict
from objtrain.errors import UserError
from objtrain.report.tables import claim_rows, notes_text, regime_text

T5 = PaperSetting(source="T5", parameters=2.2e8, tokens=3.4e10)


def test_a_scale_far_below_the_paper_is_out_of_regime() -> None:
    gap = regime_gap(T5, parameters=1.1e6, tokens=1.5e6)
    assert gap is not None and gap["out_of_regime"]
    assert gap["factor"]["parameters"] == pytest.approx(200.0)
    assert gap["factor"]["tokens"] == pytest.approx(3.4e10 / 1.5e6)
    assert gap["factor"]["tokens_per_parameter"] == pytest.approx((3.4e10 / 2.2e8) / (1.5e6 / 1.1e6))
    text = regime_text(gap)
    assert text.startswith("**out of regime**: the paper's over ours, parameters 200x, tokens 23,000x")
    # Within 10x on every count: in regime; a count the paper does not give is left out of the gap.
    near = regime_gap(PaperSetting(source="p", parameters=5e6), parameters=1e6, tokens=1e9)
    assert near is not None and not near["out_of_regime"] and near["factor"]["tokens"] is None
    assert regime_gap(None, 1e6, 1e6) is None


def test_a_claim_carries_the_regime_of_its_arms() -> None:
    arms = [
        {"name": n, "cost": {"parameters": {"mean": p}, "tokens": {"mean": 1e6}}}
        for n, p in (("a", 1e6), ("b", 3e6), ("c", 9e9))
    ]
    gap = claim_regime(T5, arms, ["a", "b"])
    assert gap is not None and gap["ours"]["parameters"] == 2e6  # the claim's two arms, not c


def test_an_experiment_reads_regime_at_top_level_and_per_claim() -> None:
    arm = {"name": "a", "objective": "clm"}
    exp = experiment_from_dict(
        {
            "arms": [arm, dict(arm, name="b")],
            "regime": {"source": "T5", "parameters": 2.2e8, "tokens": 3.4e10},
            "claims": [
                {"claim": "x", "literature": "y", "metric": "m", "arms": ["a", "b"],
                 "regime": {"source": "ALBERT", "parameters": 1.2e7}},
            ],
        }
    )  # fmt: skip
    assert exp.regime is not None and exp.regime.tokens == 3.4e10
    assert exp.claims[0].regime is not None and exp.claims[0].regime.tokens is None
    with pytest.raises(UserError, match="regime parameters must be positive"):
        experiment_from_dict({"arms": [arm], "regime": {"source": "x", "parameters": -1}})


def test_one_seed_decides_when_leaving_it_out_flips_the_direction() -> None:
    assert one_seed({0: 0.01, 1: 0.02, 2: -0.2}, "lower", 0.0) == {"seed": 2, "without": pytest.approx(0.015)}
    assert one_seed({0: 0.01, 1: 0.02, 2: 0.03}, "lower", 0.0) is None
    assert one_seed({0: 0.01, 1: -0.02}, "lower", 0.0) is None  # two seeds: one left is no estimate
    # A claim of no difference: the margin is the boundary.
    assert one_seed({0: 0.001, 1: 0.002, 2: 0.07}, "equal", 0.02) == {
        "seed": 2,
        "without": pytest.approx(0.0015),
    }


def test_seeds_needed_shrinks_the_interval_below_the_distance_to_the_boundary() -> None:
    # t(0.975, 2) / sqrt(3) = 2.48 > 2, t(0.975, 3) / 2 = 1.59 < 2: 4 seeds.
    assert seeds_needed(2.0, 1.0, "lower", 0.0) == 4
    assert seeds_needed(1.0, 1.0, "lower", 0.0) == 7  # 2.447 / sqrt(7) = 0.925 < 1
    assert seeds_needed(0.0, 1.0, "lower", 0.0) is None  # no gap: no number of seeds resolves it
    assert seeds_needed(0.019, 0.001, "equal", 0.02) == 7  # 0.001 from the margin: the ratio above


def test_a_straddling_verdict_asks_for_the_seeds_it_needs() -> None:
    claim = Claim(claim="a below b", literature="paper", metric="bpb", arms=["a", "b"], expect="lower")
    per_seed = {"a": {0: 1.0, 1: 1.1, 2: 0.95}, "b": {0: 1.05, 1: 1.06, 2: 1.08}}
    v = claim_verdict(claim, per_seed, 3)
    assert v["verdict"] == "not resolved" and v["straddles"]
    assert v["seeds_needed"] is None or v["seeds_needed"] > 3
    text = notes_text(v)
    assert "straddles" in text
    assert ("seeds: " in text) or ("more than 30 seeds" in text)
    # Resolved: no straddle note.
    resolved = claim_verdict(claim, {"a": {0: 1.0, 1: 1.01, 2: 1.02}, "b": {0: 1.1, 1: 1.12, 2: 1.1}}, 3)
    assert resolved["verdict"] == "agrees" and not resolved.get("straddles") and notes_text(resolved) == ""


def test_the_claims_table_shows_the_regime_and_the_seed_notes() -> None:
    claim = Claim(claim="a below b", literature="paper", metric="bpb", arms=["a", "b"], expect="lower")
    v = claim_verdict(claim, {"a": {0: 1.0, 1: 1.0, 2: 2.0}, "b": {0: 1.1, 1: 1.1, 2: 1.1}}, 3)
    v["regime"] = regime_gap(T5, 1e6, 1e6)
    header, rows = claim_rows({"claims": [v]})
    assert header[-1] == "scale against the paper"
    assert "one seed decides the direction: without seed 2" in rows[0][3]
    assert rows[0][4].startswith("**out of regime**")


def test_seeds_wanted_asks_for_the_seeds_a_straddling_claim_needs_up_to_the_cap() -> None:
    from objtrain.compare.regime import seeds_wanted

    def claim(name: str, verdict: str, needed: int | None, straddles: bool = True) -> dict:
        return {"claim": name, "verdict": verdict, "seeds_needed": needed, "straddles": straddles}

    results = {"seeds": [0, 1, 2], "claims": [
        claim("a", "not resolved", 4), claim("b", "not resolved", 9), claim("c", "agrees", None, False),
        claim("d", "not resolved", None),  # more than 30 seeds: adding a few settles nothing
    ]}  # fmt: skip
    assert seeds_wanted(results, 5) == (5, ["a", "b"])
    assert seeds_wanted(results, 4) == (4, ["a", "b"])
    assert seeds_wanted(results, 3) == (3, [])
    assert seeds_wanted({"seeds": [0, 1, 2], "claims": [claim("c", "agrees", None, False)]}, 5) == (3, [])
