"""Training on a busy machine: does a run keep its fair share of the CPU beside other work?

A tiny decoder (clm, 16 x 128, fp32, one thread per core, no loader workers) trains through `objtrain train`
in a fresh process, alone and then beside a fixed set of CPU hogs (one single-threaded busy loop per core,
started before the run and stopped after it), under three OpenMP waiting settings:

- `objtrain`: what the `objtrain` command sets when the user set neither `OMP_WAIT_POLICY` nor
  `GOMP_SPINCOUNT`: it watches the cores for a tenth of a second at start-up; half a core or more of other
  programs' work: `OMP_WAIT_POLICY=PASSIVE`, else `GOMP_SPINCOUNT=20000` (a thread that reaches a barrier
  early spins briefly, then sleeps instead of spinning on a core that a descheduled sibling needs); never
  spinning, `train` packs its threads onto the cores the hogs leave it (`objtrain/training/cores.py`);
- `passive`: `OMP_WAIT_POLICY=PASSIVE` (never spin, so packed beside the hogs) whatever the load: 5-15%
  slower alone;
- `libgomp`: libgomp's own default (`GOMP_SPINCOUNT=300000`: spin about 0.3 M iterations, then sleep).

Fair share: our T threads beside H single-threaded hogs get T / (T + H) of the machine, so at most that share
of the idle speed is ours (half with one hog per core). Targets: `objtrain` beside the hogs >= its fair
share of its idle speed; `objtrain` alone >= 0.95 x `libgomp` alone; no MFU above 100% (the loop quotes
MFU on a CPU against a matmul timed at start-up on one thread in its own CPU time, times the threads,
so a busy machine does not shrink the yardstick). Settings and conditions alternate within each repeat,
so each sees the same background load; the load average is printed beside each number.

    .venv/bin/python benchmarks/bench_busy.py                 # ~6 minutes on an idle 2-core machine
    .venv/bin/python benchmarks/bench_busy.py --repeats 3 --steps 60 --json out.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

SETTINGS: dict[str, dict[str, str]] = {
    "objtrain": {},  # the command's own choice, by the load at start-up
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},  # never spin
    "libgomp": {"GOMP_SPINCOUNT": "300000"},  # libgomp's default spin, as before
}


def _hog() -> None:
    while True:  # a single-threaded CPU hog
        pass


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def make_store(work: Path) -> Path:
    """A small token store of standard-library code (a few packages), tokenized once."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    inputs = [
        str(stdlib / name) for name in ("email", "json", "asyncio", "logging") if (stdlib / name).is_dir()
    ]
    store = work / "store"
    cmd = [sys.executable, "-m", "objtrain", "tokenize", *inputs, "--include", "*.py", "--doc-split",
           "blank-line", "--vocab-size", "2048", "-o", str(store), "--force"]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    return store


def run_once(store: Path, work: Path, setting: str, steps: int, threads: int) -> dict[str, float]:
    """Train in a fresh process; tokens/s (median after the first 3 steps) and the highest MFU logged."""
    run = work / f"run-{setting}"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(SETTINGS[setting])
    env["OMP_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, "-m", "objtrain", "train", str(store), "--objective", "clm", "--model", "tiny",
           "--seq-len", "128", "--batch-size", "16", "--steps", str(steps), "--dtype", "fp32", "--device",
           "cpu", "workers=0", "validation.every=-1", "logging.tensorboard=false", "logging.sample=false",
           "-o", str(run), "--force"]  # fmt: skip
    load = load_average()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in records if "tokens_per_s" in r]
    return {
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steps_[3:] or steps_),
        "mfu_max": max(r["mfu"] for r in steps_),
        "load": load,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="default: one per core")
    parser.add_argument("--store", type=Path, help="a token store (default: a few stdlib packages)")
    parser.add_argument("--json", type=Path)
    a = parser.parse_args()
    threads = os.cpu_count() or 1
    print(f"{threads} threads, {a.hogs} single-threaded hogs, {a.steps} steps a run, {a.repeats} repeats")
    results: dict[str, dict[str, list[dict[str, float]]]] = {s: {"alone": [], "busy": []} for s in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = a.store or make_store(work)
        for rep in range(a.repeats):
            for condition in ("alone", "busy"):
                hogs = []
                if condition == "busy":
                    hogs = [multiprocessing.Process(target=_hog, daemon=True) for _ in range(a.hogs)]
                    for h in hogs:
                        h.start()
                    time.sleep(1.0)
                try:
                    for setting in SETTINGS if rep % 2 == 0 else reversed(SETTINGS):
                        r = run_once(store, work, setting, a.steps, threads)
                        results[setting][condition].append(r)
                        print(
                            f"repeat {rep + 1} {condition:5s} {setting:8s} {r['tokens_per_s']:8,.0f} tok/s  "
                            f"MFU max {100 * r['mfu_max']:5.1f}%  (load average {r['load']:.1f})",
                            flush=True,
                        )
                finally:
                    for h in hogs:
                        h.terminate()
                    for h in hogs:
                        h.join()

    fair = threads / (threads + a.hogs)
    summary: dict[str, Any] = {"threads": threads, "hogs": a.hogs, "fair_share": fair}
    print(f"\n{'setting':10s} {'alone':>10s} {'busy':>10s} {'busy/alone':>11s} {'MFU max':>8s}")
    for setting, by in results.items():
        alone = statistics.median(r["tokens_per_s"] for r in by["alone"])
        busy = statistics.median(r["tokens_per_s"] for r in by["busy"])
        mfu = max(r["mfu_max"] for r in by["alone"] + by["busy"])
        summary[setting] = {"alone": alone, "busy": busy, "ratio": busy / alone, "mfu_max": mfu}
        print(f"{setting:10s} {alone:10,.0f} {busy:10,.0f} {busy / alone:11.2f} {100 * mfu:7.1f}%")
    ours, old = summary["objtrain"], summary["libgomp"]
    checks = {
        f"busy >= fair share ({fair:.2f}) of alone": ours["ratio"] >= fair,
        "alone >= 0.95 x libgomp default alone": ours["alone"] >= 0.95 * old["alone"],
        "MFU never above 100%": max(ours["mfu_max"], old["mfu_max"]) <= 1.0,
    }
    summary["busy_vs_libgomp_busy"] = ours["busy"] / old["busy"]
    summary["alone_vs_libgomp_alone"] = ours["alone"] / old["alone"]
    print(
        f"\nobjtrain vs libgomp default: busy x{summary['busy_vs_libgomp_busy']:.2f}, "
        f"alone x{summary['alone_vs_libgomp_alone']:.2f}"
    )
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    summary["checks"] = checks
    if a.json:
        a.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
