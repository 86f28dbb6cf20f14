"""A short fine-tune of the whole model on a labelled task (`objtrain eval --finetune`).

A linear probe reads frozen features; the literature compares objectives after fine-tuning the whole model
("MLM + fine-tuning", BERT section 4, T5 section 3), where a decoder's last layer, poor as a frozen
feature, is free to adapt. This is that measurement at laptop scale:

- a copy of the checkpoint's model (the checkpoint is never touched), in train mode, with a new linear
  head on the mean of the last layer's normed hidden states over the example's tokens (an encoder-decoder:
  its encoder output), each example truncated to the model's training row length;
- AdamW (weight decay 0.01 on matrices), linear warmup over the first 10% of `steps` then linear decay to
  0 (BERT's fine-tuning schedule), batches of `batch_size` examples drawn without replacement epoch by
  epoch under the eval seed, cross-entropy;
- one such fine-tune per peak learning rate in `lrs`, each from the same copy, head and batch order (BERT
  chose its rate per task on dev). One rate for every model favours some: a short fine-tune at 3e-4 left
  a pretrained span encoder at chance on SST-2 (at 1e-4) or far below the same architecture at random init,
  which 1e-3 mostly closed; of 3e-4 to 3e-3, the CLM and span arms chose the top, so 1e-2 is tried too
  (the rate chosen is reported: one at either end says the list should widen). Every model a comparison
  sets side by side, the random-init baselines too, gets the same rates, so none is tuned more than
  another (Dodge et al. 2019); a rate whose loss turns non-finite is dropped;
- the dev split scored every `steps // 4` steps and at the end; the test split is scored once, with the
  weights of the best dev score over rates and steps (MCC for two classes, else accuracy; the smaller rate
  and the earlier step on ties), so nothing is chosen on the split reported;
- with `seeds` > 1, the fine-tune's own noise: `seeds - 1` more fine-tunes at the rate chosen, each with
  the next seed (another head and batch order), each scored on test at its best dev step. Their sample sd,
  with the first, is `finetune_accuracy_tune_sd`; the score reported stays the first fine-tune's, so a
  run measured with and one without the noise report the same number (at least three
  fine-tunes of one checkpoint: BERT and Dodge et al. saw restarts differ by points at small data).

Deterministic under the eval seed: the head's initialisation and the batch order come from it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.evaluation.probe import Labelled, encode_texts, last_hidden, mcc, padded


@dataclass(frozen=True)
class FinetuneConfig:
    steps: int = 300
    lrs: tuple[float, ...] = (3e-4, 1e-3, 3e-3, 1e-2)  # peak rates tried, the best on dev kept
    seeds: int = 1  # fine-tunes at the chosen rate, each with its own seed, for the fine-tune's own sd
    batch_size: int = 32
    weight_decay: float = 0.01
    warmup: float = 0.1

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise UserError(f"--finetune-steps must be at least 1, got {self.steps}")
        if not self.lrs or not all(math.isfinite(lr) and lr > 0 for lr in self.lrs):
            raise UserError(f"--finetune-lr must be positive learning rates, got {list(self.lrs)}")
        if self.seeds < 1:
            raise UserError(f"--finetune-seeds must be at least 1, got {self.seeds}")


class _Classifier(nn.Module):
    """The pre-trained trunk and a linear head on its mean-pooled last layer."""

    def __init__(self, model: nn.Module, n_classes: int, segments: bool = False) -> None:
        super().__init__()
        self.model = model
        self.segments = segments  # segment 0 at every token: only for models trained on sentence pairs
        self.head = nn.Linear(int(model.config.d_model), n_classes)  # type: ignore[union-attr, arg-type]

    def forward(self, ids: Tensor, valid: Tensor) -> Tensor:
        hidden = last_hidden(self.model, ids, valid, self.segments)
        w = valid.to(hidden.dtype)[..., None]
        return self.head((hidden * w).sum(1) / w.sum(1).clamp(min=1))


def _rows(encoded: Sequence[list[int]], pad: int, device: torch.device) -> tuple[Tensor, Tensor]:
    ids, valid, _ = padded(encoded, pad)
    return ids.to(device), valid.to(device)


@torch.no_grad()
def _predict(clf: _Classifier, encoded: Sequence[list[int]], pad: int, device: torch.device) -> Tensor:
    clf.eval()
    out = []
    for lo in range(0, len(encoded), 64):
        ids, valid = _rows(encoded[lo : lo + 64], pad, device)
        out.append(clf(ids, valid).argmax(-1).cpu())
    clf.train()
    return torch.cat(out)


@dataclass(frozen=True)
class _Task:
    """The encoded examples one fine-tune trains and chooses its weights on."""

    n_classes: int
    segments: bool
    pad: int
    x_train: Sequence[list[int]]
    y_train: Tensor
    x_dev: Sequence[list[int]]
    y_dev: Tensor


def _scores(pred: Tensor, gold: Tensor, n_classes: int) -> dict[str, float]:
    out = {"accuracy": float((pred == gold).double().mean())}
    if n_classes == 2:
        out["mcc"] = mcc(pred, gold)
    return out


def finetune(
    model: nn.Module,
    tokenizer: Tokenizer,
    train: Labelled,
    dev: Labelled,
    test: Labelled,
    max_len: int,
    seed: int,
    config: FinetuneConfig | None = None,
    device: torch.device | str = "cpu",
    segments: bool = False,
) -> dict[str, float]:
    """Fine-tune a copy of `model` on `train`, choose the weights on `dev`, score them on `test`: accuracy
    (and MCC for two classes) on test, the best dev score, and the steps and examples used. `segments`:
    see `probe.last_hidden` (True only for models trained on sentence pairs)."""
    config = config or FinetuneConfig()
    device = torch.device(device)
    classes = sorted(set(train.labels))
    if len(classes) < 2:
        raise UserError("the fine-tuning task's training file has a single label: a classifier needs two")
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted((set(dev.labels) | set(test.labels)) - set(classes))
    if unknown:
        raise UserError(f"fine-tuning labels {unknown[:3]} never occur in the training file")
    pad = tokenizer.specials.pad
    x_train, x_dev, x_test = (encode_texts(tokenizer, d.texts, max_len) for d in (train, dev, test))
    y_train = torch.tensor([index[c] for c in train.labels])
    y_dev = torch.tensor([index[c] for c in dev.labels])
    y_test = torch.tensor([index[c] for c in test.labels])

    task = _Task(len(classes), segments, pad, x_train, y_train, x_dev, y_dev)
    best: tuple[float, float, int, _Classifier] | None = None  # dev score, rate, step, the weights
    diverged = []
    for lr in sorted(config.lrs):
        tuned = _tune(model, task, seed, lr, config, device)
        if tuned is None:
            diverged.append(lr)
        elif best is None or tuned[0] > best[0]:
            best = (tuned[0], lr, tuned[1], tuned[2])
    if best is None:
        raise UserError(f"fine-tuning diverged at every --finetune-lr ({list(config.lrs)}): lower them")
    _, best_lr, best_step, clf = best
    dev_scores = _scores(_predict(clf, x_dev, pad, device), y_dev, len(classes))
    test_scores = _scores(_predict(clf, x_test, pad, device), y_test, len(classes))
    acc, n_test = test_scores["accuracy"], len(y_test)
    majority = int(torch.bincount(y_train).argmax())
    out = {
        "finetune_accuracy": acc,
        "finetune_accuracy_se": (acc * (1 - acc) / n_test) ** 0.5,
        "finetune_dev_accuracy": dev_scores["accuracy"],
        "finetune_majority_accuracy": float((y_test == majority).double().mean()),
        "finetune_best_step": float(best_step),
        "finetune_lr": best_lr,
        "finetune_lrs_tried": float(len(config.lrs)),
        "finetune_lrs_diverged": float(len(diverged)),
        "finetune_steps": float(config.steps),
        "finetune_train_examples": float(len(x_train)),
        "finetune_test_examples": float(n_test),
    }
    if "mcc" in test_scores:
        out["finetune_mcc"] = test_scores["mcc"]
    if config.seeds > 1:  # the fine-tune's own noise at the rate chosen
        accuracies = [acc]
        for k in range(1, config.seeds):
            again = _tune(model, task, seed + k, best_lr, config, device)
            if again is not None:
                pred = _predict(again[2], x_test, pad, device)
                accuracies.append(_scores(pred, y_test, len(classes))["accuracy"])
        out["finetune_seeds"] = float(len(accuracies))  # those that did not diverge
        if len(accuracies) > 1:
            out["finetune_accuracy_tune_sd"] = float(np.std(accuracies, ddof=1))
    return out


def _tune(
    model: nn.Module, task: _Task, seed: int, lr: float, config: FinetuneConfig, device: torch.device
) -> tuple[float, int, _Classifier] | None:
    """One fine-tune at peak rate `lr`: (best dev score, its step, the classifier holding those weights),
    or None when the loss turns non-finite."""
    torch.manual_seed(seed)
    trunk = copy.deepcopy(model).float().to(device)
    clf = _Classifier(trunk, task.n_classes, task.segments).to(device)
    clf.train()
    decay = [p for p in clf.parameters() if p.dim() >= 2]
    no_decay = [p for p in clf.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
    )
    warmup = max(int(config.steps * config.warmup), 1)

    def lr_at(step: int) -> float:  # linear warmup, then linear decay to 0
        if step < warmup:
            return lr * (step + 1) / warmup
        return lr * max(config.steps - step, 0) / max(config.steps - warmup, 1)

    rng = np.random.default_rng(seed)
    order: list[int] = []
    check_every = max(config.steps // 4, 1)
    best: tuple[float, int, dict[str, Tensor]] | None = None
    n = len(task.x_train)
    for step in range(config.steps):
        if len(order) < config.batch_size:  # the next epoch's shuffled order
            order += rng.permutation(n).tolist()
        pick, order = order[: config.batch_size], order[config.batch_size :]
        ids, valid = _rows([task.x_train[i] for i in pick], task.pad, device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = F.cross_entropy(clf(ids, valid).float(), task.y_train[pick].to(device))
        if not math.isfinite(float(loss.detach())):
            return None
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(clf.parameters(), 1.0)
        opt.step()
        if (step + 1) % check_every == 0 or step + 1 == config.steps:
            dev_scores = _scores(_predict(clf, task.x_dev, task.pad, device), task.y_dev, task.n_classes)
            key = dev_scores.get("mcc", dev_scores["accuracy"])
            if best is None or key > best[0]:
                state = {k: v.detach().clone() for k, v in clf.state_dict().items()}
                best = (key, step + 1, state)
    assert best is not None
    clf.load_state_dict(best[2])
    return best[0], best[1], clf
