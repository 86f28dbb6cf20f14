"""Masked LM (reference section 2): 80/10/10 rates, exclusions, exact counts, whole words, pitfalls."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objtrain import IGNORE
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.objectives.mlm import MaskedLM, MaskedLMConfig, word_starts
from objtrain.objectives.registry import build_objective, objective_defaults
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary
V = 1200


def rows_with_specials(seed: int, B: int, L: int):
    """Ordinary tokens with specials sprinkled in, EOS-separated documents, padded tails (ordinary ids
    under document id -1 too, so padding is excluded by position, not only by id)."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(O, V, (B, L), generator=g)
    special = torch.rand(B, L, generator=g) < 0.05
    rows = torch.where(special, torch.randint(0, O, (B, L), generator=g), rows)
    docs = (rows == SP.eos).long().cumsum(dim=1)
    pad_from = torch.randint(L // 2, L + 1, (B,), generator=g)
    docs[torch.arange(L)[None, :] >= pad_from[:, None]] = -1
    return rows, docs


def mlm(**kw) -> MaskedLM:
    return MaskedLM(MaskedLMConfig(vocab_size=V, **kw), SP)


def within(count: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1


@pytest.mark.parametrize("exact", [True, False])
def test_rates_80_10_10(exact: bool) -> None:
    """Rates over >= 1e5 eligible tokens, with binomial tolerances. The conditional probabilities are the
    documented ones (transformers#35251; the TF path's 0.1-instead-of-0.5 bug, #32329/#17377, would give
    2% random and 18% kept among the selected and fail here)."""
    rows, docs = rows_with_specials(0, 300, 512)
    b = mlm(exact_count=exact)(rows, docs, torch.arange(300), 1)
    s = b.stats
    n, sel = int(s["eligible"]), int(s["selected"])
    assert n >= 100_000
    assert within(sel, n, 0.15)
    assert within(int(s["masked"]), sel, 0.8)
    assert within(int(s["random"]), sel, 0.1)
    assert within(int(s["kept"]), sel, 0.1)
    assert int(s["masked"] + s["random"] + s["kept"]) == sel == b.n_targets


def test_exact_count_per_row() -> None:
    """Exact counts: max(1, round(0.15 n)) targets per row, so no row is without a target (PR #1814)."""
    rows, docs = rows_with_specials(1, 64, 64)
    b = mlm()(rows, docs, torch.arange(64), 0)
    eligible = (rows >= O) & (docs >= 0)
    n = eligible.sum(dim=1)
    want = torch.where(n > 0, torch.round(n * 0.15).clamp(min=1), 0)
    assert torch.equal((b.labels != IGNORE).sum(dim=1), want.long())


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    L=st.integers(1, 70),
    exact=st.booleans(),
    rate=st.sampled_from([0.0, 0.15, 0.5, 1.0]),
)
def test_corruption_invariants(seed: int, L: int, exact: bool, rate: float) -> None:
    """Pitfall 15.4: specials and pads never selected (transformers#11155), random replacements never
    special (#15342). Pitfall 15.3: labels only at selected positions, equal to the originals; unselected
    positions unchanged. Masked tokens stay in attention (the DataCollatorForSOP `attention_mask =
    ~masked` pitfall): document_ids are the input's."""
    rows, docs = rows_with_specials(seed, 5, L)
    b = mlm(exact_count=exact, selection_rate=rate)(rows, docs, torch.arange(5), seed)
    selected = b.labels != IGNORE
    assert not bool(selected[(rows < O) | (docs < 0)].any())
    assert torch.equal(b.labels[selected], rows[selected])
    assert torch.equal(b.input_ids[~selected], rows[~selected])
    changed = b.input_ids != rows
    assert bool(((b.input_ids[changed] == SP.mask) | (b.input_ids[changed] >= O)).all())
    assert bool((b.input_ids < V).all())
    assert torch.equal(b.document_ids, docs) and b.attention == "bidirectional"
    if rate == 1.0:
        assert torch.equal(selected, (rows >= O) & (docs >= 0))
    if rate == 0.0:  # BERT's max(1, ...) must not force a target when nothing is asked for
        assert not bool(selected.any())


def test_empty_long_and_all_padding_rows() -> None:
    obj = mlm()
    long = torch.randint(O, V, (2, 16384))
    b = obj(long, torch.zeros_like(long), torch.arange(2), 0)
    assert (b.labels != IGNORE).sum(dim=1).tolist() == [round(16384 * 0.15)] * 2
    b = obj(torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 0, dtype=torch.long), torch.arange(2), 0)
    assert b.input_ids.shape == (2, 0)
    pads = torch.full((2, 9), SP.pad)
    b = obj(pads, torch.full((2, 9), -1), torch.arange(2), 0)
    assert b.n_targets == 0 and torch.equal(b.input_ids, pads)


@pytest.mark.parametrize("exact", [True, False])
def test_whole_word_masking_masks_whole_words(
    tokenizer: Tokenizer, stdlib_texts: list[str], exact: bool
) -> None:
    """Sentencepiece words (▁ starts, line starts), not `##` WordPiece (transformers#11768): a word is
    selected as a unit."""
    ids = torch.tensor(tokenizer.encode("".join(stdlib_texts))[: 32 * 256]).reshape(32, 256)
    docs = torch.zeros_like(ids)
    obj = MaskedLM(MaskedLMConfig(whole_word=True, exact_count=exact), SP, tokenizer)
    b = obj(ids, docs, torch.arange(32), 0)
    begins, ends = tokenizer.word_boundary_tables
    word = word_starts(ids, docs, begins, ends).long().cumsum(dim=1)
    selected = b.labels != IGNORE
    for r in range(32):
        for w in word[r].unique():
            in_word = selected[r][word[r] == w]
            assert bool(in_word.all()) or not bool(in_word.any())
    multi = [(word[r] == w).sum() > 1 for r in range(32) for w in word[r].unique()]
    assert sum(multi) > 100  # the text has many multi-piece words
    rate = selected.sum() / (ids >= O).sum()
    assert 0.12 < float(rate) < 0.18
    if exact:  # the budget, give or take the word that crosses it
        budget = torch.round((ids >= O).sum(dim=1) * 0.15)
        longest = max(int((word[r] == w).sum()) for r in range(32) for w in word[r].unique())
        assert bool(((selected.sum(dim=1) - budget).abs() <= longest).all())


def test_vocab_size_and_tokenizer_requirements(tokenizer: Tokenizer) -> None:
    with pytest.raises(UserError, match="vocabulary size"):
        MaskedLM(MaskedLMConfig(), SP)
    with pytest.raises(UserError, match="whole_word"):
        MaskedLM(MaskedLMConfig(vocab_size=V, whole_word=True), SP)
    with pytest.raises(UserError, match="differs"):
        MaskedLM(MaskedLMConfig(vocab_size=V + 1), SP, tokenizer)
    assert MaskedLM(MaskedLMConfig(), SP, tokenizer).vocab_size == tokenizer.vocab_size
    with pytest.raises(UserError, match="mask_prob"):
        build_objective("mlm", SP, tokenizer, overrides={"mask_prob": 0.95, "random_prob": 0.1})


def test_batch_size_independent_and_yaml(tokenizer: Tokenizer) -> None:
    """Pitfall 15.6: seeded per (seed, row index), whatever the batch; the YAML mirrors the defaults."""
    rows, docs = rows_with_specials(2, 8, 50)
    for obj in (mlm(), mlm(exact_count=False), MaskedLM(MaskedLMConfig(whole_word=True), SP, tokenizer)):
        whole = obj(rows, docs, torch.arange(8), 3)
        parts = [obj(rows[s], docs[s], torch.arange(8)[s], 3) for s in (slice(0, 3), slice(3, 8))]
        for name, tensor in whole.tensors().items():
            assert torch.equal(tensor, torch.cat([p.tensors()[name] for p in parts])), name
        assert not torch.equal(obj(rows, docs, torch.arange(8), 4).labels, whole.labels)
    assert objective_defaults("mlm") == dataclasses.asdict(MaskedLM.Config())
    assert build_objective("mlm", SP, tokenizer).raw_length(512) == 512


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    L=st.integers(1, 120),
    exact=st.booleans(),
    end=st.sampled_from(["cut", "boundary", "full"]),
)
def test_a_document_is_masked_whatever_follows_it(
    make_packed_rows: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    keep_first_documents: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    seed: int,
    L: int,
    exact: bool,
    end: str,
) -> None:
    """A row whose documents from some k on are padding. Per-token selection: its first k documents are
    corrupted exactly as in the whole row. Exact counts legitimately depend on the whole row (one budget,
    round(rate * eligible), drawn as the lowest random keys of the row), so the invariant is weaker: the
    two selections on the first k documents are nested (both are the lowest keys there, under two
    budgets), every position selected in both gets the same action, and the shorter row's count is its
    own budget."""
    obj = mlm(exact_count=exact)
    rows, docs = make_packed_rows(seed, 6, L, end)
    index = torch.arange(6) + seed
    full = obj(rows, docs, index, seed)
    first, _ = keep_first_documents(docs, seed)
    alone = obj(rows, first, index, seed)
    ours = first >= 0
    assert bool((alone.labels[~ours] == IGNORE).all())
    a, b = (full.labels != IGNORE) & ours, alone.labels != IGNORE
    if not exact:
        assert torch.equal(a, b) and torch.equal(full.input_ids[ours], alone.input_ids[ours])
        return
    for r in range(6):
        assert bool((a[r] <= b[r]).all()) or bool((b[r] <= a[r]).all()), r
        n = int(((rows[r] >= O) & ours[r]).sum())
        assert int(b[r].sum()) == (max(1, round(0.15 * n)) if n else 0)
    both = a & b
    assert torch.equal(full.input_ids[both], alone.input_ids[both])
    assert torch.equal(full.labels[both], alone.labels[both])
