"""Left-to-right scoring with known answers: window arithmetic, uniform, copy and bigram models."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from objtrain.errors import UserError
from objtrain.evaluation.lm import plan_windows, score_documents

EOS = 3


def scored_targets(lengths: list[int], window: int, stride: int) -> list[list[int]]:
    """Document-local target indices (1..N) scored by each plan, per document, in scoring order."""
    plan = plan_windows(lengths, window, stride)
    starts = np.concatenate(([0], np.cumsum(np.array(lengths) + 1)[:-1]))
    out: list[list[int]] = [[] for _ in lengths]
    for w in range(len(plan)):
        d = int(plan.doc[w])
        local = plan.inputs[w][plan.scored[w]] - starts[d]
        out[d] += (local + 1).tolist()
        # the window reads at most `window` real inputs, in order, ending right before its last target
        real = plan.inputs[w][plan.valid[w]]
        assert len(real) <= window and np.all(np.diff(real) == 1)
    return out


def test_every_target_scored_exactly_once_for_random_windows() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        lengths = rng.integers(0, 60, size=rng.integers(1, 5)).tolist()
        window = int(rng.integers(1, 20))
        stride = int(rng.integers(1, window + 1))
        for n, got in zip(lengths, scored_targets(lengths, window, stride), strict=True):
            assert sorted(got) == list(range(1, n + 1))


def test_later_targets_see_at_least_window_minus_stride_plus_one_tokens() -> None:
    window, stride, n = 10, 3, 50
    plan = plan_windows([n], window, stride)
    for w in range(len(plan)):
        cols = np.flatnonzero(plan.scored[w])
        context = cols + 1  # inputs up to and including the scored position
        if w > 0:
            assert context.min() >= window - stride + 1


def test_disjoint_windows_match_the_harness_example() -> None:
    # lm-evaluation-harness tests/test_utils.py: 34 tokens, window 10 -> 10 + 10 + 10 + 4 targets, the last
    # window's input starting at token 23 (0-based, document tokens; our local index 24, x_0 being 0).
    plan = plan_windows([34], 10, 10)
    assert plan.scored.sum(axis=1).tolist() == [10, 10, 10, 4]
    assert int(plan.inputs[-1][0]) == 24 and int(plan.valid[-1].sum()) == 10


def test_rows_are_as_wide_as_the_data_not_the_window() -> None:
    # --window 100000 over short documents must cost what the documents cost
    plan = plan_windows([5, 12, 3], 100_000, 100_000)
    assert plan.inputs.shape == plan.valid.shape == plan.scored.shape == (3, 12)
    assert plan.scored.sum(axis=1).tolist() == [5, 12, 3]
    assert plan_windows([40], 10, 3).inputs.shape[1] == 10


def test_bad_window_or_stride_is_a_user_error() -> None:
    with pytest.raises(UserError, match="stride"):
        plan_windows([5], 4, 5)
    with pytest.raises(UserError, match="window"):
        plan_windows([5], 0, 1)
    with pytest.raises(UserError, match="stride"):  # 0 is refused, not read as "the window"
        score_documents(torch.nn.Identity(), [np.arange(4, 9)], torch.ones(16), EOS, 4, 0)


def _docs(seed: int, V: int = 11) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(4, V, size=n) for n in (1, 7, 40, 23)]


def test_uniform_model_gives_log_v_per_token(stub) -> None:
    V = 11
    docs = _docs(0, V)
    table = torch.ones(V, dtype=torch.int64)  # one byte per token
    score = score_documents(stub(torch.zeros(V, V)), docs, table, EOS, window=8, stride=5)
    T = sum(len(d) for d in docs)
    assert score.targets == T and score.bytes == T
    assert score.nats == pytest.approx(T * math.log(V), rel=1e-6)
    assert score.metrics()["bits_per_byte"] == pytest.approx(math.log2(V), rel=1e-6)


def test_copy_model_has_the_closed_form_nll(stub) -> None:
    V, c = 11, 3.0
    docs = [np.array([5, 5, 5, 7, 7, 5, 9, 9, 9, 9]), np.array([4, 4])]
    score = score_documents(stub(c * torch.eye(V)), docs, torch.ones(V, dtype=torch.int64), EOS, 4, 3)
    z = math.exp(c) + V - 1
    expected = 0.0
    for d in docs:
        prev = [EOS, *d[:-1].tolist()]
        for p, t in zip(prev, d.tolist(), strict=True):
            expected += -(c - math.log(z)) if p == t else math.log(z)
    assert score.nats == pytest.approx(expected, rel=1e-6)


def test_stride_and_batch_size_change_no_totals_of_a_bigram_model(stub) -> None:
    V = 11
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(0))
    byte_table = torch.arange(V) % 3 + 1  # tokens of 1..3 bytes
    docs = _docs(1, V)
    ref = score_documents(stub(table), docs, byte_table, EOS, window=8, stride=8)
    for stride in (1, 2, 5, 8):
        for batch_size in (1, 3, 64):
            s = score_documents(stub(table), docs, byte_table, EOS, 8, stride, batch_size=batch_size)
            assert (s.targets, s.bytes) == (ref.targets, ref.bytes)
            assert s.nats == pytest.approx(ref.nats, rel=1e-6)
    expected_bytes = sum(int(byte_table[torch.from_numpy(d)].sum()) for d in docs)
    assert ref.bytes == expected_bytes and ref.targets == sum(len(d) for d in docs)


def test_overlapping_windows_need_more_forwards(stub) -> None:
    V = 11
    disjoint, overlapping = stub(torch.zeros(V, V)), stub(torch.zeros(V, V))
    docs = [np.arange(100) % 7 + 4]
    score_documents(disjoint, docs, torch.ones(V, dtype=torch.int64), EOS, 10, 10, batch_size=1)
    score_documents(overlapping, docs, torch.ones(V, dtype=torch.int64), EOS, 10, 2, batch_size=1)
    assert disjoint.forwards == 10 and overlapping.forwards == 1 + math.ceil((100 - 10) / 2)


def test_real_decoder_scores_match_a_direct_forward(tokenizer) -> None:
    """With one window covering the document, the total is the plain forward's summed NLL."""
    from objtrain.models.zoo import build_model, model_config

    torch.manual_seed(0)
    model = build_model(model_config("decoder", "debug", vocab_size=tokenizer.vocab_size)).eval()
    doc = np.array(tokenizer.encode("def f(x):\n    return x + 1\n"))
    ids = torch.tensor([[EOS, *doc.tolist()]])
    logp = model.logits(ids)[0, :-1].log_softmax(-1)
    expected = -logp.gather(1, ids[0, 1:, None]).sum().item()
    s = score_documents(model, [doc], torch.ones(tokenizer.vocab_size, dtype=torch.int64), EOS, 64)
    assert s.nats == pytest.approx(expected, rel=1e-5)
