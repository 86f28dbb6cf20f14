"""BART noising (reference section 8): each noise alone, their length invariants, and the full recipe."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.objectives.bart import BartDenoising, Draws
from objtrain.objectives.noise import _DOC_STRIDE
from objtrain.objectives.registry import build_objective, objective_defaults
from objtrain.rng import RowRandom
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary
STOP = O + 1  # the synthetic sentence end
V = O + 400
OFF = {
    "mask": 0.0,
    "permute_sentences": 0.0,
    "rotate": 0.0,
    "insert": 0.0,
    "whole_words": False,
    "input_ratio": 1.0,  # rows of m - 1 raw tokens, as the noises here do not shorten the input
}


def build(**overrides: Any) -> BartDenoising:
    config = {**OFF, "sentence_end_ids": [STOP], "vocab_size": V, **overrides}
    obj = build_objective("bart", SP, overrides=config)
    assert isinstance(obj, BartDenoising)
    return obj


def rows_with_sentences(seed: int, B: int, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(O + 2, V, (B, L), generator=g)
    rows[torch.rand(B, L, generator=g) < 0.15] = STOP
    docs = torch.zeros(B, L, dtype=torch.int64)
    for b in range(B):
        if b % 2 and L >= 4:  # packed rows: every document but the row's last ends with its EOS
            docs[b, L // 2 :] = 1
            rows[b, L // 2 - 1] = SP.eos
        if b % 3 == 2 and L >= 8:
            docs[b, L - 3 :] = -1
    return rows, docs


def packed_documents(
    rows: torch.Tensor, docs: torch.Tensor, seed: int, rate: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows re-cut into documents starting at random positions (`rate` per token), each closed by EOS
    inside the row, as a packed store lays them out."""
    g = torch.Generator().manual_seed(seed)
    cuts = torch.rand(rows.shape, generator=g) < rate
    cuts[:, 0] = False
    docs = torch.where(docs >= 0, cuts.long().cumsum(1), -1)
    ends = torch.zeros_like(cuts)
    ends[:, :-1] = (docs[:, 1:] != docs[:, :-1]) & (docs[:, :-1] >= 0)
    return torch.where(ends, SP.eos, rows), docs


def pairs(batch: Batch, rows: torch.Tensor, docs: torch.Tensor) -> list[tuple[list[int], list[int]]]:
    """(noised source without EOS, original document) for every document the batch holds; asserts the
    target is the original plus EOS, or, for the document a row's fit cut, a prefix of it plus EOS."""
    out = []
    assert batch.decoder_document_ids is not None
    assert batch.stats["target_tokens_dropped"] == 0 and batch.stats["truncated_tokens"] == 0
    for b in range(rows.size(0)):
        held = sorted(set(batch.document_ids[b].tolist()) - {-1})
        assert held == list(range(len(held)))  # a prefix of the row's documents, in order
        for d in held:
            original = rows[b][docs[b] == d].tolist()
            if original[-1] == SP.eos:  # its own EOS is not noised: the objective puts it back
                original = original[:-1]
            src = batch.input_ids[b][batch.document_ids[b] == d].tolist()
            tgt = batch.labels[b][batch.decoder_document_ids[b] == d].tolist()
            assert tgt[-1] == SP.eos and tgt[:-1] == original[: len(tgt) - 1]
            if len(tgt) - 1 < len(original):  # a cut document: only a row's last
                assert d == held[-1]
            assert src[-1:] == [SP.eos]
            out.append((src[:-1], original[: len(tgt) - 1]))
    return out


def sentences(tokens: list[int]) -> list[tuple[int, ...]]:
    out, cur = [], []
    for i, t in enumerate(tokens):
        cur.append(t)
        if t == STOP and (i + 1 == len(tokens) or tokens[i + 1] != STOP):
            out.append(tuple(cur))
            cur = []
    if cur:
        out.append(tuple(cur))
    return out


def tiles(tokens: list[int], blocks: Counter[tuple[int, ...]]) -> bool:
    """`tokens` is a concatenation of all `blocks` in some order (each block contiguous)."""
    if not tokens:
        return sum(blocks.values()) == 0
    for block in [b for b, n in blocks.items() if n > 0]:
        if tuple(tokens[: len(block)]) == block:
            blocks[block] -= 1
            if tiles(tokens[len(block) :], blocks):
                return True
            blocks[block] += 1
    return False


def is_subsequence(small: list[int], big: list[int]) -> bool:
    it = iter(big)
    return all(t in it for t in small)


def test_yaml_mirrors_config_defaults() -> None:
    assert objective_defaults("bart") == dataclasses.asdict(BartDenoising.Config())


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), L=st.integers(2, 80))
def test_permutation_is_a_permutation_of_sentences(seed: int, L: int) -> None:
    """Token multiset preserved, every sentence a contiguous block, same sentences (section 8)."""
    obj = build(permute_sentences=1.0)
    rows, docs = rows_with_sentences(seed, 6, L)
    batch = obj(rows, docs, torch.arange(6), seed)
    for src, original in pairs(batch, rows, docs):
        assert Counter(src) == Counter(original)
        assert tiles(src, Counter(sentences(original)))


def test_permutation_moves_sentences() -> None:
    obj = build(permute_sentences=1.0)
    x = torch.tensor([[O + 10, STOP, O + 11, O + 12, STOP, O + 13, STOP, O + 14, O + 15, STOP]])
    seen = set()
    for seed in range(20):
        batch = obj(x, torch.zeros_like(x), torch.tensor([0]), seed)
        src = batch.input_ids[0, :-1].tolist()
        assert sorted(sentences(src)) == sorted(sentences(x[0].tolist()))
        seen.add(tuple(src))
    assert len(seen) > 5


def test_rotation_is_a_rotation() -> None:
    obj = build(rotate=1.0)
    rows, docs = rows_with_sentences(0, 6, 30)
    batch = obj(rows, docs, torch.arange(6), 0)
    assert batch.stats["rotated_documents"] == 9  # every document of 2+ tokens
    held = [(b, d) for b in range(6) for d in sorted(set(batch.document_ids[b].tolist()) - {-1})]
    for (b, d), (src, original) in zip(held, pairs(batch, rows, docs), strict=True):
        n = len(original)
        assert len(src) == n
        # the drawn offset k: x[k:] + x[:k], as fairseq's rotation (keyed like every draw of the document)
        k = int(
            RowRandom(0, torch.tensor([b * _DOC_STRIDE + d])).integers(1, n - 1, "bart/rotate/offset", low=1)
        )
        assert src == original[k:] + original[:k]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), length=st.integers(3, 9))
def test_rotation_is_never_the_identity(seed: int, length: int) -> None:
    """rotate = 1: every document of distinct tokens comes back rotated by 1..L-1, never unchanged
    (fairseq's offsets 1 and len - 1 would return it as it was, see the module docstring)."""
    obj = build(rotate=1.0)
    rows = (torch.arange(length) + O + 10).repeat(8, 1)
    batch = obj(rows, torch.zeros_like(rows), torch.arange(8) + seed, seed)
    assert batch.stats["rotated_documents"] == 8
    for src, original in pairs(batch, rows, torch.zeros_like(rows)):
        assert src != original and sorted(src) == sorted(original)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    m=st.integers(8, 300),
    multi=st.booleans(),
    recipe=st.sampled_from(["infilling", "deletion", "masking", "all"]),
)
def test_rows_fill_the_encoder_and_keep_every_target(seed: int, m: int, multi: bool, recipe: str) -> None:
    """Any model length, seed, recipe and packing: documents are kept whole or (a row's last) cut to a
    prefix, every target is the original (prefix) plus </s>, nothing is dropped or truncated, and the
    widths are the encoder's m and the decoder's raw + 1."""
    config: dict[str, Any] = {
        "infilling": {"mask": 0.3, "input_ratio": 0.8},
        "deletion": {"mask": 0.3, "replace_length": 0, "input_ratio": 0.75},
        "masking": {"mask": 0.3, "replace_length": -1, "input_ratio": 1.0},
        "all": {"mask": 0.3, "permute_sentences": 1.0, "insert": 0.1, "rotate": 0.5, "input_ratio": 0.9},
    }[recipe]
    obj = build(**config)
    L = obj.raw_length(m)
    rows, docs = rows_with_sentences(seed, 6, L)
    if multi:  # documents of a few to a few dozen tokens, each closed by EOS inside the row
        rows, docs = packed_documents(rows, docs, seed, 0.08)
    batch = obj(rows, docs, torch.arange(6) + seed, seed)
    assert batch.input_ids.size(1) == obj.model_length(L) <= m and batch.labels.size(1) == L + 1
    originals = pairs(batch, rows, docs)
    assert originals or int((docs >= 0).sum()) == 0
    assert batch.stats["raw_tokens_unused"] <= batch.stats["raw_tokens_fed"]


def test_token_masking_keeps_the_length() -> None:
    """Token masking (replace_length -1, one-word spans): len(src) == len(tgt), unmasked positions
    unchanged, and each word masked with probability 0.3 (fairseq masks exactly ceil(0.3 n); the count
    here varies by document so that noise is prefix-stable, see the module docstring)."""
    obj = build(mask=0.3, replace_length=-1, mask_random=0.0, mask_length="word")
    rows, docs = rows_with_sentences(1, 60, 40)
    batch = obj(rows, docs, torch.arange(60), 0)
    total, words = 0, 0
    for src, original in pairs(batch, rows, docs):
        assert len(src) == len(original)
        masked = [i for i, t in enumerate(src) if t == SP.mask]
        assert all(src[i] == original[i] for i in range(len(src)) if i not in masked)
        total += len(masked)
        words += len(original)
    assert batch.stats["noise_tokens"] == total
    assert abs(total / words - 0.3) < 0.04  # 2,400 words: 4 standard deviations


def test_token_deletion_shortens_by_the_deleted_count() -> None:
    """Token deletion (replace_length 0, one-word spans): len(src) == len(tgt) - deleted, the source
    a subsequence of the original. (Poisson spans of length 0 would insert a <mask>, as in fairseq.)"""
    obj = build(mask=0.3, replace_length=0, mask_length="word")
    rows, docs = rows_with_sentences(2, 6, 40)
    batch = obj(rows, docs, torch.arange(6), 0)
    deleted = 0
    for src, original in pairs(batch, rows, docs):
        assert is_subsequence(src, original) and SP.mask not in src
        deleted += len(original) - len(src)
    assert deleted == batch.stats["noise_tokens"]


@pytest.mark.parametrize("replace_length", [-1, 0, 1])
def test_spans_reach_the_last_word_of_a_document_before_an_empty_one(replace_length: int) -> None:
    """A document's noise is its own: spans stop at its EOS, not one word earlier when the next document
    is only an EOS (whose first token starts no word). mask 1 with one-word spans starts a span at every
    word, so every text token is noised, the last of the document before the empty one included."""
    obj = build(mask=1.0, replace_length=replace_length, mask_length="word", mask_random=0.0)
    a, b, c = O + 10, O + 11, O + 12
    rows = torch.tensor([[a, b, SP.eos, SP.eos, c, SP.eos, O + 13, O + 14]])
    docs = torch.tensor([[0, 0, 0, 1, 2, 2, -1, -1]])
    batch = obj(rows, docs, torch.tensor([0]), 0)
    assert batch.stats["noise_tokens"] == 3 and batch.stats["raw_tokens_unused"] == 0
    assert batch.labels[0].tolist()[:6] == [a, b, SP.eos, SP.eos, c, SP.eos]
    src = {-1: [SP.mask] * 2, 0: [], 1: [SP.mask]}[replace_length]
    single = {-1: [SP.mask], 0: [], 1: [SP.mask]}[replace_length]
    held = batch.input_ids[0][batch.document_ids[0] >= 0].tolist()
    assert held == [*src, SP.eos, SP.eos, *single, SP.eos]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), lam=st.sampled_from([1.0, 3.0, 3.5]), insert=st.sampled_from([0.0, 0.1]))
def test_text_infilling_counts(seed: int, lam: float, insert: float) -> None:
    """replace_length 1, no random ids: #<mask> = masked spans + inserts; the rest is a subsequence of
    the original; the source length is original - masked + spans + inserts."""
    obj = build(mask=0.3, replace_length=1, mask_random=0.0, poisson_lambda=lam, insert=insert)
    rows, docs = rows_with_sentences(seed, 6, 50)
    batch = obj(rows, docs, torch.arange(6), seed)
    n_masks, kept_total, original_total = 0, 0, 0
    for src, original in pairs(batch, rows, docs):
        kept = [t for t in src if t != SP.mask]
        assert is_subsequence(kept, original)
        n_masks += len(src) - len(kept)
        kept_total += len(kept)
        original_total += len(original)
    s = batch.stats
    if s["truncated_tokens"] == 0:
        assert n_masks == s["spans"] + s["inserted_tokens"]
        assert kept_total == original_total - s["noise_tokens"]


def test_random_replacements_are_ordinary_tokens() -> None:
    """Pitfall 15.4: random ids come from ordinary tokens, never specials, pad or <mask>."""
    obj = build(mask=0.5, replace_length=-1, mask_random=1.0, insert=0.2)
    rows, docs = rows_with_sentences(3, 8, 60)
    batch = obj(rows, docs, torch.arange(8), 0)
    real = batch.document_ids >= 0
    src = batch.input_ids[real]
    assert bool((((src >= O) & (src < V)) | (src == SP.eos)).all())
    assert batch.stats["random_replacements"] > 0
    assert int((src == SP.mask).sum()) == 0


def test_batch_composition_does_not_change_a_row() -> None:
    obj = build(mask=0.3, permute_sentences=1.0, insert=0.05, rotate=0.5)
    rows, docs = rows_with_sentences(4, 8, 40)
    idx = torch.arange(8) + 77
    whole = obj(rows, docs, idx, 9)
    a, b = obj(rows[:3], docs[:3], idx[:3], 9), obj(rows[3:], docs[3:], idx[3:], 9)
    for name, tensor in whole.tensors().items():
        assert torch.equal(tensor, torch.cat([a.tensors()[name], b.tensors()[name]])), name


def test_layout_and_lengths() -> None:
    obj = build(mask=0.3)
    assert obj.raw_length(128) == 127 and obj.widths(127) == (128, 128)
    rows, docs = rows_with_sentences(5, 4, 127)
    batch = obj(rows, docs, torch.arange(4), 0)
    assert batch.input_ids.shape == (4, 128) and batch.labels.shape == (4, 128)
    assert batch.decoder_document_ids is not None
    assert bool(((batch.labels != IGNORE) == (batch.decoder_document_ids >= 0)).all())
    one = torch.tensor([[O + 5], [O + 6]])
    tiny = obj(one, torch.tensor([[0], [-1]]), torch.arange(2), 0)
    assert tiny.labels.tolist() == [[O + 5, SP.eos], [IGNORE, IGNORE]]


def test_default_recipe_with_a_tokenizer(tokenizer: Tokenizer, stdlib_texts: list[str]) -> None:
    """The paper recipe (whole words, sentence permutation from the tokenizer) on real text."""
    obj = build_objective("bart", SP, tokenizer=tokenizer)
    ids = torch.tensor(tokenizer.encode(stdlib_texts[0])[: 4 * 200]).view(4, 200)
    batch = obj(ids, torch.zeros_like(ids), torch.arange(4), 0)
    assert batch.stats["permuted_sentences"] > 0
    assert 0.15 < batch.stats["noise_density"] < 0.45
    assert batch.decoder_document_ids is not None
    for b in range(4):  # the row's document, cut where its noised input would not fit
        tgt = batch.labels[b][batch.decoder_document_ids[b] >= 0].tolist()
        assert tgt[-1] == SP.eos and tgt[:-1] == ids[b, : len(tgt) - 1].tolist()
        assert len(tgt) - 1 >= 0.8 * 200  # one text; the corpus-wide waste is tested in test_lossless
    assert batch.input_ids.size(1) == obj.model_length(200) and batch.labels.size(1) == 201


def test_refusals_are_user_errors() -> None:
    """Section 8 pitfall (fairseq#3803): permutation without sentence ends is refused, not skipped."""
    with pytest.raises(UserError, match="permute_sentences"):
        build_objective("bart", SP, overrides={"whole_words": False, "vocab_size": V})
    with pytest.raises(UserError, match="whole_words"):
        build_objective("bart", SP, overrides={"permute_sentences": 0.0, "vocab_size": V})
    with pytest.raises(UserError, match="vocab"):
        build_objective("bart", SP, overrides={"permute_sentences": 0.0, "whole_words": False})
    with pytest.raises(UserError):
        build(replace_length=2)
    with pytest.raises(UserError):
        build_objective("bart", SP, model_kind="decoder")


def test_random_ids_read_where_needed_match_the_whole_grid() -> None:
    """Random ids hashed only where a replacement is random equal RowRandom.integers over each
    document's whole grid read there."""
    obj = build()
    keys = torch.tensor([3, 9, 2**30])
    grid = RowRandom(4, keys).integers(40, V, "bart/random_ids", low=O)
    doc, pos = torch.tensor([[0, 2, 2, 1]]), torch.tensor([[5, 0, 39, 17]])
    expected = grid[doc[0], pos[0]]
    assert torch.equal(
        obj._random_ids(Draws(4, keys, doc, pos), torch.arange(4), "bart/random_ids"), expected
    )


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    m=st.integers(8, 200),
    multi=st.booleans(),
    recipe=st.sampled_from(["infilling", "deletion", "masking", "all"]),
)
# cut documents before an EOS-only one, whose last word spans used to miss (any recipe)
@example(seed=300, m=36, multi=True, recipe="deletion")
@example(seed=56, m=100, multi=True, recipe="infilling")
@example(seed=231, m=36, multi=True, recipe="masking")
@example(seed=504, m=100, multi=True, recipe="all")
def test_a_cut_document_is_noised_as_its_prefix_alone(seed: int, m: int, multi: bool, recipe: str) -> None:
    """What makes the row fit a prefix sum: a row cut after its first c raw tokens gives exactly the
    batch of the same row holding only those c tokens (noise, permutation, rotation, layout)."""
    config: dict[str, Any] = {
        "infilling": {"mask": 0.3, "input_ratio": 0.6},
        "deletion": {"mask": 0.3, "replace_length": 0, "input_ratio": 0.6},
        "masking": {"mask": 0.3, "replace_length": -1, "insert": 0.1, "input_ratio": 0.9},
        "all": {"mask": 0.3, "permute_sentences": 0.7, "insert": 0.1, "rotate": 0.5, "input_ratio": 0.7},
    }[recipe]
    obj = build(**config)
    L = obj.raw_length(m)
    rows, docs = rows_with_sentences(seed, 6, L)
    if multi:  # EOS only where a document ends, so a cut never lands right after one
        rows, docs = packed_documents(torch.where(rows == SP.eos, STOP, rows), docs, seed, 0.05)
    index = torch.arange(6) * 7 + seed
    full = obj(rows, docs, index, seed)
    assert full.decoder_document_ids is not None
    prefix = docs.clone()
    for b in range(6):  # everything after the raw text the row used becomes padding
        held = sorted(set(full.decoder_document_ids[b].tolist()) - {-1})
        if not held:
            prefix[b] = -1
            continue
        start = int((docs[b] == held[-1]).nonzero()[0])
        kept = int((full.decoder_document_ids[b] == held[-1]).sum()) - 1
        prefix[b, start + max(kept, 1) :] = -1  # a document of only its EOS keeps it
    alone = obj(rows, prefix, index, seed)
    for name, tensor in full.tensors().items():
        assert torch.equal(tensor, alone.tensors()[name]), name
    assert alone.stats["raw_tokens_unused"] == 0
