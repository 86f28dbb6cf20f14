"""Properties of issue 12: rolled span masks keep every </s>, packed rows lose no target token, NSP has
negatives whatever the packing, and the contrastive objective's loss and its refusals."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objtrain import IGNORE
from objtrain.batch import Batch, ModelOutput
from objtrain.errors import UserError
from objtrain.objectives.registry import build_objective
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary
# random tokens, every token a word: infilling keeps ~0.81 input tokens per raw token (code: ~0.77)
BART = {"whole_words": False, "sentence_end_ids": [O + 1], "vocab_size": O + 800, "input_ratio": 0.81}


def build(objective: str, kind: str):  # type: ignore[no-untyped-def]
    overrides = BART if objective == "bart" else {}
    return build_objective(objective, SP, model_kind=kind, overrides=overrides)  # type: ignore[arg-type]


def fed_rows(obj, m: int, gen: torch.Generator, n: int, multi: bool, rate: float, seed: int, first: int = 0):  # type: ignore[no-untyped-def]
    """Rows of `raw_length(m)` positions fed exactly `raw_lengths` tokens each (the tail is padding),
    as the training loader feeds them; returns (rows, document ids, row index)."""
    L = obj.raw_length(m)
    rows, docs = random_rows(gen, n, L, multi, rate)
    index = torch.arange(n) + first
    need = obj.raw_lengths(m, index, seed)
    tail = torch.arange(L)[None, :] >= need[:, None]
    return rows.masked_fill(tail, SP.pad), docs.masked_fill(tail, -1), index


def check_targets_whole(batch: Batch, objective: str) -> None:
    """No target token dropped, and every target document closes with </s>: encoder-decoder, each decoder
    document; decoder-only, each span-corrupted document (a UL2 S document's target is its own suffix)."""
    assert batch.stats["target_tokens_dropped"] == 0
    assert batch.stats.get("truncated_tokens", 0) == 0
    if batch.is_encdec:
        ids = batch.decoder_document_ids
        assert ids is not None
        ends = (ids >= 0) & torch.cat(
            [ids[:, 1:] != ids[:, :-1], torch.ones_like(ids[:, :1], dtype=torch.bool)], 1
        )
        assert bool((batch.labels[ends] == SP.eos).all())
        return
    d = batch.document_ids
    labelled = batch.labels != IGNORE
    for b in range(d.size(0)):
        for doc in set(d[b].tolist()) - {-1}:
            inside = d[b] == doc
            if objective == "ul2" and int(batch.input_ids[b][inside][0]) == SP.s2s:
                continue
            last = (inside & labelled[b]).nonzero().squeeze(1)
            if last.numel():
                assert int(batch.labels[b, last[-1]]) == SP.eos


def last_real(values: torch.Tensor, real: torch.Tensor) -> list[int]:
    """Per row, the last value at a real position (-1 for an empty row)."""
    out = []
    for v, r in zip(values, real, strict=True):
        idx = r.nonzero().squeeze(1)
        out.append(int(v[idx[-1]]) if idx.numel() else -1)
    return out


def random_rows(
    gen: torch.Generator, n: int, length: int, multi: bool, rate: float = 0.2
) -> tuple[torch.Tensor, torch.Tensor]:
    rows = torch.randint(O, O + 800, (n, length), generator=gen)
    if not multi:
        return rows, torch.zeros_like(rows)
    # documents of random lengths (1..length), each closed by EOS where it ends inside the row
    cuts = torch.rand(n, length, generator=gen) < torch.rand(n, 1, generator=gen) * rate
    cuts[:, 0] = False
    docs = cuts.long().cumsum(1)
    ends = torch.zeros_like(cuts)
    ends[:, :-1] = docs[:, 1:] != docs[:, :-1]
    return torch.where(ends, SP.eos, rows), docs


@pytest.mark.parametrize("kind", ["encdec", "decoder"])
@pytest.mark.parametrize("multi", [False, True])
def test_random_roll_keeps_every_eos_and_drops_nothing(kind: str, multi: bool) -> None:
    """Every row ends its input and its target with </s>, for raw lengths 2..600 and many seeds."""
    obj = build_objective("span", SP, model_kind=kind, overrides={"random_roll": True})  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(1 if multi else 0)
    lengths = sorted({*range(2, 40), *torch.randint(40, 601, (40,), generator=gen).tolist(), 600})
    for length in lengths:
        rows, docs = random_rows(gen, 12, length, multi)
        for seed in range(3):
            batch = obj(rows, docs, torch.arange(12) + 1000 * seed, seed)
            assert batch.stats["target_tokens_dropped"] == 0, (length, seed)
            assert batch.stats["truncated_tokens"] == 0, (length, seed)
            if kind == "encdec":
                assert set(last_real(batch.input_ids, batch.document_ids >= 0)) == {SP.eos}
                assert batch.decoder_document_ids is not None
                assert set(last_real(batch.labels, batch.decoder_document_ids >= 0)) == {SP.eos}
            else:
                labelled = batch.labels != IGNORE
                assert set(last_real(batch.labels, labelled)) == {SP.eos}, (length, seed)


LOSSLESS = [
    ("span", "encdec"),
    ("span", "decoder"),
    ("ul2", "encdec"),
    ("ul2", "decoder"),
    ("bart", "encdec"),
]


@pytest.mark.parametrize(("objective", "kind"), LOSSLESS)
def test_packed_rows_drop_no_target_and_waste_little(objective: str, kind: str) -> None:
    """Many documents per row: every document's target is whole (it ends in </s>) and nothing is dropped,
    even for documents of a few tokens; for documents of ~100+ tokens (document ends at a rate below 1%)
    the raw text left unused by the fit stays within 5%, rows fed exactly what `raw_lengths` asks."""
    obj = build(objective, kind)
    gen = torch.Generator().manual_seed(3)
    fed = unused = 0
    for m in (32, 96, 512):
        for seed in range(4):
            rate = 0.2 if seed == 0 else 0.01  # seed 0: tiny documents (not counted in the waste)
            rows, docs, index = fed_rows(obj, m, gen, 16, True, rate, seed, 100 * seed)
            batch = obj(rows, docs, index, seed)
            check_targets_whole(batch, objective)
            if seed:
                fed += batch.stats["raw_tokens_fed"]
                unused += batch.stats["raw_tokens_unused"]
    assert unused / fed <= 0.05, unused / fed


@pytest.mark.parametrize(("objective", "kind"), LOSSLESS)
@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    m=st.integers(16, 700),
    multi=st.booleans(),
    rate=st.sampled_from([0.3, 0.02]),
)
def test_any_length_and_seed_drops_no_target(
    objective: str, kind: str, seed: int, m: int, multi: bool, rate: float
) -> None:
    """Property: for any model length, seed and packing (one document per row, or many short or long
    ones), no target token is dropped or truncated, every target document closes with </s>, and the batch
    is no wider than the objective's widths."""
    obj = build(objective, kind)
    gen = torch.Generator().manual_seed(seed)
    rows, docs, index = fed_rows(obj, m, gen, 6, multi, rate, seed, seed * 7)
    batch = obj(rows, docs, index, seed)
    check_targets_whole(batch, objective)
    widths = obj.widths(rows.size(1))  # type: ignore[attr-defined]
    assert batch.input_ids.size(1) <= widths[0]
    if batch.is_encdec:
        assert batch.labels.size(1) <= widths[1]
    assert 0 <= batch.stats["raw_tokens_unused"] <= batch.stats["raw_tokens_fed"]


@pytest.mark.parametrize(("objective", "kind"), LOSSLESS)
@pytest.mark.parametrize("m", [256, 512])
def test_realistic_rows_pad_and_waste_little(objective: str, kind: str, m: int) -> None:
    """Documents of ~200 tokens packed in rows fed their `raw_lengths`: at most 5% of the input positions
    and 5% of the target positions are padding, and at most 5% of the raw tokens fed go unused."""
    obj = build(objective, kind)
    gen = torch.Generator().manual_seed(m)
    fed = unused = inputs = input_pad = targets = target_pad = 0
    for seed in range(3):
        rows, docs, index = fed_rows(obj, m, gen, 64, True, 0.01, seed, 64 * seed)
        batch = obj(rows, docs, index, seed)
        check_targets_whole(batch, objective)
        fed += batch.stats["raw_tokens_fed"]
        unused += batch.stats["raw_tokens_unused"]
        inputs += batch.document_ids.numel()
        input_pad += int((batch.document_ids < 0).sum())
        target_docs = batch.decoder_document_ids if batch.is_encdec else batch.document_ids
        assert target_docs is not None
        targets += target_docs.numel()
        target_pad += int((target_docs < 0).sum())
    assert unused / fed <= 0.05, unused / fed
    assert input_pad / inputs <= 0.05, input_pad / inputs
    assert target_pad / targets <= 0.05, target_pad / targets


# ---------------------------------------------------------------------------------------------------
# Contrastive


def _encoder(dropout: float = 0.0):  # type: ignore[no-untyped-def]
    from objtrain.models import build_model, model_config

    torch.manual_seed(0)
    return build_model(
        model_config("encoder", "tiny", {"dropout": dropout, "n_layer": 2, "d_model": 64}, vocab_size=800 + O)
    )


def test_contrastive_identical_views_beat_different_documents() -> None:
    """Dropout off: the two views of a row are identical, so its positive has cosine 1 and the loss is
    lower than when the 'positive' is another document."""
    obj = build_objective("contrastive", SP)
    model = _encoder().eval()
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(O, O + 800, (6, 24), generator=gen)
    batch = obj(rows, torch.zeros_like(rows), torch.arange(6), 0)
    assert torch.equal(batch.input_ids[0::2], batch.input_ids[1::2])
    same = obj.loss(model(batch), batch)
    assert int(same.n_targets) == 6  # the unit is the pair
    swapped = obj(rows, torch.zeros_like(rows), torch.arange(6), 0)
    swapped.input_ids[1::2] = swapped.input_ids[1::2].roll(1, dims=0)  # each positive: another document
    other = obj.loss(model(swapped), swapped)
    assert float(same.loss_sum.detach()) < float(other.loss_sum.detach())
    assert float(same.metrics["positive_cosine"]) == pytest.approx(1.0, abs=1e-5)


def test_contrastive_negatives_are_the_other_rows() -> None:
    """The loss equals InfoNCE over the batch computed by hand, and changing another row changes it."""
    obj = build_objective("contrastive", SP, overrides={"temperature": 0.1})
    z = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    batch = obj(torch.randint(O, O + 800, (4, 10)), torch.zeros(4, 10, dtype=torch.long), torch.arange(4), 0)
    out = obj.loss(ModelOutput(logits=torch.zeros(8, 10, 5), pooled=z), batch)
    a = torch.nn.functional.normalize(z[0::2], dim=-1)
    b = torch.nn.functional.normalize(z[1::2], dim=-1)
    logits = a @ b.T / 0.1
    expected = -(logits.diag() - logits.logsumexp(dim=1)).sum()
    assert torch.allclose(out.loss_sum, expected, atol=1e-5)
    z2 = z.clone()
    z2[7] = torch.randn(16)  # the second view of row 3: only a negative for rows 0..2
    out2 = obj.loss(ModelOutput(logits=torch.zeros(8, 10, 5), pooled=z2), batch)
    assert not torch.allclose(out.loss_sum, out2.loss_sum)


def test_contrastive_batch_of_one_is_refused() -> None:
    obj = build_objective("contrastive", SP)
    batch = obj(torch.randint(O, O + 800, (1, 10)), torch.zeros(1, 10, dtype=torch.long), torch.arange(1), 0)
    with pytest.raises(UserError, match="no negatives"):
        obj.loss(ModelOutput(logits=torch.zeros(2, 10, 5), pooled=torch.randn(2, 8)), batch)


def test_contrastive_crops_are_two_views_of_the_row() -> None:
    obj = build_objective("contrastive", SP, overrides={"views": "crop"})
    rows = torch.arange(O, O + 40).repeat(3, 1)
    batch = obj(rows, torch.zeros_like(rows), torch.arange(3), 0)
    assert batch.input_ids.shape == (6, 40)
    for r in range(6):
        real = batch.input_ids[r][batch.document_ids[r] >= 0]
        assert real.numel() >= 40 * 0.5 * 0.9 - 1
        assert bool((real.diff() > 0).all())  # a crop keeps the row's order
    assert not torch.equal(batch.input_ids[0], batch.input_ids[1])
