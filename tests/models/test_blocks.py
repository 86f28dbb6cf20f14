"""The shared blocks: RMSNorm's hand-written backward, rotary embedding properties, the compiled paths of
self-attention (half-split rotation) and of the embedding (ATen's backward) against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from objtrain.models.blocks import (
    Embedding,
    RMSNorm,
    Rotary,
    SelfAttention,
    _RMSNormFunction,
    apply_rope,
    rotate_half_split,
)


def test_rmsnorm_matches_reference_and_gradcheck() -> None:
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.empty(16, dtype=torch.float64).uniform_(0.5, 1.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, w: _RMSNormFunction.apply(a, w, 1e-6), (x, weight))
    norm = RMSNorm(16).double()
    norm.weight.data.copy_(weight.data)
    assert torch.allclose(norm(x), F.rms_norm(x, (16,), weight, 1e-6))
    with torch.no_grad():  # inference takes the one-kernel path: the same values
        assert torch.allclose(norm(x), _RMSNormFunction.apply(x, weight, 1e-6))


def test_rope_fast_and_real_forms_agree_and_depend_on_relative_position() -> None:
    rotary = Rotary(8)
    x = torch.randn(2, 6, 3, 8)
    positions = torch.arange(6).expand(2, 6)
    cos, sin = rotary(positions)
    fast = apply_rope(x, cos, sin)  # fp32 eager: complex form
    real = apply_rope(x.double(), cos.double(), sin.double())  # other dtypes: real form
    assert torch.allclose(fast.double(), real, atol=1e-5)
    assert torch.allclose(fast[:, 0], x[:, 0])  # position 0 is not rotated
    # q.k depends only on the distance: shift every position by 5 and the scores stay the same
    q, k = torch.randn(1, 6, 1, 8), torch.randn(1, 6, 1, 8)
    scores = []
    for shift in (0, 5):
        c, s = rotary(positions[:1] + shift)
        scores.append(torch.einsum("bthk,bshk->bts", apply_rope(q, c, s), apply_rope(k, c, s)))
    assert torch.allclose(scores[0], scores[1], atol=1e-4)


def test_half_split_rotation_is_the_interleaved_one_on_deinterleaved_channels() -> None:
    cos, sin = Rotary(8)(torch.arange(6).expand(2, 6))
    x = torch.randn(2, 6, 3, 8, dtype=torch.float64)
    half = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)  # channels 0, 2, 4, 6, 1, 3, 5, 7
    assert torch.allclose(
        rotate_half_split(half, cos, sin),
        torch.cat((apply_rope(x, cos, sin)[..., 0::2], apply_rope(x, cos, sin)[..., 1::2]), dim=-1),
    )


@pytest.mark.parametrize("n_kv_head", [0, 1])  # multi-head; grouped (one key/value head for two)
@pytest.mark.parametrize("is_causal", [True, False])
def test_compiled_self_attention_matches_eager_values_and_gradients(is_causal: bool, n_kv_head: int) -> None:
    """Compiled code rotates in the half-split layout over reordered weight rows: the same function and
    the same gradients (weights included, in their stored order) as the eager interleaved path."""
    torch.manual_seed(0)
    attn = SelfAttention(32, 2, n_kv_head=n_kv_head).double()
    cos, sin = Rotary(16)(torch.arange(7).expand(3, 7))
    x = torch.randn(3, 7, 32, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(3, 7, 32, dtype=torch.float64)

    def run(fn: object) -> tuple[torch.Tensor, ...]:
        x.grad, attn.qkv.weight.grad, attn.proj.weight.grad = None, None, None
        out = fn(x, cos.double(), sin.double(), None, is_causal)  # type: ignore[operator]
        out.backward(grad)
        return out.detach(), x.grad.clone(), attn.qkv.weight.grad.clone(), attn.proj.weight.grad.clone()

    eager = run(attn)
    torch._dynamo.reset()
    compiled = run(torch.compile(attn, backend="aot_eager", fullgraph=True))
    for a, b in zip(eager, compiled, strict=True):
        assert torch.allclose(a, b, atol=1e-10)
    assert attn._half_split_weight().shape == attn.qkv.weight.shape


def test_embedding_gradient_is_atens_in_eager_and_compiled_code() -> None:
    torch.manual_seed(0)
    table = Embedding(50, 8)
    ids = torch.randint(0, 50, (3, 20))  # repeats: the gradient must sum them
    grad = torch.randn(3, 20, 8)
    F.embedding(ids, table.weight).backward(grad)
    expected, table.weight.grad = table.weight.grad.clone(), None
    table(ids).backward(grad)
    assert torch.equal(table.weight.grad, expected)
    for backend in ("aot_eager", "inductor"):
        table.weight.grad = None
        torch._dynamo.reset()
        torch.compile(table, backend=backend, fullgraph=True)(ids).backward(grad)
        assert torch.allclose(table.weight.grad, expected, atol=1e-6)
    with torch.no_grad():
        assert torch.equal(table(ids), F.embedding(ids, table.weight))
