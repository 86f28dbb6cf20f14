"""Training-step throughput of the zoo models against Hugging Face transformers, side by side.

For each kind (decoder vs GPT2LMHeadModel, encoder vs BertForMaskedLM, encdec vs
T5ForConditionalGeneration) at the same shapes and random init, one training step = forward, loss,
backward, AdamW. Measured in fp32 and under bf16 autocast, ours eager and ours with per-block
torch.compile (`model.compile_blocks()`), HF eager. Measurements are interleaved (ours, HF, ours, HF, ...)
because the machine is shared; the report gives medians and ratios. Model FLOPs utilisation is the
FLOPs of one step (counted by torch.utils.flop_counter, the same counter for both) per second, over the
matmul peak measured in this run for that dtype.

    .venv/bin/python benchmarks/bench_models.py                 # 4 layers x 256 wide x seq 256 x batch 16
    .venv/bin/python benchmarks/bench_models.py --kinds decoder --rounds 3 --json out.json

`--attention` measures instead the two kernels of masked attention on packed rows (several documents a
row): SDPA with a dense mask against FlexAttention block masks (`attention_kernel` sdpa / flex), for causal,
prefix, bidirectional and encoder-decoder attention, at `--attention-seqs`. On CUDA: a bf16 training step
(forward, backward) of each, and how far apart their logits are; without CUDA it says so and times the
forward only (FlexAttention has no CPU backward). `attention_kernels(...)` is the function other
benchmarks call (benchmarks/bench_gpu.py).

    .venv/bin/python benchmarks/bench_models.py --attention --size small --attention-seqs 256 1024
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from objtrain.batch import Batch, positions_of
from objtrain.models import build_model, model_config

IGNORE = -100


def matmul_peak(dtype: torch.dtype, n: int = 1024, repeats: int = 10) -> float:
    """Best observed FLOP/s of an n x n x n matmul in `dtype` (the machine's practical peak)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


@dataclass
class Shapes:
    layers: int
    width: int
    heads: int
    seq: int
    batch: int
    vocab: int
    decoder_seq: int  # encdec decoder length (span-corruption targets are shorter than inputs)


def our_model(kind: str, s: Shapes) -> nn.Module:
    # d_ff 0 = 8/3 * width rounded to 64: SwiGLU's three matrices cost about what HF's two 4x matrices do
    overrides = {"d_model": s.width, "n_layer": s.layers, "n_head": s.heads, "d_ff": 0}
    if kind == "encdec":
        overrides["n_decoder_layer"] = s.layers
    if kind == "encoder":
        overrides |= {"n_segments": 2, "n_classes": 0}
    return build_model(model_config(kind, "debug", overrides, vocab_size=s.vocab))


def hf_model(kind: str, s: Shapes) -> nn.Module:
    import transformers as tf

    if kind == "decoder":
        cfg = tf.GPT2Config(
            vocab_size=s.vocab,
            n_positions=s.seq,
            n_embd=s.width,
            n_layer=s.layers,
            n_head=s.heads,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        return tf.GPT2LMHeadModel(cfg)
    if kind == "encoder":
        cfg = tf.BertConfig(
            vocab_size=s.vocab,
            hidden_size=s.width,
            num_hidden_layers=s.layers,
            num_attention_heads=s.heads,
            intermediate_size=4 * s.width,
            max_position_embeddings=s.seq,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        return tf.BertForMaskedLM(cfg)
    cfg = tf.T5Config(
        vocab_size=s.vocab,
        d_model=s.width,
        d_kv=s.width // s.heads,
        d_ff=4 * s.width,
        num_layers=s.layers,
        num_decoder_layers=s.layers,
        num_heads=s.heads,
        dropout_rate=0.0,
        feed_forward_proj="relu",
    )
    return tf.T5ForConditionalGeneration(cfg)


def make_data(kind: str, s: Shapes, g: torch.Generator) -> dict[str, Tensor]:
    ids = torch.randint(20, s.vocab, (s.batch, s.seq), generator=g)
    data = {"ids": ids}
    if kind == "decoder":
        data["labels"] = torch.roll(ids, -1, dims=1)
    elif kind == "encoder":
        chosen = torch.rand(ids.shape, generator=g) < 0.15
        data["labels"] = torch.where(chosen, ids, IGNORE)
        data["ids"] = torch.where(chosen, 4, ids)
    else:
        data["dec"] = torch.randint(20, s.vocab, (s.batch, s.decoder_seq), generator=g)
        data["labels"] = torch.roll(data["dec"], -1, dims=1)
    return data


def our_loss(kind: str, model: nn.Module, d: dict[str, Tensor]) -> Tensor:
    ids = d["ids"]
    B, T = ids.shape
    pos = torch.arange(T).expand(B, T)
    attention = "causal" if kind == "decoder" else "bidirectional"
    batch = Batch(ids, d["labels"], pos, torch.zeros_like(ids), attention, single_document=True)
    if kind == "encoder":
        batch.segment_ids = torch.zeros_like(ids)
    elif kind == "encdec":
        S = d["dec"].size(1)
        batch.decoder_input_ids = d["dec"]
        batch.decoder_positions = torch.arange(S).expand(B, S)
        batch.decoder_document_ids = torch.zeros_like(d["dec"])
        batch.decoder_single_document = True
    logits = model(batch).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), batch.labels.flatten(), ignore_index=IGNORE)


def hf_loss(kind: str, model: nn.Module, d: dict[str, Tensor]) -> Tensor:
    # logits from HF, the loss computed the same way as ours (HF's own labels= path shifts internally)
    if kind == "encdec":
        logits = model(input_ids=d["ids"], decoder_input_ids=d["dec"]).logits
    else:
        logits = model(input_ids=d["ids"]).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), d["labels"].flatten(), ignore_index=IGNORE)


def autocast(dtype: str) -> contextlib.AbstractContextManager[Any]:
    if dtype == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class Runner:
    """One model + optimizer + data; `step()` is one timed training step."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[nn.Module, dict[str, Tensor]], Tensor],
        data: dict[str, Tensor],
        dtype: str,
    ) -> None:
        self.model, self.loss_fn, self.data, self.dtype = model.train(), loss_fn, data, dtype
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

    def step(self) -> float:
        t0 = time.perf_counter()
        with autocast(self.dtype):
            loss = self.loss_fn(self.model, self.data)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    def flops(self) -> float:
        counter = FlopCounterMode(display=False)
        with counter, autocast(self.dtype):
            self.loss_fn(self.model, self.data).backward()
        self.opt.zero_grad(set_to_none=True)
        return float(counter.get_total_flops())


ATTENTION_CASES = (
    ("decoder", "causal"),
    ("decoder", "prefix"),
    ("encoder", "bidirectional"),
    ("encdec", "bidirectional"),
)


def packed_rows(batch: int, seq: int, mean_doc: int, g: torch.Generator) -> Tensor:
    """(batch, seq) document ids: rows packed with documents of random lengths around `mean_doc`."""
    rows = []
    for _ in range(batch):
        ids, d = [], 0
        while len(ids) < seq:
            n = int(torch.randint(mean_doc // 4 + 1, 2 * mean_doc, (1,), generator=g))
            ids.extend([d] * n)
            d += 1
        rows.append(ids[:seq])
    return torch.tensor(rows)


def packed_batch(kind: str, attention: str, batch: int, seq: int, vocab: int, g: torch.Generator) -> Batch:
    docs = packed_rows(batch, seq, max(seq // 4, 8), g)
    ids = torch.randint(20, vocab, docs.shape, generator=g)
    positions = positions_of(docs)
    prefix = positions < torch.randint(1, 32, docs.shape, generator=g) if attention == "prefix" else None
    out = Batch(ids, ids, positions, docs, attention, prefix_mask=prefix)  # type: ignore[arg-type]
    if kind == "encoder":
        out.segment_ids = torch.zeros_like(ids)
    if kind == "encdec":  # targets a quarter as long, one span per encoder document
        S = seq // 4
        dec_docs = (torch.arange(S)[None] * (docs.amax(dim=1, keepdim=True) + 1)) // S
        out.decoder_input_ids = torch.randint(20, vocab, dec_docs.shape, generator=g)
        out.decoder_document_ids = dec_docs
        out.decoder_positions = positions_of(dec_docs)
        out.labels = out.decoder_input_ids
    return out.mark_layout()


def _kernel_step(model: nn.Module, b: Batch, cuda: bool) -> None:
    """A bf16 training step's forward and backward on CUDA; a forward without gradients elsewhere."""
    if cuda:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(b).logits
        F.cross_entropy(logits.flatten(0, 1).float(), b.labels.flatten()).backward()
        model.zero_grad(set_to_none=True)
    else:
        with torch.no_grad():
            model(b)


def attention_kernels(
    device: str | torch.device | None = None,
    size: str = "small",
    seqs: tuple[int, ...] = (256, 1024),
    batch: int = 16,
    vocab: int = 8192,
    steps: int = 10,
    cases: tuple[tuple[str, str], ...] = ATTENTION_CASES,
) -> list[dict[str, Any]]:
    """Masked SDPA against FlexAttention on packed rows, per (model kind, attention) and sequence length.

    Each row: `sdpa_s` and `flex_s` (median seconds of a bf16 forward+backward step on CUDA; of an fp32
    forward without gradients elsewhere, `what` says which), `flex_speedup`, and `max_abs_diff` of the two
    kernels' logits (same weights, same batch). Device: cuda when there is one, else cpu."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    rows: list[dict[str, Any]] = []
    for seq in seqs:
        for kind, attention in cases:
            g = torch.Generator().manual_seed(seq)
            b = packed_batch(kind, attention, batch, seq, vocab, g).to(dev)
            models = {}
            for kernel in ("sdpa", "flex"):
                torch.manual_seed(0)
                cfg = model_config(kind, size, {"attention_kernel": kernel}, vocab_size=vocab)
                models[kernel] = build_model(cfg).to(dev)

            with torch.no_grad():
                ctx = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
                with ctx:
                    diff = (models["flex"](b).logits.float() - models["sdpa"](b).logits.float()).abs().max()
            times: dict[str, list[float]] = {k: [] for k in models}
            for model in models.values():
                for _ in range(3):  # warm-up (flex compiles its kernel and block-mask builder here)
                    _kernel_step(model, b, cuda)
            for _ in range(steps):
                for name, model in models.items():  # interleaved
                    if cuda:
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    _kernel_step(model, b, cuda)
                    if cuda:
                        torch.cuda.synchronize()
                    times[name].append(time.perf_counter() - t0)
            sdpa_s, flex_s = (statistics.median(times[k]) for k in ("sdpa", "flex"))
            row = {
                "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
                "what": "bf16 forward+backward" if cuda else "fp32 forward (no CUDA)",
                "kind": kind,
                "attention": attention,
                "seq": seq,
                "batch": batch,
                "docs_per_row": float((b.document_ids.amax(dim=1) + 1).float().mean()),
                "sdpa_s": sdpa_s,
                "flex_s": flex_s,
                "flex_speedup": sdpa_s / flex_s,
                "max_abs_diff": float(diff),
            }
            rows.append(row)
            print(
                f"{row['what']:22s} {kind:8s} {attention:13s} T {seq:5d}  sdpa {sdpa_s * 1e3:8.2f} ms  "
                f"flex {flex_s * 1e3:8.2f} ms  x{row['flex_speedup']:.2f}  "
                f"max |diff| {row['max_abs_diff']:.1e}  "
                f"({row['docs_per_row']:.1f} documents a row)",
                flush=True,
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", nargs="+", default=["decoder", "encoder", "encdec"])
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--decoder-seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per variant per round")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--attention", action="store_true", help="masked SDPA vs FlexAttention on packed rows")
    ap.add_argument("--size", default="small", help="--attention: model size")
    ap.add_argument("--attention-seqs", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--device", default=None, help="--attention: device (default: cuda when there is one)")
    args = ap.parse_args()
    if args.attention:
        if not torch.cuda.is_available() and args.device in (None, "cpu"):
            print("no CUDA here: measuring the CPU forward only (FlexAttention has no CPU backward)")
        rows = attention_kernels(args.device, args.size, tuple(args.attention_seqs), args.batch, args.vocab)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"torch": torch.__version__, "attention": rows}, f, indent=2)
        return
    torch._logging.set_logs(graph_breaks=False, dynamo=logging.ERROR)
    torch.manual_seed(0)
    s = Shapes(args.layers, args.width, args.heads, args.seq, args.batch, args.vocab, args.decoder_seq)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; shapes {s}")
    peaks = {"fp32": [], "bf16": []}
    results: list[dict[str, Any]] = []
    for kind in args.kinds:
        data = make_data(kind, s, torch.Generator().manual_seed(1))
        tokens = s.batch * s.seq + (s.batch * s.decoder_seq if kind == "encdec" else 0)
        for dtype in args.dtypes:
            runners: dict[str, Runner] = {}
            torch.manual_seed(0)
            runners["ours"] = Runner(our_model(kind, s), lambda m, d, k=kind: our_loss(k, m, d), data, dtype)
            if not args.no_compile:
                torch.manual_seed(0)
                compiled = our_model(kind, s)
                compiled.compile_blocks()  # type: ignore[operator]
                runners["ours+compile"] = Runner(
                    compiled, lambda m, d, k=kind: our_loss(k, m, d), data, dtype
                )
                # the whole step's forward (embedding, blocks, head, loss) under one torch.compile, one graph:
                # the rows are one document each, said by the batch's layout flags (Batch.mark_layout)
                torch.manual_seed(0)
                full = torch.compile(lambda m, d, k=kind: our_loss(k, m, d))
                runners["ours+compile-all"] = Runner(our_model(kind, s), full, data, dtype)
            runners["hf"] = Runner(hf_model(kind, s), lambda m, d, k=kind: hf_loss(k, m, d), data, dtype)
            # FLOPs counted eagerly (compiling under FlopCounterMode would compile the counting mode into
            # the graphs); the compiled variants run the same arithmetic as "ours"
            flops = {name: r.flops() for name, r in runners.items() if name in ("ours", "hf")}
            flops |= {name: flops["ours"] for name in runners if name.startswith("ours+")}
            t0 = time.perf_counter()
            for r in runners.values():
                r.step()  # warm-up (and compilation)
                r.step()
            warm = time.perf_counter() - t0
            times: dict[str, list[float]] = {name: [] for name in runners}
            for _ in range(args.rounds):
                key = "fp32" if dtype == "fp32" else "bf16"
                peaks[key].append(matmul_peak(torch.float32 if key == "fp32" else torch.bfloat16))
                for name, r in runners.items():  # interleaved: ours, ours+compile, hf, ours, ...
                    times[name].extend(r.step() for _ in range(args.steps))
            peak = statistics.median(peaks["fp32" if dtype == "fp32" else "bf16"])
            hf_tps = tokens / statistics.median(times["hf"])
            for name, ts in times.items():
                med = statistics.median(ts)
                row = {
                    "kind": kind,
                    "dtype": dtype,
                    "model": name,
                    "step_s": med,
                    "tokens_per_s": tokens / med,
                    "vs_hf": tokens / med / hf_tps,
                    "gflop_per_step": flops[name] / 1e9,
                    "mfu": flops[name] / med / peak,
                    "params": sum(p.numel() for p in runners[name].model.parameters()),
                }
                results.append(row)
                print(
                    f"{kind:8s} {dtype:5s} {name:16s} {row['tokens_per_s']:9.0f} tok/s  "
                    f"x{row['vs_hf']:.2f} vs HF  MFU {row['mfu']:6.1%}  "
                    f"({row['gflop_per_step']:.1f} GFLOP/step, {row['params'] / 1e6:.2f}M params)",
                    flush=True,
                )
            print(f"         (warm-up incl. compile {warm:.0f}s)", flush=True)
    peak_report = {k: statistics.median(v) / 1e9 for k, v in peaks.items() if v}
    print(
        "matmul peak GFLOP/s (median over rounds): "
        + ", ".join(f"{k} {v:.1f}" for k, v in peak_report.items())
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shapes": vars(s), "peak_gflops": peak_report, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
