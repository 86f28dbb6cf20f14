"""T5 span corruption (reference section 5): merge-back, exact counts, lengths, layouts, short rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.errors import UserError
from objtrain.objectives.noise import random_spans_helper, span_counts
from objtrain.objectives.registry import build_objective, objective_defaults
from objtrain.objectives.span import SpanCorruption
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary


def make_rows(
    seed: int, B: int, L: int, max_docs: int = 4, pad_tail: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ordinary tokens in B rows, cut into up to `max_docs` documents, some with trailing padding."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(O, O + 500, (B, L), generator=g)
    docs = torch.zeros(B, L, dtype=torch.int64)
    for b in range(B):
        cuts = sorted(
            torch.randint(
                1, max(L, 2), (int(torch.randint(0, max_docs, (1,), generator=g)),), generator=g
            ).tolist()
        )
        for c in cuts:
            docs[b, c:] += 1
        if pad_tail and b % 3 == 2:
            docs[b, L - L // 4 :] = -1
    return rows, docs


def original_documents(rows: torch.Tensor, docs: torch.Tensor, b: int) -> list[list[int]]:
    out = []
    ids = docs[b]
    for d in ids.unique().tolist():
        if d >= 0:
            toks = rows[b][ids == d].tolist()
            if toks and toks[-1] == SP.eos:
                toks = toks[:-1]
            out.append(toks)
    return out


def merge_back(inputs: list[int], targets: list[int]) -> list[int]:
    """Replace every sentinel in the inputs by the target tokens that follow the same sentinel."""
    assert inputs[-1] == SP.eos and targets[-1] == SP.eos
    fill: dict[int, list[int]] = {}
    current = None
    for t in targets[:-1]:
        if SP.is_sentinel(torch.tensor(t)):
            current = t
            fill[t] = []
        else:
            assert current is not None, "target tokens before the first sentinel"
            fill[current].append(t)
    out: list[int] = []
    order = []
    for t in inputs[:-1]:
        if SP.is_sentinel(torch.tensor(t)):
            out.extend(fill[t])
            order.append(t)
        else:
            out.append(t)
    assert order == list(fill), "sentinels appear in the same order in inputs and targets"
    return out


def documents_of(batch: Batch, b: int) -> list[tuple[list[int], list[int]]]:
    """(inputs, targets) of every document in row b of a span batch, for either layout."""
    out = []
    ids = batch.document_ids[b]
    for d in ids.unique().tolist():
        if d < 0:
            continue
        if batch.is_encdec:
            assert batch.decoder_document_ids is not None
            inputs = batch.input_ids[b][ids == d].tolist()
            targets = batch.labels[b][batch.decoder_document_ids[b] == d].tolist()
        else:
            assert batch.prefix_mask is not None
            seq = batch.input_ids[b][ids == d]
            prefix = batch.prefix_mask[b][ids == d]
            inputs, targets = seq[prefix].tolist(), seq[~prefix].tolist()
        out.append((inputs, targets))
    return out


def check_invariants(batch: Batch) -> None:
    """Labels never on padding; positions restart per document; decoder documents cross-attend to encoder
    documents of the same id; decoder-only labels never predict a prefix token."""
    if batch.is_encdec:
        assert batch.decoder_document_ids is not None and batch.decoder_input_ids is not None
        assert bool(((batch.labels != IGNORE) == (batch.decoder_document_ids >= 0)).all())
        for b in range(batch.input_ids.size(0)):
            enc_docs = set(batch.document_ids[b].tolist()) - {-1}
            dec_docs = set(batch.decoder_document_ids[b].tolist()) - {-1}
            assert dec_docs <= enc_docs
        # decoder input = labels shifted right inside each document, start id 0
        dec, lab, dd = batch.decoder_input_ids, batch.labels, batch.decoder_document_ids
        first = torch.ones_like(dd, dtype=torch.bool)
        first[:, 1:] = dd[:, 1:] != dd[:, :-1]
        real = dd >= 0
        assert bool((dec[first & real] == 0).all())
        inner = (~first & real)[:, 1:]
        assert bool((dec[:, 1:][inner] == lab[:, :-1][inner]).all())
    else:
        assert batch.prefix_mask is not None
        lab = batch.labels
        labelled = lab != IGNORE
        assert bool((batch.document_ids[labelled] >= 0).all())
        nxt_prefix = torch.zeros_like(labelled)
        nxt_prefix[:, :-1] = batch.prefix_mask[:, 1:]
        assert not bool((labelled & nxt_prefix).any()), "a label lies on the prefix"
        # the last column may predict a truncated token of its own document (a real target); elsewhere
        # every label's token is the next position, in the same document
        same_doc = torch.ones_like(labelled)
        same_doc[:, :-1] = batch.document_ids[:, 1:] == batch.document_ids[:, :-1]
        assert bool(same_doc[labelled].all())
        assert bool((lab[:, :-1][labelled[:, :-1]] == batch.input_ids[:, 1:][labelled[:, :-1]]).all())
    assert bool((batch.input_ids[batch.document_ids < 0] == SP.pad).all())


def test_yaml_mirrors_config_defaults() -> None:
    assert objective_defaults("span") == dataclasses.asdict(SpanCorruption.Config())


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    model_length=st.integers(16, 200),
    kind=st.sampled_from(["encdec", "decoder"]),
    roll=st.booleans(),
    density=st.sampled_from([0.15, 0.3, 0.5]),
    mean_span=st.sampled_from([1.0, 3.0, 8.0]),
)
def test_merge_back_reproduces_every_document(
    seed: int, model_length: int, kind: str, roll: bool, density: float, mean_span: float
) -> None:
    """Pitfall 15.7: replacing each input sentinel by its target span gives back the document exactly,
    for packed rows with several documents and padding, in both layouts, with and without roll."""
    obj = build_objective(
        "span",
        SP,
        model_kind=kind,  # type: ignore[arg-type]
        overrides={"random_roll": roll, "noise_density": density, "mean_noise_span_length": mean_span},
    )
    L = obj.raw_length(model_length)
    rows, docs = make_rows(seed, 6, L)
    batch = obj(rows, docs, torch.arange(6) + seed, seed)
    check_invariants(batch)
    width = batch.input_ids.size(1)
    assert width == obj.widths(L)[0]
    checked = 0
    for b in range(6):
        originals = original_documents(rows, docs, b)
        corrupted = documents_of(batch, b)
        assert len(corrupted) <= len(originals)
        for i, ((inputs, targets), original) in enumerate(zip(corrupted, originals, strict=False)):
            merged = merge_back(inputs, targets)  # every kept document ends input and target with </s>
            if i < len(corrupted) - 1:
                assert merged == original
            else:  # the last kept document may be cut in raw text, before corruption
                assert merged == original[: len(merged)]
            checked += 1
    assert checked >= 1
    assert batch.stats["target_tokens_dropped"] == 0 and batch.stats["truncated_tokens"] == 0
    assert checked >= 1


@pytest.mark.parametrize("kind", ["encdec", "decoder"])
@pytest.mark.parametrize("model_length", [64, 128, 512])
def test_single_document_rows_fill_the_model_length_exactly(kind: str, model_length: int) -> None:
    """raw_length is T5's random_spans_helper: no padding, no truncation, exact noise and span counts."""
    obj = build_objective("span", SP, model_kind=kind)  # type: ignore[arg-type]
    L = obj.raw_length(model_length)
    rows = torch.randint(O, O + 900, (8, L))
    batch = obj(rows, torch.zeros_like(rows), torch.arange(8), 0)
    assert batch.input_ids.shape == (8, model_length)
    assert bool((batch.document_ids == 0).all())
    n_noise, n_spans = span_counts(L, 0.15, 3.0)
    assert batch.stats["noise_tokens"] == 8 * n_noise and batch.stats["spans"] == 8 * n_spans
    assert batch.stats["truncated_tokens"] == 0
    if kind == "encdec":
        assert (L, batch.labels.size(1)) == random_spans_helper(model_length, 0.15, 3.0)
        assert bool((batch.labels != IGNORE).all())
    else:
        assert batch.n_targets == 8 * (n_noise + n_spans + 1)


def test_golden_tiny_case() -> None:
    """Hand-checked: 8 tokens, r = 0.25, mu = 2 -> 2 noise tokens in 1 span at the end (last token noise)."""
    obj = build_objective("span", SP, overrides={"noise_density": 0.25, "mean_noise_span_length": 2.0})
    x = torch.arange(8)[None, :] + O
    batch = obj(x, torch.zeros_like(x), torch.tensor([0]), 0)
    s0 = SP.sentinel(0)
    assert batch.input_ids[0].tolist() == [*(x[0, :6].tolist()), s0, SP.eos]
    assert batch.labels[0].tolist() == [s0, O + 6, O + 7, SP.eos]
    assert batch.decoder_input_ids is not None
    assert batch.decoder_input_ids[0].tolist() == [0, s0, O + 6, O + 7]


def test_batch_composition_does_not_change_a_row() -> None:
    """Rows 0..7 corrupted as one batch and as batches of 3 + 5 are identical, row by row."""
    for kind in ("encdec", "decoder"):
        obj = build_objective("span", SP, model_kind=kind, overrides={"random_roll": True})  # type: ignore[arg-type]
        L = obj.raw_length(48)
        rows, docs = make_rows(1, 8, L)
        idx = torch.arange(100, 108)
        whole = obj(rows, docs, idx, 7)
        first, second = obj(rows[:3], docs[:3], idx[:3], 7), obj(rows[3:], docs[3:], idx[3:], 7)
        for name, tensor in whole.tensors().items():
            assert torch.equal(tensor, torch.cat([first.tensors()[name], second.tensors()[name]])), name
        again = obj(rows, docs, idx, 7)
        assert torch.equal(again.input_ids, whole.input_ids)
        other = obj(rows, docs, idx, 8)
        assert not torch.equal(other.input_ids, whole.input_ids)


def test_short_documents() -> None:
    """The width of one 5-token document holds a 1-token document whole; the next is cut in raw text
    (before corruption) to what fits, the EOS-only document is left out and counted unused, an empty row
    stays padding, and no target token is dropped."""
    obj = build_objective("span", SP)
    rows = torch.tensor([[O, O + 1, O + 2, SP.eos, O + 5], [O, O, O, O, O]])
    docs = torch.tensor([[0, 1, 1, 2, -1], [-1, -1, -1, -1, -1]])
    batch = obj(rows, docs, torch.arange(2), 0)
    assert batch.input_ids[0].tolist() == [O, SP.eos, O + 1, SP.eos, SP.pad, SP.pad]
    assert batch.labels[0].tolist() == [SP.eos, SP.eos, IGNORE]
    assert batch.stats["target_tokens_dropped"] == 0 and batch.stats["truncated_tokens"] == 0
    assert batch.stats["raw_tokens_fed"] == 4 and batch.stats["raw_tokens_unused"] == 2  # O + 2, the EOS
    assert bool((batch.document_ids[1] == -1).all()) and bool((batch.labels[1] == IGNORE).all())


@pytest.mark.parametrize("kind", ["encdec", "decoder"])
def test_rolled_masks_on_an_empty_batch(kind: str) -> None:
    """No rows (as the mixture probes its widths with) give an empty batch, not an index error."""
    obj = build_objective("span", SP, model_kind=kind, overrides={"random_roll": True})
    rows = torch.zeros(0, obj.raw_length(64), dtype=torch.int64)
    batch = obj(rows, rows.clone(), torch.arange(0), 0)
    assert batch.input_ids.shape[0] == 0 and batch.n_targets == 0


def test_very_long_rows() -> None:
    obj = build_objective("span", SP)
    L = obj.raw_length(4096)
    rows = torch.randint(O, O + 900, (2, L))
    batch = obj(rows, torch.zeros_like(rows), torch.arange(2), 0)
    assert batch.input_ids.shape == (2, 4096)
    for inputs, targets in documents_of(batch, 0):
        assert merge_back(inputs, targets) == rows[0].tolist()


def test_packed_rows_keep_whole_documents_and_count_the_rest() -> None:
    """Many tiny documents spend an EOS and a sentinel each: the row keeps its fixed width, the documents
    that do not fit are left out before corruption and counted as unused raw tokens, never as dropped
    targets, and every kept document merges back."""
    obj = build_objective("span", SP)
    L = obj.raw_length(64)
    rows = torch.randint(O, O + 900, (1, L))
    docs = (torch.arange(L) // 5)[None, :]
    batch = obj(rows, docs, torch.tensor([0]), 0)
    assert batch.input_ids.shape == (1, 64)
    assert batch.stats["target_tokens_dropped"] == 0 and batch.stats["truncated_tokens"] == 0
    assert 0 < batch.stats["raw_tokens_unused"] < batch.stats["raw_tokens_fed"] == L
    originals = original_documents(rows, docs, 0)
    for i, (inputs, targets) in enumerate(documents_of(batch, 0)):
        merged = merge_back(inputs, targets)
        assert merged == originals[i][: len(merged)]
    check_invariants(batch)


def test_too_many_spans_is_a_user_error() -> None:
    """Pitfall 15.2: assert n_spans <= n_sentinels, at raw_length and per batch."""
    few = Specials(n_sentinels=8)
    obj = build_objective("span", few)
    with pytest.raises(UserError, match="sentinels"):
        obj.raw_length(512)
    rows = torch.randint(few.first_ordinary, few.first_ordinary + 500, (1, 568))
    with pytest.raises(UserError, match="sentinels"):
        obj(rows, torch.zeros_like(rows), torch.tensor([0]), 0)


def test_bad_config_is_a_user_error() -> None:
    with pytest.raises(UserError):
        build_objective("span", SP, overrides={"noise_density": 1.5})
    with pytest.raises(UserError):
        build_objective("span", SP, model_kind="encoder")


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    m=st.integers(8, 300),
    kind=st.sampled_from(["encdec", "decoder"]),
    roll=st.booleans(),
    density=st.sampled_from([0.15, 0.5]),
    mean_span=st.sampled_from([1.0, 3.0]),
    end=st.sampled_from(["cut", "boundary", "full"]),
)
def test_a_cut_document_is_corrupted_as_its_prefix_alone(
    make_packed_rows: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    prefix_alone: Callable[..., None],
    seed: int,
    m: int,
    kind: str,
    roll: bool,
    density: float,
    mean_span: float,
    end: str,
) -> None:
    """A row holds a raw prefix of its text (whole documents, then the first that does not fit cut before
    corruption), and that prefix is corrupted exactly as the row holding only it: no document's noise
    depends on what follows it, EOS-only and one-token documents included. Without roll the prefix is
    the longest that fits: one more raw token would leave text unused."""
    overrides = {"random_roll": roll, "noise_density": density, "mean_noise_span_length": mean_span}
    obj = build_objective("span", SP, model_kind=kind, overrides=overrides)  # type: ignore[arg-type]
    L = obj.raw_length(m)
    rows, docs = make_packed_rows(seed, 6, L, end)
    index = torch.arange(6) * 7 + seed
    full = obj(rows, docs, index, seed)
    assert full.stats["target_tokens_dropped"] == 0 and full.stats["truncated_tokens"] == 0
    # a cut document is budgeted the sentinel a wrapped span may add: with roll it may stop one short
    prefix_alone(obj, rows, docs, index, seed, full, docs, longest=not roll)
