"""FlexAttention block masks: the same rule as the dense masks, the same outputs as SDPA (forward; CPU
FlexAttention has no backward), and CPU training never taking them."""

from __future__ import annotations

import pytest
import torch
from model_helpers import docs_row, make_batch, tiny_model
from torch.nn.attention.flex_attention import BlockMask, create_mask

from objtrain.errors import UserError
from objtrain.models.attention import (
    cross_attention_mask,
    flex_attend,
    flex_attention_spec,
    flex_cross_attention_spec,
    self_attention_block_mask,
    self_attention_mask,
    use_flex,
)
from objtrain.models.blocks import attend
from objtrain.models.config import ModelConfig
from objtrain.models.zoo import config_to_dict

PACKED = [docs_row([3, 5, 2], 12), docs_row([7, 4], 12), docs_row([12], 12)]
DECODER_SIDE = [docs_row([2, 5, 1], 9), docs_row([4, 4], 9), docs_row([6], 9)]


def dense(mask: BlockMask, q_len: int, kv_len: int) -> torch.Tensor:
    """The element-wise (B, 1, Q, KV) mask a BlockMask's mask_mod describes."""
    return create_mask(mask.mask_mod, mask.shape[0], 1, q_len, kv_len, device="cpu")


@pytest.mark.parametrize("attention", ["causal", "bidirectional", "prefix"])
def test_block_masks_follow_the_dense_rule(attention: str) -> None:
    batch = make_batch(PACKED, attention, prefix_len=3)
    block = self_attention_block_mask(batch.document_ids, attention, batch.prefix_mask)  # type: ignore[arg-type]
    want = self_attention_mask(batch.document_ids, attention, batch.prefix_mask)  # type: ignore[arg-type]
    assert torch.equal(dense(block, 12, 12), want)


def test_cross_block_mask_follows_the_dense_rule() -> None:
    enc, dec = torch.tensor(PACKED), torch.tensor(DECODER_SIDE)
    block = flex_cross_attention_spec(dec, enc)
    assert isinstance(block, BlockMask)
    assert torch.equal(dense(block, 9, 12), cross_attention_mask(dec, enc))  # type: ignore[arg-type]
    one = torch.zeros(3, 9, dtype=torch.long)
    assert flex_cross_attention_spec(one, torch.zeros(3, 12, dtype=torch.long)) is None


def test_one_document_rows_keep_the_mask_free_path() -> None:
    one = torch.zeros(2, 6, dtype=torch.long)
    assert flex_attention_spec(one, "causal") == (None, True)
    assert flex_attention_spec(one, "bidirectional") == (None, False)
    mask, is_causal = flex_attention_spec(torch.tensor([[0, 0, 1, 1, 1, -1]] * 2), "causal")
    assert isinstance(mask, BlockMask) and not is_causal


CASES = [
    ("decoder", "causal", {}),
    ("decoder", "prefix", {}),
    ("decoder", "causal", {"n_head": 4, "n_kv_head": 2}),  # grouped-query attention
    ("encoder", "bidirectional", {}),
    ("encoder", "prefix", {}),
    ("encdec", "bidirectional", {}),  # encoder self, decoder causal and cross attention
]


@pytest.mark.parametrize(("kind", "attention", "overrides"), CASES)
def test_flex_forward_equals_masked_sdpa(kind: str, attention: str, overrides: dict[str, int]) -> None:
    batch = make_batch(
        PACKED, attention, prefix_len=3, decoder_doc_rows=DECODER_SIDE if kind == "encdec" else None
    )
    sdpa = tiny_model(kind, attention_kernel="sdpa", **overrides)
    flex = tiny_model(kind, attention_kernel="flex", **overrides)
    with torch.no_grad():
        ctx = flex.trunk(batch).ctx
        assert isinstance(ctx.mask, BlockMask)
        assert kind != "encdec" or isinstance(ctx.cross_mask, BlockMask)
        want, got = sdpa(batch).logits, flex(batch).logits
    assert (got - want).abs().max() <= 1e-5


def test_flex_attend_equals_sdpa_compiled_too() -> None:
    """The kernel itself on a two-document causal row with grouped-query heads, eager and compiled."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 16, 8, generator=g) for h in (4, 2, 2))
    docs = torch.tensor([docs_row([6, 10], 16), docs_row([9, 5], 16)])
    want = attend(q, k, v, self_attention_mask(docs, "causal"), False)
    block = self_attention_block_mask(docs, "causal")
    with torch.no_grad():
        assert (flex_attend(q, k, v, block) - want).abs().max() <= 1e-5
        torch._dynamo.reset()
        compiled = torch.compile(flex_attend, fullgraph=True)
        assert (compiled(q, k, v, block) - want).abs().max() <= 1e-5


def test_flex_model_traces_as_one_graph() -> None:
    """Block masks are built inside a compiled forward without a graph break (the CUDA training path)."""
    batch = make_batch(PACKED, "causal").mark_layout()
    model = tiny_model("decoder", attention_kernel="flex")
    with torch.no_grad():
        want = model(batch).logits
        torch._dynamo.reset()
        traced = torch.compile(model, backend="eager", fullgraph=True)
        assert torch.allclose(traced(batch).logits, want, atol=1e-5)


def test_cpu_training_never_takes_flex() -> None:
    batch = make_batch(PACKED, "causal")
    model = tiny_model("decoder").train()  # attention_kernel auto
    assert torch.is_grad_enabled()
    assert isinstance(model.trunk(batch).ctx.mask, torch.Tensor)
    with torch.no_grad():  # CPU inference too: auto means flex on CUDA only
        assert isinstance(model.trunk(batch).ctx.mask, torch.Tensor)
    assert not use_flex("auto", torch.device("cpu"))
    assert use_flex("auto", torch.device("cuda")) and not use_flex("sdpa", torch.device("cuda"))
    flex = tiny_model("decoder", attention_kernel="flex").train()
    with pytest.raises(UserError, match="cannot train on CPU"):
        flex(batch)


def test_the_kernel_is_checked_and_not_recorded() -> None:
    with pytest.raises(ValueError, match="attention_kernel"):
        ModelConfig(attention_kernel="fast")
    cfg = ModelConfig(vocab_size=97, attention_kernel="flex")
    assert "attention_kernel" not in config_to_dict(cfg)


def test_block_mask_is_built_once_per_batch() -> None:
    batch = make_batch(PACKED, "causal")
    first = self_attention_block_mask(batch.document_ids, "causal")
    assert self_attention_block_mask(batch.document_ids, "causal") is first  # a second forward reuses it
    assert self_attention_block_mask(batch.document_ids, "bidirectional") is not first
    batch.document_ids[0, :3] = 5  # changed in place: built again, to the new ids
    again = self_attention_block_mask(batch.document_ids, "causal")
    assert again is not first
    assert torch.equal(dense(again, 12, 12), self_attention_mask(batch.document_ids, "causal"))
