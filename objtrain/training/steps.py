"""Step accounting: what one optimizer step reports, and the figures read off its batches."""

from __future__ import annotations

from dataclasses import dataclass

from objtrain.batch import Batch
from objtrain.errors import UserError


class NonFiniteLoss(UserError):
    """The loss or the gradient norm is NaN or infinite: the run stops, the last good checkpoint stays."""


@dataclass
class StepOutcome:
    """One optimizer step, over all micro-batches and ranks."""

    loss: float  # summed over all targets / their count (+ the pair-level loss's mean)
    grad_norm: float  # before clipping
    lr: float
    n_targets: float
    metrics: dict[str, float]  # the objective's own figures, averaged over this rank's micro-batches


def target_len(batches: list[Batch]) -> int | None:
    b = batches[0]
    return int(b.labels.size(1)) if b.is_encdec else None


def realised(batches: list[Batch]) -> dict[str, float]:
    """Waste figures the objectives report (raw tokens fed / unused, target tokens dropped), summed."""
    out: dict[str, float] = {}
    for b in batches:
        for key in ("raw_tokens_fed", "raw_tokens_unused", "target_tokens_dropped"):
            if key in b.stats:
                out[key] = out.get(key, 0.0) + float(b.stats[key])
    return out
