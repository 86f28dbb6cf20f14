"""GPT-BERT (Charpentier & Samuel 2024): causal rows are CLM rows, masked rows are next-token-aligned MLM
rows read bidirectionally, mixed per row as a pure function of (row, seed)."""

from __future__ import annotations

import math

import pytest
import torch

from objtrain import IGNORE
from objtrain.errors import UserError
from objtrain.models.attention import self_attention_mask
from objtrain.objectives.clm import causal_batch
from objtrain.objectives.gpt_bert import GptBert, GptBertConfig
from objtrain.objectives.registry import build_objective, objective_config, objective_defaults
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary
V = 1500


def packed(seed: int, B: int, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ordinary tokens in EOS-closed documents (some of one token), padded tails on some rows."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(O, V, (B, L), generator=g)
    ends = torch.rand(B, L, generator=g) < 0.08
    rows = torch.where(ends, SP.eos, rows)
    docs = torch.zeros(B, L, dtype=torch.int64)
    docs[:, 1:] = ends[:, :-1].long().cumsum(dim=1)
    pad_from = torch.randint(L // 2, 2 * L, (B,), generator=g).clamp(max=L)
    docs[torch.arange(L)[None, :] >= pad_from[:, None]] = -1
    return torch.where(docs >= 0, rows, SP.pad), docs


def gpt_bert(**kw: object) -> GptBert:
    return GptBert(GptBertConfig(vocab_size=V, **kw), SP)  # type: ignore[arg-type]


def test_yaml_mirrors_config_defaults_and_the_paper_ratio() -> None:
    assert objective_config("gpt_bert") == GptBertConfig()
    assert objective_defaults("gpt_bert")["causal_fraction"] == pytest.approx(1 / 16)  # 1:15
    objective = build_objective("gpt_bert", SP, overrides={"vocab_size": V})
    assert objective.model_kind == "decoder" and objective.scores_left_to_right
    assert objective.raw_length(64) == 65


def test_causal_rows_are_clm_rows_and_masked_rows_attend_both_ways() -> None:
    rows, docs = packed(0, 64, 41)
    b = gpt_bert()(rows, docs, torch.arange(64), 3)
    clm = causal_batch(rows, docs, False)
    causal = ~b.prefix_mask.any(dim=1) & (docs[:, :40] >= 0).any(dim=1)
    masked = b.prefix_mask.any(dim=1)
    assert causal.any() and masked.any()
    assert torch.equal(b.input_ids[causal], clm.input_ids[causal])
    assert torch.equal(b.labels[causal], clm.labels[causal])
    assert torch.equal(b.prefix_mask[masked], b.document_ids[masked] >= 0)
    # the attention the model builds: within documents, causal for causal rows, all ways for masked rows
    allowed = self_attention_mask(b.document_ids, b.attention, b.prefix_mask)
    allowed = allowed.reshape(64, 40, 40)
    same = (b.document_ids[:, :, None] == b.document_ids[:, None, :]) & (b.document_ids[:, :, None] >= 0)
    lower = torch.ones(40, 40, dtype=torch.bool).tril()
    assert torch.equal(allowed[causal] & same[causal], same[causal] & lower)
    assert torch.equal(allowed[masked] & same[masked], same[masked])


def test_masked_rows_label_the_next_position_and_never_cross_documents() -> None:
    rows, docs = packed(1, 200, 129)
    b = gpt_bert(causal_fraction=0.0)(rows, docs, torch.arange(200), 5)
    tokens, d = rows[:, :128], docs[:, :128]
    lab = b.labels
    at = lab != IGNORE  # output t predicts the token at t + 1
    assert not at[:, -1].any()
    nxt = torch.zeros_like(at)
    nxt[:, 1:] = at[:, :-1]  # the predicted (selected) positions
    assert torch.equal(lab[:, :-1][at[:, :-1]], tokens[:, 1:][at[:, :-1]])
    # never the first token of a document, a special token or padding; same document as its predictor
    follows = torch.zeros_like(at)
    follows[:, 1:] = (d[:, 1:] == d[:, :-1]) & (d[:, 1:] >= 0)
    assert not (nxt & ~follows).any()
    assert not (nxt & SP.is_special(tokens)).any()
    # unselected positions keep their token; selected ones are 80% <mask>, 10% random, 10% kept
    assert torch.equal(b.input_ids[~nxt], tokens[~nxt])
    n = int(nxt.sum())
    eligible = int((follows & ~SP.is_special(tokens)).sum())
    assert abs(n - 0.15 * eligible) <= 0.01 * eligible + 200
    shown = b.input_ids[nxt]
    n_mask = int((shown == SP.mask).sum())
    n_kept = int((shown == tokens[nxt]).sum())
    assert abs(n_mask - 0.8 * n) <= 5 * math.sqrt(n * 0.16) + 1
    assert abs(n_kept - 0.1 * n) <= 5 * math.sqrt(n * 0.09) + 1
    assert b.stats["selected"] == n and b.stats["eligible"] == eligible
    assert b.stats["masked_rows"] == 200 and b.stats["causal_rows"] == 0


def test_worked_example() -> None:
    rows = torch.tensor([[O + 1, O + 2, O + 3, O + 4, O + 5, O + 6]])
    docs = torch.zeros_like(rows)
    objective = gpt_bert(causal_fraction=0.0, selection_rate=0.2, mask_prob=1.0, random_prob=0.0)
    b = objective(rows, docs, torch.tensor([0]), 0)
    (i,) = torch.nonzero(b.input_ids[0] == SP.mask)[0].tolist()  # one of 4 eligible (positions 1..4)
    assert 1 <= i <= 4
    expected = torch.full((5,), IGNORE)
    expected[i - 1] = O + 1 + i
    assert torch.equal(b.labels[0], expected)
    assert b.prefix_mask.all()
    assert b.stats["raw_tokens_unused"] == 1  # a masked row's last raw token


def test_causal_share_follows_the_fraction_and_rows_do_not_depend_on_their_batch() -> None:
    objective = gpt_bert()
    rows, docs = packed(2, 4000, 17)
    b = objective(rows, docs, torch.arange(4000), 9)
    share = b.stats["causal_rows"] / 4000
    assert abs(share - 1 / 16) < 5 * math.sqrt(1 / 16 * 15 / 16 / 4000)
    part = objective(rows[100:140], docs[100:140], torch.arange(100, 140), 9)
    for name in ("input_ids", "labels", "prefix_mask"):
        assert torch.equal(getattr(part, name), getattr(b, name)[100:140])
    other = objective(rows[100:140], docs[100:140], torch.arange(100, 140), 10)
    assert not torch.equal(other.input_ids, part.input_ids)
    all_causal = gpt_bert(causal_fraction=1.0)(rows, docs, torch.arange(4000), 9)
    assert torch.equal(all_causal.labels, causal_batch(rows, docs, False).labels)


def test_reported_raw_usage_is_what_the_batch_holds() -> None:
    gen = torch.Generator().manual_seed(4)
    rows = torch.stack([torch.randperm(V - O, generator=gen)[:33] for _ in range(40)]) + O
    docs = (torch.rand(40, 33, generator=gen) < 0.06).long().cumsum(1)
    docs[30:, 20:] = -1
    rows = torch.where(docs >= 0, rows, SP.pad)
    b = gpt_bert(causal_fraction=0.5, random_prob=0.0)(rows, docs, torch.arange(40), 0)
    used = 0
    for r in range(40):
        values = set(b.input_ids[r].tolist()) | set(b.labels[r].tolist())
        used += sum(v in values for v in rows[r][docs[r] >= 0].tolist())
    fed = int((docs >= 0).sum())
    assert b.stats["raw_tokens_fed"] == fed
    assert b.stats["raw_tokens_unused"] == fed - used


def test_bad_settings_are_user_errors() -> None:
    with pytest.raises(UserError, match="causal_fraction"):
        build_objective("gpt_bert", SP, overrides={"causal_fraction": 1.5, "vocab_size": V})
    with pytest.raises(UserError, match="cannot train"):
        build_objective("gpt_bert", SP, model_kind="encoder", overrides={"vocab_size": V})
