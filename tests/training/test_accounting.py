"""Peak memory on CPU: the process's resident high-water mark, resettable per run."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from objtrain.training.accounting import PeakMemory

STATUS = Path("/proc/self/status")


def vm_hwm() -> int:
    line = next(ln for ln in STATUS.read_text().splitlines() if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_cpu_peak_is_the_high_water_mark_from_the_last_reset() -> None:
    memory = PeakMemory(torch.device("cpu"))
    memory.reset()
    before = memory.peak_bytes()
    assert before == vm_hwm()
    # 64 MiB of fresh anonymous pages, every one touched: an allocator could serve a tensor from memory
    # an earlier test freed but left resident, which would not raise the mark
    block = mmap.mmap(-1, 64 << 20)
    block.write(b"\1" * (64 << 20))
    after = memory.peak_bytes()
    assert after == vm_hwm() and after - before >= 60 << 20
    block.close()
    memory.reset()
    assert memory.peak_bytes() < after  # the reset drops the mark to what is resident now


def test_the_cpu_matmul_yardstick_is_one_threads_own_cpu_time_times_the_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MFU on a CPU is quoted against a matmul timed at start-up. Timed by the wall clock, a start-up beside
    other programs shrank that yardstick; timed by the process's CPU time over its threads, a thread spinning
    at a barrier for a descheduled sibling counted as work (in-process under load: a fifth of the peak), and
    later steps read MFU above 100%. The product now runs on one thread, timed by that thread's own clock,
    and the yardstick is that rate times the threads training uses."""
    from objtrain.training import accounting

    threads = {"now": 2}
    clock = {"wall": 0.0, "process": 0.0, "thread": 0.0}
    seen: list[int] = []

    def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append(threads["now"])
        # one product: 1 ms of this thread's time; the machine is shared, so 3 ms pass on the wall, and
        # siblings spinning at a barrier would add CPU time that is not the product's
        clock["wall"] += 3e-3
        clock["process"] += 5e-3
        clock["thread"] += 1e-3 if threads["now"] == 1 else 0.6e-3
        return a

    monkeypatch.setattr(accounting.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(accounting.time, "process_time", lambda: clock["process"])
    monkeypatch.setattr(accounting.time, "thread_time", lambda: clock["thread"])
    monkeypatch.setattr(torch.Tensor, "__matmul__", matmul)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads["now"])
    monkeypatch.setattr(torch, "set_num_threads", lambda n: threads.update(now=n))
    accounting.measured_peak_flops.cache_clear()
    try:
        peak = accounting.measured_peak_flops("cpu", "fp32")
    finally:
        accounting.measured_peak_flops.cache_clear()
    assert peak == pytest.approx(2 * 2 * 512**3 / 1e-3)  # 2 threads x one product a ms each
    assert seen[2:] and set(seen[2:]) == {1}  # every timed product ran on one thread (after 2 warm-ups)
    assert threads["now"] == 2  # training's thread count is restored


def test_the_objtrain_command_lets_idle_openmp_threads_sleep_soon_unless_the_user_chose() -> None:
    from objtrain.__main__ import openmp_defaults

    for others in (None, 0.0, 0.3):  # unknown or a quiet machine: a short spin
        env: dict[str, str] = {}
        assert openmp_defaults(env, others) == "GOMP_SPINCOUNT"
        assert env == {"GOMP_SPINCOUNT": "20000"}
    for others in (0.5, 1.9, 12.0):  # other programs hold a core's worth or more: never spin
        env = {}
        assert openmp_defaults(env, others) == "OMP_WAIT_POLICY"
        assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    for chosen in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "300000"}):
        env = dict(chosen)
        assert openmp_defaults(env, 2.0) is None
        assert env == chosen


def test_other_work_counts_busy_ticks_on_this_process_cpus_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import objtrain.__main__ as entry

    stat = tmp_path / "stat"

    def write(cpu0: list[int], cpu1: list[int], cpu2: list[int]) -> None:
        lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]  # the all-CPU line is not read: affinity decides
        lines += [f"cpu{i} " + " ".join(map(str, t)) + " 0 0" for i, t in enumerate((cpu0, cpu1, cpu2))]
        lines += ["intr 1 2 3", "ctxt 5"]
        stat.write_text("\n".join(lines) + "\n")

    #           user nice system idle iowait irq softirq steal
    write([100, 0, 0, 100, 0, 0, 0, 0], [0, 0, 0, 200, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0])
    # over the sample: cpu0 busy 9 of 10 ticks (user, system, irq), cpu1 idle (idle and iowait), cpu2 (not
    # ours) flat out
    after = ([106, 0, 2, 101, 0, 1, 0, 0], [0, 0, 0, 207, 3, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0])
    monkeypatch.setattr(entry.time, "sleep", lambda s: write(*after))
    monkeypatch.setattr(entry.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert entry.other_work(0.1, stat) == pytest.approx(9 / 20 * 2)
    monkeypatch.setattr(entry.time, "sleep", lambda s: None)  # no tick passed: unknown, not idle
    assert entry.other_work(0.1, stat) is None
    assert entry.other_work(0.1, tmp_path / "missing") is None


PROBE = """
import os, sys
seen = []


class Spy:  # records the variables at the moment torch is first imported
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.append(os.environ.get("GOMP_SPINCOUNT"))
            seen.append(os.environ.get("OMP_WAIT_POLICY"))
        return None


sys.meta_path.insert(0, Spy())
sys.argv = ["objtrain", *sys.argv[1:]]
from objtrain.__main__ import main
try:
    main()
except SystemExit:
    pass
print(seen)
"""


@pytest.mark.slow
def test_the_objtrain_command_sets_the_waiting_before_torch_loads_openmp() -> None:
    """libgomp reads GOMP_SPINCOUNT once, when torch loads it: the command must set it before that."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}

    def seen(*argv: str) -> str:
        cmd = [sys.executable, "-c", PROBE, *argv]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        return done.stdout.strip().splitlines()[-1] + done.stderr[-2000:]

    assert seen("--version") == "[]"  # torch never loads for the version
    assert seen("pack", "--help") == "['20000', None]"  # no model to run: no look at the machine
    # a command that runs models: one of the two, whichever the machine's load at start-up chose
    assert seen("train", "--help") in ("['20000', None]", "[None, 'PASSIVE']")


def test_flops_count_grouped_kv_projections_and_untied_heads_correctly() -> None:
    from objtrain.models import build_model, model_config
    from objtrain.training.accounting import _block_params, flops_per_step

    def cfg(**overrides: object) -> object:
        return model_config("decoder", "debug", {"n_head": 4, **overrides}, vocab_size=100)

    mha, gqa, untied = cfg(), cfg(n_kv_head=1), cfg(n_kv_head=1, tie_embeddings=False)
    # the analytic block size is the built block's: q, o (D x D), k and v (G*K x D each), FFN, norms
    for c in (mha, gqa):
        block = build_model(c).blocks[0]  # type: ignore[arg-type, index]
        assert _block_params(c) == sum(p.numel() for p in block.parameters())  # type: ignore[arg-type]
    rows, T, d, L = 3, 16, 32, 2
    saved = 2 * d * (d - 8)  # per layer: k and v shrink from 4 heads of width 8 to one
    assert flops_per_step(mha, rows, T) - flops_per_step(gqa, rows, T) == rows * T * 6 * L * saved  # type: ignore[arg-type]
    # an untied head is the same matmul as a tied one; the input embedding is a lookup, no FLOPs
    assert flops_per_step(untied, rows, T) == flops_per_step(gqa, rows, T)  # type: ignore[arg-type]


def _flop_cases() -> list[tuple[str, str, int]]:
    from objtrain.objectives.registry import OBJECTIVES, objective_class

    out = []
    for name in OBJECTIVES:
        for kind in objective_class(name).model_kinds:
            if name == "mixture" and kind == "encoder":
                continue  # the default mixture's components train decoders and encoder-decoders only
            out += [(name, kind, heads) for heads in ((1, 2, 4) if name == "mtp" else (1,))]
    return out


@pytest.mark.parametrize(("name", "kind", "heads"), _flop_cases())
def test_the_flops_estimate_matches_a_measured_count(
    name: str, kind: str, heads: int, tokenizer, stdlib_texts
) -> None:
    """Every objective on every kind it trains (MTP at 1, 2, 4 heads): the estimate compare's FLOPs budgets
    and MFU use, within 1% of `torch.utils.flop_counter`'s count of forward, loss and backward."""
    from objtrain.models.zoo import build_model, model_config
    from objtrain.objectives.registry import build_objective
    from objtrain.training.accounting import batch_flops, measured_batch_flops

    overrides: dict = {"views": "crop"} if name == "contrastive" else {}
    if name == "mtp":
        overrides["n"] = heads
    objective = build_objective(name, tokenizer.specials, tokenizer, kind, overrides)
    cfg = model_config(
        kind, "debug", {"mtp_heads": heads} if heads > 1 else None, vocab_size=tokenizer.vocab_size
    )
    torch.manual_seed(0)
    model = build_model(cfg)
    ids = torch.tensor(tokenizer.encode("".join(stdlib_texts)[:40_000]), dtype=torch.long)
    rows, width = 4, objective.raw_length(64)
    raw = ids[: rows * width].reshape(rows, width)
    batch = objective(raw, torch.zeros_like(raw), torch.arange(rows), 0)
    ratio = batch_flops(cfg, batch) / measured_batch_flops(model, objective, batch)
    assert ratio == pytest.approx(1.0, abs=0.01), ratio


def test_a_contrastive_batch_counts_both_views_and_no_logits_backward() -> None:
    from objtrain.models.zoo import model_config
    from objtrain.training.accounting import flops_per_step

    cfg = model_config("encoder", "debug", vocab_size=1000)
    one_view = flops_per_step(cfg, 4, 64)
    two_views = flops_per_step(cfg, 8, 64, logits_backward=False)
    unembedding = 6 * 1000 * cfg.d_model * 4 * 64
    assert two_views == pytest.approx(2 * (one_view - unembedding) + 2 * unembedding / 3)
