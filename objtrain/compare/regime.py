"""What a verdict knows about itself: how far its scale lies from the paper's, whether one seed decides it,
and how many seeds a verdict the seeds cannot resolve would need.

- Regime (a claim's `regime` in configs/experiments/): each claim's row carries the paper's smallest setting
  (parameters, tokens, tokens per parameter, from the experiment's `regime:`) beside ours, the factor
  between them, and **out of regime** when any factor exceeds `REGIME_FACTOR` (10x) either way.
- One seed: a verdict's direction rests on one seed when leaving that seed out moves the mean difference to
  the other side of 0 (or, for a claim of no difference, to the other side of the margin).
- Seeds needed: for a verdict not resolved, the fewest seeds whose 95% t interval, at the spread measured,
  would be narrower than the distance from the mean difference to 0 (or the margin): a rough guide, since
  the spread and the difference are themselves estimates from few seeds.
"""

from __future__ import annotations

import math
from typing import Any

from objtrain.compare.experiment import REGIME_FACTOR, PaperSetting
from objtrain.stats.seeds import t975

MAX_SEEDS = 30  # past this the guidance says "more than 30": the gap is too small for seeds to settle


def regime_gap(setting: PaperSetting | dict[str, Any] | None, parameters: float | None, tokens: float | None
               ) -> dict[str, Any] | None:  # fmt: skip
    """The paper's setting, ours, and paper / ours per quantity; None without a setting."""
    if setting is None:
        return None
    paper = setting if isinstance(setting, dict) else {
        "source": setting.source, "parameters": setting.parameters, "tokens": setting.tokens
    }  # fmt: skip
    theirs = {"parameters": paper.get("parameters"), "tokens": paper.get("tokens")}
    theirs["tokens_per_parameter"] = _ratio(theirs["tokens"], theirs["parameters"])
    ours = {"parameters": parameters, "tokens": tokens, "tokens_per_parameter": _ratio(tokens, parameters)}
    factors = {k: _ratio(theirs[k], ours[k]) for k in theirs}
    known = [f for f in factors.values() if f is not None]
    out = bool(known) and any(max(f, 1 / f) > REGIME_FACTOR for f in known)
    return {
        "source": paper.get("source", ""),
        "paper": theirs,
        "ours": ours,
        "factor": factors,  # paper / ours: 100 means the paper's is 100x larger
        "out_of_regime": out,
        "limit": REGIME_FACTOR,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not (a > 0 and b > 0):
        return None
    return float(a) / float(b)


def one_seed(diffs: dict[int, float], expect: str, margin: float) -> dict[str, Any] | None:
    """The seed whose removal flips the verdict's direction: {seed, without} (the mean difference without
    it), or None. Needs 3 seeds: with 2, leaving one out leaves a single value."""
    if len(diffs) < 3:
        return None
    mean = sum(diffs.values()) / len(diffs)

    def side(d: float) -> int:
        if expect == "equal":
            return 1 if abs(d) <= margin else -1
        return (d > 0) - (d < 0)

    flips = []
    for seed, value in diffs.items():
        without = (mean * len(diffs) - value) / (len(diffs) - 1)
        if side(without) != side(mean):
            flips.append((abs(value - mean), seed, without))
    if not flips:
        return None
    _, seed, without = max(flips)
    return {"seed": seed, "without": without}


def seeds_needed(delta: float, std: float, expect: str, margin: float) -> int | None:
    """The fewest seeds whose 95% interval at spread `std` would exclude the boundary from `delta`; None
    when more than `MAX_SEEDS` would be needed (or the spread is unknown)."""
    if not (math.isfinite(delta) and math.isfinite(std)) or std <= 0:
        return None
    distance = abs(abs(delta) - margin) if expect == "equal" else abs(delta)
    for n in range(2, MAX_SEEDS + 1):
        if t975(n - 1) * std / math.sqrt(n) < distance:
            return n
    return None


def seed_notes(verdict: str, diffs: dict[int, float], paired: dict[str, Any] | None, expect: str,
               margin: float) -> dict[str, Any]:  # fmt: skip
    """`one_seed` (see `one_seed`) and, for a verdict not resolved, `seeds_needed` (None: more than 30)."""
    out: dict[str, Any] = {"one_seed": one_seed(diffs, expect, margin)}
    known = paired is not None and paired.get("std") is not None and paired.get("delta") is not None
    if verdict == "not resolved" and known and paired is not None:
        out["seeds_needed"] = seeds_needed(paired["delta"], paired["std"], expect, margin)
        out["straddles"] = True
    return out


def seeds_wanted(results: dict[str, Any], most: int) -> tuple[int, list[str]]:
    """How many seeds the claims' spread asks for, at most `most`, and the claims asking: each claim not
    resolved because its interval straddles the boundary, where `seeds_needed` (at the spread measured)
    resolves it. A claim that would need more than MAX_SEEDS asks for nothing: more seeds will not settle
    a gap that small. (seeds now, []) when no claim asks."""
    have = len(results.get("seeds") or [])
    want, asking = have, []
    for claim in results.get("claims") or []:
        needed = claim.get("seeds_needed")
        straddles = claim.get("verdict") == "not resolved" and claim.get("straddles")
        if not straddles or not isinstance(needed, int):
            continue
        if min(needed, most) > have:
            want = max(want, min(needed, most))
            asking.append(str(claim.get("claim") or claim.get("metric")))
    return want, asking
