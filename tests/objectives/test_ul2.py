"""UL2 mixture of denoisers (reference section 7): the denoiser table, mode tokens, lengths, mixing."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from objtrain import IGNORE
from objtrain.errors import UserError
from objtrain.objectives.registry import build_objective, objective_config, objective_defaults
from objtrain.objectives.ul2 import UL2, s_target_lengths
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary
MODES = {SP.nlu: "R", SP.nlg: "X", SP.s2s: "S"}


def test_yaml_mirrors_config_defaults() -> None:
    assert objective_defaults("ul2") == dataclasses.asdict(UL2.Config())
    assert objective_config("ul2") == UL2.Config()


def test_default_table_is_the_papers() -> None:
    """The 7 denoisers of section 7 with their mode tokens, weighted 40% R / 40% X / 20% S."""
    table = [(d.kind, d.mean_noise_span_length, d.noise_density, d.mode) for d in UL2.Config().denoisers]
    assert table == [
        ("R", 3.0, 0.15, "nlu"),
        ("R", 8.0, 0.15, "nlu"),
        ("X", 3.0, 0.5, "nlg"),
        ("X", 8.0, 0.5, "nlg"),
        ("X", 64.0, 0.15, "nlg"),
        ("X", 64.0, 0.5, "nlg"),
        ("S", 3.0, 0.25, "s2s"),
    ]
    shares: dict[str, float] = {}
    for d in UL2.Config().denoisers:
        shares[d.kind] = shares.get(d.kind, 0.0) + d.weight
    assert shares == pytest.approx({"R": 0.4, "X": 0.4, "S": 0.2})


def test_raw_lengths() -> None:
    """Decoder-only: rows hold the largest single-denoiser need (X(64, .5) at 512, one input position
    spent on the mode token), each row fed its own denoiser's need. Encoder-decoder: the encoder is the
    model length, the decoder the mixture's targets per input times it, and rows hold at most both."""
    dec = build_objective("ul2", SP, model_kind="decoder")
    assert dec.raw_length(512) == max(  # type: ignore[attr-defined]
        dec.denoiser_raw_length(d, 512)  # type: ignore[attr-defined]
        for d in UL2.Config().denoisers
    )
    assert dec.model_length(dec.raw_length(512)) == 512  # type: ignore[attr-defined]
    needs = dec.raw_lengths(512, torch.arange(100), 0)
    choice = dec.choose(torch.arange(100), 0)  # type: ignore[attr-defined]
    table = [dec.denoiser_raw_length(d, 512) for d in UL2.Config().denoisers]  # type: ignore[attr-defined]
    assert needs.tolist() == [table[int(k)] for k in choice]
    obj = build_objective("ul2", SP)
    ratio = obj.target_ratio  # type: ignore[attr-defined]
    assert 0.35 < ratio < 0.45  # 40% R (~0.2 targets per input), 40% X, 20% S at r = 0.25
    D = math.ceil(ratio * 512)
    assert obj.raw_length(512) == 512 + D
    assert obj.widths(obj.raw_length(512)) == (512, D)  # type: ignore[attr-defined]
    need = obj.raw_lengths(512, torch.arange(2000), 0)
    assert int(need.max()) <= obj.raw_length(512)
    assert 500 < float(need.double().mean()) < 512 + D


def test_plan_is_per_row_and_fills_both_sides() -> None:
    """Encoder-decoder rows: a few examples, each row's plan a function of (seed, row) only; the plan's
    linear estimate of the row's inputs and targets is close to both widths."""
    obj = build_objective("ul2", SP)
    index = torch.arange(3000)
    plan = obj.plan(512, index, 4)  # type: ignore[attr-defined]
    part = obj.plan(512, index[1000:1010], 4)  # type: ignore[attr-defined]
    for name in ("denoiser", "fraction", "length", "count"):
        assert torch.equal(getattr(plan, name)[1000:1010], getattr(part, name)), name
    assert torch.equal(plan.denoiser[:, 0], obj.choose(index, 4))  # type: ignore[attr-defined]
    assert 2.0 <= float(plan.count.double().mean()) <= 4.0
    assert int(plan.count.max()) <= 8 and bool((plan.length[:, 0] > 0).all())
    valid = torch.arange(8)[None, :] < plan.count[:, None]
    assert bool((plan.length[valid] >= 8).all()) and bool((plan.length[~valid] == 0).all())


@pytest.mark.parametrize("kind", ["encdec", "decoder"])
def test_denoiser_shares_follow_the_weights(kind: str) -> None:
    """Every example's denoiser is drawn by weight; encoder-decoder rows stop drawing on what was drawn
    only, so the shares of the examples are still the weights (Wald's identity)."""
    obj = build_objective("ul2", SP, model_kind=kind)  # type: ignore[arg-type]
    plan = obj.plan(512, torch.arange(20_000), 0)  # type: ignore[attr-defined]
    valid = torch.arange(plan.denoiser.size(1))[None, :] < plan.count[:, None]
    counts = torch.bincount(plan.denoiser[valid], minlength=7).double() / int(valid.sum())
    expected = torch.tensor([d.weight for d in UL2.Config().denoisers], dtype=torch.float64)
    assert float((counts - expected).abs().max()) < 0.01
    s = plan.fraction[valid & (plan.denoiser == 6)]  # S at r = 0.25: uniform on [0, 0.5]
    assert float(s.min()) >= 0.0 and float(s.max()) <= 0.5 and abs(float(s.mean()) - 0.25) < 0.01


@pytest.mark.parametrize("kind", ["encdec", "decoder"])
def test_rows_follow_their_denoiser(kind: str) -> None:
    """Every document's input starts with a mode token of one of its row's examples; R/X documents of
    two or more tokens hold sentinels, S documents none; realised shares are reported in stats; labels
    never on padding."""
    obj = build_objective("ul2", SP, model_kind=kind)  # type: ignore[arg-type]
    L = obj.raw_length(64)
    B = 32
    rows = torch.randint(O, O + 500, (B, L))
    docs = torch.zeros(B, L, dtype=torch.int64)
    docs[::2, L // 2 :] = 1
    batch = obj(rows, docs, torch.arange(B), 5)
    plan = obj.plan(64, torch.arange(B), 5)  # type: ignore[attr-defined]
    denoisers = obj.config.denoisers
    shares = sum(v for k, v in batch.stats.items() if k.startswith("share/"))
    assert shares == pytest.approx(1.0)
    assert batch.stats["target_tokens_dropped"] == 0
    seen = set()
    for b in range(B):
        kinds = {denoisers[int(plan.denoiser[b, i])].kind for i in range(int(plan.count[b]))}
        ids, d = batch.input_ids[b], batch.document_ids[b]
        for doc in sorted(set(d.tolist()) - {-1}):
            part = ids[d == doc]
            kind_ = MODES[int(part[0])]
            assert kind_ in kinds
            seen.add(kind_)
            if part.numel() > 4:
                assert bool(SP.is_sentinel(part).any()) == (kind_ != "S")
    assert seen == {"R", "X", "S"}
    if kind == "encdec":
        assert batch.decoder_document_ids is not None
        assert bool(((batch.labels != IGNORE) == (batch.decoder_document_ids >= 0)).all())
    else:
        assert bool((batch.document_ids[batch.labels != IGNORE] >= 0).all())


@pytest.mark.parametrize("kind", ["encdec", "decoder"])
def test_rows_use_only_their_raw_lengths(kind: str) -> None:
    """A row only reads the first raw_lengths tokens: changing the rest of the row changes nothing."""
    obj = build_objective("ul2", SP, model_kind=kind)  # type: ignore[arg-type]
    L = obj.raw_length(32)
    need = obj.raw_lengths(32, torch.arange(16), 0)
    rows = torch.randint(O, O + 500, (16, L))
    other = torch.where(torch.arange(L)[None, :] >= need[:, None], O + 7, rows)
    a = obj(rows, torch.zeros_like(rows), torch.arange(16), 0)
    b = obj(other, torch.zeros_like(rows), torch.arange(16), 0)
    assert bool((need < L).any())
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)


def test_no_row_needs_more_raw_tokens_than_it_holds() -> None:
    """Encoder-decoder at short model lengths: a row's examples, each at least 8 raw tokens, used to need
    more than the row's width (57 raw tokens for a 12-token row at m = 8, a third of the rows), and the
    loader skipped the excess unread. Every need now fits the width, and every example counted has text."""
    obj = build_objective("ul2", SP)
    for m in (8, 12, 20, 35, 64, 512):
        index = torch.arange(3000)
        need = obj.raw_lengths(m, index, 0)
        assert int(need.max()) <= obj.raw_length(m), m
        plan = obj.plan(m, index, 0)  # type: ignore[attr-defined]
        counted = torch.arange(plan.length.size(1))[None, :] < plan.count[:, None]
        assert bool((plan.length[counted] >= 1).all()) and bool((plan.length[~counted] == 0).all())
        assert torch.equal(need, plan.length.sum(1))


def test_batch_composition_does_not_change_a_row() -> None:
    obj = build_objective("ul2", SP)
    L = obj.raw_length(48)
    rows = torch.randint(O, O + 500, (8, L))
    docs = torch.zeros_like(rows)
    docs[1, 20:] = 1
    idx = torch.arange(8) + 1000
    whole = obj(rows, docs, idx, 2)
    a, b = obj(rows[:3], docs[:3], idx[:3], 2), obj(rows[3:], docs[3:], idx[3:], 2)
    for name, tensor in whole.tensors().items():
        assert torch.equal(tensor, torch.cat([a.tensors()[name], b.tensors()[name]])), name


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    m=st.integers(8, 600),
    kind=st.sampled_from(["encdec", "decoder"]),
    split=st.integers(1, 7),
    rate=st.sampled_from([0.0, 0.01, 0.2]),
)
def test_a_row_does_not_depend_on_its_batch(seed: int, m: int, kind: str, split: int, rate: float) -> None:
    """Any model length, seed and packing: a batch cut in two gives the same rows (the examples, their
    lengths and every document's corruption depend on the seed, the global row and its tokens only)."""
    obj = build_objective("ul2", SP, model_kind=kind)  # type: ignore[arg-type]
    L = obj.raw_length(m)
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(O, O + 500, (8, L), generator=g)
    docs = (torch.rand(8, L, generator=g) < rate).long().cumsum(1)
    idx = torch.arange(8) * 3 + seed
    need = obj.raw_lengths(m, idx, seed)
    docs = docs.masked_fill(torch.arange(L)[None, :] >= need[:, None], -1)
    whole = obj(rows, docs, idx, seed)
    a = obj(rows[:split], docs[:split], idx[:split], seed)
    b = obj(rows[split:], docs[split:], idx[split:], seed)
    for name, tensor in whole.tensors().items():
        assert torch.equal(tensor, torch.cat([a.tensors()[name], b.tensors()[name]])), name
    assert whole.stats["target_tokens_dropped"] == 0


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    m=st.integers(8, 300),
    rate=st.sampled_from([0.0, 0.02, 0.2, 0.6]),
    roll=st.booleans(),
    per_row=st.sampled_from([1, 8]),
)
def test_flat_layout_is_the_padded_one(seed: int, m: int, rate: float, roll: bool, per_row: int) -> None:
    """Encoder-decoder on CPU corrupts and lays out the real tokens only: the same batch and stats as
    the padded pieces, for any length, packing, roll and examples per row."""
    overrides = {"random_roll": roll, "examples_per_row": per_row}
    obj = build_objective("ul2", SP, model_kind="encdec", overrides=overrides)
    L = obj.raw_length(m)
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(O, O + 500, (8, L), generator=g)
    docs = (torch.rand(8, L, generator=g) < rate).long().cumsum(1)
    rows = torch.where(torch.rand(8, L, generator=g) < rate / 4, SP.eos, rows)  # some documents end in EOS
    idx = torch.arange(8) * 5 + seed
    docs[-1, L // 2 :] = -1
    flat = obj(rows, docs, idx, seed)
    obj.flat_layout = False
    padded = obj(rows, docs, idx, seed)
    assert flat.tensors().keys() == padded.tensors().keys()
    for name, tensor in padded.tensors().items():
        assert torch.equal(flat.tensors()[name], tensor), name
    assert list(flat.stats.items()) == list(padded.stats.items())


def test_s_split_keeps_both_parts() -> None:
    """S: round(1 + t (L - 1)) target tokens, at most L - 1 (the prefix keeps one); a 1-token document
    is all target, a lone EOS (length 0) has none."""
    lengths = torch.tensor([0, 1, 2, 2, 3, 10, 10, 10, 101])
    fraction = torch.tensor([0.3, 0.0, 0.0, 1.0, 0.5, 0.0, 0.25, 1.0, 0.5], dtype=torch.float64)
    assert s_target_lengths(lengths, fraction).tolist() == [0, 1, 1, 1, 2, 1, 3, 9, 51]


def test_sentinel_budget_is_checked() -> None:
    """Section 7 pitfall: X(3, .5) at 512 needs 128 sentinels; a tokenizer with fewer is refused."""
    obj = build_objective("ul2", Specials(n_sentinels=100))
    with pytest.raises(UserError, match="sentinels"):
        obj.raw_length(512)
    assert build_objective("ul2", Specials(n_sentinels=128)).raw_length(512) > 0


def test_bad_denoisers_are_user_errors() -> None:
    with pytest.raises(UserError):
        build_objective("ul2", SP, overrides={"denoisers": []})
    with pytest.raises(UserError):
        build_objective("ul2", SP, overrides={"denoisers": [{"kind": "Q"}]})
    with pytest.raises(UserError):
        build_objective("ul2", SP, overrides={"denoisers": [{"kind": "R", "weight": 0.0}]})


@pytest.mark.parametrize("kind", ["encdec", "decoder"])
def test_empty_and_tiny_documents(kind: str) -> None:
    """Padding-only rows stay padding; 1-token documents still get a mode token and an EOS, and those
    a short decoder has no room for are left unused, never cut off their targets."""
    obj = build_objective("ul2", SP, model_kind=kind)  # type: ignore[arg-type]
    L = obj.raw_length(16)
    rows = torch.randint(O, O + 500, (6, L))
    docs = torch.full((6, L), -1)
    docs[:3, :4] = torch.tensor([0, 1, 2, 3])
    batch = obj(rows, docs, torch.arange(6), 0)
    assert bool((batch.document_ids[3:] == -1).all()) and bool((batch.labels[3:] == IGNORE).all())
    assert batch.stats["target_tokens_dropped"] == 0
    kept = 0
    for b in range(3):
        starts = batch.input_ids[b][:1].tolist()
        assert starts[0] in MODES
        held = set(batch.document_ids[b].tolist()) - {-1}
        assert held == set(range(len(held))) and len(held) >= 2
        kept += len(held)
    assert batch.stats["raw_tokens_unused"] == 12 - kept


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    m=st.integers(8, 300),
    kind=st.sampled_from(["encdec", "decoder"]),
    roll=st.booleans(),
    end=st.sampled_from(["cut", "boundary", "full"]),
)
# short model lengths, where a row's examples used to need more raw tokens than the row holds
@example(seed=0, m=8, kind="encdec", roll=False, end="cut")
def test_a_cut_document_is_corrupted_as_its_prefix_alone(
    make_packed_rows: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    prefix_alone: Callable[..., None],
    seed: int,
    m: int,
    kind: str,
    roll: bool,
    end: str,
) -> None:
    """Rows fed their `raw_lengths`, each ending inside a document, at a boundary or with an EOS in its
    last position: a row holds a raw prefix of its (example, document) parts, whole parts then the first
    that does not fit cut before corruption, and that prefix is corrupted exactly as the row holding only
    it (no part's noise, mode token or split depends on what follows it; EOS-only and one-token documents
    included). Without roll the prefix is the longest that fits: one more raw token would be unused."""
    obj = build_objective("ul2", SP, model_kind=kind, overrides={"random_roll": roll})  # type: ignore[arg-type]
    L = obj.raw_length(m)
    index = torch.arange(6) * 7 + seed
    need = obj.raw_lengths(m, index, seed)
    rows = torch.full((6, L), SP.pad)
    docs = torch.full((6, L), -1)
    for b, n in enumerate(need.tolist()):
        rows[b, :n], docs[b, :n] = (t[0] for t in make_packed_rows(seed + b, 1, n, end))
    full = obj(rows, docs, index, seed)
    assert full.stats["target_tokens_dropped"] == 0 and full.stats["truncated_tokens"] == 0
    # the units corrupted on their own: the documents of every example of the row's plan
    plan = obj.plan(m, index, seed)  # type: ignore[attr-defined]
    bounds = plan.length.cumsum(1)
    example = (torch.arange(L)[None, :, None] >= bounds[:, None, :]).sum(2)
    parts = torch.where(docs >= 0, docs * bounds.size(1) + example, -1)
    # a cut R/X part is budgeted the sentinel a wrapped span may add: with roll it may stop one short
    prefix_alone(obj, rows, docs, index, seed, full, parts, longest=not roll)
