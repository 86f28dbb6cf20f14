"""Shared transformer blocks: RMSNorm, RoPE, SwiGLU, self/cross attention, and the pre-norm block.

Every model kind (decoder, encoder, encoder-decoder) is a stack of `Block`s; the only differences are
the mask each block receives and whether it cross-attends. Attention always goes through
`attend` (`F.scaled_dot_product_attention`), so there is exactly one attention implementation.

Shapes: B batch, T query positions, S key positions, D model width, H heads, K head width (D = H*K),
G key/value heads (grouped-query attention: query head h reads key/value head h // (H/G); G = H is plain
multi-head attention).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask

from objtrain.models.attention import Mask, flex_attend


class _RMSNormFunction(torch.autograd.Function):
    """Eager RMSNorm with a hand-written backward: about half the kernels of autograd's decomposition
    of `F.rms_norm`, which on CPU is a chain of small elementwise ops."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1)
        x_hat = x * rstd
        ctx.save_for_backward(x_hat, rstd, weight)
        return x_hat * weight

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        x_hat, rstd, weight = ctx.saved_tensors
        grad_weight = (grad * x_hat).flatten(0, -2).sum(0)
        g = grad * weight
        grad_x = (g - x_hat * (g * x_hat).mean(-1, keepdim=True)) * rstd
        return grad_x, grad_weight, None


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain (Zhang & Sennrich 2019; Llama)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        needs_grad = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)
        if not needs_grad or torch.compiler.is_compiling() or x.dtype != self.weight.dtype:
            # inductor fuses this one, and without autograd it is one kernel (~40% faster in decoding)
            return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)
        return _RMSNormFunction.apply(x, self.weight, self.eps)


@torch.library.custom_op("objtrain::embedding_grad", mutates_args=())
def embedding_grad(grad: Tensor, ids: Tensor, num_weights: int) -> Tensor:
    """d(loss)/d(table) (num_weights, D) of a lookup: ATen's kernel, opaque to torch.compile."""
    return torch.ops.aten.embedding_dense_backward(grad.contiguous(), ids, num_weights, -1, False)


@embedding_grad.register_fake
def _(grad: Tensor, ids: Tensor, num_weights: int) -> Tensor:
    return grad.new_empty(num_weights, grad.size(-1))


class _EmbeddingLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, ids: Tensor, weight: Tensor) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.num_weights = weight.size(0)
        return F.embedding(ids, weight)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor]:
        (ids,) = ctx.saved_tensors
        return None, embedding_grad(grad, ids, ctx.num_weights)


class Embedding(nn.Embedding):
    """A token table whose gradient is ATen's embedding backward even inside torch.compile.

    Inductor's CPU code for that scatter adds with per-element atomics: 4-6x slower than ATen's kernel at
    our sizes (390 vs 97 us for 768 tokens of width 128; 1.2 vs 0.19 ms for 2048 tokens, V 4096), and the
    order of its sums depends on how the threads race."""

    def forward(self, ids: Tensor) -> Tensor:
        if torch.is_grad_enabled() and self.weight.requires_grad:
            return _EmbeddingLookup.apply(ids, self.weight)
        return F.embedding(ids, self.weight)


class Rotary(nn.Module):
    """Rotary position embedding (Su et al. 2021), driven by explicit per-token positions.

    Positions come from the batch and restart at 0 in every packed document, so a document's
    encoding never depends on where it landed in the row. Channels (2i, 2i+1) form a rotating pair
    (the interleaved layout of the RoFormer paper and Meta's Llama code).
    """

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (K/2,)

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions (B, T) int -> cos, sin (B, T, 1, K/2) float32, shared by every layer."""
        angles = positions[..., None].float() * self.inv_freq  # (B, T, K/2)
        return angles.cos()[:, :, None], angles.sin()[:, :, None]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, T, h, K) by cos/sin (B, T, 1, K/2); pairs are channels (2i, 2i+1).

    Eager fp32 uses one complex multiply (about 2.5x faster on CPU than the real form); compiled code and
    low precision use the real form, which inductor fuses into neighbouring kernels.
    """
    if x.dtype == torch.float32 and not torch.compiler.is_compiling():
        rotation = torch.complex(cos, sin)  # (B, T, 1, K/2)
        pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)))  # (B, T, h, K/2)
        return torch.view_as_real(pairs * rotation).flatten(-2)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)  # (B, T, h, K/2) each
    return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)


def rotate_half_split(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """`apply_rope` for channels laid out half-split: channel i pairs with channel i + K/2."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    first, second = x.chunk(2, dim=-1)  # (B, T, h, K/2) each
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Mask | None, is_causal: bool) -> Tensor:
    """(B, H, T, K) x (B, G, S, K) -> (B, H, T, K). `mask` (B, 1, T, S) bool, True = may attend, or the
    same rule as a FlexAttention BlockMask (see `objtrain.models.attention`).

    The single place attention is computed; tests swap it for a naive softmax to check equivalence.
    With fewer key/value heads than query heads (G < H), SDPA shares each among H/G query heads itself,
    so k and v are never copied out to H heads.
    """
    if isinstance(mask, BlockMask):
        return flex_attend(q, k, v, mask)
    causal = is_causal and mask is None
    if k.size(1) == q.size(1):  # the flag left off: multi-head attention takes exactly its old path
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)


class KVCache:
    """Keys and values of one attention layer for incremental decoding, preallocated to `max_len`.

    `length` is the number of valid positions; speculative decoding rolls back by lowering it, or keeps a
    draft tree's accepted path with `compact`.

    Static use (`objtrain.models.static`): with `slots` set to a (t,) index tensor, `append` writes the new
    keys/values there and returns the whole buffers, whose shapes never change; the caller's mask hides
    the positions not yet valid. No Python number tracks the length, so the step can be captured in a
    CUDA graph and replayed.
    """

    def __init__(self, batch: int, n_head: int, max_len: int, head_dim: int, like: Tensor) -> None:
        shape = (batch, n_head, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=like.dtype, device=like.device)
        self.v = torch.zeros(shape, dtype=like.dtype, device=like.device)
        self.length = 0
        self.slots: Tensor | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store (B, H, t, K) new keys/values; return all valid ones (B, H, length, K), or with `slots`
        set, store them at those positions and return all `max_len` positions."""
        if self.slots is not None:
            self.k.index_copy_(2, self.slots, k)
            self.v.index_copy_(2, self.slots, v)
            return self.k, self.v
        t = k.size(2)
        end = self.length + t
        if end > self.k.size(2):
            raise ValueError(f"KV cache overflow: {end} > {self.k.size(2)} positions")
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def compact(self, start: int, source: Tensor, keep: int) -> None:
        """Move the positions `source` (ascending, none below its target) to start, start + 1, ... and
        keep the first `keep` of them: a token tree's accepted path becomes contiguous after `start`."""
        end = start + source.numel()
        self.k[:, :, start:end] = self.k[:, :, source]  # the gather copies first, so overlap is safe
        self.v[:, :, start:end] = self.v[:, :, source]
        self.length = start + keep


class SelfAttention(nn.Module):
    """Rotary self-attention; q, k and v come from one fused projection, rows q (D) | k (G*K) | v (G*K)."""

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.0, n_kv_head: int = 0) -> None:
        super().__init__()
        self.n_head = n_head
        self.n_kv_head = n_kv_head or n_head
        kv_dim = self.n_kv_head * (d_model // n_head)
        self.qkv = nn.Linear(d_model, d_model + 2 * kv_dim, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Mask | None,
        is_causal: bool,
        cache: KVCache | None = None,
    ) -> Tensor:
        B, T, D = x.shape
        H, G = self.n_head, self.n_kv_head
        QK = D + G * (D // H)  # q and k channels, rotated together
        if cache is None and torch.compiler.is_compiling():
            # Compiled code rotates q and k in the half-split layout: it reads whole vectors, where the
            # interleaved pairs cost strided loads in every layer's forward and backward. Per head, the
            # weight rows of the even channels come first, then the odd ones; permuting q and k alike
            # leaves every score q.k unchanged, and v is not touched, so the layer computes the same
            # function (up to float rounding) with the same weights.
            qkv = F.linear(x, self._half_split_weight())  # (B, T, D + 2GK)
            qk = rotate_half_split(qkv[..., :QK].unflatten(-1, (H + G, -1)), cos, sin)
        else:
            qkv = self.qkv(x)  # (B, T, D + 2GK)
            qk = apply_rope(qkv[..., :QK].unflatten(-1, (H + G, -1)), cos, sin)  # (B, T, H+G, K), one call
        q, k = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2)  # (B, H, T, K), (B, G, T, K)
        v = qkv[..., QK:].unflatten(-1, (G, -1)).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, G, S, K): all positions so far
        y = attend(q, k, v, mask, is_causal)  # (B, H, T, K)
        return self.dropout(self.proj(y.transpose(1, 2).reshape(B, T, D)))

    def _half_split_weight(self) -> Tensor:
        """The qkv weight with each q and k head's rows as channels 0, 2, .., K-2, 1, 3, .., K-1."""
        w = self.qkv.weight
        H, G = self.n_head, self.n_kv_head
        QK = w.size(1) + G * (w.size(1) // H)
        qk = w[:QK].unflatten(0, (H + G, -1, 2)).transpose(1, 2).flatten(0, 2)  # (QK, D)
        return torch.cat((qk, w[QK:]))


class CrossAttention(nn.Module):
    """Decoder queries over encoder memory; no rotary (the two position axes are unrelated, as in T5)."""

    def __init__(self, d_model: int, n_head: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.n_head = n_head
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.kv = nn.Linear(d_model, 2 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, D) encoder output -> keys, values (B, H, S, K); computed once per generation."""
        B, S, D = memory.shape
        k, v = self.kv(memory).view(B, S, 2, self.n_head, D // self.n_head).permute(2, 0, 3, 1, 4)
        return k, v

    def forward(self, x: Tensor, kv: tuple[Tensor, Tensor], mask: Mask | None) -> Tensor:
        B, T, D = x.shape
        q = self.q(x).view(B, T, self.n_head, D // self.n_head).transpose(1, 2)  # (B, H, T, K)
        y = attend(q, kv[0], kv[1], mask, is_causal=False)
        return self.dropout(self.proj(y.transpose(1, 2).reshape(B, T, D)))


class SwiGLU(nn.Module):
    """FFN(x) = W2 (silu(W1 x) * W3 x) (Shazeer 2020), with W1 and W3 fused into one matmul."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.w13 = nn.Linear(d_model, 2 * d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)  # (B, T, F) each
        return self.dropout(self.w2(F.silu(gate) * up))


@dataclass
class Context:
    """Everything a block needs besides its input: rotary angles and masks, built once per forward.

    mask (B, 1, T, T) bool, a BlockMask, or None (then `is_causal` picks SDPA's causal or full fast path);
    cross_mask (B, 1, T, S) bool, a BlockMask, or None (every decoder position may see all of memory).
    """

    cos: Tensor
    sin: Tensor
    mask: Mask | None
    is_causal: bool
    cross_mask: Mask | None = None


class Block(nn.Module):
    """Pre-norm transformer layer: x + attn(norm(x)) [+ cross(norm(x), memory)] + ffn(norm(x))."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        d_ff: int,
        eps: float,
        dropout: float,
        cross: bool = False,
        n_kv_head: int = 0,
    ) -> None:
        super().__init__()
        self.norm1 = RMSNorm(d_model, eps)
        self.attn = SelfAttention(d_model, n_head, dropout, n_kv_head)
        self.norm_cross = RMSNorm(d_model, eps) if cross else None
        self.cross = CrossAttention(d_model, n_head, dropout) if cross else None
        self.norm2 = RMSNorm(d_model, eps)
        self.mlp = SwiGLU(d_model, d_ff, dropout)

    def forward(
        self,
        x: Tensor,  # (B, T, D)
        cos: Tensor,
        sin: Tensor,
        mask: Mask | None,
        is_causal: bool,
        memory: Tensor | None = None,  # (B, S, D) encoder output, cross-attention blocks only
        cross_mask: Mask | None = None,
        cache: KVCache | None = None,
        memory_kv: tuple[Tensor, Tensor] | None = None,  # precomputed from `memory` (generation)
    ) -> Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, mask, is_causal, cache)
        if self.cross is not None and self.norm_cross is not None:
            if memory_kv is None:
                assert memory is not None, "a cross-attention block needs encoder memory"
                memory_kv = self.cross.memory_kv(memory)
            x = x + self.cross(self.norm_cross(x), memory_kv, cross_mask)
        return x + self.mlp(self.norm2(x))

    def run(self, x: Tensor, ctx: Context, memory: Tensor | None = None) -> Tensor:
        """Training-time forward from a `Context`."""
        return self(x, ctx.cos, ctx.sin, ctx.mask, ctx.is_causal, memory, ctx.cross_mask)


class StackedBlocks:
    """Several pre-norm self-attention blocks that read the same input, run as one batch (inference only).

    Self-speculative decoding runs every MTP head on the trunk's output at each step. As n separate
    blocks that costs n blocks' worth of small kernels, which dominate decoding at small widths; here
    each matmul is one `bmm` over the n stacked weights and attention one SDPA call over n x B rows, so
    the n heads cost about one block. The weights are a snapshot taken at construction (build it for a
    generation, after training); the arithmetic is `Block.forward`'s, head by head.
    """

    def __init__(self, blocks: list[Block]) -> None:
        if any(b.cross is not None for b in blocks):
            raise ValueError("StackedBlocks takes self-attention blocks only")
        with torch.no_grad():
            self.norm1 = torch.stack([b.norm1.weight for b in blocks])[:, None]  # (n, 1, D)
            self.qkv = torch.stack([b.attn.qkv.weight.T for b in blocks])  # (n, D, D + 2GK)
            self.proj = torch.stack([b.attn.proj.weight.T for b in blocks])  # (n, D, D)
            self.norm2 = torch.stack([b.norm2.weight for b in blocks])[:, None]
            self.w13 = torch.stack([b.mlp.w13.weight.T for b in blocks])  # (n, D, 2F)
            self.w2 = torch.stack([b.mlp.w2.weight.T for b in blocks])  # (n, F, D)
        self.n = len(blocks)
        self.n_head, self.n_kv_head = blocks[0].attn.n_head, blocks[0].attn.n_kv_head
        self.eps = blocks[0].norm1.eps

    def refresh(self, blocks: list[Block]) -> None:
        """Take the blocks' current weights into the same tensors (a captured step reads them in place)."""
        with torch.no_grad():
            for dst, src in zip(self._weights(), StackedBlocks(blocks)._weights(), strict=True):
                dst.copy_(src)

    def _weights(self) -> tuple[Tensor, ...]:
        return self.norm1, self.qkv, self.proj, self.norm2, self.w13, self.w2

    def _norm(self, x: Tensor, weight: Tensor) -> Tensor:
        return F.rms_norm(x, (x.size(-1),), None, self.eps) * weight

    def __call__(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, cache: KVCache) -> Tensor:
        """x (B, t, D) -> (n, B, t, D); `cache` holds the n blocks as n x B rows (block-major)."""
        B, t, D = x.shape
        n, H, G = self.n, self.n_head, self.n_kv_head
        QK = D + G * (D // H)
        flat = x.reshape(1, B * t, D)
        qkv = torch.bmm(self._norm(flat, self.norm1), self.qkv).view(n, B, t, -1)
        # the angles (B, t, 1, K/2) broadcast over the n heads; then heads and rows share one axis
        qk = apply_rope(qkv[..., :QK].unflatten(-1, (H + G, -1)), cos, sin).flatten(0, 1)
        q, k = qk[:, :, :H].transpose(1, 2), qk[:, :, H:].transpose(1, 2)  # (nB, H, t, K), (nB, G, t, K)
        v = qkv[..., QK:].flatten(0, 1).unflatten(-1, (G, -1)).transpose(1, 2)
        k, v = cache.append(k, v)
        y = attend(q, k, v, mask, is_causal=False).transpose(1, 2).reshape(n, B * t, D)
        h = flat + torch.bmm(y, self.proj)  # (n, Bt, D)
        gate, up = torch.bmm(self._norm(h, self.norm2), self.w13).chunk(2, dim=-1)
        return (h + torch.bmm(F.silu(gate) * up, self.w2)).view(n, B, t, D)
