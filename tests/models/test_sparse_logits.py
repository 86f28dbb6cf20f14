"""Sparse prediction (`Batch.sparse_logits`): token logits only at the labelled positions give the dense
path's loss and gradients, and the FLOPs estimate counts the unembedding only where it runs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from objtrain import IGNORE
from objtrain.models import build_model, model_config
from objtrain.objectives.registry import build_objective
from objtrain.specials import Specials
from objtrain.training.accounting import batch_flops

SP = Specials()
V = 300


def _rows(width: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(SP.first_ordinary, V, (6, width), generator=g)
    docs = (torch.rand(6, width, generator=g) < 0.05).long().cumsum(1)
    docs[4:, width // 2 :] = -1
    return torch.where(docs >= 0, rows, SP.pad), docs


@pytest.mark.parametrize(("name", "kind"), [("mlm", "encoder"), ("gpt_bert", "decoder")])
def test_sparse_logits_give_the_dense_loss_and_gradients(name: str, kind: str) -> None:
    objective = build_objective(name, SP, model_kind=kind, overrides={"vocab_size": V})  # type: ignore[arg-type]
    rows, docs = _rows(objective.raw_length(48))
    sparse = objective(rows, docs, torch.arange(6), 1)
    assert sparse.sparse_logits
    dense = dataclasses.replace(sparse, sparse_logits=False)
    torch.manual_seed(0)
    model = build_model(model_config(kind, "debug", {"init_std": 0.3}, vocab_size=V))
    results = []
    for batch in (sparse, dense):
        model.zero_grad()
        out = model(batch)
        loss = objective.loss(out, batch)
        (loss.loss_sum / loss.n_targets).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        results.append((out.logits, loss, grads))
    (s_logits, s_loss, s_grads), (d_logits, d_loss, d_grads) = results
    keep = sparse.labels != IGNORE
    assert s_logits.shape == (int(keep.sum()), V)
    torch.testing.assert_close(s_logits, d_logits[keep])
    torch.testing.assert_close(s_loss.loss_sum, d_loss.loss_sum)
    assert int(s_loss.n_targets) == int(d_loss.n_targets)
    assert len(s_grads) == len(d_grads)
    for a, b in zip(s_grads, d_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_flops_estimate_counts_the_unembedding_at_labelled_positions_only() -> None:
    objective = build_objective("mlm", SP, model_kind="encoder", overrides={"vocab_size": V})
    rows, docs = _rows(64)
    sparse = objective(rows, docs, torch.arange(6), 1)
    dense = dataclasses.replace(sparse, sparse_logits=False)
    cfg = model_config("encoder", "debug", vocab_size=V)
    saved = 6 * V * cfg.d_model * (sparse.labels.numel() - sparse.n_targets)
    assert batch_flops(cfg, dense) - batch_flops(cfg, sparse) == saved
