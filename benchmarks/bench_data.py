"""The training data path per objective: rows/s of one loader process on one thread, where the time goes, and
how many loader workers a GPU host needs, for this tree against a baseline commit measured in the same run.

What one loader worker does per micro-batch, timed stage by stage (one process, `torch.set_num_threads(1)`,
as a DataLoader worker runs):
- plan: the sampler's `row_needs` (each row's raw length; the training process does this, once per step);
- read: `DocumentStream.rows` from the store (plus the donor text where the objective reads one);
- corrupt: the objective's `__call__` (corruption and layout into a `Batch`);
- collate: `Batch.mark_layout` and the trip to the wire format the workers send
  (`objtrain.data.loader._to_wire`).
rows/s counts all four in wall time; `cpu` counts them in the worker's CPU time (`time.process_time`),
the rate a dedicated core would give. On a machine whose cores other jobs keep busy, wall time also counts
the time the worker waits for a core (on 2 cores shared with 2 training jobs, wall rows/s came out several
times below the CPU rate, and moved with the jobs' load), so there the CPU columns are the ones to hold
against the target. Rows come from the seeded, shuffled stream of the store's train split, fresh rows
every batch, as training reads them.

Baseline: the commit given by `--baseline` (default `ef5ed71`, main when the data-path issue was opened) is
exported with `git archive` into a temporary directory and imported by its own worker process; this tree's
worker runs beside it. The two workers take turns cell by cell (baseline, this tree, baseline, this tree,
...: `--rounds`), so both see the same machine load; the table gives each side's best round (the least
disturbed by the shared machine) and their ratio. Only ratios measured together mean anything here.

Workers needed: the rows/s the small and base decoders eat on an H100 at 40% MFU (989 TFLOP/s dense bf16 peak,
FLOPs from `training.accounting.flops_per_step`, the formula bench_train.py's data-wait section uses), divided
by one worker's rows/s on this machine's core, rounded up. The issue's target: 2,400 rows/s at seq-len 1024,
so that 8 workers feed the small decoder and 2 the base one.

    .venv/bin/python benchmarks/bench_data.py                                   # everything (~15 minutes)
    .venv/bin/python benchmarks/bench_data.py --objectives fim ul2 bart --seq-lens 1024 --rounds 3
    .venv/bin/python benchmarks/bench_data.py --store runs/readme/store --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
H100_BF16_PEAK = 989e12  # dense bf16 tensor-core FLOP/s (datasheet), as bench_train.py
MFU = 0.4
TARGET_ROWS_PER_S = 2400  # the target at seq-len 1024 on one core
# every objective with each model kind it trains (contrastive trains the encoder only)
KINDS: dict[str, tuple[str, ...]] = {
    "clm": ("decoder",),
    "mtp": ("decoder",),
    "mlm": ("encoder",),
    "span": ("encdec", "decoder"),
    "prefix_lm": ("decoder", "encdec"),
    "fim": ("decoder",),
    "ul2": ("encdec", "decoder"),
    "bart": ("encdec",),
    "nsp": ("encoder",),
    "sop": ("encoder",),
    "mixture": ("encdec", "decoder"),
    "contrastive": ("encoder",),
}


# ------------------------------------------------------------------------------------------------ worker


def worker(store: str) -> None:
    """Answer one JSON request per stdin line with one JSON line: measure a cell for some seconds."""
    import numpy as np
    import torch

    torch.set_num_threads(1)
    try:
        from objtrain.data.batches import donor_offsets
        from objtrain.data.loader import _to_wire
        from objtrain.data.store_reader import DataSource
        from objtrain.data.stream import row_needs, row_starts
    except ImportError:  # a baseline from before the data path moved from training/data.py to data/
        from objtrain.training.data import (  # type: ignore[no-redef]
            DataSource,
            _to_wire,
            donor_offsets,
            row_needs,
            row_starts,
        )
    from objtrain.objectives.registry import build_objective

    source = DataSource(Path(store))
    stream = source.stream("train", 0)
    cells: dict[tuple[str, str, int], dict[str, Any]] = {}
    for line in sys.stdin:
        req = json.loads(line)
        key = (req["objective"], req["kind"], int(req["seq"]))
        if key not in cells:
            obj = build_objective(key[0], source.specials, source.tokenizer, model_kind=key[1])  # type: ignore[arg-type]
            cells[key] = {"obj": obj, "row": 0, "offset": 0, "width": obj.raw_length(key[2])}
        cell = cells[key]
        obj, width, seq, B = cell["obj"], cell["width"], key[2], int(req["batch"])
        times = {"plan": 0.0, "read": 0.0, "corrupt": 0.0, "collate": 0.0}
        rows_done = 0
        cpu = 0.0
        deadline = time.perf_counter() + float(req["seconds"])
        warm = 1
        while warm > 0 or time.perf_counter() < deadline:
            c0, t0 = time.process_time(), time.perf_counter()
            rows = np.arange(cell["row"], cell["row"] + B, dtype=np.int64)
            lengths = row_needs(obj, seq, rows, 0)
            offsets = row_starts(lengths, cell["offset"])
            cell["row"] += B
            cell["offset"] = int(offsets[-1] + lengths[-1])
            t1 = time.perf_counter()
            tokens, document_ids = stream.rows(offsets, lengths, width)
            extra = {}
            need = obj.donor_length(width)
            if need:
                at = donor_offsets(rows, offsets, need, 0, stream.epoch_tokens)
                extra["donors"] = stream.rows(at, np.full(len(rows), need, dtype=np.int64), need)
            t2 = time.perf_counter()
            batch = obj(tokens, document_ids, torch.from_numpy(rows), 0, **extra)
            t3 = time.perf_counter()
            batch.stats["raw_tokens_fed"] = float(np.sum(lengths))
            _to_wire((None, batch.mark_layout()))  # type: ignore[arg-type]
            t4, c4 = time.perf_counter(), time.process_time()
            if warm > 0:  # the first batch builds caches (lookup tables, lengths): not timed
                warm -= 1
                continue
            for name, a, b in (("plan", t0, t1), ("read", t1, t2), ("corrupt", t2, t3), ("collate", t3, t4)):
                times[name] += b - a
            cpu += c4 - c0
            rows_done += B
        total = sum(times.values())
        out = {"rows_per_s": rows_done / total, "cpu_rows_per_s": rows_done / cpu, "seconds": times}
        print(json.dumps({**out, "rows": rows_done}), flush=True)


class Worker:
    """A worker process of one implementation (its own `objtrain` on PYTHONPATH), driven over pipes."""

    def __init__(self, path: Path, store: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(path), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", str(store)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(path),
        )

    def measure(self, objective: str, kind: str, seq: int, batch: int, seconds: float) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request = {"objective": objective, "kind": kind, "seq": seq, "batch": batch, "seconds": seconds}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker in {self.proc.args} died on {request}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


# ------------------------------------------------------------------------------------------------ driver


def baseline_tree(commit: str, into: Path) -> Path:
    """`objtrain/` of `commit`, exported under `into` (importable with PYTHONPATH=into)."""
    git = ["git", "archive", commit, "objtrain"]
    archive = subprocess.run(git, cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def gpu_need(vocab: int, seq: int) -> dict[str, float]:
    """Rows/s the small and base decoders eat on an H100 at 40% MFU, at `seq` tokens a row."""
    from objtrain.models.zoo import model_config
    from objtrain.training.accounting import flops_per_step

    return {
        size: MFU * H100_BF16_PEAK / flops_per_step(model_config("decoder", size, vocab_size=vocab), 1, seq)
        for size in ("small", "base")
    }


def default_store(work: Path) -> Path:
    """The standard library as a token store (built once under runs/, as the README's first example)."""
    store = ROOT / "runs" / "bench-data" / "stdlib"
    if not (store / "meta.json").is_file():
        print(f"building the standard-library store at {store} (a minute or two) ...", flush=True)
        cmd = [sys.executable, "-m", "objtrain", "tokenize", "--corpus", "stdlib", "-o", str(store)]
        cmd.append("--force")
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return store


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--store", type=Path, help="token or packed store (default: the standard library)")
    p.add_argument("--objectives", nargs="*", default=list(KINDS))
    p.add_argument("--seq-lens", nargs="*", type=int, default=[512, 1024])
    p.add_argument("--batch", type=int, default=32, help="rows per micro-batch")
    p.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    p.add_argument("--rounds", type=int, default=2, help="alternations of baseline and this tree per cell")
    p.add_argument("--baseline", default="ef5ed71", help="commit to compare with ('' = this tree only)")
    p.add_argument("--baseline-tree", type=Path, help="a directory holding the baseline's objtrain/ instead")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    if a.worker:
        worker(a.worker)
        return
    with tempfile.TemporaryDirectory() as tmp:
        store = a.store or default_store(Path(tmp))
        vocab = json.loads((store / "meta.json").read_text())["vocab_size"]
        sides = {"this": Worker(ROOT, store)}
        if a.baseline_tree:
            a.baseline = str(a.baseline_tree)
            sides = {"base": Worker(a.baseline_tree.resolve(), store), **sides}
        elif a.baseline:
            sides = {"base": Worker(baseline_tree(a.baseline, Path(tmp)), store), **sides}
        print(
            f"loader rows/s, one process, one thread, micro-batch {a.batch}, store {store}; "
            f"baseline {a.baseline or '-'} and this tree alternate {a.rounds}x per cell, best round shown",
            flush=True,
        )
        head = f"{'objective':11s} {'kind':7s} {'seq':>4s} " + (f"{'base':>7s} " if a.baseline else "")
        head += f"{'this':>7s} " + ("  x   " if a.baseline else "")
        head += (
            (f"{'cpu:base':>8s} " if a.baseline else "") + f"{'this':>7s} " + ("  x   " if a.baseline else "")
        )
        head += "  plan  read corrupt collate  workers small/base (this)"
        print(head)
        results: list[dict[str, Any]] = []
        for seq in a.seq_lens:
            need = gpu_need(vocab, seq)
            for objective in a.objectives:
                for kind in KINDS[objective]:
                    best: dict[str, dict[str, Any]] = {}
                    cpu: dict[str, float] = {}
                    for _ in range(a.rounds):
                        for side, w in sides.items():
                            r = w.measure(objective, kind, seq, a.batch, a.seconds)
                            if side not in best or r["rows_per_s"] > best[side]["rows_per_s"]:
                                best[side] = r
                            cpu[side] = max(cpu.get(side, 0.0), r["cpu_rows_per_s"])
                    this = best["this"]
                    total = sum(this["seconds"].values())
                    share = {k: v / total for k, v in this["seconds"].items()}
                    workers = {k: math.ceil(v / this["rows_per_s"]) for k, v in need.items()}
                    row = {
                        "objective": objective,
                        "kind": kind,
                        "seq_len": seq,
                        "rows_per_s": this["rows_per_s"],
                        "cpu_rows_per_s": cpu["this"],
                        "stage_share": share,
                        "workers_h100_40pct": workers,
                        "gpu_rows_per_s": need,
                    }
                    line = f"{objective:11s} {kind:7s} {seq:4d} "
                    if a.baseline:
                        row["baseline_rows_per_s"] = best["base"]["rows_per_s"]
                        row["baseline_cpu_rows_per_s"] = cpu["base"]
                        line += f"{best['base']['rows_per_s']:7,.0f} "
                    line += f"{this['rows_per_s']:7,.0f} "
                    if a.baseline:
                        line += f"{this['rows_per_s'] / best['base']['rows_per_s']:5.2f} "
                        line += f"{cpu['base']:8,.0f} "
                    line += f"{cpu['this']:7,.0f} "
                    if a.baseline:
                        line += f"{cpu['this'] / cpu['base']:5.2f} "
                    line += "".join(f"{share[k]:6.0%}" for k in ("plan", "read", "corrupt"))
                    line += f"{share['collate']:8.0%}  {workers['small']:3d} / {workers['base']:d}"
                    print(line, flush=True)
                    results.append(row)
        for w in sides.values():
            w.close()
        for seq in a.seq_lens:
            n = gpu_need(vocab, seq)
            print(
                f"seq {seq}: an H100 at 40% MFU eats {n['small']:,.0f} rows/s (small decoder), "
                f"{n['base']:,.0f} (base); target {TARGET_ROWS_PER_S:,} rows/s per worker at seq 1024"
            )
        if a.json:
            out = {"baseline": a.baseline, "batch": a.batch, "rows": results}
            a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
