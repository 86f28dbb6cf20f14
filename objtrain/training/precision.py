"""`--dtype auto` on a CPU: the precision whose training step is faster on this CPU, measured once and kept.

Whether bf16 pays on a CPU depends on the CPU and on the model's shape, not only on its instruction set.
Measured with `objtrain train --objective clm --seq-len 128 --batch-size 32` (steps 10-60, median tok/s):
on an AMD EPYC with AVX512-BF16 and no AMX, bf16 trained a tiny decoder x1.40 and a small one x2.43 faster
than fp32 at equal loss; on an Intel Xeon with AMX, bf16 trained the tiny decoder x0.90 (slower: at this
width the conversions cost more than the tile units save) while a timed matmul is several times faster in
bf16. A rule from the instruction set is wrong in both directions, so where the CPU has bf16 units at all
the run's own step is timed in both precisions (`calibrate`), interleaved so that a load on the machine
falls on both alike, and the answer is cached per CPU model, torch version, thread count and step shape
(`precision.json` in objtrain's cache folder). The same command on the same machine then always picks the
same precision, and a resumed run keeps the one it started in (`plan._choose_dtype`). Without bf16 units
bf16 is emulated, far slower than fp32, and nothing is timed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from objtrain.batch import Batch
from objtrain.devices import cpu_features
from objtrain.objectives.base import Objective

# bf16 only where it is this much faster: below it the margin is within the timing's noise and fp32 keeps
# the full precision for free.
MARGIN = 1.05
# Timed steps per precision: rounds of `PER_ROUND` steps, the two precisions alternating, after one warm-up
# step each (oneDNN builds its kernels for a shape on first use). The best round of each is compared: a
# load from other programs only ever slows a round down.
ROUNDS = 3
PER_ROUND = 2
# What the timed step is: a new probe does not take ratios an earlier one measured. 2: the run's own fused
# AdamW, with the loop's allocator settings (`host_memory`); the bare step of 1 read bf16 x1.08-1.13 the
# speed of fp32 where the loop ran it at x0.86 (a tiny decoder on an Intel Xeon with AMX).
PROBE = 2
BF16_UNITS = ("amx_bf16", "avx512_bf16", "bf16", "sve_bf16")  # x86 AMX / AVX512-BF16; aarch64 BF16 (SVE)


@dataclass(frozen=True)
class Choice:
    dtype: str  # "fp32" or "bf16"
    why: str  # one clause for the run's first line
    ratio: float | None = None  # fp32 step time / bf16 step time, where measured


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "cpu model", "hardware")):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def bf16_units(features: set[str] | None = None) -> list[str]:
    """The CPU's bf16 units, by feature name (empty: bf16 would be emulated)."""
    have = cpu_features() if features is None else features
    return [u for u in BF16_UNITS if u in have]


def cache_key(step_shape: dict[str, Any], units: list[str]) -> str:
    """What the measured ratio depends on: the CPU, torch, the threads and the step's shape."""
    what = {
        "probe": PROBE,
        "cpu": cpu_model(),
        "units": units,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "step": step_shape,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def cache_path() -> Path:
    """`OBJTRAIN_PRECISION_CACHE`, else precision.json in objtrain's cache folder (`OBJTRAIN_CACHE`, else
    ~/.cache/objtrain)."""
    if os.environ.get("OBJTRAIN_PRECISION_CACHE"):
        return Path(os.environ["OBJTRAIN_PRECISION_CACHE"])
    from objtrain.data.default import cache_dir

    return cache_dir() / "precision.json"


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, key: str, entry: dict[str, Any]) -> None:
    """Best effort (a read-only home only costs a re-measurement next time), atomic (a torn file is never
    read: `_read_cache` of a partial file would forget every entry)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(f".{path.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two lanes of a comparison: neither loses the other's entry
            data = _read_cache(path)
            data[key] = entry
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, path)
    except OSError:
        pass


def choose_cpu_dtype(
    step_shape: dict[str, Any],
    measure: Callable[[], float],
    may_measure: bool = True,
    features: set[str] | None = None,
) -> Choice:
    """fp32 or bf16 for `--dtype auto` on this CPU. `measure()` times the run's step in both precisions and
    returns fp32's time over bf16's; it runs only where the CPU has bf16 units and the cache has no answer
    for this step shape (and `may_measure`: several processes of one run must not each time their step)."""
    units = bf16_units(features)
    if not units:
        return Choice("fp32", "this CPU has no bf16 units (bf16 would be emulated, far slower)")
    path, key = cache_path(), cache_key(step_shape, units)
    entry = _read_cache(path).get(key)
    if isinstance(entry, dict) and isinstance(entry.get("ratio"), (int, float)):
        ratio = float(entry["ratio"])
        how = f"measured on this CPU on {entry.get('date', 'an earlier run')}, cached"
    elif may_measure:
        ratio = measure()
        how = "measured on this CPU now"
        _write_cache(
            path, key, {"ratio": round(ratio, 4), "date": time.strftime("%Y-%m-%d"), "cpu": cpu_model()}
        )
    else:
        return Choice(
            "fp32", "this step's bf16 speed on this CPU is not measured yet (a 1-process run measures it)"
        )
    dtype = "bf16" if ratio >= MARGIN else "fp32"
    faster = (
        f"bf16 steps x{ratio:.2f} the speed of fp32"
        if ratio >= 1
        else f"bf16 steps x{ratio:.2f} fp32's speed"
    )
    return Choice(dtype, f"{faster} ({how}; bf16 from x{MARGIN:.2f})", ratio)


def time_step(
    model: torch.nn.Module,
    objective: Objective,
    batch: Batch,
    rounds: int = ROUNDS,
    per_round: int = PER_ROUND,
    optimizer: torch.optim.Optimizer | None = None,
) -> float:
    """fp32's step time over bf16's for `model` on `batch`: forward, loss, backward, clipping and an AdamW
    update, as the training step (fp32 master weights, bf16 autocast). `optimizer` is the run's own (the
    training loop's fused AdamW: torch's default multi-tensor one took a third longer on a tiny decoder,
    the same in both precisions, which pulled the ratio toward 1). The model's weights change: the caller
    passes a throwaway copy. Torch's random state is left as it was: the run's seed gives the same curve
    whether or not its precision was measured."""
    if optimizer is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)

    def step(dtype: str) -> float:
        start = time.perf_counter()
        context = torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16" else nullcontext()
        with context:
            lo = objective.loss(model(batch), batch)
        loss = lo.loss_sum if lo.pair_sum is None else lo.loss_sum + lo.pair_sum
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    best = {"fp32": float("inf"), "bf16": float("inf")}
    with torch.random.fork_rng(devices=[]):
        model.train()
        step("fp32"), step("bf16")  # warm-up: kernels built, buffers allocated
        for _ in range(rounds):
            for dtype in ("fp32", "bf16"):
                best[dtype] = min(best[dtype], sum(step(dtype) for _ in range(per_round)))
    return best["fp32"] / best["bf16"]
