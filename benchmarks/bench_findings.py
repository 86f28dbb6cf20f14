"""How long `make findings` takes on this machine, measured alone rather than read off the published runs
(which shared the machine with other work, and whose recorded seconds are that slower).

Every cost of an experiment but its training tokens is independent of its budget, so each experiment's own
command runs here once at a small budget (one seed, `--budget TOKENS`, into a temporary report): every arm
trains briefly and is evaluated with the experiment's full suite. From that run:

- each arm's steady training throughput: tokens over wall time between its first and last logged step;
- each arm's evaluation seconds (what the comparison records);
- the rest of the command's wall time (start-up, tokenizer and store checks, checkpoints, the report),
  shared out over the arms.

An experiment's estimate is its seeds times the sum over its arms of (its full budget's tokens at that
throughput + its evaluation + its share of the rest). The compute sweeps run at their smoke budget
(`--budget tiny`) the same way, each point's tokens being what its chain trains: the longest point whole
and each shorter one's decay (the share of its steps after the branch point).

    .venv/bin/python benchmarks/bench_findings.py                  # the seven findings and the sweeps
    .venv/bin/python benchmarks/bench_findings.py span-length      # one experiment
    .venv/bin/python benchmarks/bench_findings.py --jobs 2         # as `make findings` runs them: 2 lanes

With `--jobs N`, as `findings run --jobs N`: each experiment in turn trains N of its runs (a sweep: its
chains of one arm, size and seed) at once (`compare --jobs N`), each on its share of the cores, so every
throughput is measured with the other lanes busy beside it. An estimate is the experiment's lane-hours; the
total shares each experiment's lane-hours over the N lanes. The last run of each experiment runs alone in the
end, a little faster than its estimate (and with a core idle beside it).

Needs ../shared/data for the prose experiments (it builds the prose store as `make findings` does) and
skips them with a message when it is absent. Run it on an otherwise idle machine: it times wall clock.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _data_common import SHARED_DATA, table

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the repository's scripts.findings
from scripts.findings import findings

SMALL = 100_000  # tokens an arm: enough logged steps for a steady throughput
OBJTRAIN = str(Path(sys.executable).with_name("objtrain"))


def small_command(name: str, out: Path) -> list[str]:
    """The experiment's own findings command, at one seed and a small budget, into `out`."""
    cmd = findings.command(name)
    if "--max-seeds" in cmd:  # one seed: no spread, no seeds added (their cost is not in the estimate)
        i = cmd.index("--max-seeds")
        del cmd[i : i + 2]
    i = cmd.index("--seeds")
    cmd[i + 1] = "1"
    cmd[cmd.index("-o") + 1] = str(out)
    budget = "tiny" if name in findings.SWEEPS else str(SMALL)
    return [OBJTRAIN, *cmd[1:], "--budget", budget, "--force"]


def steady_throughput(run_dir: Path) -> float | None:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    steps = [r for r in records if "tokens" in r and "wall_time" in r and "loss" in r]
    if len(steps) < 2 or steps[-1]["wall_time"] <= steps[0]["wall_time"]:
        return None
    return (steps[-1]["tokens"] - steps[0]["tokens"]) / (steps[-1]["wall_time"] - steps[0]["wall_time"])


def measure(name: str, work: Path, jobs: int = 1) -> dict[str, object]:
    out = work / name
    cmd = small_command(name, out)
    if jobs > 1:  # its runs (chains) N at once, each worker on its share of the cores
        cmd += ["--jobs", str(jobs)]
    start = time.perf_counter()
    if jobs == 1:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    else:  # as `findings run --jobs` runs it: its share of the cores, its output kept apart
        done = subprocess.run(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=findings.lane_env(jobs)
        )
        if done.returncode:
            raise SystemExit(f"{name} failed (exit {done.returncode}):\n{done.stderr.decode()[-2000:]}")
    wall = time.perf_counter() - start
    results = [json.loads(p.read_text()) for p in sorted((out / "results").glob("*.json"))]
    by_arm: dict[str, list[tuple[float, float, float]]] = {}  # arm -> (tps, eval s, small tokens) per run
    accounted = 0.0
    for r in results:
        tps = steady_throughput(Path(r["run_dir"]))  # relative to the project root, where it ran
        tokens = float(r["train"]["tokens"])
        evaluation = float(r.get("eval_seconds") or 0.0)
        by_arm.setdefault(r["arm"], []).append((tps or float("nan"), evaluation, tokens))
        accounted += evaluation + (tokens / tps if tps else 0.0)
    runs = sum(len(v) for v in by_arm.values())
    rest = max(wall - accounted, 0.0) / max(runs, 1)
    seeds = findings.SWEEP_SEEDS if name in findings.SWEEPS else findings.SEEDS
    full = findings.run_tokens(name)
    estimate = 0.0
    for arm, measured in by_arm.items():
        tps = max(m[0] for m in measured)  # the longest smoke point's: the least start-up in it
        evaluation = sum(m[1] for m in measured) / len(measured)
        tokens = [t for key, t in full.items() if key == arm or key.startswith(f"{arm}/")]
        estimate += sum(t / tps + evaluation + rest for t in tokens)
    return {
        "name": name,
        "arms": len(by_arm),
        "runs": len(full),
        "tokens_per_s": sum(max(m[0] for m in v) for v in by_arm.values()) / len(by_arm),
        "eval_s": sum(m[1] for v in by_arm.values() for m in v) / runs,
        "rest_s": rest,
        "small_wall_s": wall,
        "estimate_s": seeds * estimate,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="experiments (default: what make findings runs)")
    parser.add_argument("--jobs", type=int, default=1, help="lanes, as `findings run --jobs N`")
    args = parser.parse_args()
    names = args.names or findings.core_names()
    prose = [n for n in names if n in findings.FINDINGS and findings.FINDINGS[n].corpus == "prose"]
    if prose and not SHARED_DATA.is_dir():
        print(f"skipping {', '.join(prose)}: {SHARED_DATA} is absent (the prose corpus and probe sets)")
        names = [n for n in names if n not in prose]
    elif prose:
        subprocess.run([sys.executable, "benchmarks/findings_data.py", "runs/findings/data"], check=True)
    comparisons = [n for n in names if n in findings.FINDINGS]  # one after another, as findings runs them
    sweeps = findings.most_tokens_first([n for n in names if n not in findings.FINDINGS])
    with tempfile.TemporaryDirectory(prefix="bench-findings-") as tmp:

        def one(name: str) -> dict[str, object]:
            m = measure(name, Path(tmp), args.jobs)
            print(f"{name}: about {float(m['estimate_s']) / 3600:.2f} lane-hours", flush=True)  # type: ignore[arg-type]
            return m

        measured = [one(name) for name in comparisons + sweeps]
    rows = [[m["name"], str(m["runs"]), f"{m['tokens_per_s']:,.0f}", f"{m['eval_s']:.0f}",
             f"{m['rest_s']:.0f}", f"{m['small_wall_s']:.0f}", f"{float(m['estimate_s']) / 3600:.2f}"]  # type: ignore[arg-type]
            for m in measured]  # fmt: skip
    header = ["experiment", "runs a seed", "tokens/s an arm", "eval s a run", "rest s a run", "measured s",
              "estimate lane-h"]  # fmt: skip
    print(table(header, rows))
    hours = [float(m["estimate_s"]) / 3600 for m in measured]  # type: ignore[arg-type]
    if args.jobs == 1:
        print(f"all: about {sum(hours):.2f} hours on this machine ({len(names)} experiments)")
    else:  # each estimate is an experiment's lane-hours, the other lanes busy beside it
        span = sum(hours) / args.jobs
        print(f"all: about {span:.2f} hours on this machine ({len(names)} experiments, "
              f"{args.jobs} at once, {findings.lane_threads(args.jobs)} threads each)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
