"""Multi-token prediction (reference section 10): head layout, n=1 == CLM, loss and sequential backward."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objtrain import IGNORE
from objtrain.batch import ModelOutput
from objtrain.errors import UserError
from objtrain.objectives.base import token_loss
from objtrain.objectives.clm import CausalLM
from objtrain.objectives.mtp import MultiTokenPrediction
from objtrain.objectives.registry import build_objective, objective_defaults
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary


def packed(seed: int, B: int, L: int, n_docs: int = 3):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(O, O + 300, (B, L), generator=g)
    cuts = torch.randint(0, 2, (B, L), generator=g) * (torch.rand(B, L, generator=g) < n_docs / max(L, 1))
    docs = cuts.cumsum(dim=1)
    docs[1::3, L - L // 4 :] = -1
    return rows, docs


def mtp(n: int, cross: bool = False) -> MultiTokenPrediction:
    return MultiTokenPrediction(MultiTokenPrediction.Config(n=n, cross_document_targets=cross), SP)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 6), L=st.integers(1, 40))
def test_single_document_rows(seed: int, n: int, L: int) -> None:
    """Section 10 invariant on a T+1 raw block: labels_k[:, :T-k+1] == x[:, k:]; the rest IGNORE, never
    wrapped (pitfall 15.3, MTP: drop the last positions of each head)."""
    rows = torch.randint(O, O + 300, (3, L), generator=torch.Generator().manual_seed(seed))
    docs = torch.zeros_like(rows)
    batch = mtp(n)(rows, docs, torch.arange(3), seed)
    T = L - 1
    assert batch.mtp_labels is not None and batch.mtp_labels.shape == (3, n, T)
    assert torch.equal(batch.mtp_labels[:, 0], batch.labels)
    for k in range(1, n + 1):
        head = batch.mtp_labels[:, k - 1]
        valid = max(T - k + 1, 0)
        assert torch.equal(head[:, :valid], rows[:, k : k + valid])
        assert bool((head[:, valid:] == IGNORE).all())


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 5), cross=st.booleans())
def test_targets_never_cross_documents_or_padding(seed: int, n: int, cross: bool) -> None:
    rows, docs = packed(seed, 4, 30)
    batch = mtp(n, cross)(rows, docs, torch.arange(4), 0)
    assert batch.mtp_labels is not None
    T = 29
    for k in range(1, n + 1):
        for t in range(T):
            src = t + k
            for b in range(4):
                here = int(docs[b, t])
                there = int(docs[b, src]) if src <= T else -1
                ok = here >= 0 and there >= 0 and (cross or here == there)
                want = int(rows[b, src]) if ok else IGNORE
                assert int(batch.mtp_labels[b, k - 1, t]) == want


def test_n1_equals_clm_bit_for_bit() -> None:
    rows, docs = packed(3, 5, 33)
    a = mtp(1)(rows, docs, torch.arange(5), 9)
    c = CausalLM(CausalLM.Config(), SP)(rows, docs, torch.arange(5), 9)
    for name, tensor in c.tensors().items():
        assert torch.equal(tensor, a.tensors()[name]), name
    logits = torch.randn(5, 32, 600)
    la = mtp(1).loss(ModelOutput(logits=logits, mtp_logits=[]), a)
    lc = token_loss(logits, c.labels)
    assert torch.equal(la.loss_sum, lc.loss_sum) and torch.equal(la.n_targets, lc.n_targets)


def test_loss_sums_heads_and_reports_head1() -> None:
    """Pitfall 15.8: the total MTP loss is not comparable with CLM; head1_loss is, and equals CLM's mean."""
    obj = mtp(3)
    rows, docs = packed(4, 3, 21)
    batch = obj(rows, docs, torch.arange(3), 0)
    out = ModelOutput(logits=torch.randn(3, 20, 600), mtp_logits=[torch.randn(3, 20, 600) for _ in range(2)])
    loss = obj.loss(out, batch)
    heads = [obj.head_loss(out, batch, k) for k in (1, 2, 3)]
    assert torch.allclose(loss.loss_sum, sum(s for s, _ in heads))
    assert int(loss.n_targets) == int(heads[0][1]) == batch.n_targets
    clm = token_loss(out.logits, batch.labels)
    assert torch.allclose(loss.metrics["head1_loss"], clm.loss_sum / clm.n_targets)
    for k in (2, 3):
        assert torch.allclose(loss.metrics[f"head{k}_loss"], heads[k - 1][0] / heads[k - 1][1])
    with pytest.raises(UserError, match="heads"):
        obj.loss(ModelOutput(logits=out.logits, mtp_logits=out.mtp_logits[:1]), batch)


def test_loss_is_per_position_not_the_sum_of_head_means() -> None:
    """Reference section 10: L = sum_t sum_k CE_k(t), normalised by the positions (head 1's count).
    Heads k > 1 have fewer targets on packed rows, so this differs from the sum of per-head means."""
    obj = mtp(4)
    rows, docs = packed(7, 4, 33, n_docs=6)
    batch = obj(rows, docs, torch.arange(4), 0)
    g = torch.Generator().manual_seed(1)
    out = ModelOutput(
        logits=torch.randn(4, 32, 600, generator=g),
        mtp_logits=[torch.randn(4, 32, 600, generator=g) * 3 for _ in range(3)],
    )
    loss = obj.loss(out, batch)
    heads = [obj.head_loss(out, batch, k) for k in (1, 2, 3, 4)]
    counts = [int(c) for _, c in heads]
    assert counts[0] > counts[1] > counts[2] > counts[3]  # documents and row ends take targets away
    per_position = sum(s for s, _ in heads) / counts[0]
    assert torch.allclose(loss.loss_sum / loss.n_targets, per_position)
    labels = batch.mtp_labels
    assert labels is not None
    by_hand = sum(  # the paper's double sum, over every position of every row
        torch.nn.functional.cross_entropy(logits[b, t], labels[b, k, t], reduction="sum")
        for k, logits in enumerate([out.logits, *out.mtp_logits])
        for b in range(4)
        for t in range(32)
        if int(labels[b, k, t]) != IGNORE
    )
    assert torch.allclose(loss.loss_sum, by_hand, rtol=1e-4)
    mean_sum = sum(s / c for s, c in heads)
    assert not torch.allclose(loss.loss_sum / loss.n_targets, mean_sum, rtol=1e-3)


def test_sequential_backward_matches_summed_loss() -> None:
    """Section 10 invariant: per-head forward+backward accumulated at the trunk == naive summed backward."""
    torch.manual_seed(0)
    obj = mtp(3)
    rows, docs = packed(6, 2, 17)
    batch = obj(rows, docs, torch.arange(2), 0)
    V, D = 600, 8
    emb = torch.nn.Embedding(V, D)
    heads = torch.nn.ModuleList(torch.nn.Linear(D, V) for _ in range(3))

    def grads() -> list[torch.Tensor]:
        return [p.grad.clone() for p in [*emb.parameters(), *heads.parameters()]]

    trunk = torch.tanh(emb(batch.input_ids))
    out = ModelOutput(logits=heads[0](trunk), mtp_logits=[heads[1](trunk), heads[2](trunk)])
    loss = obj.loss(out, batch)
    (loss.loss_sum / loss.n_targets).backward()
    naive = grads()
    emb.zero_grad()
    heads.zero_grad()

    trunk = torch.tanh(emb(batch.input_ids))
    detached = trunk.detach().requires_grad_()
    n1 = obj.head_loss(ModelOutput(logits=heads[0](detached)), batch, 1)[1]
    for k in (1, 2, 3):
        logits = heads[k - 1](detached)
        out = ModelOutput(logits=logits, mtp_logits=[logits, logits])
        loss_sum, _ = obj.head_loss(out, batch, k)
        (loss_sum / n1).backward()
    trunk.backward(detached.grad)
    for a, b in zip(naive, grads(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_batch_size_independent_and_yaml() -> None:
    """Pitfall 15.6: seeded per (seed, row index); the YAML mirrors the defaults."""
    rows, docs = packed(1, 8, 25)
    obj = mtp(4)
    whole = obj(rows, docs, torch.arange(8), 3)
    parts = [obj(rows[s], docs[s], torch.arange(8)[s], 3) for s in (slice(0, 3), slice(3, 8))]
    for name, tensor in whole.tensors().items():
        assert torch.equal(tensor, torch.cat([p.tensors()[name] for p in parts])), name
    assert objective_defaults("mtp") == dataclasses.asdict(MultiTokenPrediction.Config())
    assert obj.raw_length(512) == 513  # the same rows as CLM
    with pytest.raises(UserError, match="n must be at least 1"):
        build_objective("mtp", SP, overrides={"n": 0})


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    L=st.integers(2, 80),
    n=st.integers(1, 4),
    end=st.sampled_from(["cut", "boundary", "full"]),
)
def test_a_document_is_trained_whatever_follows_it(
    make_packed_rows: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    keep_first_documents: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    seed: int,
    L: int,
    n: int,
    end: str,
) -> None:
    """Packed rows with EOS-only and one-token documents (n = 1 is CLM): a row whose documents from some k
    on are padding gives exactly the same inputs and targets of every head on its first k documents, and
    every target a document has inside the row is trained: head k's label at t is x[t + k] wherever t and
    t + k are in one document (a one-token or EOS-only document has none, a document's EOS is a target)."""
    obj = mtp(n)
    rows, docs = make_packed_rows(seed, 6, L, end)
    index = torch.arange(6) + seed
    full = obj(rows, docs, index, seed)
    first, k = keep_first_documents(docs, seed)
    alone = obj(rows, first, index, seed)
    ours = (full.document_ids >= 0) & (full.document_ids < k[:, None])
    assert full.mtp_labels is not None and alone.mtp_labels is not None
    for name in ("input_ids", "labels", "positions", "document_ids"):
        assert torch.equal(getattr(full, name)[ours], getattr(alone, name)[ours]), name
    for h in range(n):
        assert torch.equal(full.mtp_labels[:, h][ours], alone.mtp_labels[:, h][ours])
        assert bool((alone.mtp_labels[:, h][~ours] == IGNORE).all())
        T = L - 1
        for b in range(6):
            for t in range(T):
                inside = t + h + 1 < L and int(docs[b, t]) >= 0 and int(docs[b, t]) == int(docs[b, t + h + 1])
                want = int(rows[b, t + h + 1]) if inside else IGNORE
                assert int(full.mtp_labels[b, h, t]) == want


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 6), cross=st.booleans(), L=st.integers(1, 40))
def test_reports_raw_tokens_fed_and_unused(seed: int, n: int, cross: bool, L: int) -> None:
    """Every objective reports its waste (`corrupt --stats`, the training metrics): the raw positions fed, and
    of them those in no input and no head's target. Counted from the batch itself: the real inputs, and the
    raw position each labelled target of any head reads."""
    rows, docs = packed(seed, 4, L)
    batch = mtp(n, cross)(rows, docs, torch.arange(4), 0)
    assert batch.mtp_labels is not None
    T = L - 1
    used = torch.zeros_like(docs, dtype=torch.bool)
    used[:, :T] = docs[:, :T] >= 0
    for k in range(1, n + 1):
        t = torch.arange(T)
        labelled = batch.mtp_labels[:, k - 1] != IGNORE
        src = (t + k).clamp(max=L - 1).expand_as(labelled)
        at = torch.where(labelled, src, 0)
        used.scatter_(1, at, labelled | used.gather(1, at))
    fed = int((docs >= 0).sum())
    assert batch.stats["raw_tokens_fed"] == fed
    assert batch.stats["raw_tokens_unused"] == fed - int((used & (docs >= 0)).sum())
    clm = CausalLM(CausalLM.Config(cross_document_targets=cross), SP)(rows, docs, torch.arange(4), 0)
    assert batch.stats["raw_tokens_unused"] == clm.stats["raw_tokens_unused"]
