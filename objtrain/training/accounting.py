"""Throughput accounting: FLOPs per token, the device's peak, MFU, peak memory, bytes per token.

FLOPs (Chowdhery et al. 2022, PaLM, appendix B): `6N + 12·L·d·T` per trained token, N the
parameters a token passes through (the tied embedding counts once, as the output layer; an untied model's
input embedding is a lookup, not a matmul, so it adds none), T the attention length. Grouped-query
attention's narrower k and v projections count at their size; scores and their weighted sum still run
per query head, so the `12·L·d·T` term is unchanged. An encoder-decoder counts encoder parameters per
encoder token and decoder parameters (plus cross attention's q and o) per decoder token; cross attention's
k and v run once per encoder token and decoder layer. `batch_flops` reads the rest from a real batch: a
contrastive batch's two views of each row, an unembedding no loss reads (forward only), the NSP/SOP head,
and sparse prediction's unembedding at the labelled positions only (MLM, GPT-BERT).
Against `torch.utils.flop_counter.FlopCounterMode` (attention through the math kernel, which the counter
sees) the estimate is within 1% for every objective and kind, MTP at 1, 2 and 4 heads included
(`benchmarks/bench_flops.py`).
"""

from __future__ import annotations

import functools
import os
import platform
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.data.tokenizer import Tokenizer
from objtrain.models.config import ModelConfig
from objtrain.objectives.base import Objective

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _block_params(cfg: ModelConfig, cross: bool = False) -> int:
    d = cfg.d_model
    attn = 2 * d * d + 2 * d * cfg.kv_heads * cfg.head_dim  # q and o; k and v (narrower under GQA)
    mlp = 3 * d * cfg.ffn_dim
    norms = 2 * d
    return attn + mlp + norms + ((2 * d * d + d) if cross else 0)  # cross attention's q and o, its norm


def flops_per_step(
    cfg: ModelConfig,
    rows: int,
    input_len: int,
    target_len: int | None = None,
    *,
    logits_backward: bool = True,
    pooler: bool = False,
    logit_positions: int | None = None,
) -> float:
    """Training FLOPs (forward + backward) of one step of `rows` model rows (a contrastive batch holds two
    views of every raw row: pass the model's rows, see `batch_flops`).

    `input_len` is the decoder-only/encoder length T; `target_len` the decoder length S (encoder-decoder).
    `logits_backward=False`: no loss reads the token logits (contrastive pools the hidden states), so the
    unembedding runs forward only. `pooler`: the NSP/SOP head (a d x d layer and the classifier) runs at
    every position. `logit_positions`: how many positions compute token logits (sparse prediction, the
    labelled ones of a `Batch.sparse_logits` batch); None = every position (decoder side of an
    encoder-decoder).
    """
    d, V = cfg.d_model, cfg.vocab_size
    out = (6 if logits_backward else 2) * V * d  # the unembedding, per position with logits
    if cfg.kind == "encdec":
        S = target_len or input_len
        enc = 6 * cfg.n_layer * _block_params(cfg) + 12 * cfg.n_layer * d * input_len
        dec = 6 * cfg.decoder_layers * _block_params(cfg, cross=True) + 12 * cfg.decoder_layers * d * (
            S + input_len
        )
        # Cross attention's k and v project each encoder position once per decoder layer: per encoder
        # token, not per decoder token (span corruption's targets are a fifth of its inputs).
        cross_kv = 6 * cfg.decoder_layers * 2 * d * cfg.kv_heads * cfg.head_dim
        return rows * (input_len * (enc + cross_kv) + S * (dec + out))
    layers = cfg.n_layer + max(cfg.mtp_heads - 1, 0)
    per_token = 6 * layers * _block_params(cfg) + 12 * layers * d * input_len + out * (cfg.mtp_heads - 1)
    if pooler:
        per_token += 6 * (d * d + d * cfg.n_classes)
    with_logits = rows * input_len if logit_positions is None else logit_positions
    return rows * input_len * per_token + with_logits * out


def batch_flops(cfg: ModelConfig, batch: Batch) -> float:
    """Training FLOPs of one (micro-)batch as the model sees it: its rows (both views of a contrastive
    pair), its encoder and decoder lengths, the unembedding backward only where a loss reads the token
    logits, and the pooled head where the batch has sequence labels. Checked against
    `torch.utils.flop_counter` for every objective and model kind (tests/training/test_accounting.py)."""
    rows, input_len = batch.input_ids.shape
    target_len = int(batch.labels.size(1)) if batch.is_encdec else None
    reads_logits = batch.mtp_labels is not None or _any_target(batch.labels)
    return flops_per_step(
        cfg,
        int(rows),
        int(input_len),
        target_len,
        logits_backward=reads_logits,
        pooler=batch.seq_labels is not None and cfg.kind == "encoder",
        logit_positions=_count_targets(batch.labels) if batch.sparse_logits else None,
    )


def _count_targets(labels: torch.Tensor) -> int:
    if labels.device.type == "cpu":
        return int(np.count_nonzero(labels.numpy() != IGNORE))
    return int((labels != IGNORE).sum())


def _any_target(labels: torch.Tensor) -> bool:
    # The loop counts its host batches: numpy on the loader's arrays reads nothing back from a device.
    if labels.device.type == "cpu":
        return bool(np.any(labels.numpy() != IGNORE))
    return bool((labels != IGNORE).any())


def measured_batch_flops(model: nn.Module, objective: Objective, batch: Batch) -> float:
    """Training FLOPs of one batch as `torch.utils.flop_counter` counts them: forward, the objective's loss
    and backward (the NSP/SOP pair loss included). Attention runs through the math kernel, because the
    counter has no formula for the CPU's fused kernel and would leave attention out (16% of a debug
    model's FLOPs at length 64). The yardstick `batch_flops` is checked against."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        loss = objective.loss(model(batch), batch)
        total = loss.loss_sum + (loss.pair_sum if loss.pair_sum is not None else 0.0)
        total.backward()
    return float(counter.get_total_flops())


@functools.lru_cache(maxsize=8)
def measured_peak_flops(device_type: str, dtype_name: str) -> float:
    """FLOP/s of a warmed square matmul on this device and dtype: the yardstick MFU is quoted against when no
    vendor peak is known (CPUs). Said as 'measured matmul' wherever it is reported."""
    device = torch.device(device_type)
    dtype = DTYPES[dtype_name]
    n = 1024 if device_type != "cpu" else 512
    # Its own generator: measured once per process (cached), it must not move the training RNG.
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=g).to(dtype)
    b = torch.randn(n, n, device=device, generator=g).to(dtype)
    for _ in range(2):
        a @ b
    if device_type == "cpu":
        return 2 * n**3 * _cpu_products_per_s(a, b)
    reps = 50
    best = float("inf")
    for _ in range(5):  # best of five: another process on a shared machine only ever slows a window down
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 * reps / best


def _cpu_products_per_s(a: torch.Tensor, b: torch.Tensor) -> float:
    """Threads over the CPU seconds one thread takes for its fastest product: a perfectly parallel
    matmul on every thread, an upper bound of what training attains, so MFU cannot read above 100%.
    Wall time would count the moments other programs hold the cores (a busy start-up shrank the yardstick
    and a quieter step read MFU above 100%); the process's CPU time over several threads counts a thread
    spinning at a barrier for a descheduled sibling as work (under load with libgomp's default spin it read
    a fifth of the peak). One thread's own CPU time has neither: it runs only the product."""
    threads = max(torch.get_num_threads(), 1)
    torch.set_num_threads(1)
    try:
        best, spent = float("inf"), 0.0
        for _ in range(25):  # the fastest of up to 25 products or 0.3 s (bf16 without bf16 units: ~1 GFLOP/s)
            t0 = time.thread_time()
            a @ b
            took = time.thread_time() - t0
            best, spent = min(best, took), spent + took
            if spent > 0.3:
                break
    finally:
        torch.set_num_threads(threads)
    return threads / max(best, 1e-9)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Dense bf16/fp16 tensor-core peaks (no sparsity), by device name; fp32 runs use TF32 peaks.
GPU_PEAKS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}


def peak_flops(device: torch.device, dtype_name: str) -> tuple[float, str]:
    """(peak FLOP/s, where it comes from)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in GPU_PEAKS.items():
            if key in name:
                return (value if dtype_name != "fp32" else value / 2), f"{key} datasheet"
    return measured_peak_flops(device.type, dtype_name), "measured matmul"


class PeakMemory:
    """Peak memory over a window: CUDA's allocator peak, or the process's resident high-water mark on CPU
    (reset through /proc/self/clear_refs where Linux allows it)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
        except OSError:
            pass

    def peak_bytes(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        try:  # read every step: find the one field in the raw bytes rather than decode and split them all
            status = Path("/proc/self/status").read_bytes()
            at = status.find(b"\nVmHWM:")
            if at >= 0:
                return int(status[at + 7 : status.index(b"\n", at + 1)].split()[0]) * 1024
        except (OSError, ValueError):
            pass
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def token_bytes(tokenizer: Tokenizer) -> torch.Tensor:
    """(V,) UTF-8 bytes each token stands for: 0 for control tokens, 1 for a byte-fallback piece, and the
    piece's text with the word marker as one space otherwise. Bits per byte divide by these. `<unk>` (only
    a tokenizer without byte fallback emits it) counts 0: which character it stood for is not known."""
    out = torch.zeros(tokenizer.vocab_size, dtype=torch.int64)
    for i in range(tokenizer.vocab_size):
        out[i] = len(tokenizer.piece_bytes(i))  # 0 for control tokens and <unk>, 1 for a byte piece
    return out


def memory_estimate(model: nn.Module, cfg: ModelConfig, micro_rows: int, length: int, dtype: str) -> dict:
    """Rough bytes: weights + grads + Adam moments (fp32), and activations of one micro-batch."""
    n = sum(p.numel() for p in model.parameters())
    return {
        "weights_bytes": n * 4,
        "gradients_bytes": n * 4,
        "optimizer_bytes": n * 8,
        "activation_bytes": activation_bytes(cfg, micro_rows, length, dtype),
    }


def activation_bytes(cfg: ModelConfig, micro_rows: int, length: int, dtype: str) -> int:
    """Rough bytes of one micro-batch's activations, from the config alone (nothing built)."""
    act_bytes = 2 if dtype in ("bf16", "fp16") else 4
    layers = cfg.n_layer + (cfg.decoder_layers if cfg.kind == "encdec" else 0) + max(cfg.mtp_heads - 1, 0)
    # Per layer and token: ~34·d values kept for backward (Korthikanti et al. 2022, without attention scores
    # since SDPA recomputes them), plus one logits tensor in fp32.
    return micro_rows * length * (layers * 34 * cfg.d_model * act_bytes + cfg.vocab_size * 4 * 2)


def threads() -> int:
    return torch.get_num_threads() or os.cpu_count() or 1


def processor_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (else what `platform` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


def numerics(device: torch.device) -> dict[str, Any]:
    """What picks the kernels, and so the float rounding, besides the inputs: a run resumed where any of
    these differ continues to float tolerance, not bit for bit."""
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "processor": processor_name(),
        "accelerator": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }
