"""What a re-published comparison changed against the results it replaces (`previous-results.json` beside
`results.json`): the budget and the control held equal, each claim's difference and verdict, and every
arm's metric whose mean moved. A re-publication changes the design (FLOPs held equal, parameter-matched
arms, neutral scores) and fixes in the evaluation (the probe's segment embedding) move numbers that were
published: a reader of the old report finds here which, and by how much.

Pure functions of the two results dicts; `findings.py` beside this file keeps the previous file when a
re-run's plan differs from the published one, and passes `section` of the diff into the report.
"""

from __future__ import annotations

import math
from typing import Any

PREVIOUS = "previous-results.json"
TOLERANCE = 1e-9  # relative: a number that moved less than this is the same number read back


def _budget(results: dict[str, Any]) -> str:
    b = results.get("budget") or {}
    if not b:
        sw = results.get("sweep") or {}
        kind = "tokens" if "tokens" in sw else "flops"
        points = ", ".join(f"{p:.3g}" for p in sw.get(kind, []))
        sizes = f" x sizes {', '.join(sw['size'])}" if sw.get("size") else ""
        return f"{kind} sweep {points}{sizes}"
    return f"{b.get('value', 0):.3g} {b.get('kind', '')} an arm" + (
        f" at size {b['size']}" if b.get("size") else ""
    )


def _moved(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is not b
    return not math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


def diff(previous: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """{budget: [before, now] | None, claims: [...], metrics: [...], arms_added, arms_removed}."""
    before_budget, now_budget = _budget(previous), _budget(now)
    claims = []
    old_claims = {c["claim"]: c for c in previous.get("claims", [])}
    for c in now.get("claims", []):
        old = old_claims.pop(c["claim"], None)
        new_delta = (c.get("paired") or {}).get("delta")
        if old is None:
            claims.append({"claim": c["claim"], "status": "new", "verdict": [None, c["verdict"]],
                           "delta": [None, new_delta]})  # fmt: skip
            continue
        old_delta = (old.get("paired") or {}).get("delta")
        if old["verdict"] != c["verdict"] or old["metric"] != c["metric"] or _moved(old_delta, new_delta):
            claims.append({
                "claim": c["claim"], "status": "changed", "metric": [old["metric"], c["metric"]],
                "verdict": [old["verdict"], c["verdict"]], "delta": [old_delta, new_delta],
            })  # fmt: skip
    claims += [
        {"claim": name, "status": "dropped", "verdict": [c["verdict"], None]}
        for name, c in old_claims.items()
    ]
    old_arms = {a["name"]: a for a in previous.get("arms", [])}
    new_arms = {a["name"]: a for a in now.get("arms", [])}
    metrics = []
    for name in new_arms.keys() & old_arms.keys():
        old_m, new_m = old_arms[name].get("metrics", {}), new_arms[name].get("metrics", {})
        for metric in sorted(old_m.keys() | new_m.keys()):
            a = (old_m.get(metric) or {}).get("mean")
            b = (new_m.get(metric) or {}).get("mean")
            if _moved(a, b):
                metrics.append({"arm": name, "metric": metric, "before": a, "now": b})
    metrics.sort(key=lambda r: (r["metric"], r["arm"]))
    return {
        "budget": [before_budget, now_budget] if before_budget != now_budget else None,
        "claims": claims,
        "metrics": metrics,
        "arms_added": sorted(new_arms.keys() - old_arms.keys()),
        "arms_removed": sorted(old_arms.keys() - new_arms.keys()),
        "previous_commit": (previous.get("machine") or {}).get("commit"),
    }


def _g(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


def section(changes: dict[str, Any] | None) -> list[str]:
    """The report's "Changed since the previous publication" section (nothing when there is no diff)."""
    if not changes:
        return []
    out = ["## Changed since the previous publication", ""]
    commit = f" (objtrain {changes['previous_commit']})" if changes.get("previous_commit") else ""
    out.append(f"Against the results published before{commit}, kept as `{PREVIOUS}` beside `results.json`.")
    out.append("")
    if changes["budget"]:
        out += [f"- Budget: {changes['budget'][0]} before, {changes['budget'][1]} now", ""]
    if changes["arms_added"] or changes["arms_removed"]:
        out += [f"- Arms added: {', '.join(changes['arms_added']) or '—'}; removed: "
                f"{', '.join(changes['arms_removed']) or '—'}", ""]  # fmt: skip
    if changes["claims"]:
        out += ["| claim | change | verdict before → now | a − b before → now |", "|---|---|---|---|"]
        for c in changes["claims"]:
            verdict = f"{c['verdict'][0] or '—'} → {c['verdict'][1] or '—'}"
            delta = c.get("delta") or [None, None]
            metric = c.get("metric")
            what = c["status"] + (
                f" (metric {metric[0]} → {metric[1]})" if metric and metric[0] != metric[1] else ""
            )
            out.append(f"| {c['claim']} | {what} | {verdict} | {_g(delta[0])} → {_g(delta[1])} |")
        out.append("")
    if changes["metrics"]:
        out += ["| metric | arm | before | now |", "|---|---|---|---|"]
        out += [
            f"| {r['metric']} | {r['arm']} | {_g(r['before'])} | {_g(r['now'])} |" for r in changes["metrics"]
        ]
        out.append("")
    if not (changes["budget"] or changes["claims"] or changes["metrics"] or changes["arms_added"]
            or changes["arms_removed"]):  # fmt: skip
        out += ["Nothing published changed.", ""]
    return out
