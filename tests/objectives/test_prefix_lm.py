"""Prefix LM (reference section 6): split range, loss on the suffix only, the shift off-by-one, layouts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.errors import UserError
from objtrain.objectives.prefix_lm import PrefixLM
from objtrain.objectives.registry import build_objective, objective_defaults
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary


def attention_mask(batch: Batch) -> torch.Tensor:
    """(B, T, T) bool, the pattern `batch.py` defines: (causal | both in the prefix) & same document."""
    docs = batch.document_ids
    T = docs.size(1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None]
    assert batch.prefix_mask is not None
    both = batch.prefix_mask[:, :, None] & batch.prefix_mask[:, None, :]
    return (causal | both) & (docs[:, :, None] == docs[:, None, :])


def packed(seed: int, B: int, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(O, O + 500, (B, L), generator=g)
    docs = torch.zeros(B, L, dtype=torch.int64)
    for b in range(B):
        for cut in torch.randint(1, L, (b % 4,), generator=g).tolist():
            docs[b, cut:] += 1
        if b % 3 == 2:
            docs[b, L - L // 3 :] = -1
    return rows, docs


def test_yaml_mirrors_config_defaults() -> None:
    assert objective_defaults("prefix_lm") == dataclasses.asdict(PrefixLM.Config())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), L=st.integers(2, 120), density=st.sampled_from([0.1, 0.25, 0.5, 0.9]))
def test_decoder_prefix_lm_invariants(seed: int, L: int, density: float) -> None:
    """Row unchanged; no label on a prefix token; every suffix token labelled from the previous position;
    split in range; positions restart per document; no label on padding."""
    obj = build_objective("prefix_lm", SP, overrides={"noise_density": density})
    rows, docs = packed(seed, 6, L)
    batch = obj(rows, docs, torch.arange(6), seed)
    assert torch.equal(batch.input_ids[docs >= 0], rows[docs >= 0])
    assert batch.prefix_mask is not None
    labelled = batch.labels != IGNORE
    assert bool((docs[labelled] >= 0).all())
    for b in range(6):
        for d in set(docs[b].tolist()) - {-1}:
            where = (docs[b] == d).nonzero().squeeze(1)
            n = where.numel()
            prefix = batch.prefix_mask[b, where]
            n_in = int(prefix.sum())
            assert bool(prefix[:n_in].all())  # the prefix is a leading block
            if n >= 2:
                max_in = n - 1
                low = min(max_in, max(1, round((1 - 2 * density) * max_in))) if density <= 0.5 else 1
                assert low <= n_in <= max_in
            lab = batch.labels[b, where]
            expected = [IGNORE] * max(n_in - 1, 0) + rows[b, where][n_in:].tolist() + [IGNORE]
            if n_in == 0:  # a 1-token document: nothing before it to predict it from
                expected = [IGNORE]
            assert lab.tolist() == expected
            assert batch.positions[b, where].tolist() == list(range(n))


def test_shift_off_by_one() -> None:
    """Section 6 pitfall: the last prefix token sees the whole prefix (itself included) and predicts the
    first target; the first target position cannot see itself from the prefix or anything later;
    changing suffix tokens changes nothing the prefix positions can see."""
    obj = build_objective("prefix_lm", SP)
    x = torch.arange(10)[None, :] + O
    batch = obj(x, torch.zeros_like(x), torch.tensor([5]), 3)
    assert batch.prefix_mask is not None
    n_in = int(batch.prefix_mask[0].sum())
    mask = attention_mask(batch)[0]
    last = n_in - 1
    assert bool(mask[last, :n_in].all()) and not bool(mask[last, n_in:].any())
    assert int(batch.labels[0, last]) == int(x[0, n_in])  # first target predicted from the whole prefix
    assert bool(mask[:n_in, :n_in].all())  # bidirectional inside the prefix
    assert not bool(mask[:n_in, n_in:].any())  # no prefix position sees the suffix
    for t in range(n_in, 10):
        assert mask[t, : t + 1].all() and not mask[t, t + 1 :].any()  # causal on the suffix
    assert not bool((batch.labels[0, :last] != IGNORE).any())


def test_encdec_split_merges_back() -> None:
    """Pitfall 15.7: encoder prefix + decoder suffix (EOS removed) gives back the document."""
    obj = build_objective("prefix_lm", SP, model_kind="encdec")
    rows, docs = packed(4, 8, 40)
    rows[0, 39] = SP.eos  # a document that ends with its own EOS keeps exactly one
    batch = obj(rows, docs, torch.arange(8), 0)
    assert batch.attention == "bidirectional" and batch.decoder_document_ids is not None
    assert batch.input_ids.shape == (8, 40) and batch.labels.shape == (8, 40)
    assert batch.stats["truncated_tokens"] == 0
    for b in range(8):
        for d in set(docs[b].tolist()) - {-1}:
            enc = batch.input_ids[b][batch.document_ids[b] == d].tolist()
            dec = batch.labels[b][batch.decoder_document_ids[b] == d].tolist()
            original = rows[b][docs[b] == d].tolist()
            if original[-1] == SP.eos:
                original = original[:-1]
            assert enc[-1] == SP.eos and dec[-1] == SP.eos
            assert enc[:-1] + dec[:-1] == original
            if len(original) >= 2:
                assert len(enc) >= 2 and len(dec) >= 2  # both parts non-empty


@pytest.mark.parametrize(
    ("tokens", "ids"),
    [
        ([O + 5, SP.eos, O + 6], [0, 0, 1]),
        ([SP.eos, O + 6], [0, 1]),
        ([SP.eos, O + 5, SP.eos, O + 6], [0, 1, 1, 2]),
    ],
)
def test_encdec_row_of_tiny_documents_drops_no_target(tokens: list[int], ids: list[int]) -> None:
    """A 1-token document is all target, so its target (token + EOS) is one position longer than its raw
    text when the row cuts it before its EOS. Behind documents of at most one token (no room to spare), its
    EOS used to be truncated off the decoder row: a target without its EOS, counted as unused raw text.
    Now the document that does not fit is left out, and every target the batch holds is whole."""
    obj = build_objective("prefix_lm", SP, model_kind="encdec")
    rows, docs = torch.tensor([tokens]), torch.tensor([ids])
    batch = obj(rows, docs, torch.tensor([0]), 0)
    assert batch.decoder_document_ids is not None
    assert batch.stats["truncated_tokens"] == 0 and batch.stats["target_tokens_dropped"] == 0
    held = sorted(set(batch.decoder_document_ids[0].tolist()) - {-1})
    assert held == list(range(ids[-1]))  # every document but the cut one-token one
    for d in held:
        dec = batch.labels[0][batch.decoder_document_ids[0] == d].tolist()
        original = [t for t, i in zip(tokens, ids, strict=True) if i == d and t != SP.eos]
        assert dec == [*original, SP.eos]
    assert batch.stats["raw_tokens_unused"] == 1  # the left-out token


def test_batch_composition_does_not_change_a_row() -> None:
    for kind in ("decoder", "encdec"):
        obj = build_objective("prefix_lm", SP, model_kind=kind)  # type: ignore[arg-type]
        rows, docs = packed(2, 8, 30)
        idx = torch.arange(40, 48)
        whole = obj(rows, docs, idx, 1)
        a, b = obj(rows[:3], docs[:3], idx[:3], 1), obj(rows[3:], docs[3:], idx[3:], 1)
        for name, tensor in whole.tensors().items():
            assert torch.equal(tensor, torch.cat([a.tensors()[name], b.tensors()[name]])), name


def test_mean_target_fraction_follows_density() -> None:
    """r = 0.25 (UL2's S-denoiser): target fraction uniform on [0, 0.5], mean ~0.25."""
    obj = build_objective("prefix_lm", SP, overrides={"noise_density": 0.25})
    rows = torch.randint(O, O + 500, (400, 101))
    batch = obj(rows, torch.zeros_like(rows), torch.arange(400), 0)
    assert batch.prefix_mask is not None
    frac = 1 - batch.prefix_mask.float().sum(1) / 101
    assert abs(float(frac.mean()) - 0.25) < 0.02
    assert float(frac.max()) <= 0.51


def test_empty_and_one_token_rows() -> None:
    obj = build_objective("prefix_lm", SP)
    rows = torch.tensor([[O, O + 1, O + 2], [O, O, O]])
    docs = torch.tensor([[0, 1, 1], [-1, -1, -1]])
    batch = obj(rows, docs, torch.arange(2), 0)
    assert batch.prefix_mask is not None
    assert batch.prefix_mask[0].tolist() == [False, True, False]
    assert batch.labels[0].tolist() == [IGNORE, O + 2, IGNORE]
    assert bool((batch.labels[1] == IGNORE).all())


def test_bad_density_is_a_user_error() -> None:
    with pytest.raises(UserError):
        build_objective("prefix_lm", SP, overrides={"noise_density": 0.0})


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    m=st.integers(2, 200),
    kind=st.sampled_from(["encdec", "decoder"]),
    density=st.sampled_from([0.25, 0.5, 0.9]),
    end=st.sampled_from(["cut", "boundary", "full"]),
)
# one-token documents before a one-token document the row cuts: its target's EOS used to be truncated
@example(seed=0, m=3, kind="encdec", density=0.25, end="cut")
def test_a_cut_document_is_split_as_its_prefix_alone(
    make_packed_rows: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    prefix_alone: Callable[..., None],
    seed: int,
    m: int,
    kind: str,
    density: float,
    end: str,
) -> None:
    """Packed rows with EOS-only and one-token documents: a row holds a raw prefix of its documents (all of
    it, decoder-only; encoder-decoder, whole documents then the first that does not fit, cut), each split
    on its own, exactly as the row holding only that prefix; no target is truncated or dropped, and the
    prefix is the longest that fits: one more raw token would be left unused."""
    obj = build_objective("prefix_lm", SP, model_kind=kind, overrides={"noise_density": density})  # type: ignore[arg-type]
    L = obj.raw_length(m)
    rows, docs = make_packed_rows(seed, 6, L, end)
    index = torch.arange(6) * 7 + seed
    full = obj(rows, docs, index, seed)
    assert full.stats["truncated_tokens"] == 0 and full.stats.get("target_tokens_dropped", 0) == 0
    prefix_alone(obj, rows, docs, index, seed, full, docs, longest=True)
