"""The shared blocks: RMSNorm's hand-written backward, rotary embedding properties."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from objtrain.models.blocks import RMSNorm, Rotary, _RMSNormFunction, apply_rope


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
