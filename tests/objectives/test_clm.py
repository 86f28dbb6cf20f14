"""Causal LM (reference section 1): aligned labels, document boundaries, EOS trained, pads never."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objtrain import IGNORE
from objtrain.objectives.clm import CausalLM
from objtrain.objectives.registry import build_objective, objective_defaults
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary


def packed(seed: int, B: int, L: int, mean_doc: int = 12, eos: int = SP.eos, pad: int = SP.pad):
    """B packed rows of documents ending in EOS (the last one may be cut), every third row padded."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(O, O + 300, (B, L), generator=g)
    docs = torch.full((B, L), -1, dtype=torch.int64)
    for b in range(B):
        pos, d = 0, 0
        end = L - (L // 4 if b % 3 == 2 else 0)
        while pos < end:
            n = int(torch.randint(1, 2 * mean_doc, (1,), generator=g))
            stop = min(pos + n, end)
            docs[b, pos:stop] = d
            if stop == pos + n:
                rows[b, stop - 1] = eos
            pos, d = stop, d + 1
        rows[b, end:] = pad
    return rows, docs


def test_golden_example() -> None:
    """Shift exactly once (section 1 pitfall): labels are x[1:], not x[2:]; EOS position predicts nothing."""
    x = torch.tensor([[300, 301, SP.eos, 302, 303, 304]])
    d = torch.tensor([[0, 0, 0, 1, 1, 1]])
    b = CausalLM(CausalLM.Config(), SP)(x, d, torch.arange(1), 0)
    assert b.input_ids.tolist() == [[300, 301, SP.eos, 302, 303]]
    assert b.labels.tolist() == [[301, SP.eos, IGNORE, 303, 304]]
    assert b.positions.tolist() == [[0, 1, 2, 0, 1]]
    assert b.document_ids.tolist() == [[0, 0, 0, 1, 1]]
    assert b.attention == "causal"


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 6), L=st.integers(0, 80), cross=st.booleans())
def test_labels_are_next_token_within_documents(seed: int, B: int, L: int, cross: bool) -> None:
    rows, docs = packed(seed, B, L)
    obj = CausalLM(CausalLM.Config(cross_document_targets=cross), SP)
    batch = obj(rows, docs, torch.arange(B), seed)
    T = max(L - 1, 0)
    assert obj.raw_length(T) == L or L == 0
    assert batch.input_ids.shape == batch.labels.shape == (B, T)
    for b in range(B):
        for t in range(T):
            here, there = int(docs[b, t]), int(docs[b, t + 1])
            trained = here >= 0 and there >= 0 and (cross or here == there)
            assert int(batch.labels[b, t]) == (int(rows[b, t + 1]) if trained else IGNORE)
    assert torch.equal(batch.document_ids, docs[:, :T])
    assert not bool((batch.labels[batch.document_ids < 0] != IGNORE).any())  # no label on padding


def test_eos_is_trained_even_when_pad_equals_eos() -> None:
    """Pitfall 15.3 (CLM: pads, never EOS) and pad_id == eos_id (transformers#23530, trl#976): masking
    by id would hide every real EOS. Labels come from document_ids only, so EOS stays a target."""
    specials = Specials(pad=3)  # pad shares EOS's id
    rows, docs = packed(5, 6, 64, pad=3)
    batch = CausalLM(CausalLM.Config(), specials)(rows, docs, torch.arange(6), 0)
    eos_targets = (batch.labels == SP.eos).sum()
    expected = ((rows[:, 1:] == SP.eos) & (docs[:, 1:] >= 0) & (docs[:, :-1] == docs[:, 1:])).sum()
    assert int(eos_targets) == int(expected) > 0
    assert not bool((batch.labels[docs[:, :-1] < 0] != IGNORE).any())


def test_batch_size_independent() -> None:
    """Pitfall 15.6: a row's batch depends only on (seed, row index), not on its batch."""
    rows, docs = packed(1, 8, 40)
    obj = CausalLM(CausalLM.Config(), SP)
    whole = obj(rows, docs, torch.arange(8), 3)
    parts = [obj(rows[s], docs[s], torch.arange(8)[s], 3) for s in (slice(0, 3), slice(3, 8))]
    for name, tensor in whole.tensors().items():
        assert torch.equal(tensor, torch.cat([p.tensors()[name] for p in parts])), name


def test_very_long_rows() -> None:
    rows, docs = packed(2, 2, 8193, mean_doc=3000)
    batch = CausalLM(CausalLM.Config(), SP)(rows, docs, torch.arange(2), 0)
    same = (docs[:, 1:] == docs[:, :-1]) & (docs[:, 1:] >= 0)
    assert torch.equal(batch.labels != IGNORE, same)
    assert torch.equal(batch.labels[same], rows[:, 1:][same])


def test_yaml_mirrors_config_defaults() -> None:
    assert objective_defaults("clm") == dataclasses.asdict(CausalLM.Config())
    obj = build_objective("clm", SP, overrides={"cross_document_targets": True})
    assert isinstance(obj, CausalLM) and obj.config.cross_document_targets
