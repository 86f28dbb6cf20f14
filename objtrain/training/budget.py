"""A run's length: `--steps`, `--tokens` or `--time` turned into the run's step count."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from objtrain.training.config import DEFAULT_STEPS, TrainConfig


def total_steps(cfg: TrainConfig, plan: Any, step_seconds: Callable[[], float] | None = None) -> int:
    b = cfg.budget
    if b.steps is not None:
        return b.steps
    if b.tokens is not None:
        return max(math.ceil(b.tokens / (cfg.batch.batch_size * plan.seq_len)), 1)
    if b.seconds is not None:
        assert step_seconds is not None
        return max(int(b.seconds / max(step_seconds(), 1e-6)), 1)
    return DEFAULT_STEPS
