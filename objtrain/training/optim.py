"""AdamW with decay on Linear weights only, and the learning-rate schedule as a pure function of the step.

Decay is chosen by module type, not by `ndim` (reference training.md section 2): Linear weights decay;
norms, biases and embeddings (the tied unembedding follows the embedding) do not.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from objtrain.training.config import OptimConfig, ScheduleConfig


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups, each parameter once, in module order (names kept for checking on resume)."""
    decay_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear) and m.weight.requires_grad}
    decay, no_decay, decay_names, no_decay_names = [], [], [], []
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if id(p) in decay_ids:
            decay.append(p)
            decay_names.append(name)
        else:
            no_decay.append(p)
            no_decay_names.append(name)
    return [
        {"params": decay, "weight_decay": weight_decay, "names": decay_names},
        {"params": no_decay, "weight_decay": 0.0, "names": no_decay_names},
    ]


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    groups = parameter_groups(model, cfg.weight_decay)
    # One fused kernel per step on CPU and CUDA (a few percent of a small model's step on CPU); sharded
    # (DTensor) parameters and other devices take the multi-tensor path. The choice depends only on the
    # device and the sharding, so a resumed run uses the same implementation and stays bit-exact.
    sharded = any(type(p).__name__ == "DTensor" for g in groups for p in g["params"])
    fused = device.type in ("cpu", "cuda") and not sharded
    return torch.optim.AdamW(
        groups,
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        eps=cfg.eps,
        fused=fused or None,
        foreach=None if fused else device.type != "mps",
    )


def warmup_steps(cfg: ScheduleConfig, total: int) -> int:
    w = cfg.warmup
    return round(w * total) if isinstance(w, float) and w < 1 else int(w)


def lr_factor(step: int, total: int, cfg: ScheduleConfig) -> float:
    """Multiplier of the peak lr at 0-based optimizer step `step` of a `total`-step run.

    Linear warmup `(s+1)/W`, then: cosine or linear decay to `min_lr_ratio` at the last step; constant;
    or warmup-stable-decay (constant, then a linear decay over the last `decay_ratio` of the run).
    """
    warm = min(warmup_steps(cfg, total), total)
    if step < warm:
        return (step + 1) / warm
    m = cfg.min_lr_ratio
    if cfg.kind == "constant":
        return 1.0
    if cfg.kind == "wsd":
        decay = max(round(cfg.decay_ratio * total), 1)
        start = max(total - decay, warm)
        if step < start:
            return 1.0
        p = (step + 1 - start) / max(total - start, 1)
        return m + (1 - m) * (1 - min(p, 1.0))
    span = max(total - 1 - warm, 1)
    p = min((step - warm) / span, 1.0)
    if cfg.kind == "linear":
        return m + (1 - m) * (1 - p)
    return m + (1 - m) * 0.5 * (1 + math.cos(math.pi * p))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def scaled_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> bool:
    """Step through fp16's GradScaler; False when it skipped the step. Inf/NaN gradients are the scaler's
    normal signal that the scale is too high: it leaves the weights alone and lowers the scale, which is
    how a skip is told apart (HF's `optimizer_step_was_skipped` compares the scale the same way)."""
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return scaler.get_scale() >= before
