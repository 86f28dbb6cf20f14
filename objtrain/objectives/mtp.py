"""Multi-token prediction (Gloeckle et al. 2024): head k predicts the token k ahead.

Layout: the same (B, T+1) raw rows as CLM, so head 1 is CLM exactly (same targets, same packed store: its
loss is the comparable one). `mtp_labels[:, k-1, t] = x[t + k]`; targets past the raw row
are IGNORE, never wrapped, so head k has IGNORE on its last k - 1 model positions (the last k of the
T+1-token raw block, which `test_mtp.py` checks). With `cross_document_targets: false` (default) a target in
another document is IGNORE too, as for CLM.

Loss: the paper's L = sum_t sum_k -log p_k(x_{t+k} | x_<=t) with equal weights (Gloeckle et al. 2024),
per position: the n heads' summed cross-entropies over the head-1 target count, (sum_k S_k) / N_1, where
S_k is head k's summed CE and N_k its target count. Positions are what the sum runs over (every position
with a next token), so a head k > 1 whose target at a position lies past the row or document adds no
term there rather than being re-weighted: this is *not* the sum of the per-head means sum_k S_k / N_k,
which would weight head k's remaining targets up by N_1 / N_k (N_k = N_1 minus up to k - 1 per document);
the two agree only when every head has N_1 targets. One denominator also makes gradient accumulation
exact: the training loop divides the summed loss of every micro-batch by the global head-1 count.
Per-head means are reported as metrics (`head{k}_loss`); head 1's is CLM's loss, the comparable one.
`head_loss` gives one head's (S_k, N_k), for the memory-efficient backward (trunk once, then each head's
forward + backward in turn, so only one (B, T, V) logits tensor is alive at a time).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import Batch, ModelOutput
from objtrain.errors import UserError
from objtrain.objectives.base import LossOutput, Objective
from objtrain.objectives.clm import causal_batch, next_token_labels


def mtp_head_loss(logits: Tensor, mtp_labels: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Summed CE and target count of head k (offset k, 1-based): logits (B, T, V), mtp_labels (B, n, T)."""
    labels = mtp_labels[:, k - 1]
    loss_sum = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1), ignore_index=IGNORE, reduction="sum"
    )
    return loss_sum, (labels != IGNORE).sum()


class MultiTokenPrediction(Objective):
    """n next-token heads on a shared trunk; `output.logits` is offset 1, `output.mtp_logits` offsets 2..n."""

    name = "mtp"
    model_kinds = ("decoder",)
    attention = "causal"
    scores_left_to_right = True  # head 1 is CLM

    @dataclass
    class Config:
        n: int = 4  # tokens predicted per position (Gloeckle et al.: 4 best for code; 1 = CLM)
        cross_document_targets: bool = False  # keep targets that lie in the next document (as CLM's key)

        def __post_init__(self) -> None:
            if self.n < 1:
                raise ValueError(f"n must be at least 1, got {self.n}")

    def raw_length(self, model_length: int) -> int:
        return model_length + 1

    def model_overrides(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """One extra head per token predicted past the next: `mtp_heads = n`."""
        n = int(self.config.n)
        if overrides.setdefault("mtp_heads", n) != n:
            raise UserError(
                f"mtp with n={n} needs mtp_heads={n}, the model override says {overrides['mtp_heads']}"
            )
        return overrides

    @classmethod
    def extra_head_layers(cls, config: Any) -> int:
        """n - 1: each head past the first is a transformer layer (Gloeckle et al. 2024, section 2)."""
        return max(int(config.n) - 1, 0)

    def run_notes(self, model_config: Any) -> list[str]:
        heads = getattr(model_config, "mtp_heads", 1)
        if heads <= 1:
            return []
        return [
            f"loss is the sum of the {heads} heads' losses (each in metrics.jsonl); "
            "val_loss is head 1's, comparable with a next-token model"
        ]

    def splits_backward(self, model_config: Any) -> bool:
        """The per-head backward, on a model with more than one head."""
        return getattr(model_config, "mtp_heads", 1) > 1

    def split_forward_backward(
        self,
        model: Any,
        batch: Batch,
        scale: float,
        autocast: Callable[[], AbstractContextManager[Any]],
        backward: Callable[[Tensor], None],
    ) -> LossOutput:
        """Gloeckle et al. 2024, section 2: trunk once; each head's forward and backward in turn into the
        detached trunk output; then one backward through the trunk. Gradients equal the joint backward."""
        assert batch.mtp_labels is not None
        with autocast():
            trunk = model.trunk(batch)
        detached = trunk.hidden.detach().requires_grad_()
        shared = replace(trunk, hidden=detached)  # the model's TrunkOutput, cut from the trunk's graph
        device = trunk.hidden.device
        total = torch.zeros((), device=device)
        n_head1 = torch.zeros((), dtype=torch.int64, device=device)
        metrics: dict[str, Tensor] = {}
        for k in range(1, model.config.mtp_heads + 1):
            with autocast():
                # the logits stay a temporary: cross-entropy keeps its own output for the backward, so a
                # name held here would keep a second (B, T, V) tensor alive through it
                loss_sum, count = mtp_head_loss(model.head(k - 1, shared)[1], batch.mtp_labels, k)
            backward(loss_sum * scale)
            total = total + loss_sum.detach()
            metrics[f"head{k}_loss"] = loss_sum.detach() / count.clamp(min=1)
            if k == 1:
                n_head1 = count.detach()
        trunk.hidden.backward(detached.grad)
        return LossOutput(total, n_head1, metrics)

    def validation_loss(self, output: ModelOutput, batch: Batch) -> LossOutput:
        """Head 1's loss: CLM's, comparable with a next-token model (pitfall: the heads' sum is not)."""
        if batch.mtp_labels is None:
            return self.loss(output, batch)
        loss_sum, count = mtp_head_loss(output.logits, batch.mtp_labels, 1)
        return LossOutput(loss_sum, count, {})

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        rows, document_ids = rows.long(), document_ids.long()
        cross = self.config.cross_document_targets
        batch = causal_batch(rows, document_ids, cross)
        B, T = batch.input_ids.shape
        n = self.config.n
        heads = torch.empty((B, n, T), dtype=torch.int64, device=rows.device)
        heads[:, 0] = batch.labels
        for k in range(2, n + 1):
            next_token_labels(rows, document_ids, k, cross, T, out=heads[:, k - 1])
        batch.mtp_labels = heads
        counts = (heads != IGNORE).count_nonzero(dim=(0, 2)).tolist()
        tokens = float((batch.document_ids >= 0).sum())
        batch.stats = {"tokens": tokens}
        batch.stats.update({f"head{k}_targets": float(c) for k, c in enumerate(counts, start=1)})
        # as CLM's: every real input is used, and of the raw row only its last position can be fed and
        # unused (a target of no head: in the next document, without cross_document_targets). Head k reads
        # that position as its target at T - k.
        last_fed = float((document_ids[:, T] >= 0).sum()) if document_ids.size(1) > T else 0.0
        last_used = torch.zeros(B, dtype=torch.bool, device=rows.device)
        for k in range(1, min(n, T) + 1):
            last_used |= heads[:, k - 1, T - k] != IGNORE
        used_last = float((last_used & (document_ids[:, T] >= 0)).sum()) if document_ids.size(1) > T else 0.0
        batch.stats.update(raw_tokens_fed=tokens + last_fed, raw_tokens_unused=last_fed - used_last)
        return batch

    def head_loss(self, output: ModelOutput, batch: Batch, k: int) -> tuple[Tensor, Tensor]:
        """(summed CE, target count) of head k (1-based); the training loop divides by head 1's count."""
        logits = self._head_logits(output, k)
        assert batch.mtp_labels is not None
        return mtp_head_loss(logits, batch.mtp_labels, k)

    def _head_logits(self, output: ModelOutput, k: int) -> Tensor:
        if k == 1:
            return output.logits
        extra = output.mtp_logits or []
        if len(extra) < k - 1:
            raise UserError(f"mtp with n={self.config.n} needs a model with {self.config.n} heads")
        return extra[k - 2]

    def loss(self, output: ModelOutput, batch: Batch) -> LossOutput:
        """(sum_k S_k, N_1): the n heads' summed CE and head 1's target count, so loss_sum / n_targets is
        the paper's per-position loss (not the sum of per-head means, see the module docstring);
        per-head mean losses as metrics."""
        assert batch.mtp_labels is not None
        metrics: dict[str, Tensor] = {}
        total: Tensor | None = None
        n_head1 = torch.zeros((), dtype=torch.int64)
        for k in range(1, self.config.n + 1):
            loss_sum, count = self.head_loss(output, batch, k)
            total = loss_sum if total is None else total + loss_sum
            metrics[f"head{k}_loss"] = loss_sum.detach() / count.clamp(min=1)
            if k == 1:
                n_head1 = count
                metrics["head1_loss_sum"] = loss_sum.detach()
        assert total is not None
        return LossOutput(total, n_head1, metrics)
