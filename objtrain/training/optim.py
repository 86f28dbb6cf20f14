"""AdamW with decay on Linear weights only, and the learning-rate schedule as a pure function of the step.

Decay is chosen by module type, not by `ndim` (not nanoGPT's `dim >= 2` rule): Linear weights decay;
norms, biases and embeddings (the tied unembedding follows the embedding) do not; an untied output layer
is a Linear and decays.
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
    return _factor(step, total, min(warmup_steps(cfg, total), total), cfg)


def _factor(step: int, total: int, warm: int, cfg: ScheduleConfig) -> float:
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


def extended_lr_factor(step: int, totals: list[tuple[int, int]], cfg: ScheduleConfig) -> float:
    """`lr_factor` of a run whose total was raised on resume (`--resume --steps` more than it had).

    `totals` is the run's history: `[(0, S0), (k1, S1), ...]`, each raise made at optimizer step `k` to a
    total `S`. Before the first raise this is `lr_factor(step, S0)`, so an unextended run is unchanged.
    From a raise at step k on:
    - still warming up, a constant schedule, or a wsd run in its stable phase: the schedule of an S-step
      run with the original warmup (wsd: the stable phase goes on; the decay takes the new run's last
      `decay_ratio`);
    - a decay already under way (cosine, linear, or wsd past its stable phase): the rest of that decay is
      stretched from its value at k to reach `min_lr_ratio` at the new last step, so the lr never jumps;
      a finished run (already at the floor) goes on at the floor. Re-warming decayed weights to the peak
      would be a new run, not the rest of this one.
    Every value is a pure function of (step, totals, config): a resumed run stays bit-identical."""
    if len(totals) <= 1:
        return lr_factor(step, totals[0][1], cfg)
    at, total = totals[-1]
    if step < at:
        return extended_lr_factor(step, totals[:-1], cfg)
    first = totals[0][1]
    warm = min(warmup_steps(cfg, first), first)
    before = extended_lr_factor(at, totals[:-1], cfg)
    if at < warm or cfg.kind == "constant" or (cfg.kind == "wsd" and before >= 1.0):
        return _factor(step, total, warm, cfg)
    m = cfg.min_lr_ratio
    if m >= 1.0:
        return 1.0
    left = min(max((before - m) / (1 - m), 0.0), 1.0)  # share of the decay still to go at step k
    phase = math.acos(2 * left - 1) / math.pi if cfg.kind == "cosine" else 1 - left
    p = phase + (1 - phase) * min((step - at) / max(total - 1 - at, 1), 1.0)
    shape = 0.5 * (1 + math.cos(math.pi * p)) if cfg.kind == "cosine" else 1 - p
    return m + (1 - m) * shape


def describe_extension(at: int, old: int, new: int, cfg: ScheduleConfig, before: float) -> str:
    """One line on what the lr does from a raise of the run's total (`extended_lr_factor`)."""
    head = f"the run grows from {old} to {new} steps at step {at}"
    first_warm = warmup_steps(cfg, old)
    if at < first_warm:
        return (
            f"{head}: its warmup ends at step {first_warm} as before, then its {cfg.kind} schedule "
            f"spans {new} steps"
        )
    if cfg.kind == "constant":
        return f"{head}: the constant lr goes on"
    if cfg.kind == "wsd" and before >= 1.0:
        decay = max(round(cfg.decay_ratio * new), 1)
        return f"{head}: the wsd stable phase goes on; its decay now takes steps {new - decay}-{new}"
    floor = cfg.min_lr_ratio
    if before <= floor + 1e-12:
        return (
            f"{head}: it had decayed to its final lr ({floor:g} x peak) and goes on at it; for a new decay "
            "from the peak start a new run from its weights"
        )
    what = "the wsd decay" if cfg.kind == "wsd" else f"the {cfg.kind} decay"
    return (
        f"{head}: {what} from here ({before:.3g} x peak) is stretched to reach {floor:g} x peak at step "
        f"{new}, with no jump in the lr"
        + (
            " (to continue the stable phase instead, resume from a checkpoint before the decay)"
            if cfg.kind == "wsd"
            else ""
        )
    )


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


def clip_scaled(params: list[torch.nn.Parameter], max_norm: float, factor: torch.Tensor) -> torch.Tensor:
    """`clip_grad_norm_` of the gradients times `factor` (a device scalar), with no read from the device:
    the gradients become `grad * factor * min(max_norm / (norm + 1e-6), 1)`, `norm` that of `grad * factor`,
    which is returned. With `factor` 1.0 every value is bit for bit torch's (x * 1.0 is x), and the
    multiplications are the one foreach pass torch's clip makes."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=factor.device)
    norm = torch.nn.utils.get_total_norm(grads, 2.0) * factor
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0) * factor  # as torch's: a clamp, not a branch
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault((g.device, g.dtype), []).append(g)
    for (device, _), group in groups.items():
        torch._foreach_mul_(group, coef.to(device))
    return norm
