"""Step accounting: a step's numbers stay on the device until they are logged.

Reading a number off a GPU (`float()`, `.item()`, `.tolist()`) makes the host wait for every kernel queued
before it: a read per step keeps the GPU from running ahead of the host (PyTorch's CUDA semantics notes). So a
step leaves its loss and count sums, its gradient norm and its metrics in one small device tensor
(`StepFigures`), the loop keeps them with the host-side part of the step's record (`Pending`), and the
window of steps since the last read is read at once, with one transfer, when the loop needs the numbers: a
log line, a validation, a checkpoint, a time-budget check, the run's end. A non-finite loss or gradient
norm is found there, so a run stops within its logging interval, naming the step that went wrong and the
last checkpoint saved before it (a checkpoint is only saved right after a read found every step finite).

The numbers read are those the per-step reads gave: the same float operations, in the same order.
Target counts come from the host batches the loader made (`host_counts`), not from the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.errors import UserError


class NonFiniteLoss(UserError):
    """The loss or the gradient norm is NaN or infinite: the run stops, the last good checkpoint stays."""


@dataclass
class StepOutcome:
    """One optimizer step, over all micro-batches and ranks, as read on the host."""

    loss: float  # summed over all targets / their count (+ the pair-level loss's mean)
    grad_norm: float  # before clipping
    lr: float
    n_targets: float
    metrics: dict[str, float]  # the objective's own figures, averaged over this rank's micro-batches


@dataclass
class StepFigures:
    """One optimizer step's numbers, left on the device until read (`read_window`).

    `values` (float64): loss sum, target count, pair-loss sum, pair count (all summed over micro-batches and
    ranks), the gradient norm before clipping, then each micro-batch's metrics in `metric_names` order."""

    values: Tensor
    metric_names: tuple[str, ...]
    micro_batches: int
    lr: float
    check_grad: bool = True  # fp16: an infinite gradient is the scaler's signal to skip, not a failure

    def outcome(self, values: list[float]) -> StepOutcome:
        """The step as read: `values` are `self.values` on the host."""
        loss_sum, count, pair_sum, pair_count, grad_norm = values[:5]
        n_actual = max(count, 1.0)
        loss = loss_sum / n_actual + pair_sum / max(pair_count, 1.0)
        metrics: dict[str, float] = {}
        k = len(self.metric_names)
        for m in range(self.micro_batches):
            for i, key in enumerate(self.metric_names):
                metrics[key] = metrics.get(key, 0.0) + values[5 + m * k + i] / self.micro_batches
        return StepOutcome(loss, grad_norm, self.lr, n_actual, metrics)


def step_values(totals: Tensor, grad_norm: Tensor, metrics: list[list[Tensor]]) -> Tensor:
    """`StepFigures.values` from the step's device tensors (`metrics`: each micro-batch's, in one order),
    with no read: one float64 vector. A copy: a CUDA graph's outputs are overwritten by its next replay."""
    parts = [totals.double().reshape(-1), grad_norm.detach().double().reshape(1)]
    parts += [value.detach().double().reshape(1) for mb in metrics for value in mb]
    return torch.cat(parts)


@dataclass
class Pending:
    """A step that ran and is not read yet: its device figures and the host side of its record."""

    figures: StepFigures
    record: dict[str, Any]  # step, rows, tokens: the record's head
    timing: dict[str, Any]  # peak memory, wall time, elapsed, time: what the host saw at the step
    seconds: float  # the step's wall time as the host saw it (on a GPU: until its kernels were queued)
    wait: float  # of which waiting for the loader
    flops: float
    tail: dict[str, Any] = field(default_factory=dict)  # host figures after the objective's own
    events: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl events before the record
    notes: list[str] = field(default_factory=list)  # console notes before the record


def read_window(pending: list[Pending]) -> list[StepOutcome]:
    """Read every pending step's figures with one device-to-host transfer."""
    if not pending:
        return []
    flat = torch.cat([p.figures.values for p in pending]).tolist()  # the one read (a sync on a GPU)
    out, at = [], 0
    for p in pending:
        n = p.figures.values.numel()
        out.append(p.figures.outcome(flat[at : at + n]))
        at += n
    return out


def non_finite(outcome: StepOutcome, check_grad: bool) -> str | None:
    """What of the step is NaN or infinite ("loss is nan", ...), or None."""
    if not math.isfinite(outcome.loss):
        return f"loss is {outcome.loss}"
    if check_grad and not math.isfinite(outcome.grad_norm):
        return f"gradient norm is {outcome.grad_norm}"
    return None


def host_counts(batches: list[Batch]) -> tuple[float, float]:
    """(targets, pairs) over host batches, counted with numpy on the arrays the loader made: the step's
    global normaliser needs no read from the device. A batch already on a device is counted there."""
    n = p = 0
    for b in batches:
        if b.labels.device.type != "cpu":
            n, p = n + b.n_targets, p + b.n_pairs
            continue
        n += (
            b.target_count
            if b.target_count is not None
            else int(np.count_nonzero(b.labels.numpy() != IGNORE))
        )
        if b.seq_labels is not None:
            p += int(np.count_nonzero(b.seq_labels.numpy() != IGNORE))
    return float(n), float(p)


def realised(batches: list[Batch]) -> dict[str, float]:
    """Waste figures the objectives report (raw tokens fed / unused, target tokens dropped), summed."""
    out: dict[str, float] = {}
    for b in batches:
        for key in ("raw_tokens_fed", "raw_tokens_unused", "target_tokens_dropped"):
            if key in b.stats:
                out[key] = out.get(key, 0.0) + float(b.stats[key])
    return out
