"""The training loop (`objtrain.training`), measured against peers in the same run, on this machine.

1. nanogpt: nanoGPT's CPU recipe on tiny shakespeare (character vocabulary, 4 layers x 4 heads x 128 wide,
   block 64, batch 12, 2000 steps, lr 1e-3 -> 1e-4 cosine, warmup 100, beta2 0.99, no dropout; nanoGPT
   reports val loss ~1.88). objtrain trains through `objtrain.training.loop.train`; the peer is a plain
   PyTorch loop over HF `GPT2LMHeadModel` at the same shapes, budget and schedule, reading nanoGPT-style
   random windows of the same tokens, tuned as its users train it: no KV cache (`use_cache=False`; HF's
   default builds one in every training forward that no training loop reads), SDPA attention. Both run
   eager, then both compiled (objtrain `--compile`, the peer `torch.compile(model)` as nanoGPT does):
   objtrain's ratio is reported eager vs eager and compiled vs compiled, never compiled vs eager.
   The two alternate in segments of 100 steps, never overlapping (the
   peer's segment runs from objtrain's per-step hook, outside objtrain's timed steps), so both see the
   same machine load. The peer runs in its own process, as a user runs it: objtrain sets process-wide
   state for CPU training (malloc thresholds, see objtrain/training/host_memory.py) that a plain loop
   does not have (`--peer-process shared` runs it inside objtrain's process instead). Validation loss
   is per-character cross-entropy on nanoGPT's split (the last 10% of the file), every non-overlapping
   64-character window, the same rows for both. Target: val <= 1.88 and >= 1.5x the peer's tokens/s.
2. overhead: tokens/s of the whole loop (`train()`, loader workers, logging; timed between its per-step
   records) against the bare step of bench_models.py (forward, loss, backward, AdamW on one prepared
   batch) at the same shapes, for clm, mlm, span and ul2. Interleaved step by step (a bare step after each
   loop step, from the loop's per-step hook); the verdict is the median of the adjacent pairs' ratios.
   The loader worker may prefetch during a bare step as it does during a loop step (its CPU time per batch
   is well under 1% of these steps). Target >= 0.95.
3. datawait: the loop's data-wait share (`data_wait_frac` in metrics.jsonl) for every objective at the
   tiny and small sizes (target < 2%), and the loader's rows/s without a model (RowSampler + CorruptedRows
   in one process) against the rows/s the small decoder would eat on an H100 at 40% MFU.
4. mtp: peak resident memory of one training step (the loop's `forward_backward`: trunk once, then each
   head's forward and backward in turn) with 4 heads against 1 head, at a vocabulary and length where the
   logits dominate (V 32000, T 1024), each in a fresh process, as the VmHWM delta over the resident size
   before the step. The joint backward (all heads' logits alive at once) is shown for contrast. Target
   <= 1.1x.
5. gpu: whether a GPU is present; the bf16 MFU target needs one.
6. precision: CLM at the tiny (32 x 128) and small (16 x 256) sizes on the standard-library store, the
   whole loop in fp32 and in bf16, two runs each alternating (fp32, bf16, fp32, bf16: a load that comes and
   goes falls on both), tokens/s the median of steps 10 onwards; beside them what `--dtype auto` picks on
   this CPU (its own cached timing, objtrain/training/precision.py), this CPU's measured matmul rate in
   each precision, and whether auto trains within 10% of the faster. `compile: auto` stays eager on a CPU
   (`loop.compile_mode`); the nanogpt section measures objtrain compiled against eager.

    .venv/bin/python benchmarks/bench_train.py                       # everything (~20 minutes: nanogpt twice)
    .venv/bin/python benchmarks/bench_train.py --only nanogpt --modes eager --steps 500
    .venv/bin/python benchmarks/bench_train.py --only nanogpt --steps 500
    .venv/bin/python benchmarks/bench_train.py --only overhead datawait mtp --json out.json
    .venv/bin/python benchmarks/bench_train.py --only datawait --wait-seq 1024   # the wait share at 1024
    .venv/bin/python benchmarks/bench_train.py --only datawait --wait-seq 1024 --wait-device cuda  # a GPU's
    .venv/bin/python benchmarks/bench_train.py --only precision           # fp32 vs bf16 vs auto (~5 minutes)
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from objtrain import IGNORE
from objtrain.training.config import build_config

HERE = Path(__file__).resolve().parent
SHAKESPEARE = HERE.parent / ".." / "shared" / "data" / "tinyshakespeare" / "input.txt"
H100_BF16_PEAK = 989e12  # dense bf16 tensor-core FLOP/s (datasheet)


def load_percent() -> str:
    """The machine's 1-minute load average against its cores: how shared it was while we measured."""
    try:
        one = os.getloadavg()[0]
    except OSError:
        return "load unknown"
    return f"load average {one:.2f} on {os.cpu_count()} cores"


def train_config(store: Path, objective: str, kind: str | None, **sections: Any) -> Any:
    """A TrainConfig for a benchmark run: quiet (no sample, no TensorBoard), fp32 on CPU, no validation."""
    base: dict[str, Any] = {
        "data": {"store": str(store)},
        "model": {"kind": kind, "size": "tiny"},
        "objective": {"name": objective},
        "precision": {"dtype": "fp32"},
        "validation": {"every": -1},
        "checkpoint": {"every": 0, "keep": 1},
        # every step read and logged: the hooks below time the loop step by step (records arrive at reads,
        # which a CPU makes at no cost; on a GPU each read waits for the step)
        "logging": {"every": 1, "tensorboard": False, "sample": False},
        "device": "cpu",
        "workers": 1,
    }
    for key, value in sections.items():
        base[key] = value if not isinstance(value, dict) else {**base.get(key, {}), **value}
    return build_config(base)


def run_loop(cfg: Any, run_dir: Path, hook: Callable[[dict[str, Any]], None] | None = None) -> Any:
    from rich.console import Console

    from objtrain.training.loop import train

    console = Console(stderr=True, quiet=True)
    return train(cfg, run_dir, force=True, console=console, show_progress=False, on_record=hook)


# --------------------------------------------------------------------------------------------- 1. nanoGPT


def shakespeare_store(work: Path) -> tuple[Path, dict[str, Any]]:
    """A char token store of tiny shakespeare with nanoGPT's split: the first 90% train, the last 10% valid.
    Its vocabulary is nanoGPT's, the corpus's characters, plus objtrain's 14 fixed specials: no sentinels
    and no byte pieces (`--no-byte-fallback`; with them the table and the softmax were 329 wide, not 79).

    `objtrain tokenize` puts a document in the valid split when a keyed hash of its bytes falls under
    --valid-fraction; with the two halves as two documents, a seed where the valid half hashes lower and a
    fraction between the two keys reproduce nanoGPT's split exactly (checked below by the token counts).
    """
    from objtrain.data.tokenize import _keys

    text = SHAKESPEARE.read_text(encoding="utf-8")
    cut = int(len(text) * 0.9)
    train_txt, valid_txt = work / "train.txt", work / "valid.txt"
    train_txt.write_text(text[:cut], encoding="utf-8")
    valid_txt.write_text(text[cut:], encoding="utf-8")
    for seed in range(100):
        k_train = _keys(text[:cut].encode(), seed)[0]
        k_valid = _keys(text[cut:].encode(), seed)[0]
        if k_valid < k_train:
            break
    fraction = (k_train + k_valid) / 2
    store = work / "shakespeare-char"
    cmd = [sys.executable, "-m", "objtrain", "tokenize", str(train_txt), str(valid_txt)]
    cmd += ["--model-type", "char", "--sentinels", "0", "--no-byte-fallback"]
    cmd += ["--valid-fraction", f"{fraction:.6f}"]
    cmd += ["--seed", str(seed), "-o", str(store), "--force"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    meta = json.loads((store / "meta.json").read_text())
    splits = meta["splits"]
    if (splits["train"]["tokens"], splits["valid"]["tokens"]) != (cut, len(text) - cut):
        raise SystemExit(f"the char store does not reproduce nanoGPT's split: {splits}")
    return store, {
        "vocab_size": meta["vocab_size"],
        "characters": len(set(text)),
        "train_tokens": cut,
        "valid_tokens": len(text) - cut,
    }


class NanoGPTPeer:
    """nanoGPT's train.py loop over HF GPT2LMHeadModel: random windows, warmup + cosine, AdamW, clipping."""

    def __init__(self, train: np.ndarray, vocab: int, a: argparse.Namespace) -> None:
        import transformers as tf

        torch.manual_seed(0)
        cfg = tf.GPT2Config(
            vocab_size=vocab,
            n_positions=a.block,
            n_embd=a.width,
            n_layer=a.layers,
            n_head=a.heads,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=None,
            eos_token_id=None,
            use_cache=False,  # a training loop never reads the KV cache HF builds by default
        )
        cfg._attn_implementation = "sdpa"  # HF's default where torch has SDPA; said, not assumed
        self.model = tf.GPT2LMHeadModel(cfg).train()
        self.forward = torch.compile(self.model) if a.compile else self.model  # nanoGPT compiles the model
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        self.opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.99))
        self.data = torch.from_numpy(train.astype(np.int64))
        self.g = torch.Generator().manual_seed(1337)
        self.a = a
        self.step = 0
        self.times: list[float] = []

    def lr(self, it: int) -> float:  # nanoGPT's get_lr
        a = self.a
        if it < a.warmup:
            return a.lr * (it + 1) / (a.warmup + 1)
        ratio = min((it - a.warmup) / max(a.steps - a.warmup, 1), 1.0)
        return a.lr / 10 + 0.5 * (1 + math.cos(math.pi * ratio)) * (a.lr - a.lr / 10)

    def run(self, steps: int) -> None:
        B, T = self.a.batch, self.a.block
        offsets = torch.arange(T + 1)
        for _ in range(steps):
            t0 = time.perf_counter()
            ix = torch.randint(len(self.data) - T - 1, (B,), generator=self.g)
            window = self.data[ix[:, None] + offsets]
            for group in self.opt.param_groups:
                group["lr"] = self.lr(self.step)
            logits = self.forward(input_ids=window[:, :-1], use_cache=False).logits
            loss = F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.last_loss = float(loss.detach())
            self.times.append(time.perf_counter() - t0)
            self.step += 1

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @torch.no_grad()
    def validate(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        """Per-token cross-entropy over (input_ids, labels) batches."""
        self.model.eval()
        total, count = 0.0, 0
        for input_ids, labels in batches:
            logits = self.model(input_ids=input_ids, use_cache=False).logits
            keep = labels != IGNORE
            total += float(F.cross_entropy(logits[keep], labels[keep], reduction="sum"))
            count += int(keep.sum())
        self.model.train()
        return total / count


def _peer_main(conn: Any, train: np.ndarray, vocab: int, a: argparse.Namespace, threads: int) -> None:
    """The peer's own process: build it, then run segments and validations on request."""
    torch.set_num_threads(threads)
    peer = NanoGPTPeer(train, vocab, a)
    conn.send(peer.params)
    while True:
        command, arg = conn.recv()
        if command == "run":
            first = len(peer.times)
            peer.run(arg)
            conn.send((peer.step, peer.last_loss, peer.times[first:]))
        elif command == "validate":
            conn.send(peer.validate(arg))
        else:
            return


class PeerProcess:
    """`NanoGPTPeer` in a spawned process of its own, driven over a pipe: each call blocks until the
    peer is done, so its segments never overlap objtrain's."""

    def __init__(self, train: np.ndarray, vocab: int, a: argparse.Namespace) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_peer_main, args=(child, train, vocab, a, torch.get_num_threads()), daemon=True
        )
        self.proc.start()
        self.params: int = self.conn.recv()  # built: its start-up is over before objtrain's steps begin
        self.step, self.last_loss, self.times = 0, math.nan, []

    def run(self, steps: int) -> None:
        self.conn.send(("run", steps))
        self.step, self.last_loss, times = self.conn.recv()
        self.times += times

    def validate(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        self.conn.send(("validate", batches))
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(("stop", None))
        self.proc.join(timeout=30)


def bench_nanogpt(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    if not SHAKESPEARE.is_file():
        print(f"nanogpt: skipped, {SHAKESPEARE} not found (the shared corpora are not on this machine)")
        return {"skipped": f"{SHAKESPEARE} not found"}
    out: dict[str, Any] = {}
    for mode in a.modes:  # both sides eager, then both compiled: like against like
        print(f"nanogpt: {mode}, objtrain and the peer", flush=True)
        out[mode] = bench_nanogpt_mode(argparse.Namespace(**{**vars(a), "compile": mode == "compiled"}), work)
    ratios = ", ".join(f"{m} vs {m} x{out[m]['speed_ratio']:.2f}" for m in a.modes)
    print(f"nanogpt: objtrain's tokens/s against the tuned HF GPT-2 loop: {ratios}", flush=True)
    return out


def bench_nanogpt_mode(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    if not SHAKESPEARE.is_file():
        print(f"nanogpt: skipped, {SHAKESPEARE} not found (the shared corpora are not on this machine)")
        return {"skipped": f"{SHAKESPEARE} not found"}
    from objtrain.data.batches import validation_batches
    from objtrain.data.store_reader import DataSource
    from objtrain.objectives.registry import build_objective

    store, info = shakespeare_store(work)
    source = DataSource(store)
    valid_rows = info["valid_tokens"] // (a.block + 1) + 1  # every window; the loader keeps those that fit
    clm = build_objective("clm", source.specials, source.tokenizer, "decoder")
    val_batches = validation_batches(
        source.documents("valid"), source.specials, clm, a.block, valid_rows, a.batch
    )
    n_val_rows = sum(b.input_ids.size(0) for b in val_batches)
    where_peer = "a process of its own" if a.peer_process == "own" else "objtrain's process"
    print(
        f"nanogpt: tiny shakespeare, {info['train_tokens']:,} train / {info['valid_tokens']:,} valid "
        f"characters (nanoGPT's 90/10 split); objtrain's char vocabulary holds {info['vocab_size']} tokens "
        f"({info['vocab_size'] - info['characters']} specials and the characters; nanoGPT's: the "
        f"{info['characters']} characters; one token per character either way, so the loss "
        f"is per-character CE); validation on all {n_val_rows} windows of {a.block} of the valid split; "
        f"the peer runs in {where_peer}",
        flush=True,
    )
    # SwiGLU's three matrices at 8/3 x width hold exactly GPT-2's two at 4 x width: the same parameters
    # and FLOPs per token (the zoo's default rounds up to a multiple of 64, 12% more at width 128).
    d_ff = a.d_ff or round(8 * a.width / 3)
    cfg = train_config(
        store,
        "clm",
        "decoder",
        model={"overrides": {"d_model": a.width, "n_layer": a.layers, "n_head": a.heads, "d_ff": d_ff}},
        batch={"seq_len": a.block, "batch_size": a.batch},
        optim={"lr": a.lr, "betas": [0.9, 0.99], "weight_decay": 0.1, "grad_clip": 1.0},
        schedule={"kind": "cosine", "warmup": a.warmup, "min_lr_ratio": 0.1},
        budget={"steps": a.steps},
        precision={"dtype": "fp32", "compile": a.compile},
        validation={"every": a.val_every, "rows": valid_rows},
        seed=0,
        workers=a.nanogpt_workers,
    )
    train_tokens = source.documents("train").tokens
    peer_val_batches = [(b.input_ids, b.labels) for b in val_batches]
    own = a.peer_process == "own"
    peer = (PeerProcess if own else NanoGPTPeer)(train_tokens, info["vocab_size"], a)
    peer_segment = a.peer_steps or a.segment  # fewer: the peer runs for speed only, its loss is not final
    stamps: list[tuple[int, float]] = []
    ours_val: dict[int, float] = {}
    peer_val: dict[int, float] = {}
    seg_ours: list[list[float]] = [[]]
    last = [time.perf_counter()]

    def hook(record: dict[str, Any]) -> None:
        now = time.perf_counter()
        if record.get("split") == "val":
            ours_val[record["step"]] = record["val_loss"]
            last[0] = time.perf_counter()  # the next step interval starts after validation
            return
        seg_ours[-1].append(now - last[0])
        stamps.append((record["step"], now))
        if record["step"] % a.segment == 0:  # the peer's segment, outside objtrain's step intervals
            peer.run(peer_segment)
            if peer.step % a.val_every == 0 or peer.step >= a.steps:
                peer_val[peer.step] = peer.validate(peer_val_batches)
                print(
                    f"  step {record['step']:5d}  objtrain train {record['loss']:.4f}  "
                    f"peer train {peer.last_loss:.4f} val {peer_val[peer.step]:.4f}  ({load_percent()})",
                    flush=True,
                )
            seg_ours.append([])
        last[0] = time.perf_counter()

    t0 = time.perf_counter()
    result = run_loop(cfg, work / f"nanogpt-{'compiled' if a.compile else 'eager'}", hook)
    wall = time.perf_counter() - t0
    if peer_segment == a.segment and peer.step < a.steps:  # a budget that is not a multiple of the segment
        peer.run(a.steps - peer.step)
        peer_val[peer.step] = peer.validate(peer_val_batches)
    if isinstance(peer, PeerProcess):
        peer.close()
    tokens_step = a.batch * a.block
    seg_ours = [s[1:] for s in seg_ours if len(s) > 1]  # each segment's first interval holds the warm-up
    ours_tps = [tokens_step / statistics.median(s) for s in seg_ours]
    per = peer_segment
    seg_peer = [
        peer.times[i + 1 : i + per] for i in range(0, len(peer.times), per) if peer.times[i + 1 : i + per]
    ]
    peer_tps = [tokens_step / statistics.median(s) for s in seg_peer]
    ratios = [o / p for o, p in zip(ours_tps, peer_tps, strict=False)]
    val = result.validation.get("val_loss", float("nan"))
    out = {
        **info,
        "validation_windows": n_val_rows,
        "objtrain_params": result.parameters,
        "peer_params": peer.params,
        "peer_process": a.peer_process,
        "objtrain_val_loss": val,
        "objtrain_val_curve": ours_val,
        "peer_steps": peer.step,
        "peer_val_loss": peer_val[max(peer_val)],
        "peer_val_curve": peer_val,
        "objtrain_tokens_per_s_segments": ours_tps,
        "peer_tokens_per_s_segments": peer_tps,
        "objtrain_tokens_per_s": statistics.median(ours_tps),
        "peer_tokens_per_s": statistics.median(peer_tps),
        "speed_ratio_segments": ratios,
        "speed_ratio": statistics.median(ratios),
        "objtrain_loop_tokens_per_s_reported": result.tokens_per_s,
        "wall_s_both": wall,
        "target_met": bool(val <= 1.88 and statistics.median(ratios) >= 1.5),
    }
    print(
        f"nanogpt: objtrain val {val:.4f} (target <= 1.88; nanoGPT reports ~1.88), peer (HF GPT-2) val "
        f"{out['peer_val_loss']:.4f} after {peer.step} steps; params {out['objtrain_params'] / 1e6:.2f}M vs "
        f"{out['peer_params'] / 1e6:.2f}M\n"
        f"nanogpt: {out['objtrain_tokens_per_s']:,.0f} vs {out['peer_tokens_per_s']:,.0f} tokens/s "
        f"(median of segment medians) -> x{out['speed_ratio']:.2f} (target x1.5); per segment "
        + ", ".join(f"x{r:.2f}" for r in ratios)
        + f"; -> {'met' if out['target_met'] else 'NOT met'}",
        flush=True,
    )
    return out


# ------------------------------------------------------------------------------------- 2. loop overhead

OVERHEAD = [("clm", "decoder"), ("mlm", "encoder"), ("span", "encdec"), ("ul2", "encdec")]


def shapes_config(
    store: Path, objective: str, kind: str, a: argparse.Namespace, steps: int, **extra: Any
) -> Any:
    """bench_models.py's model (4 layers, SwiGLU at 8/3 width) at --ov-width, --ov-seq, --ov-batch."""
    overrides: dict[str, Any] = {"d_model": a.ov_width, "n_layer": 4, "n_head": 4, "d_ff": 0}
    if kind == "encdec":
        overrides["n_decoder_layer"] = 4
    if kind == "encoder":
        overrides |= {"n_segments": 2, "n_classes": 0}
    return train_config(
        store,
        objective,
        kind,
        model={"overrides": overrides},
        batch={"seq_len": a.ov_seq, "batch_size": a.ov_batch},
        budget={"steps": steps},
        workers=1,
        **extra,
    )


def interleaved_step_times(cfg: Any, run_dir: Path, runner: Any) -> dict[str, list[float]]:
    """The loop's steps and bare steps, one after the other: after each of the loop's per-step records its
    hook runs one bare step, so the two see the same machine from second to second (this machine's speed
    drifts by 10-20% over tens of seconds, which blocks of whole runs cannot cancel). A loop step is timed
    from the end of the previous hook to its record: everything the loop does per step. CPU time is this
    process's (the loader worker's own time is not in it)."""
    times: dict[str, list[float]] = {"loop": [], "loop_cpu": [], "bare": [], "bare_cpu": []}
    mark: list[float] = []

    def hook(record: dict[str, Any]) -> None:
        if record.get("split") == "val":
            return
        wall, cpu = time.perf_counter(), time.process_time()
        if mark:
            times["loop"].append(wall - mark[0])
            times["loop_cpu"].append(cpu - mark[1])
        wall_b, cpu_b = bare_step(runner)
        times["bare"].append(wall_b)
        times["bare_cpu"].append(cpu_b)
        mark[:] = [time.perf_counter(), time.process_time()]

    run_loop(cfg, run_dir, hook)
    # the first intervals still warm the loader worker and the allocator: dropped on both sides
    return {k: v[2:] for k, v in times.items()}


def bare_step(runner: Any) -> tuple[float, float]:
    c0 = time.process_time()
    wall = runner.step()
    return wall, time.process_time() - c0


def bare_runner(cfg: Any, run_dir: Path, n_batches: int) -> Any:
    """bench_models.Runner (forward, loss, backward, AdamW) on the model and batches the loop would use."""
    sys.path.insert(0, str(HERE))
    from bench_models import Runner

    from objtrain.data.loader import CorruptedRows, RowSampler
    from objtrain.data.stream import Position
    from objtrain.models.zoo import build_model
    from objtrain.training.loop import prepare

    plan = prepare(cfg, run_dir, force=True)
    stream = plan.source.stream("train", cfg.seed)
    sampler = RowSampler(
        plan.objective,
        plan.seq_len,
        cfg.seed,
        cfg.batch.batch_size,
        plan.micro_batch,
        0,
        1,
        Position(),
        0,
        n_batches,
    )
    rows = CorruptedRows(stream, plan.objective, plan.seq_len, cfg.seed)
    batches = [rows[item][1] for item in sampler]
    cycle = {"i": 0}
    objective = plan.objective

    def loss_fn(model: torch.nn.Module, _: Any) -> torch.Tensor:
        batch = batches[cycle["i"] % len(batches)]
        cycle["i"] += 1
        lo = objective.loss(model(batch), batch)
        return lo.loss_sum / lo.n_targets.clamp(min=1)

    torch.manual_seed(0)
    return Runner(build_model(plan.model_cfg), loss_fn, {}, "fp32")


def bench_overhead(a: argparse.Namespace, work: Path, store: Path) -> dict[str, Any]:
    print(
        f"overhead: the loop (train(), {a.loop_steps} steps, 1 loader worker) vs bench_models' bare step on "
        f"the same model and batches; 4 layers x {a.ov_width} wide, seq {a.ov_seq}, batch {a.ov_batch}, "
        "fp32; one bare step after each loop step, medians",
        flush=True,
    )
    out: dict[str, Any] = {}
    for objective, kind in OVERHEAD:
        cfg = shapes_config(store, objective, kind, a, a.loop_steps)
        runner = bare_runner(cfg, work / "bare", 8)
        runner.step()
        t: dict[str, list[float]] = {"loop": [], "loop_cpu": [], "bare": [], "bare_cpu": []}
        for r in range(a.rounds):
            for key, values in interleaved_step_times(cfg, work / f"loop-{objective}-{r}", runner).items():
                t[key] += values
        tokens = a.ov_batch * a.ov_seq
        loop_tps, bare_tps = tokens / statistics.median(t["loop"]), tokens / statistics.median(t["bare"])
        paired = statistics.median(b / x for b, x in zip(t["bare"], t["loop"], strict=False))
        cpu_ratio = statistics.median(t["bare_cpu"]) / statistics.median(t["loop_cpu"])
        out[objective] = {
            "model_kind": kind,
            "loop_tokens_per_s": loop_tps,
            "bare_tokens_per_s": bare_tps,
            "ratio": loop_tps / bare_tps,
            "paired_ratio": paired,
            "loop_cpu_s_per_step": statistics.median(t["loop_cpu"]),
            "bare_cpu_s_per_step": statistics.median(t["bare_cpu"]),
            "cpu_ratio": cpu_ratio,
            "loop_step_s_quartiles": statistics.quantiles(t["loop"], n=4),
            "bare_step_s_quartiles": statistics.quantiles(t["bare"], n=4),
            # the verdict on the step-by-step ratio: adjacent steps share the machine's speed of the moment,
            # where the two medians can differ by the drift between them
            "target_met": paired >= 0.95,
        }
        q_l, q_b = out[objective]["loop_step_s_quartiles"], out[objective]["bare_step_s_quartiles"]
        print(
            f"  {objective:5s} ({kind:7s}) loop vs bare step by step x{paired:.3f} "
            f"(target x0.95: {'met' if out[objective]['target_met'] else 'NOT'}); "
            f"medians {loop_tps:7,.0f} vs {bare_tps:7,.0f} tokens/s (x{loop_tps / bare_tps:.3f}); "
            f"step quartiles loop {q_l[0]:.3f}/{q_l[1]:.3f}/{q_l[2]:.3f}s, "
            f"bare {q_b[0]:.3f}/{q_b[1]:.3f}/{q_b[2]:.3f}s; CPU time per step (this process) "
            f"loop {statistics.median(t['loop_cpu']):.3f}s vs bare {statistics.median(t['bare_cpu']):.3f}s"
            f" -> x{cpu_ratio:.3f} ({load_percent()})",
            flush=True,
        )
    return out


# ----------------------------------------------------------------------------------------- 3. data wait


def every_objective() -> list[str]:
    from objtrain.objectives.registry import OBJECTIVES

    return list(OBJECTIVES)


def wait_share(run_dir: Path) -> tuple[float, float, int]:
    """(Σ wait / Σ step time over steps 2.., step 1's wait share, steps) from RUN/metrics.jsonl."""
    waits, times, first = 0.0, 0.0, float("nan")
    steps = 0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "data_wait_frac" not in r:
            continue
        step_s = r["tokens"] / r["step"] / r["tokens_per_s"]  # tokens per step / tokens per second
        if r["step"] == 1:
            first = r["data_wait_frac"]
            continue
        waits += r["data_wait_frac"] * step_s
        times += step_s
        steps += 1
    return waits / max(times, 1e-12), first, steps


def loader_rows_per_s(store: Path, objective: str, seq_len: int, seconds: float) -> float:
    """Rows/s of RowSampler + CorruptedRows in this process: the loader's work without a model."""
    from objtrain.data.loader import CorruptedRows, RowSampler
    from objtrain.data.store_reader import DataSource
    from objtrain.data.stream import Position
    from objtrain.objectives.registry import build_objective

    source = DataSource(store)
    obj = build_objective(objective, source.specials, source.tokenizer)
    stream = source.stream("train", 0)
    sampler = RowSampler(obj, seq_len, 0, 16, 16, 0, 1, Position(), 0, 10**6)
    rows = CorruptedRows(stream, obj, seq_len, 0)
    it = iter(sampler)
    for _ in range(2):
        rows[next(it)]
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += rows[next(it)][1].input_ids.size(0)
    return n / (time.perf_counter() - t0)


def bench_datawait(a: argparse.Namespace, work: Path, store: Path) -> dict[str, Any]:
    from objtrain.models.zoo import model_config
    from objtrain.training.accounting import flops_per_step

    vocab = json.loads((store / "meta.json").read_text())["vocab_size"]
    seq = a.wait_seq
    need: dict[str, float] = {}
    for kind in ("decoder", "encoder", "encdec"):
        cfg = model_config(kind, "small", vocab_size=vocab)
        flops_row = flops_per_step(cfg, 1, seq, seq // 4 if kind == "encdec" else None)
        need[kind] = 0.4 * H100_BF16_PEAK / flops_row
    print(
        f"datawait: every objective, tiny ({a.tiny_steps} steps) and small ({a.small_steps} steps) models, "
        f"seq {seq}, 1 loader worker; share of step time waiting for data over steps 2.. (step 1 holds the "
        f"worker's start). GPU need: the small decoder at 40% of an H100's 989 TFLOPS bf16 eats "
        f"{need['decoder']:,.0f} rows/s of {seq} ({need['decoder'] * seq / 1e6:.1f}M tokens/s)",
        flush=True,
    )
    out: dict[str, Any] = {"gpu_rows_per_s_needed": need, "objectives": {}}
    from objtrain.objectives.registry import objective_class

    for objective in every_objective():
        kind = objective_class(objective).model_kinds[0]
        row: dict[str, Any] = {"model_kind": kind}
        for size, steps, batch in (("tiny", a.tiny_steps, 16), ("small", a.small_steps, 8)):
            cfg = train_config(
                store,
                objective,
                None,
                model={"size": size},
                batch={"seq_len": seq, "batch_size": batch},
                budget={"steps": steps},
                workers=1,
                device=a.wait_device,
                precision={"dtype": "fp32" if a.wait_device == "cpu" else "bf16"},
            )
            run = work / f"wait-{objective}-{size}-{seq}"
            run_loop(cfg, run)
            share, first, n = wait_share(run)
            row[size] = {"wait_share": share, "first_step_wait_share": first, "steps_measured": n}
        rate = loader_rows_per_s(store, objective, seq, a.loader_seconds)
        row["loader_rows_per_s"] = rate
        row["workers_for_h100_small_decoder"] = math.ceil(need["decoder"] / rate)
        row["workers_for_h100_small_own_kind"] = math.ceil(need[kind] / rate)
        row["target_met"] = bool(row["tiny"]["wait_share"] < 0.02 and row["small"]["wait_share"] < 0.02)
        out["objectives"][objective] = row
        print(
            f"  {objective:9s} ({kind:7s}) wait tiny {row['tiny']['wait_share']:6.2%} "
            f"small {row['small']['wait_share']:6.2%} (step 1: {row['tiny']['first_step_wait_share']:.0%} / "
            f"{row['small']['first_step_wait_share']:.0%}) {'met' if row['target_met'] else 'NOT met'}; "
            f"loader {rate:7,.0f} rows/s in one process -> {row['workers_for_h100_small_decoder']} worker(s) "
            f"for the H100 small decoder ({load_percent()})",
            flush=True,
        )
    return out


# --------------------------------------------------------------------------------------------- 4. MTP memory


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def mtp_child(heads: int, mode: str, vocab: int, seq: int, batch: int) -> dict[str, Any]:
    """One step's peak RSS over the RSS before it, in this fresh process (run by `bench_mtp`)."""
    from objtrain.models.zoo import build_model, model_config
    from objtrain.objectives.registry import build_objective
    from objtrain.specials import Specials
    from objtrain.training.config import OptimConfig
    from objtrain.training.loop import forward_backward
    from objtrain.training.optim import build_optimizer

    torch.manual_seed(0)
    specials = Specials()
    objective = build_objective("mtp", specials, None, "decoder", {"n": heads})
    model = build_model(model_config("decoder", "tiny", {"mtp_heads": heads}, vocab_size=vocab)).train()
    optimizer = build_optimizer(model, OptimConfig(), torch.device("cpu"))
    rows = torch.randint(specials.first_ordinary, vocab, (batch, seq + 1))
    b = objective(rows, torch.zeros_like(rows), torch.arange(batch), 0)
    n = float(b.n_targets)
    cpu = torch.device("cpu")

    def step() -> None:
        if mode == "sequential":  # the loop's own path: trunk once, each head's forward and backward in turn
            forward_backward(model, objective, b, 1 / n, cpu, "fp32", None)
        else:  # every head's logits alive at once, one backward
            lo = objective.loss(model(b), b)
            (lo.loss_sum / n).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # Adam's moments exist from here on, as in any step after the first
    before = status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    step()
    peak = status_kib("VmHWM")
    return {"heads": heads, "mode": mode, "delta_bytes": (peak - before) * 1024, "rss_before": before * 1024}


def bench_mtp(a: argparse.Namespace) -> dict[str, Any]:
    print(
        f"mtp: one training step's peak RSS over the RSS before it (fresh process each, median of "
        f"{a.mtp_repeats}); tiny decoder, V {a.mtp_vocab}, T {a.mtp_seq}, batch {a.mtp_batch}: one logits "
        f"tensor is {a.mtp_batch * a.mtp_seq * a.mtp_vocab * 4 / 2**20:.0f} MiB",
        flush=True,
    )
    cases = [(1, "sequential"), (4, "sequential"), (4, "joint")]
    deltas: dict[str, list[float]] = {f"{h}-{m}": [] for h, m in cases}
    for _ in range(a.mtp_repeats):
        for heads, mode in cases:  # interleaved
            cmd = [sys.executable, str(Path(__file__).resolve()), "--mtp-child", str(heads), mode]
            cmd += ["--threads", str(a.threads)] if a.threads else []
            cmd += [
                "--mtp-vocab",
                str(a.mtp_vocab),
                "--mtp-seq",
                str(a.mtp_seq),
                "--mtp-batch",
                str(a.mtp_batch),
            ]
            proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
            deltas[f"{heads}-{mode}"].append(json.loads(proc.stdout.strip().splitlines()[-1])["delta_bytes"])
    med = {k: statistics.median(v) for k, v in deltas.items()}
    ratio = med["4-sequential"] / med["1-sequential"]
    out = {
        "vocab": a.mtp_vocab,
        "seq": a.mtp_seq,
        "batch": a.mtp_batch,
        "delta_bytes": deltas,
        "ratio_4_vs_1": ratio,
        "ratio_joint_4_vs_1": med["4-joint"] / med["1-sequential"],
        "target_met": ratio <= 1.1,
    }
    print(
        f"mtp: step peak over baseline: 1 head {med['1-sequential'] / 2**20:,.0f} MiB, 4 heads (the loop's "
        f"sequential backward) {med['4-sequential'] / 2**20:,.0f} MiB -> x{ratio:.3f} (target <= x1.1: "
        f"{'met' if ratio <= 1.1 else 'NOT met'}); for contrast 4 heads with one joint backward "
        f"{med['4-joint'] / 2**20:,.0f} MiB (x{out['ratio_joint_4_vs_1']:.2f})",
        flush=True,
    )
    return out


def bench_gpu() -> dict[str, Any]:
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        print(
            f"gpu: {name} present; the bf16 MFU comparison against LlamaForCausalLM is not in this script yet"
        )
        return {"gpu": name, "measured": False}
    print(
        "gpu: no GPU on this machine (none is lent to this project), so the bf16 small/base decoder MFU "
        "target (>= 40% on base, >= 1.3x a LlamaForCausalLM loop) is not measured"
    )
    return {"gpu": None, "measured": False}


# --------------------------------------------------------------------------------------------------- main


# ------------------------------------------------------------------------------------------- 6. precision


def loop_rate(cfg: Any, run_dir: Path) -> float:
    """Median tokens/s of a run's steps from the tenth on (the first hold warm-up and kernel builds)."""
    rates: list[float] = []

    def hook(record: dict[str, Any]) -> None:
        if "loss" in record and record.get("step", 0) >= 10 and record.get("tokens_per_s"):
            rates.append(float(record["tokens_per_s"]))

    run_loop(cfg, run_dir, hook)
    return statistics.median(rates)


def bench_precision(a: argparse.Namespace, work: Path, store: Path) -> dict[str, Any]:
    from objtrain.training import accounting
    from objtrain.training.loop import prepare

    peaks = {d: accounting.measured_peak_flops("cpu", d) for d in ("fp32", "bf16")}
    print(
        f"precision: matmul on this CPU fp32 {peaks['fp32'] / 1e9:,.0f} GFLOP/s, "
        f"bf16 {peaks['bf16'] / 1e9:,.0f} (x{peaks['bf16'] / peaks['fp32']:.2f})",
        flush=True,
    )
    out: dict[str, Any] = {"matmul_flops": peaks}
    for size, batch, seq in (("tiny", 32, 128), ("small", 16, 256)):
        steps = a.precision_steps if size == "tiny" else max(12, a.precision_steps // 3)
        rates: dict[str, list[float]] = {"fp32": [], "bf16": []}

        def config(
            dtype: str, size: str = size, batch: int = batch, seq: int = seq, steps: int = steps
        ) -> Any:
            shape = {"model": {"size": size}, "batch": {"seq_len": seq, "batch_size": batch}}
            return train_config(
                store, "clm", "decoder", **shape, budget={"steps": steps}, precision={"dtype": dtype}
            )

        for dtype in ("fp32", "bf16", "fp32", "bf16"):
            rates[dtype].append(loop_rate(config(dtype), work / f"precision-{size}-{dtype}"))
        best = {d: max(r) for d, r in rates.items()}
        auto_cfg = config("auto")
        plan = prepare(auto_cfg, work / f"precision-{size}-auto", force=True)
        plan.release()
        faster = max(best, key=best.get)
        within = best[plan.dtype] >= 0.9 * best[faster]
        print(
            f"precision: {size} {batch} x {seq}: fp32 {best['fp32']:,.0f} tok/s, bf16 {best['bf16']:,.0f} "
            f"(bf16/fp32 x{best['bf16'] / best['fp32']:.2f}); auto picks {plan.dtype} "
            f"({plan.dtype_note.removeprefix('auto: ')}): {'within' if within else 'NOT within'} 10% of the "
            f"faster ({load_percent()})",
            flush=True,
        )
        out[size] = {
            "tokens_per_s": rates,
            "auto": plan.dtype,
            "auto_note": plan.dtype_note,
            "within": within,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--only", nargs="+", default=["nanogpt", "overhead", "datawait", "mtp", "gpu", "precision"]
    )
    ap.add_argument("--precision-steps", type=int, default=40, help="precision: steps per tiny run")
    ap.add_argument("--steps", type=int, default=2000, help="nanogpt: optimizer steps")
    ap.add_argument(
        "--segment",
        type=int,
        default=100,
        help="nanogpt: steps per alternating segment (short: both sides see the same machine speed)",
    )
    ap.add_argument("--val-every", type=int, default=500, help="nanogpt: validation interval (steps)")
    ap.add_argument(
        "--nanogpt-workers",
        type=int,
        default=1,
        help="nanogpt: loader workers (0: corrupt in the training process, as the peer samples its windows)",
    )
    ap.add_argument(
        "--peer-steps",
        type=int,
        default=0,
        help="nanogpt: peer steps per segment (0 = the segment: full budget)",
    )
    ap.add_argument(
        "--peer-process",
        choices=["own", "shared"],
        default="own",
        help="nanogpt: the peer in a process of its own (as a user runs it) or inside objtrain's",
    )
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument(
        "--d-ff",
        type=int,
        default=0,
        help="nanogpt: SwiGLU width; 0 = 8/3 x width (GPT-2's 4x in parameters)",
    )
    ap.add_argument(
        "--modes",
        nargs="+",
        choices=["eager", "compiled"],
        default=["eager", "compiled"],
        help="nanogpt: both sides eager, then both compiled (objtrain --compile, the peer torch.compile)",
    )
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=1, help="overhead: loop runs per objective")
    ap.add_argument("--loop-steps", type=int, default=24, help="overhead: steps per loop run")
    ap.add_argument("--ov-width", type=int, default=256, help="overhead: model width (bench_models: 256)")
    ap.add_argument("--ov-seq", type=int, default=256, help="overhead: sequence length (bench_models: 256)")
    ap.add_argument("--ov-batch", type=int, default=16, help="overhead: rows per step (bench_models: 16)")
    ap.add_argument("--tiny-steps", type=int, default=20, help="datawait: steps at the tiny size")
    ap.add_argument("--small-steps", type=int, default=4, help="datawait: steps at the small size")
    ap.add_argument("--wait-seq", type=int, default=256, help="datawait: sequence length (e.g. 1024)")
    ap.add_argument("--wait-device", default="cpu", help="datawait: where the model trains (cuda: bf16)")
    ap.add_argument("--loader-seconds", type=float, default=2.0, help="datawait: seconds per loader rate")
    ap.add_argument("--mtp-vocab", type=int, default=32000)
    ap.add_argument("--mtp-seq", type=int, default=1024)
    ap.add_argument("--mtp-batch", type=int, default=2)
    ap.add_argument("--mtp-repeats", type=int, default=2)
    ap.add_argument("--mtp-child", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--threads", type=int, default=0, help="torch threads for both sides; 0 = torch's default"
    )
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.mtp_child:
        heads, mode = a.mtp_child
        print(json.dumps(mtp_child(int(heads), mode, a.mtp_vocab, a.mtp_seq, a.mtp_batch)))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {load_percent()} at start")
    out: dict[str, Any] = {"threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory(prefix="bench_train-") as tmp:
        work = Path(tmp)
        if "nanogpt" in a.only:
            out["nanogpt"] = bench_nanogpt(a, work)
        if {"overhead", "datawait", "precision"} & set(a.only):
            from objtrain.data.default import default_store

            store = default_store()
            if "precision" in a.only:
                out["precision"] = bench_precision(a, work, store)
            if "overhead" in a.only:
                out["overhead"] = bench_overhead(a, work, store)
            if "datawait" in a.only:
                out["datawait"] = bench_datawait(a, work, store)
        if "mtp" in a.only:
            out["mtp"] = bench_mtp(a)
        if "gpu" in a.only:
            out["gpu"] = bench_gpu()
    print(f"{load_percent()} at the end")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
