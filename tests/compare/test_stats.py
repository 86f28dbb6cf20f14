"""Seeds: mean ± sample std, the 95% interval, and which gaps the seed spread cannot resolve."""

from __future__ import annotations

import math

import pytest

from objtrain.stats.seeds import Summary, fmt, rank, summarise, welch


def test_summary_is_mean_and_sample_std() -> None:
    s = summarise([1.0, 2.0, 3.0])
    assert s.mean == pytest.approx(2.0) and s.std == pytest.approx(1.0) and s.n == 3
    assert s.ci95 == pytest.approx(4.303 / math.sqrt(3))
    one = summarise([0.7])
    assert one.mean == 0.7 and one.n == 1 and math.isnan(one.std)
    assert summarise([float("nan"), 1.0, 3.0]).n == 2  # a missing value is not a zero
    assert fmt(s) == "2 ± 1" and fmt(one) == "0.7"


def test_gap_smaller_than_the_seed_spread_is_marked() -> None:
    acc = {
        "a": summarise([0.80, 0.90, 0.85]),  # mean 0.85, std 0.05
        "b": summarise([0.86, 0.87, 0.88]),  # mean 0.87: best, but only 0.02 above a
        "c": summarise([0.60, 0.61, 0.62]),  # far below
    }
    r = rank("probe_accuracy", acc)
    assert r is not None and r.best == "b" and not r.lower_is_better
    assert r.within_spread == ["a"]
    assert r.gaps["a"]["delta"] == pytest.approx(-0.02)
    assert r.gaps["a"]["spread"] == pytest.approx(math.sqrt((0.05**2 + 0.01**2) / 2))


def test_lower_is_better_for_bits_and_losses_and_the_direction_can_be_given() -> None:
    bits = {"x": summarise([1.0, 1.1]), "y": summarise([2.0, 2.1])}
    r = rank("bits_per_byte", bits)
    assert r is not None and r.best == "x" and r.within_spread == []
    flipped = rank("some_score", bits, lower=True)
    assert flipped is not None and flipped.best == "x"
    assert rank("some_score", bits, lower=False).best == "y"  # type: ignore[union-attr]


def test_one_seed_marks_nothing() -> None:
    r = rank("loss", {"a": summarise([1.0]), "b": summarise([1.0001])})
    assert r is not None and r.best == "a" and r.within_spread == []
    assert r.gaps["b"]["spread"] is None


def test_welch_t_and_degrees_of_freedom() -> None:
    a, b = Summary(1.0, 0.1, 3, 0.0), Summary(0.5, 0.2, 5, 0.0)
    t, df = welch(a, b)
    va, vb = 0.01 / 3, 0.04 / 5
    assert t == pytest.approx(0.5 / math.sqrt(va + vb))
    assert df == pytest.approx((va + vb) ** 2 / (va**2 / 2 + vb**2 / 4))
