"""SOP's pair head learns a synthetic order task through the real objective, model and loss, and the
evaluation's pairs (`evaluation.sentence_order`) are the length the objective trains on, where it scores it.

The task: sentence k of every document draws its tokens from band k of the vocabulary, so whether a pair
is in order is visible (the first segment's bands come before the second's) but only by comparing the
two segments."""

from __future__ import annotations

import numpy as np
import torch

from objtrain.data.tokenizer import Tokenizer
from objtrain.evaluation.sentence_order import build_pairs, head_accuracy, pair_budget
from objtrain.models import build_model, model_config
from objtrain.objectives.registry import build_objective
from objtrain.objectives.sentences import sentence_end_table

BANDS, WIDTH, L = 12, 30, 64


def banded_documents(tokenizer: Tokenizer, n: int, seed: int) -> list[list[int]]:
    sp = tokenizer.specials
    ends = sentence_end_table(tokenizer)
    ordinary = [i for i in sp.ordinary_ids(tokenizer.vocab_size).tolist() if not ends[i]]
    end = next(i for i in sp.ordinary_ids(tokenizer.vocab_size).tolist() if ends[i])
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n):
        doc: list[int] = []
        for k in range(BANDS):
            doc += [ordinary[k * WIDTH + int(t)] for t in rng.integers(0, WIDTH, int(rng.integers(3, 7)))]
            doc.append(end)
        docs.append([*doc, sp.eos])
    return docs


def packed(docs: list[list[int]], B: int, eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    flat = torch.tensor([t for d in docs for t in d][: B * L]).view(B, L)
    ids = torch.zeros_like(flat)
    ids[:, 1:] = (flat[:, :-1] == eos).long().cumsum(1)
    return flat, ids


def test_the_pair_budget_is_the_trained_pair_length(tokenizer: Tokenizer) -> None:
    sop = build_objective("sop", tokenizer.specials, tokenizer, "encoder")
    for seq_len, pair_length in ((128, 128), (512, 128), (64, 40), (32, 128)):
        training = {"objective": "sop", "objective_config": {"pair_length": pair_length}}
        assert (
            pair_budget(training, seq_len)
            == sop.chunk_length(seq_len)
            == min(pair_length, (seq_len - 6) // 2)
        )


def test_a_sop_head_learns_sentence_order_far_above_chance(tokenizer: Tokenizer) -> None:
    sp = tokenizer.specials
    sop = build_objective("sop", sp, tokenizer, "encoder", {"pair_length": 40})
    torch.manual_seed(0)
    model = build_model(model_config("encoder", "debug", vocab_size=tokenizer.vocab_size))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(400):
        rows, ids = packed(banded_documents(tokenizer, 16, step), 16, sp.eos)
        batch = sop(rows, ids, torch.arange(16) + 16 * step, 0)
        lo = sop.loss(model(batch), batch)
        assert lo.pair_sum is not None and lo.n_pairs is not None
        loss = lo.loss_sum / lo.n_targets.clamp(min=1) + lo.pair_sum / lo.n_pairs.clamp(min=1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    rows, ids = packed(banded_documents(tokenizer, 64, 10**6), 64, sp.eos)
    held_out = sop(rows, ids, torch.arange(64) + 10**6, 1)
    with torch.no_grad():
        lo = sop.loss(model(held_out), held_out)
    assert float(lo.metrics["seq_accuracy"]) > 0.9  # chance is 0.5
    # the evaluation's own pairs, at the length the run trained on
    budget = pair_budget({"objective": "sop", "objective_config": {"pair_length": 40}}, L)
    pairs, _ = build_pairs(
        [np.array(d) for d in banded_documents(tokenizer, 100, 7)], tokenizer, 0, budget, 300
    )
    assert len(pairs.ids) >= 200
    assert head_accuracy(model, pairs, sp.pad) > 0.9
