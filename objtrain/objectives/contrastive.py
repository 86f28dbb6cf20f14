"""Unsupervised contrastive learning of text embeddings (SimCSE, Gao et al. 2021).

Each raw row is one text unit (a document, or the documents a packed row holds) and becomes two *views*,
rows 2i and 2i+1 of the `Batch`, so one ordinary forward pass of the encoder encodes both:
- `views: dropout` (SimCSE unsupervised): both views are the row itself; the model's dropout, drawn
  independently for every row of the forward pass, makes them differ. Train with dropout > 0 (SimCSE: 0.1):
  with dropout off the two views are identical and the task is trivial.
- `views: crop` (augmentation): each view is its own random contiguous crop of the row's real tokens
  (at least `crop_min` of them), from which one random span of `round(deletion_rate * crop)` tokens is
  deleted. The two crops of one row are the positive pair.

Contract with the training loop: `batch = objective(rows, ...)`, `output = model(batch)`,
`objective.loss(output, batch)`, nothing else. The loss pools each view (`pooling: mean`, the encoder's
`ModelOutput.pooled`: mean of the final hidden states over the row's real tokens; or `first`, the first
position), normalises, and takes InfoNCE with cosine similarity over the batch:
`loss_i = -log(exp(cos(a_i, b_i) / t) / sum_j exp(cos(a_i, b_j) / t))`, a_i = view 2i, b_j = view 2j+1,
temperature t (SimCSE: 0.05). The negatives of pair i are the second views of the *other rows of the
same forward pass*, so a micro-batch of one row has none and is refused. The unit of the loss is the
pair: `LossOutput.loss_sum` sums the pairs' losses and `n_targets` counts the pairs (never tokens), so the
loop's division by the step's total pair count gives the mean loss per pair. The negatives are the rows of
each *micro-batch* on each process (SimCSE's per-device batch): with gradient accumulation or several
processes a step's loss is the pair-weighted mean of per-micro-batch InfoNCE terms, each over
`micro_batch_size - 1` negatives, not InfoNCE over the global batch.

Training it (numbers from the debug encoder, 64-token rows of standard-library code):
- Every model size in `configs/models` has `dropout: 0`, so `views: dropout` needs model dropout: `train`
  sets SimCSE's `model.dropout=0.1` unless the run sets it, and refuses an explicit 0. Without dropout the
  views are identical: `positive_cosine` is exactly 1, the loss starts near 0 (about 0.01 with 8 rows) and
  there is nothing to learn. `views: crop` differs without dropout.
- Even with distinct views a randomly initialised encoder already separates different texts well (mean
  off-diagonal cosine about 0.25), so at temperature 0.05 the loss starts low; a higher temperature or
  more rows per micro-batch make the task harder.
- The loss depends only on the angles between pooled embeddings, divided by the temperature: a learning
  rate of 1e-2 (as large as the init std of 0.02 per Adam step) collapses the embeddings once warmup ends
  (every cosine goes to 1, the loss rises to 1-3); 1e-3 trains (SimCSE: 3e-5 for BERT-base).
- Validation runs the model in eval mode, where dropout views coincide: with `views: dropout` the
  validation loss measures only how far apart the rows are, not the positive pairs.

No token has a label (`labels` is IGNORE everywhere); the pairing is positional (rows 2i and 2i+1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import Batch, ModelOutput, positions_of
from objtrain.errors import UserError
from objtrain.objectives.base import LossOutput, Objective, raw_usage
from objtrain.rng import RowRandom


class Contrastive(Objective):
    """SimCSE-style in-batch InfoNCE over two views of every row (dropout views or crops)."""

    name = "contrastive"
    model_kinds = ("encoder",)
    attention = "bidirectional"

    def model_overrides(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """SimCSE's two views differ only by dropout, and every model size ships with none: default to
        SimCSE's 0.1 and refuse an explicit 0, which would train the trivial task of matching a row to
        itself (Gao et al. 2021, section 3)."""
        if self.config.views == "dropout" and float(overrides.setdefault("dropout", 0.1)) <= 0:
            raise UserError(
                "contrastive with views=dropout needs model dropout > 0 (SimCSE: model.dropout=0.1)"
            )
        return overrides

    @dataclass
    class Config:
        temperature: float = 0.05  # InfoNCE temperature on cosine similarities (SimCSE: 0.05)
        views: Literal["dropout", "crop"] = "dropout"  # dropout: the same row twice; crop: two random crops
        pooling: Literal["mean", "first"] = "mean"  # mean over real tokens, or the first position
        crop_min: float = 0.5  # crop: each view keeps at least this share of the row's tokens
        deletion_rate: float = 0.1  # crop: one span of this share of the crop is deleted from each view

    def setup(self) -> None:
        c = self.config
        if c.temperature <= 0:
            raise UserError(f"contrastive: temperature must be positive, got {c.temperature}")
        if c.views not in ("dropout", "crop"):
            raise UserError(f"contrastive: views must be dropout or crop, got {c.views!r}")
        if c.pooling not in ("mean", "first"):
            raise UserError(f"contrastive: pooling must be mean or first, got {c.pooling!r}")
        if not 0.0 < c.crop_min <= 1.0:
            raise UserError(f"contrastive: crop_min must be in (0, 1], got {c.crop_min}")
        if not 0.0 <= c.deletion_rate < 1.0:
            raise UserError(f"contrastive: deletion_rate must be in [0, 1), got {c.deletion_rate}")

    def _crop(self, rows: Tensor, docs: Tensor, rr: RowRandom, stream: str) -> tuple[Tensor, Tensor, Tensor]:
        """One cropped view per row: (tokens, document ids, kept-source mask), all (B, L)."""
        B, L = rows.shape
        c = self.config
        n = (docs >= 0).sum(1)  # real tokens sit at the front of a row, padding after them
        lo = torch.ceil(n.double() * c.crop_min).long().clamp(min=1)
        length = torch.minimum(rr.integers(1, n + 1, stream + "/length", low=lo)[:, 0], n)
        start = rr.integers(1, (n - length + 1).clamp(min=1), stream + "/start")[:, 0]
        cut = torch.round(length.double() * c.deletion_rate).long()
        cut = torch.minimum(cut, (length - 1).clamp(min=0))
        cut_at = start + rr.integers(1, (length - cut + 1).clamp(min=1), stream + "/cut")[:, 0]
        j = torch.arange(L, device=rows.device)[None, :]
        keep = (j >= start[:, None]) & (j < (start + length)[:, None])
        keep &= ~((j >= cut_at[:, None]) & (j < (cut_at + cut)[:, None]))
        keep &= docs >= 0
        pos = torch.where(keep, keep.long().cumsum(1) - 1, L)
        tokens = torch.full((B, L + 1), self.specials.pad, dtype=rows.dtype, device=rows.device)
        tokens.scatter_(1, pos, rows)
        ids = torch.full((B, L + 1), -1, dtype=docs.dtype, device=rows.device)
        ids.scatter_(1, pos, docs)
        # document ids renumbered from 0 in each view (a crop may start inside the second document)
        ids = ids[:, :L]
        first = ids[:, :1].clamp(min=0)
        ids = torch.where(ids >= 0, ids - first, -1)
        return tokens[:, :L], ids, keep

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        rows, document_ids = rows.long(), document_ids.long()
        B, L = rows.shape
        if self.config.views == "dropout":
            tokens = rows.repeat_interleave(2, dim=0)
            docs = document_ids.repeat_interleave(2, dim=0)
            used = int((document_ids >= 0).sum())
        else:
            rr = RowRandom(seed, row_index)
            ta, da, ka = self._crop(rows, document_ids, rr, "contrastive/a")
            tb, db, kb = self._crop(rows, document_ids, rr, "contrastive/b")
            tokens = torch.stack([ta, tb], dim=1).reshape(2 * B, L)
            docs = torch.stack([da, db], dim=1).reshape(2 * B, L)
            used = int((ka | kb).sum())
        tokens = tokens.masked_fill(docs < 0, self.specials.pad)
        stats = {"pairs": float(B), "view_tokens": float((docs >= 0).sum())}
        stats.update(raw_usage(document_ids, used))
        return Batch(
            input_ids=tokens,
            labels=torch.full_like(tokens, IGNORE),
            positions=positions_of(docs),
            document_ids=docs,
            attention="bidirectional",
            stats=stats,
            target_count=B,  # the loss's unit is the pair
        )

    def embeddings(self, output: ModelOutput, batch: Batch) -> Tensor:
        """(2n, D) pooled views, as configured."""
        if self.config.pooling == "first":
            if output.hidden is None:
                raise UserError("contrastive: pooling 'first' needs the model's hidden states")
            return output.hidden[:, 0]
        if output.pooled is None:
            raise UserError("contrastive: the model gives no pooled output (it needs an encoder)")
        return output.pooled

    def loss(self, output: ModelOutput, batch: Batch) -> LossOutput:
        """Summed InfoNCE over the pairs; `n_targets` = number of pairs (the unit of this loss)."""
        z = self.embeddings(output, batch).float()
        if z.size(0) % 2:
            raise UserError("contrastive: a batch holds two views per row (rows 2i and 2i+1)")
        n = z.size(0) // 2
        if n < 2:
            raise UserError(
                f"contrastive: a batch of {n} row has no negatives (they are the other rows of the batch): "
                "use a micro-batch of at least 2 rows"
            )
        z = F.normalize(z, dim=-1)
        a, b = z[0::2], z[1::2]
        logits = a @ b.T / self.config.temperature  # (n, n): row i's positive on the diagonal
        target = torch.arange(n, device=z.device)
        loss_sum = F.cross_entropy(logits, target, reduction="sum")
        with torch.no_grad():
            accuracy = (logits.argmax(dim=1) == target).float().mean()
            positive = (a * b).sum(-1).mean()
        metrics = {"contrastive_accuracy": accuracy, "positive_cosine": positive}
        return LossOutput(loss_sum, torch.tensor(n, dtype=torch.int64, device=z.device), metrics)
