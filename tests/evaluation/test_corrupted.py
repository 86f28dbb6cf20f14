"""Corruption-based scores: the masks are fixed by the eval seed and never leak the answer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from objtrain import IGNORE
from objtrain.data.stream import Documents
from objtrain.evaluation.corrupted import NEUTRAL_MLM, corrupted_batches, objective_scores, score_batches
from objtrain.objectives.registry import build_objective


def _docs(tokenizer, texts) -> Documents:
    ids = [np.array(tokenizer.encode(t)) for t in texts]
    offsets = np.concatenate(([0], np.cumsum([len(d) for d in ids]))).astype(np.int64)
    return Documents(np.concatenate(ids), offsets)


def test_neutral_masks_are_all_mask_tokens_and_repeat_under_the_seed(tokenizer, stdlib_texts) -> None:
    docs = _docs(tokenizer, stdlib_texts[:2])
    s = tokenizer.specials
    mlm = build_objective("mlm", s, tokenizer, model_kind="encoder", overrides=NEUTRAL_MLM)
    a = corrupted_batches(docs, mlm, s, 64, 16, 8, seed=7)
    b = corrupted_batches(docs, mlm, s, 64, 16, 8, seed=7)
    c = corrupted_batches(docs, mlm, s, 64, 16, 8, seed=8)
    assert all(torch.equal(x.input_ids, y.input_ids) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x.input_ids, y.input_ids) for x, y in zip(a, c, strict=True))
    labels = torch.cat([x.labels for x in a])
    inputs = torch.cat([x.input_ids for x in a])
    scored = labels != IGNORE
    assert bool((inputs[scored] == s.mask).all())  # nothing of the answer is visible
    ordinary = (inputs >= s.first_ordinary) | scored
    assert 0.13 < float(scored.sum() / ordinary.sum()) < 0.17  # exactly 15% per row, up to rounding


def test_a_copy_model_scores_zero_masked_accuracy(stub, tokenizer, stdlib_texts) -> None:
    """Copying the input at a masked position predicts <mask>: a leak would show up as accuracy > 0."""
    V = tokenizer.vocab_size
    model = stub(10.0 * torch.eye(V), kind="encoder")
    out = objective_scores(
        model,
        "encoder",
        {},
        _docs(tokenizer, stdlib_texts[:2]),
        tokenizer.specials,
        tokenizer,
        64,
        16,
        8,
        0,
        "cpu",
    )
    assert out["masked_accuracy"] == 0.0 and out["masked_tokens"] > 50
    assert 0.0 < out["masked_majority_accuracy"] < 1.0


def test_an_oracle_that_sees_the_labels_scores_one(tokenizer, stdlib_texts) -> None:
    s = tokenizer.specials
    mlm = build_objective("mlm", s, tokenizer, model_kind="encoder", overrides=NEUTRAL_MLM)
    batches = corrupted_batches(_docs(tokenizer, stdlib_texts[:1]), mlm, s, 64, 8, 8, seed=0)

    class Oracle(torch.nn.Module):
        def forward(self, batch):
            from objtrain.batch import ModelOutput

            target = torch.where(batch.labels == IGNORE, batch.input_ids, batch.labels)
            return ModelOutput(
                logits=20.0 * torch.nn.functional.one_hot(target, tokenizer.vocab_size).float()
            )

    score = score_batches(Oracle(), mlm, batches, "cpu")
    assert score.correct == score.targets > 0
    expected = math.log1p((tokenizer.vocab_size - 1) * math.exp(-20.0))  # -log softmax of the 20-logit
    assert score.nats / score.targets == pytest.approx(expected, rel=0.1)  # float32 logits
