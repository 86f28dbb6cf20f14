"""Attention patterns from the batch: masks, causality, document isolation, prefix, SDPA vs naive."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_helpers import change_tokens, docs_row, make_batch, naive_attend, reference_mask, tiny_model

import objtrain.models.base as base_module
import objtrain.models.blocks as blocks_module
import objtrain.models.encdec as encdec_module
from objtrain.batch import Batch
from objtrain.models.attention import cross_attention_mask, self_attention_mask, self_attention_spec

PACKED = [docs_row([3, 5, 2], 12), docs_row([7, 4], 12), docs_row([12], 12)]


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=4), min_size=1, max_size=3),
    attention=st.sampled_from(["causal", "bidirectional", "prefix"]),
    prefix_len=st.integers(0, 4),
)
def test_mask_matches_the_rule_position_by_position(
    lengths: list[list[int]], attention: str, prefix_len: int
) -> None:
    total = max(sum(row) for row in lengths) + 1
    batch = make_batch([docs_row(row, total) for row in lengths], attention, prefix_len=prefix_len)
    got = self_attention_mask(batch.document_ids, attention, batch.prefix_mask)  # type: ignore[arg-type]
    assert torch.equal(got, reference_mask(batch.document_ids, attention, batch.prefix_mask))
    assert got.any(dim=-1).all()  # no empty softmax row, pads included


def test_fast_path_only_for_one_document_per_row() -> None:
    one = torch.zeros(2, 6, dtype=torch.long)
    assert self_attention_spec(one, "causal") == (None, True)
    assert self_attention_spec(one, "bidirectional") == (None, False)
    packed = torch.tensor([[0, 0, 1, 1, 1, -1]] * 2)
    mask, is_causal = self_attention_spec(packed, "causal")
    assert mask is not None and not is_causal
    padded = torch.tensor([[0, 0, 0, 0, -1, -1]] * 2)
    assert self_attention_spec(padded, "causal")[0] is not None


@pytest.mark.parametrize("kind", ["decoder", "encoder", "encdec"])
@pytest.mark.parametrize("doc_rows", [[[0] * 12] * 2, PACKED], ids=["one-document", "packed"])
def test_marked_layout_gives_the_same_outputs_and_one_graph(kind: str, doc_rows: list[list[int]]) -> None:
    """`Batch.mark_layout` only moves the fast-path test out of the forward: same outputs, and with it the
    whole forward traces without a graph break (fullgraph=True fails on any)."""
    attention = "bidirectional" if kind == "encoder" else "causal"
    model = tiny_model(kind)
    batch = make_batch(doc_rows, attention, decoder_doc_rows=doc_rows if kind == "encdec" else None)
    marked = make_batch(doc_rows, attention, decoder_doc_rows=doc_rows if kind == "encdec" else None)
    assert marked.mark_layout() is marked
    assert marked.single_document == (doc_rows[0] == [0] * 12)
    assert kind != "encdec" or marked.decoder_single_document == marked.single_document
    assert (marked.decoder_single_document is None) == (kind != "encdec")
    with torch.no_grad():
        assert torch.equal(model(batch).logits, model(marked).logits)
        torch._dynamo.reset()
        traced = torch.compile(model, backend="eager", fullgraph=True)
        # to float rounding: compiled attention rotates in the half-split layout, which reorders sums
        assert torch.allclose(traced(marked).logits, model(marked).logits, atol=1e-5)


@pytest.mark.parametrize("doc_rows", [[[0] * 12] * 2, PACKED], ids=["one-document", "packed"])
def test_future_tokens_never_change_causal_outputs(doc_rows: list[list[int]]) -> None:
    model = tiny_model("decoder", mtp_heads=3)
    batch = make_batch(doc_rows, "causal")
    out = model(batch)
    for t in (0, 4, 9):
        future = torch.zeros_like(batch.input_ids, dtype=torch.bool)
        future[:, t + 1 :] = True
        changed = model(change_tokens(batch, future))
        assert torch.allclose(changed.logits[:, : t + 1], out.logits[:, : t + 1], atol=1e-5)
        for a, b in zip(changed.mtp_logits, out.mtp_logits, strict=True):  # type: ignore[arg-type]
            assert torch.allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-5)
        assert not torch.allclose(changed.logits[:, t + 1 :], out.logits[:, t + 1 :])


@pytest.mark.parametrize(
    ("kind", "attention"),
    [("decoder", "causal"), ("decoder", "prefix"), ("encoder", "bidirectional"), ("encoder", "prefix")],
)
def test_documents_in_a_packed_row_never_see_each_other(kind: str, attention: str) -> None:
    model = tiny_model(kind)
    batch = make_batch(PACKED, attention, prefix_len=2)
    out = model(batch)
    docs = batch.document_ids
    for target in (0, 1):
        changed = model(change_tokens(batch, docs == target))
        others = (docs != target) & (docs >= 0)
        assert torch.allclose(changed.logits[others], out.logits[others], atol=1e-5)
        assert not torch.allclose(changed.logits[docs == target], out.logits[docs == target])
    # padding is invisible to real tokens
    changed = model(change_tokens(batch, docs < 0))
    real = docs >= 0
    assert torch.allclose(changed.logits[real], out.logits[real], atol=1e-5)


def test_prefix_positions_see_each_other_and_targets_stay_causal() -> None:
    model = tiny_model("decoder")
    batch = make_batch([docs_row([6, 6], 12)], "prefix", prefix_len=3)  # prefixes: 0-2 and 6-8
    out = model(batch)
    where = torch.zeros_like(batch.input_ids, dtype=torch.bool)
    where[0, 2] = True  # the last prefix token of document 0
    changed = model(change_tokens(batch, where))
    assert not torch.allclose(changed.logits[0, 0], out.logits[0, 0])  # earlier prefix position sees it
    assert torch.allclose(changed.logits[0, 6:], out.logits[0, 6:], atol=1e-5)  # other document unaffected
    where = torch.zeros_like(where)
    where[0, 4] = True  # a target token
    changed = model(change_tokens(batch, where))
    assert torch.allclose(changed.logits[0, :4], out.logits[0, :4], atol=1e-5)  # nothing before it sees it
    assert not torch.allclose(changed.logits[0, 4:6], out.logits[0, 4:6])


def reference_cross(dec_docs: torch.Tensor, enc_docs: torch.Tensor, _: bool | None = None) -> torch.Tensor:
    B, S = dec_docs.shape
    T = enc_docs.size(1)
    out = torch.zeros(B, 1, S, T, dtype=torch.bool)
    for b in range(B):
        for s in range(S):
            row = enc_docs[b] == dec_docs[b, s]
            out[b, 0, s] = row if row.any() else torch.ones(T, dtype=torch.bool)
    return out


def test_cross_attention_mask_matches_the_rule() -> None:
    enc = torch.tensor([docs_row([3, 4], 8), docs_row([8], 8)])
    dec = torch.tensor([docs_row([2, 3], 6), docs_row([4], 6)])
    assert torch.equal(cross_attention_mask(dec, enc), reference_cross(dec, enc))  # type: ignore[arg-type]
    assert (
        cross_attention_mask(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 5, dtype=torch.long)) is None
    )


def test_encdec_cross_attention_stays_within_documents() -> None:
    model = tiny_model("encdec")
    batch = make_batch(
        [docs_row([4, 5], 10), docs_row([6, 3], 10)],
        "bidirectional",
        decoder_doc_rows=[docs_row([3, 4], 8), docs_row([2, 5], 8)],
    )
    out = model(batch)
    dec_docs = batch.decoder_document_ids
    assert dec_docs is not None
    for target in (0, 1):
        changed = model(change_tokens(batch, batch.document_ids == target))  # encoder side only
        others = (dec_docs != target) & (dec_docs >= 0)
        assert torch.allclose(changed.logits[others], out.logits[others], atol=1e-5)
        assert not torch.allclose(changed.logits[dec_docs == target], out.logits[dec_docs == target])


CASES = [
    ("decoder", "causal", [[0] * 10] * 2),  # SDPA is_causal fast path
    ("decoder", "causal", [docs_row([3, 4], 10), docs_row([10], 10)]),
    ("decoder", "prefix", [docs_row([5, 4], 10), docs_row([6], 10)]),
    ("encoder", "bidirectional", [[0] * 10] * 2),  # no-mask fast path
    ("encoder", "bidirectional", [docs_row([3, 4], 10), docs_row([9], 10)]),
    ("encdec", "bidirectional", [docs_row([4, 5], 10), docs_row([10], 10)]),
]


@pytest.mark.parametrize(("kind", "attention", "doc_rows"), CASES)
def test_sdpa_path_equals_naive_attention(
    kind: str, attention: str, doc_rows: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    decoder_docs = [docs_row([3, 4], 8), docs_row([8], 8)] if kind == "encdec" else None
    batch = make_batch(doc_rows, attention, prefix_len=3, decoder_doc_rows=decoder_docs)
    weights = torch.randn(*batch.labels.shape, 97, generator=torch.Generator().manual_seed(3))

    def logits_and_grads() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model = tiny_model(kind).train()
        out = model(batch)
        (out.logits * weights).sum().backward()
        return out.logits.detach(), {
            n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
        }

    fast_logits, fast_grads = logits_and_grads()

    def naive_spec(
        docs: torch.Tensor, att: str, prefix: torch.Tensor | None, single: bool | None = None
    ) -> tuple[torch.Tensor, bool]:
        return reference_mask(docs, att, prefix), False

    monkeypatch.setattr(base_module, "self_attention_spec", naive_spec)
    monkeypatch.setattr(encdec_module, "cross_attention_mask", reference_cross)
    monkeypatch.setattr(blocks_module, "attend", lambda q, k, v, mask, is_causal: naive_attend(q, k, v, mask))
    naive_logits, naive_grads = logits_and_grads()
    assert torch.allclose(fast_logits, naive_logits, atol=1e-5, rtol=1e-4)
    assert fast_grads.keys() == naive_grads.keys()
    for name, grad in fast_grads.items():
        scale = float(grad.abs().max()) + 1e-6
        assert torch.allclose(grad, naive_grads[name], atol=1e-5 * scale, rtol=1e-3), name


def test_encoder_segments_and_pooled_head() -> None:
    model = tiny_model("encoder")
    batch = make_batch([[0] * 8] * 3, "bidirectional")
    assert model(batch).seq_logits is None  # no pair labels (MLM): the pooled head is not run
    batch.seq_labels = torch.full_like(batch.input_ids, -100)
    out = model(batch)
    assert out.seq_logits is not None and out.seq_logits.shape == (3, 8, 2)  # pooled head at every position
    batch.segment_ids = torch.ones_like(batch.input_ids)
    assert not torch.allclose(model(batch).logits, out.logits)  # segment embeddings are used


def test_mtp_sequential_backward_equals_summed_loss() -> None:
    """Trunk once, each head's forward+backward in turn, then the trunk's backward (reference section 10)."""
    batch = make_batch([[0] * 10] * 2, "causal")
    targets = torch.randint(0, 97, (3, 2, 10), generator=torch.Generator().manual_seed(5))

    def head_loss(logits: torch.Tensor, k: int) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets[k].flatten())

    model = tiny_model("decoder", mtp_heads=3).train()
    out = model(batch)
    sum(head_loss(lg, k) for k, lg in enumerate([out.logits, *out.mtp_logits])).backward()  # type: ignore[misc]
    naive = {n: p.grad.clone() for n, p in model.named_parameters()}

    model = tiny_model("decoder", mtp_heads=3).train()
    trunk = model.trunk(batch)
    hidden = trunk.hidden.detach().requires_grad_()
    detached = type(trunk)(hidden, trunk.ctx)
    for k in range(3):
        head_loss(model.head(k, detached)[1], k).backward()
    trunk.hidden.backward(hidden.grad)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, naive[name], atol=1e-6), name


def test_forward_is_finite_under_bf16_autocast() -> None:
    for kind in ("decoder", "encoder", "encdec"):
        model = tiny_model(kind)
        batch = make_batch(
            PACKED,
            "causal" if kind == "decoder" else "bidirectional",
            decoder_doc_rows=PACKED if kind == "encdec" else None,
        )
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(batch)
        assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.logits).all()


def test_batch_type_is_the_only_input() -> None:
    model = tiny_model("decoder")
    ids = torch.randint(0, 97, (1, 5))
    out = model(Batch(ids, ids, torch.arange(5)[None], torch.zeros_like(ids), "causal"))
    assert out.logits.shape == (1, 5, 97) and out.hidden is not None and out.mtp_logits is None
