"""Scores on fixed-seed corruptions of held-out rows: an objective's own loss, masked-token accuracy, and
span-target loss (Devlin et al. 2019; Raffel et al. 2020).

Rows are cut from the unshuffled held-out documents as the training loop cuts them (documents behind EOS
separators, each row as long as the objective needs), then corrupted by the objective from the registry
with the *eval* seed. Corruption is a pure function of (rows, seed), so every checkpoint sees the same
masks. Two protocols:

- native: the checkpoint's own objective with its recorded config (`objective_loss`, the validation loss
  of training on another seed);
- neutral, the same for every model of a kind so that variants compare: 15% of the ordinary tokens, all
  shown as `<mask>` (`masked_accuracy`, `masked_loss`, for models with an MLM head), and T5's default
  span corruption, rate 0.15 and mean span 3 (`span_target_loss`, for encoder-decoders).

Accuracy and loss count only the scored positions (never copies, pads or specials); the
most-frequent-target baseline comes with the accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from objtrain.batch import Batch, labelled_logits
from objtrain.data.batches import validation_batches
from objtrain.data.stream import Documents
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.objectives.base import Objective
from objtrain.objectives.registry import build_objective
from objtrain.specials import Specials

NEUTRAL_MLM = {"selection_rate": 0.15, "mask_prob": 1.0, "random_prob": 0.0, "exact_count": True}
NEUTRAL_SPAN = {"noise_density": 0.15, "mean_noise_span_length": 3.0, "random_roll": False}


def corrupted_batches(
    docs: Documents,
    objective: Objective,
    specials: Specials,
    seq_len: int,
    rows: int,
    batch_size: int,
    seed: int,
) -> list[Batch]:
    """The first `rows` rows of the unshuffled documents, corrupted by `objective` under `seed`: training's
    validation rows (`validation_batches`), under the eval seed instead of validation's 0."""
    return validation_batches(docs, specials, objective, seq_len, rows, batch_size, seed=seed)


@dataclass
class CorruptedScore:
    nats: float = 0.0
    targets: int = 0
    correct: int = 0
    majority: int = 0  # targets equal to the most frequent target


@torch.no_grad()
def score_batches(
    model: nn.Module, objective: Objective, batches: list[Batch], device: torch.device | str
) -> CorruptedScore:
    """Token loss over each batch's labels (MTP: head 1), top-1 accuracy at the same positions."""
    out = CorruptedScore()
    counts: dict[int, int] = {}
    for batch in batches:
        batch = batch.to(device)
        output = model(batch)
        lo = objective.validation_loss(output, batch)  # MTP: head 1's
        loss_sum, n = lo.loss_sum, lo.n_targets
        out.nats += float(loss_sum)
        out.targets += int(n)
        logits, labels = labelled_logits(output.logits, batch.labels)
        out.correct += int((logits.argmax(dim=-1) == labels).sum())
        values, freq = labels.unique(return_counts=True)
        for v, f in zip(values.tolist(), freq.tolist(), strict=True):
            counts[v] = counts.get(v, 0) + f
    out.majority = max(counts.values()) if counts else 0
    return out


def objective_scores(
    model: nn.Module,
    kind: str,
    training: dict[str, Any],
    docs: Documents,
    specials: Specials,
    tokenizer: Tokenizer | None,
    seq_len: int,
    rows: int,
    batch_size: int,
    seed: int,
    device: torch.device | str,
) -> dict[str, Any]:
    """Every corruption-based score the model can give (see the module docstring)."""
    out: dict[str, Any] = {}
    name = training.get("objective")
    objective = None
    if name:
        try:
            objective = build_objective(
                name, specials, tokenizer, model_kind=kind, overrides=training.get("objective_config") or {}
            )
            objective.raw_length(seq_len)  # too short a length for this objective is refused here
        except UserError as exc:  # e.g. an objective this objtrain no longer knows: the rest still runs
            out["objective_loss_skipped"] = str(exc)
            objective = None
    if objective is not None:
        s = score_batches(
            model,
            objective,
            corrupted_batches(docs, objective, specials, seq_len, rows, batch_size, seed),
            device,
        )
        if s.targets:
            out["objective_loss"] = s.nats / s.targets
    if kind == "encoder":
        mlm = build_objective("mlm", specials, tokenizer, model_kind="encoder", overrides=NEUTRAL_MLM)
        s = score_batches(
            model, mlm, corrupted_batches(docs, mlm, specials, seq_len, rows, batch_size, seed), device
        )
        if s.targets:
            out["masked_accuracy"] = s.correct / s.targets
            out["masked_loss"] = s.nats / s.targets
            out["masked_majority_accuracy"] = s.majority / s.targets
            out["masked_tokens"] = float(s.targets)
    if kind == "encdec":
        span = build_objective("span", specials, tokenizer, model_kind="encdec", overrides=NEUTRAL_SPAN)
        s = score_batches(
            model, span, corrupted_batches(docs, span, specials, seq_len, rows, batch_size, seed), device
        )
        if s.targets:
            out["span_target_loss"] = s.nats / s.targets
            out["span_target_accuracy"] = s.correct / s.targets
    return out
