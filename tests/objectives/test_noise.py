"""Mask makers, transforms and length arithmetic of objtrain.objectives.noise (sections 5, 6, 15)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objtrain import rng
from objtrain.errors import UserError
from objtrain.objectives.noise import (
    drop_noise_tokens,
    drop_nonnoise_tokens,
    iid_noise_mask,
    noise_span_to_unique_sentinel,
    nonnoise_span_to_sentinel,
    nonnoise_span_to_unique_sentinel,
    prefix_noise_mask,
    prefix_split,
    random_segmentation,
    random_spans_helper,
    random_spans_noise_mask,
    sentinel_then_noise,
    sort_keys,
    span_counts,
    span_inputs_targets,
    split_documents,
)
from objtrain.rng import RowRandom
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary  # ordinary ids start here


def runs(mask: list[bool]) -> tuple[int, int]:
    """(True runs, False runs) of a 1-D mask."""
    true_runs = sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
    false_runs = sum(1 for i, m in enumerate(mask) if not m and (i == 0 or mask[i - 1]))
    return true_runs, false_runs


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((64, 0.2, 2.0), (70, 22)),
        ((64, 0.2, 1.0), (63, 27)),
        ((512, 0.15, 3.0), (568, 114)),
        ((256, 0.15, 3.0), (284, 58)),
        ((128, 0.15, 3.0), (141, 29)),
        ((512, 0.5, 3.0), (766, 512)),
    ],
)
def test_random_spans_helper_vectors(args: tuple[int, float, float], expected: tuple[int, int]) -> None:
    """Pitfall 15.1 (round half to even): the section-5 helper vectors, exactly."""
    assert random_spans_helper(*args) == expected


def test_round_half_to_even_in_counts() -> None:
    """Pitfall 15.1: 10 * 0.25 = 2.5 rounds to 2 and 14 * 0.25 = 3.5 to 4, as tf.round and np.round do."""
    assert span_counts(10, 0.25, 1.0)[0] == 2
    assert span_counts(14, 0.25, 1.0)[0] == 4
    assert span_counts(10, 0.25, 5.0 / 3.0)[1] == 1  # 2 / (5/3) = 1.2 -> 1
    assert span_counts(1, 0.15, 3.0) == (0, 0)  # L' = max(L, 2), cropped back to one kept token


def test_t5_unit_vectors() -> None:
    """Reference section 5 unit vectors (t5 preprocessors_test.py), vocab-1000 sentinel 999 = <extra_id_0>."""
    tokens = torch.tensor([[10, 11, 12, 13, 14, 15]]) + O
    mask = torch.tensor([[True, True, False, False, True, False]])
    lengths = torch.tensor([6])
    s0, s1 = SP.sentinel(0), SP.sentinel(1)
    out, n = noise_span_to_unique_sentinel(tokens, mask, lengths, SP)
    assert out[0, : n[0]].tolist() == [s0, 12 + O, 13 + O, s1, 15 + O]
    out, n = nonnoise_span_to_sentinel(tokens, mask, lengths, s0, SP.pad)
    assert out[0, : n[0]].tolist() == [10 + O, 11 + O, s0, 14 + O, s0]
    out, n = nonnoise_span_to_unique_sentinel(tokens, mask, lengths, SP)
    assert out[0, : n[0]].tolist() == [10 + O, 11 + O, s0, 14 + O, s1]
    out, n = sentinel_then_noise(tokens, mask, SP)
    assert out[0, : n[0]].tolist() == [s0, 10 + O, 11 + O, s1, 14 + O]
    out, n = drop_noise_tokens(tokens, mask, lengths, SP.pad)
    assert out[0, : n[0]].tolist() == [12 + O, 13 + O, 15 + O]
    out, n = drop_nonnoise_tokens(tokens, mask, lengths, SP.pad)
    assert out[0, : n[0]].tolist() == [10 + O, 11 + O, 14 + O]


def test_pad_inside_text_survives_compaction() -> None:
    """Pitfall 15.2 (transformers #15443): a literal <pad> (id 0) in the text is kept, not compacted."""
    tokens = torch.tensor([[O, SP.pad, O + 1, SP.pad, O + 2]])
    mask = torch.tensor([[False, False, True, False, False]])
    out, n = noise_span_to_unique_sentinel(tokens, mask, torch.tensor([5]), SP)
    assert out[0, : n[0]].tolist() == [O, SP.pad, SP.sentinel(0), SP.pad, O + 2]


def test_running_out_of_sentinels_is_a_user_error() -> None:
    """Pitfall 15.2: more spans than reserved sentinels is refused, never counted into ordinary ids."""
    few = Specials(n_sentinels=2)
    tokens = torch.arange(10)[None, :] + few.first_ordinary
    mask = torch.tensor([[False, True, False, True, False, True, False, False, False, False]])
    with pytest.raises(UserError, match="sentinels"):
        noise_span_to_unique_sentinel(tokens, mask, torch.tensor([10]), few)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(2, 300), min_size=1, max_size=6),
    density=st.sampled_from([0.05, 0.15, 0.3, 0.5, 0.8]),
    mean_span=st.sampled_from([1.0, 2.0, 3.0, 8.0, 64.0]),
    seed=st.integers(0, 2**31),
)
def test_span_mask_counts_and_structure(
    lengths: list[int], density: float, mean_span: float, seed: int
) -> None:
    """Exact noise count clamp(round(L r), 1, L-1), exactly max(1, round(n/mu)) noise runs, as many keep
    runs, first token kept and last token noise; per-segment lengths inside one batch."""
    lens = torch.tensor(lengths)
    width = max(lengths) + 3
    mask = random_spans_noise_mask(
        lens, width, density, mean_span, RowRandom(seed, torch.arange(len(lengths)))
    )
    for i, L in enumerate(lengths):
        m = mask[i].tolist()
        assert not any(m[L:])
        n_noise, n_spans = span_counts(L, density, mean_span)
        assert sum(m) == n_noise == min(max(round(L * density), 1), L - 1)
        assert runs(m[:L]) == (n_spans, n_spans)
        assert not m[0] and m[L - 1]


def test_random_segmentation_parts_are_nonempty_and_sum() -> None:
    n_items = torch.tensor([10, 7, 1, 30])
    n_parts = torch.tensor([3, 7, 1, 5])
    sizes = random_segmentation(n_items, n_parts, RowRandom(0, torch.arange(4)), "s")
    for i in range(4):
        parts = sizes[i, : n_parts[i]]
        assert int(parts.sum()) == int(n_items[i]) and bool((parts >= 1).all())
        assert int(sizes[i, n_parts[i] :].sum()) == 0


def test_rolled_mask_density_is_flat_over_positions() -> None:
    """Pitfall t5#905: unrolled, the last position is always noise; rolled, every position is noise
    with probability ~r and the mean density is within 0.01 of r (T5's own check)."""
    n, L, r = 4000, 20, 0.15
    lens = torch.full((n,), L)
    rr = RowRandom(3, torch.arange(n))
    plain = random_spans_noise_mask(lens, L, r, 3.0, rr)
    assert bool(plain[:, -1].all()) and not bool(plain[:, 0].any())
    rolled = random_spans_noise_mask(lens, L, r, 3.0, rr, random_roll=True)
    assert rolled.sum(1).eq(3).all()  # round(20 * 0.15) = 3 noise tokens either way
    per_position = rolled.float().mean(0)
    assert abs(float(per_position.mean()) - r) < 0.01
    assert float((per_position - r).abs().max()) < 0.04
    assert not bool(rolled[:, -1].all())


@settings(max_examples=30, deadline=None)
@given(
    L=st.integers(2, 200), density=st.sampled_from([0.1, 0.25, 0.5, 0.75, 1.0]), seed=st.integers(0, 2**31)
)
def test_prefix_split_range(L: int, density: float, seed: int) -> None:
    """Both parts non-empty; r <= 0.5: n_in in [min(max_in, max(1, round((1-2r) max_in))), L-1] (t5)."""
    n = 64
    n_in = prefix_split(torch.full((n,), L), density, RowRandom(seed, torch.arange(n)))
    max_in = L - 1
    if density <= 0.5:
        low = min(max_in, max(1, round((1 - 2 * density) * max_in)))
        high = max_in
    else:
        low, high = 1, min(max_in, max(1, round((2 - 2 * density) * max_in)))
    assert int(n_in.min()) >= low and int(n_in.max()) <= high


def test_prefix_split_is_uniform_at_half() -> None:
    """r = 0.5: the split is uniform on [1, L-1] (chi-square, 8 bins, p ~ 0.001 threshold)."""
    n, L = 8000, 9
    n_in = prefix_split(torch.full((n,), L), 0.5, RowRandom(11, torch.arange(n)))
    counts = torch.bincount(n_in, minlength=L)[1:L].double()
    expected = n / (L - 1)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 24.3  # chi-square(7) 0.999 quantile
    assert int(counts.sum()) == n


def test_prefix_split_short_documents() -> None:
    n_in = prefix_split(torch.tensor([1, 2, 0]), 0.5, RowRandom(0, torch.arange(3)))
    assert n_in.tolist() == [0, 1, 0]


def test_split_documents_of_packed_rows() -> None:
    rows = torch.tensor([[5, 6, 7, 8, 9], [1, 2, 3, 0, 0], [4, 4, 4, 4, 4]])
    docs = torch.tensor([[0, 0, 1, 2, 2], [0, 0, 0, -1, -1], [-1, -1, -1, -1, -1]])
    seg = split_documents(rows, docs)
    assert seg.lengths.tolist() == [2, 1, 2, 3]
    assert seg.row.tolist() == [0, 0, 0, 1]
    assert seg.doc.tolist() == [0, 1, 2, 0]
    assert seg.tokens.tolist() == [[5, 6, 0], [7, 0, 0], [8, 9, 0], [1, 2, 3]]
    with_eos = split_documents(torch.tensor([[5, 3, 6, 3, 7]]), torch.tensor([[0, 0, 1, 1, 2]]), 0, eos_id=3)
    assert with_eos.lengths.tolist() == [1, 1, 1]
    assert with_eos.had_eos is not None and with_eos.had_eos.tolist() == [True, True, False]
    empty = split_documents(rows[2:], docs[2:])
    assert empty.n == 0


def test_split_documents_as_many_documents_as_rows_but_not_one_per_row() -> None:
    """One full-length row, one row of two documents, one row of padding: as many documents as rows and
    one as wide as the row, yet the rows are not the segments."""
    rows = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    docs = torch.tensor([[0, 0, 0], [0, 1, 1], [-1, -1, -1]])
    for eos in (None, 6):
        seg = split_documents(rows, docs, 0, eos_id=eos)
        assert seg.row.tolist() == [0, 1, 1]
        assert seg.tokens.tolist() == [[1, 2, 3], [4, 0, 0], [5, 6 if eos is None else 0, 0]]
        assert seg.lengths.tolist() == [3, 1, 2 if eos is None else 1]


def test_row_random_cpu_path_matches_the_int64_reference() -> None:
    """The numpy uint64 hash of CPU grids gives the bits of the int64 torch formulation (used on other
    devices), and bits_at / bits_of read the grid at the given positions."""
    rows = torch.tensor([0, 5, 2**40 + 3])
    rr = RowRandom(11, rows)
    base = rng._finalise(rows * rng._ROW + rng.stream_key(11, "s"))
    ref = rng._finalise(base[:, None] + torch.arange(9)[None, :] * rng._POS)
    assert torch.equal(rr.bits(9, "s"), ref)
    assert torch.equal(rr.uniform(9, "s"), rng._shr(ref, 40).float() / (1 << 24))
    assert torch.equal(rr.uniform64(9, "s"), rng._shr(ref, 11).double() / (1 << 53))
    at = torch.tensor([[8, 0], [3, 3], [1, 7]])
    assert torch.equal(rr.bits_at(at, "s"), ref.gather(1, at))
    which, where = torch.tensor([2, 0, 2, 1]), torch.tensor([4, 4, 0, 8])
    assert torch.equal(rr.bits_of(which, where, "s"), ref[which, where])


def test_iid_mask_rate_and_lengths() -> None:
    lens = torch.tensor([1000] * 50 + [3] * 50)
    mask = iid_noise_mask(lens, 1000, 0.15, RowRandom(0, torch.arange(100)))
    assert not bool(mask[50:, 3:].any())
    assert abs(float(mask[:50].float().mean()) - 0.15) < 0.01


def test_sort_keys_depend_only_on_position() -> None:
    """A key must not depend on how many keys a batch asks for, or rows change with their batch."""
    rr = RowRandom(5, torch.arange(3))
    long, short = sort_keys(rr, 11, "k"), sort_keys(rr, 4, "k")
    assert torch.equal(long[:, :4], short)
    assert len(set(long[0].tolist())) == 11


def test_length_groups_do_not_change_results(monkeypatch: pytest.MonkeyPatch) -> None:
    """Documents processed in length groups (forced here: free groups) give exactly the one-group batch."""
    from objtrain.objectives import noise
    from objtrain.objectives.registry import build_objective

    g = torch.Generator().manual_seed(0)
    rows = torch.randint(O, O + 500, (8, 300), generator=g)
    docs = (torch.rand(8, 300, generator=g) < 0.03).long().cumsum(1)
    docs[5, 250:] = -1
    for name, kind in [("span", "encdec"), ("span", "decoder"), ("prefix_lm", "encdec"), ("ul2", "encdec")]:
        obj = build_objective(name, SP, model_kind=kind)  # type: ignore[arg-type]
        monkeypatch.setattr(noise, "_GROUP_COST", 10**12)
        one = obj(rows, docs, torch.arange(8), 4)
        monkeypatch.setattr(noise, "_GROUP_COST", 0)
        grouped = obj(rows, docs, torch.arange(8), 4)
        for key, tensor in one.tensors().items():
            assert torch.equal(tensor, grouped.tensors()[key]), (name, key)
    bart = build_objective(
        "bart", SP, overrides={"whole_words": False, "vocab_size": O + 500, "sentence_end_ids": [O + 1]}
    )
    monkeypatch.setattr(noise, "_GROUP_COST", 10**12)
    one = bart(rows, docs, torch.arange(8), 4)
    monkeypatch.setattr(noise, "_GROUP_COST", 0)
    grouped = bart(rows, docs, torch.arange(8), 4)
    for key, tensor in one.tensors().items():
        assert torch.equal(tensor, grouped.tensors()[key]), ("bart", key)


@settings(max_examples=20, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 60), min_size=1, max_size=5),
    seed=st.integers(0, 2**31),
    roll=st.booleans(),
)
def test_fused_span_transform_equals_the_composition(lengths: list[int], seed: int, roll: bool) -> None:
    """`span_inputs_targets` (one pass) == sentinel transforms + EOS (+ a leading mode token)."""
    lens = torch.tensor(lengths)
    W = max(lengths)
    tokens = (torch.arange(max(W, 1))[None, :] + O).repeat(len(lengths), 1)[:, :W]
    rr = RowRandom(seed, torch.arange(len(lengths)))
    mask = random_spans_noise_mask(lens, W, 0.3, 2.0, rr, random_roll=roll)
    inputs, n_in, targets, n_tgt = span_inputs_targets(tokens, mask, lens, SP, SP.nlg)
    ref_in, ref_n_in = noise_span_to_unique_sentinel(tokens, mask, lens, SP)
    ref_t, ref_n_t = sentinel_then_noise(tokens, mask, SP)
    for i in range(len(lengths)):
        assert inputs[i, : n_in[i]].tolist() == [SP.nlg, *ref_in[i, : ref_n_in[i]].tolist(), SP.eos]
        assert targets[i, : n_tgt[i]].tolist() == [*ref_t[i, : ref_n_t[i]].tolist(), SP.eos]


def test_prefix_noise_mask() -> None:
    mask = prefix_noise_mask(torch.tensor([4, 2]), 5, torch.tensor([1, 1]))
    assert mask.tolist() == [[False, True, True, True, False], [False, True, False, False, False]]
