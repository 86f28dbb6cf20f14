"""Evaluation: bits per byte checked against an independent computation, and eval speed.

1. Trains a checkpoint with `objtrain train` (a tiny CLM decoder, a few hundred steps on the embedded
   standard-library store), or takes `--checkpoint`.
2. Runs `objtrain eval --format json` on the first `--docs` documents of the store's valid split, with
   disjoint and with overlapping windows.
3. Recomputes bits per byte independently: one window at a time in a plain loop (window ends
   e_1 = min(L, N), e_k+1 = min(e_k + S, N), targets (e_k-1, e_k]), each window through `Decoder.logits`,
   log-softmax in float64, and the bytes as the UTF-8 length of the decoded documents (not the per-token
   byte table `eval` uses). The two must agree to 1e-6.
4. Eval tokens/s (scored targets per second of the left-to-right pass) against the training step's forward
   (train mode, autograd on, loss included) over the same (rows, window) shape, interleaved, medians.

    .venv/bin/python benchmarks/bench_eval.py
    .venv/bin/python benchmarks/bench_eval.py --steps 300 --docs 8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from objtrain.batch import Batch
from objtrain.data.default import default_store
from objtrain.data.store import TokenStore
from objtrain.evaluation import lm
from objtrain.models.checkpoint import load_checkpoint

BIN = Path(sys.executable).parent


def objtrain(*args: str) -> str:
    exe = BIN / "objtrain"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "objtrain"]
    done = subprocess.run([*command, *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"objtrain {' '.join(args[:2])} failed:\n{done.stderr}")
    return done.stdout


def independent_bpb(model: Any, docs: list[np.ndarray], texts: list[str], eos: int, L: int, S: int) -> dict:
    """Summed token log-likelihoods over the same windows, written from the definitions (no shared code)."""
    nll, targets = 0.0, 0
    with torch.no_grad():
        for doc in docs:
            x = [eos, *doc.tolist()]  # x_0 = EOS, then the document's N tokens
            n = len(doc)
            prev_end, end = 0, min(L, n)
            while True:
                start = max(0, end - L)
                ids = torch.tensor([x[start:end]])  # inputs x_start .. x_{end-1}
                logp = model.logits(ids)[0].double().log_softmax(dim=-1)
                for i in range(prev_end + 1, end + 1):  # targets (prev_end, end]
                    nll -= float(logp[i - 1 - start, x[i]])
                    targets += 1
                if end == n:
                    break
                prev_end, end = end, min(end + S, n)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    return {"nats": nll, "targets": targets, "bytes": n_bytes, "bits_per_byte": nll / (math.log(2) * n_bytes)}


def throughput(model: Any, docs: list[np.ndarray], window: int, rows: int, repeats: int) -> dict[str, float]:
    """Eval (scoring pass) vs the training step's forward at the same (rows, window) shape."""
    table = torch.ones(model.config.vocab_size, dtype=torch.int64)
    flat, lengths = lm.flatten_documents(docs, 3)
    plan = lm.plan_windows(lengths, window, window)
    full = plan.valid.all(axis=1)
    plan = lm.WindowPlan(plan.inputs[full], plan.valid[full], plan.scored[full], plan.doc[full])
    n = (len(plan) // rows) * rows
    plan = lm.WindowPlan(plan.inputs[:n], plan.valid[:n], plan.scored[:n], plan.doc[:n])
    ids = torch.from_numpy(flat[plan.inputs[:rows]])
    batch = Batch(ids, ids, torch.arange(window).expand(rows, window), torch.zeros_like(ids), "causal")
    labels = torch.from_numpy(flat[np.minimum(plan.inputs[:rows] + 1, len(flat) - 1)])
    ev, tr = [], []
    for _ in range(repeats):  # interleaved, so load on a shared machine hits both alike
        model.eval()
        t0 = time.perf_counter()
        _, targets, _, _ = lm.score_windows(model, flat, plan, table, 3, rows)
        ev.append(targets / (time.perf_counter() - t0))
        model.train()
        t0 = time.perf_counter()
        for _ in range(n // rows):
            logits = model(batch).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1))
            loss.detach()
        tr.append(n * window / (time.perf_counter() - t0))
        model.zero_grad(set_to_none=True)
    model.eval()
    e, t = statistics.median(ev), statistics.median(tr)
    return {
        "eval_tokens_per_s": e,
        "train_forward_tokens_per_s": t,
        "ratio": e / t,
        "rows": rows,
        "windows": n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoint", type=Path, help="Evaluate this checkpoint instead of training one.")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--docs", type=int, default=6, help="Valid documents scored.")
    parser.add_argument("--stride", type=int, default=48, help="The overlapping run's stride.")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default).")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    store = default_store()
    with tempfile.TemporaryDirectory() as tmp:
        if args.checkpoint is None:
            run = Path(tmp) / "clm"
            t0 = time.perf_counter()
            objtrain("train", "--objective", "clm", "--model", args.model, "--steps", str(args.steps),
                     "--seq-len", str(args.seq_len), "--batch-size", "16", "-o", str(run),
                     "logging.sample=false", "logging.tensorboard=false", "validation.every=-1")  # fmt: skip
            print(
                f"trained {args.model} CLM for {args.steps} steps in {time.perf_counter() - t0:.0f} s",
                flush=True,
            )
            checkpoint = run
        else:
            checkpoint = args.checkpoint
        ckpt = load_checkpoint(checkpoint)
        assert ckpt.tokenizer is not None
        split = TokenStore.open(store).split("valid")
        docs = [np.asarray(split.doc(i), dtype=np.int64) for i in range(min(args.docs, len(split)))]
        texts = [ckpt.tokenizer.decode(d.tolist()) for d in docs]
        window = args.seq_len
        results: dict[str, Any] = {"checkpoint": str(checkpoint), "window": window, "docs": len(docs)}
        for stride in (window, args.stride):
            eval_args = ["--max-docs", str(args.docs), "--window", str(window), "--stride", str(stride)]
            eval_args += ["--format", "json", "--skip", "corrupted,infill,probe,samples"]
            out = json.loads(objtrain("eval", str(checkpoint), "--data", str(store), *eval_args))
            ref = independent_bpb(ckpt.model, docs, texts, ckpt.specials.eos, window, stride)
            diff = abs(out["bits_per_byte"] - ref["bits_per_byte"])
            ok = (
                diff <= 1e-6
                and out["scored_tokens"] == ref["targets"]
                and out["scored_bytes"] == ref["bytes"]
            )
            print(
                f"stride {stride:4d}: eval bpb {out['bits_per_byte']:.8f}, "
                f"independent {ref['bits_per_byte']:.8f}, "
                f"|diff| {diff:.1e}; targets {int(out['scored_tokens'])} vs {ref['targets']}, bytes "
                f"{int(out['scored_bytes'])} vs {ref['bytes']}: {'OK' if ok else 'MISMATCH'}",
                flush=True,
            )
            results[f"stride_{stride}"] = {
                "eval": out["bits_per_byte"],
                "independent": ref,
                "diff": diff,
                "ok": ok,
            }
            if not ok:
                raise SystemExit("bits per byte of `objtrain eval` differs from the independent computation")
        speed = throughput(ckpt.model, docs, window, args.rows, args.repeats)
        print(
            f"eval {speed['eval_tokens_per_s']:.0f} tokens/s vs training-step forward "
            f"{speed['train_forward_tokens_per_s']:.0f} tokens/s at ({args.rows} x {window}), "
            f"ratio {speed['ratio']:.2f} ({torch.get_num_threads()} threads, {os.cpu_count()} cpus)",
            flush=True,
        )
        results["speed"] = speed
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
