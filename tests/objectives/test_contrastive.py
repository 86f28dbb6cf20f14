"""Contrastive (SimCSE): what the encoder is fed and what the loss computes. The two dropout views differ
only through the model's dropout in training, pooling sees real tokens only, the temperature divides the
cosines once, gradients reach both views, and the negatives are the other rows of each micro-batch."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from objtrain.batch import ModelOutput
from objtrain.models import build_model, model_config
from objtrain.objectives.registry import build_objective
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary


def _encoder(dropout: float) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(model_config("encoder", "debug", {"dropout": dropout}, vocab_size=O + 200))


def _rows(n: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(O, O + 200, (n, length), generator=torch.Generator().manual_seed(seed))


def _pooled(z: torch.Tensor, rows: int) -> ModelOutput:
    return ModelOutput(logits=torch.zeros(rows, 1, 1), pooled=z)


def test_dropout_views_differ_only_through_training_mode_dropout() -> None:
    obj = build_objective("contrastive", SP)
    rows = _rows(4, 16)
    batch = obj(rows, torch.zeros_like(rows), torch.arange(4), 0)
    assert torch.equal(batch.input_ids[0::2], batch.input_ids[1::2])  # the same tokens twice
    model = _encoder(0.1)
    with torch.no_grad():
        pooled = model.train()(batch).pooled
        assert not torch.allclose(pooled[0::2], pooled[1::2])  # two dropout samples
        lo = obj.loss(model(batch), batch)
        assert float(lo.metrics["positive_cosine"]) < 0.999
        pooled = model.eval()(batch).pooled
        assert torch.equal(pooled[0::2], pooled[1::2])  # eval: no dropout, identical views
        pooled = _encoder(0.0).train()(batch).pooled
        assert torch.equal(pooled[0::2], pooled[1::2])  # dropout 0: identical even in training


def test_pooling_reads_real_tokens_only() -> None:
    """Crops leave padding at the end of a view: what sits there changes nothing."""
    obj = build_objective("contrastive", SP, overrides={"views": "crop", "crop_min": 0.3})
    rows = _rows(3, 32, seed=1)
    docs = torch.zeros_like(rows)
    docs[:, 24:] = -1  # real tokens first, padding after them, as the loader gives them
    batch = obj(rows, docs, torch.arange(3), 0)
    pad = batch.document_ids < 0
    assert bool(pad.any())
    model = _encoder(0.0).eval()
    with torch.no_grad():
        before = model(batch).pooled
        batch.input_ids = torch.where(pad, O + 7, batch.input_ids)
        after = model(batch).pooled
    torch.testing.assert_close(after, before)


def test_the_temperature_divides_the_cosines_once() -> None:
    t = 0.5
    obj = build_objective("contrastive", SP, overrides={"temperature": t})
    rows = _rows(2, 4)
    batch = obj(rows, torch.zeros_like(rows), torch.arange(2), 0)
    e = torch.eye(3)
    z = torch.stack([e[0], 3 * e[0], e[1], e[1]])  # positives: cosine 1; negatives: cosine 0
    lo = obj.loss(_pooled(z, 4), batch)
    assert float(lo.loss_sum) == pytest.approx(2 * math.log(1 + math.exp(-1 / t)), rel=1e-6)
    assert int(lo.n_targets) == 2


def test_gradients_reach_both_views() -> None:
    obj = build_objective("contrastive", SP)
    rows = _rows(4, 8)
    batch = obj(rows, torch.zeros_like(rows), torch.arange(4), 0)
    z = torch.randn(8, 16, generator=torch.Generator().manual_seed(2), requires_grad=True)
    obj.loss(_pooled(z, 8), batch).loss_sum.backward()
    assert z.grad is not None
    assert bool((z.grad[0::2].norm(dim=1) > 0).all()) and bool((z.grad[1::2].norm(dim=1) > 0).all())


def test_negatives_are_the_rows_of_each_micro_batch() -> None:
    """Two micro-batches of 3 pairs: the loop's sum of loss sums over the sum of pair counts is the mean of
    the per-micro-batch InfoNCE terms (2 negatives each), not InfoNCE over all 6 pairs (5 negatives)."""
    t = 0.05
    obj = build_objective("contrastive", SP)
    rows = _rows(6, 8)
    z = torch.randn(12, 16, generator=torch.Generator().manual_seed(3))
    parts = []
    for half in (slice(0, 3), slice(3, 6)):
        batch = obj(rows[half], torch.zeros_like(rows[half]), torch.arange(6)[half], 0)
        parts.append(obj.loss(_pooled(z[half.start * 2 : half.stop * 2], 6), batch))
    loss = sum(float(p.loss_sum) for p in parts) / sum(int(p.n_targets) for p in parts)

    def infonce(v: torch.Tensor) -> torch.Tensor:
        v = F.normalize(v, dim=-1)
        logits = v[0::2] @ v[1::2].T / t
        return F.cross_entropy(logits, torch.arange(logits.size(0)), reduction="none")

    per_micro = torch.cat([infonce(z[:6]), infonce(z[6:])]).mean()
    assert loss == pytest.approx(float(per_micro), rel=1e-5)
    assert loss != pytest.approx(float(infonce(z).mean()), rel=1e-3)
