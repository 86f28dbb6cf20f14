"""Attention masks from the batch's attention pattern (see the `objtrain.batch` docstring).

The rule, for query i and key j of one row: `doc[i] == doc[j]` and
- causal:        j <= i
- bidirectional: always
- prefix:        j <= i, or both i and j are in the document's prefix (`prefix_mask`)

Padding has document id -1, so pads see only pads: no softmax row is ever empty. When every row holds
exactly one document and no padding, the mask is dropped and SDPA's own causal / full path is used
(`is_causal=True` or no mask), which is the common case for plain CLM on unpacked rows.

The fast-path test reads tensor values. The loader makes it once per batch (`Batch.mark_layout`), so a
compiled forward sees a Python bool and traces as one graph; a batch without the flag is checked here.

Where a mask is needed, it is either the dense boolean mask above (SDPA: on a GPU its fast flash kernel
refuses any mask, so packed rows fall to slower kernels that still compute every tile), or a FlexAttention
`BlockMask` with the same rule as a `mask_mod` (its kernel skips the tiles no query may see). The model's
`attention_kernel` picks: `sdpa` the dense mask; `flex` a BlockMask; `auto` a BlockMask on CUDA only
(rows that need no mask keep SDPA's mask-free path under all three). FlexAttention has no CPU backward
(torch 2.13 refuses gradients on CPU), so CPU training always takes the dense mask, and its numbers stay
those of before. Both kinds of mask are built once per forward and shared by every layer.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Literal

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from objtrain.batch import AttentionKind, single_document_rows
from objtrain.errors import UserError

AttentionKernel = Literal["auto", "sdpa", "flex"]
ATTENTION_KERNELS: tuple[AttentionKernel, ...] = ("auto", "sdpa", "flex")
Mask = Tensor | BlockMask  # dense (B, 1, T, S) bool, True = may attend; or a FlexAttention block mask


def self_attention_mask(
    document_ids: Tensor, attention: AttentionKind, prefix_mask: Tensor | None = None
) -> Tensor:
    """document_ids (B, T) -> allowed (B, 1, T, T) bool, True where query i may attend to key j."""
    T = document_ids.size(1)
    allowed = document_ids[:, :, None] == document_ids[:, None, :]  # (B, T, T) same document
    if attention != "bidirectional":
        causal = torch.ones(T, T, dtype=torch.bool, device=document_ids.device).tril()
        if attention == "prefix":
            if prefix_mask is None:
                raise ValueError("prefix attention needs batch.prefix_mask")
            causal = causal | (prefix_mask[:, :, None] & prefix_mask[:, None, :])  # (B, T, T)
        allowed = allowed & causal
    return allowed[:, None]


def self_attention_spec(
    document_ids: Tensor,
    attention: AttentionKind,
    prefix_mask: Tensor | None = None,
    single_document: bool | None = None,
) -> tuple[Tensor | None, bool]:
    """(mask or None, is_causal) for `attend`: no mask on the one-document-per-row fast path.
    `single_document` is `Batch.single_document` when known (then no tensor value is read here)."""
    if _needs_mask(document_ids, attention, single_document):
        return self_attention_mask(document_ids, attention, prefix_mask), False
    return None, attention == "causal"


def flex_attention_spec(
    document_ids: Tensor,
    attention: AttentionKind,
    prefix_mask: Tensor | None = None,
    single_document: bool | None = None,
) -> tuple[BlockMask | None, bool]:
    """As `self_attention_spec`, with the mask as a FlexAttention BlockMask."""
    if _needs_mask(document_ids, attention, single_document):
        return self_attention_block_mask(document_ids, attention, prefix_mask), False
    return None, attention == "causal"


def _needs_mask(document_ids: Tensor, attention: AttentionKind, single_document: bool | None) -> bool:
    if attention == "prefix":
        return True
    if single_document is None:
        single_document = single_document_rows(document_ids)
    return not single_document


def cross_attention_mask(
    decoder_document_ids: Tensor, encoder_document_ids: Tensor, single_documents: bool | None = None
) -> Tensor | None:
    """(B, S) decoder x (B, T) encoder document ids -> allowed (B, 1, S, T) bool, or None if all may see all.

    Decoder position s sees encoder positions of its own document. A decoder position whose document has
    no encoder tokens (only possible for padding) sees every encoder position instead of none, so its
    softmax row is not empty; no real position ever reads a padded decoder position's output. So when both
    sides' rows are one document each (`single_documents`, from `Batch.mark_layout` when known), every
    decoder position sees all of its row's encoder positions, whatever the ids: no mask.
    """
    if _both_single(decoder_document_ids, encoder_document_ids, single_documents):
        return None
    allowed = decoder_document_ids[:, :, None] == encoder_document_ids[:, None, :]  # (B, S, T)
    allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
    return allowed[:, None]


def flex_cross_attention_spec(
    decoder_document_ids: Tensor, encoder_document_ids: Tensor, single_documents: bool | None = None
) -> BlockMask | None:
    """As `cross_attention_mask`, with the mask as a FlexAttention BlockMask."""
    if _both_single(decoder_document_ids, encoder_document_ids, single_documents):
        return None
    return cross_attention_block_mask(decoder_document_ids, encoder_document_ids)


def _both_single(decoder_ids: Tensor, encoder_ids: Tensor, single_documents: bool | None) -> bool:
    if single_documents is None:
        return single_document_rows(decoder_ids) and single_document_rows(encoder_ids)
    return single_documents


def causal_chunk_mask(n_new: int, n_total: int, device: torch.device) -> Tensor | None:
    """Mask for `n_new` queries appended after `n_total - n_new` cached keys (one document): (1, 1, n, S).

    A single new query sees every cached key, so it needs no mask.
    """
    if n_new == 1:
        return None
    q = torch.arange(n_total - n_new, n_total, device=device)[:, None]
    k = torch.arange(n_total, device=device)[None, :]
    return (k <= q)[None, None]


# --- FlexAttention ------------------------------------------------------------------------------------


FLEX_ON_CPU = (
    "attention_kernel flex cannot train on CPU (FlexAttention has no CPU backward): use auto or sdpa there"
)


def use_flex(kernel: AttentionKernel, device: torch.device) -> bool:
    """Whether masks on `device` are FlexAttention block masks, for the model's `attention_kernel`.

    `auto` takes flex on CUDA only. On CPU, FlexAttention runs forward but refuses backward, so an
    explicit `flex` there is for inference (and tests) and is refused while gradients are on.
    """
    if kernel == "sdpa" or (kernel == "auto" and device.type != "cuda"):
        return False
    if device.type == "cpu" and torch.is_grad_enabled():
        raise UserError(FLEX_ON_CPU)
    return True


def _block_mask(mask_mod: Any, B: int, q_len: int, kv_len: int, device: torch.device) -> BlockMask:
    """`create_block_mask` with H=None (one mask for every head). On CUDA it runs compiled: eager, it
    materialises the dense B x Q x KV mask first (torchtitan keeps one compiled builder likewise)."""
    # inside a compiled forward the builder is traced into that graph: no compiled function is made there
    eager = device.type != "cuda" or torch.compiler.is_compiling()
    build = create_block_mask if eager else _compiled_create_block_mask()
    return build(mask_mod, B, None, q_len, kv_len, device=device)


def self_attention_block_mask(
    document_ids: Tensor, attention: AttentionKind, prefix_mask: Tensor | None = None
) -> BlockMask:
    """`self_attention_mask`'s rule as a FlexAttention BlockMask over (B, T) document ids."""
    docs = document_ids
    B, T = docs.shape
    if attention == "bidirectional":

        def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            return docs[b, q] == docs[b, kv]

    elif attention == "causal":

        def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            return (docs[b, q] == docs[b, kv]) & (kv <= q)

    else:
        if prefix_mask is None:
            raise ValueError("prefix attention needs batch.prefix_mask")
        pre = prefix_mask

        def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            return (docs[b, q] == docs[b, kv]) & ((kv <= q) | (pre[b, q] & pre[b, kv]))

    return _cached(
        ("self", attention), (docs, prefix_mask), lambda: _block_mask(mask_mod, B, T, T, docs.device)
    )


def cross_attention_block_mask(decoder_document_ids: Tensor, encoder_document_ids: Tensor) -> BlockMask:
    """`cross_attention_mask`'s rule as a BlockMask: (B, S) decoder queries over (B, T) encoder keys."""
    dec, enc = decoder_document_ids, encoder_document_ids

    def build() -> BlockMask:
        # a decoder position whose document has no encoder tokens sees all of them (no empty softmax row)
        no_memory = ~(dec[:, :, None] == enc[:, None, :]).any(dim=-1)  # (B, S)

        def mask_mod(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
            return (dec[b, q] == enc[b, kv]) | no_memory[b, q]

        return _block_mask(mask_mod, dec.size(0), dec.size(1), enc.size(1), dec.device)

    return _cached(("cross",), (dec, enc), build)


_compiled_builder: Any = None


def _compiled_create_block_mask() -> Any:
    global _compiled_builder
    if _compiled_builder is None:
        _compiled_builder = torch.compile(create_block_mask)
    return _compiled_builder


_compiled_flex: Any = None


def flex_attend(q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask) -> Tensor:
    """FlexAttention (B, H, T, K) x (B, G, S, K) -> (B, H, T, K) under a BlockMask.

    Eager, flex_attention materialises the score matrix (slower than SDPA); on CUDA it runs through one
    module-level compiled function (inside a compiled region it is traced into that graph instead). On CPU
    (inference and tests) it runs eager, its warning about that silenced.
    """
    global _compiled_flex
    gqa = k.size(1) != q.size(1)
    if torch.compiler.is_compiling():
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)  # type: ignore[return-value]
    if q.device.type == "cuda":
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        return _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=gqa)  # type: ignore[no-any-return]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)  # type: ignore[return-value]


# One block mask kept per kind: a batch forwarded again (the trunk and heads of MTP's split backward, a
# second pass over the same validation batch) reuses it instead of building it again. The key holds weak
# references to the id tensors and their versions, so an in-place change or a new batch misses.
_BLOCK_MASKS: dict[tuple[str, ...], tuple[tuple[Any, ...], BlockMask]] = {}


def _cached(kind: tuple[str, ...], tensors: tuple[Tensor | None, ...], build: Any) -> BlockMask:
    if torch.compiler.is_compiling():
        return build()  # type: ignore[no-any-return]
    key = tuple((weakref.ref(t), t._version) if t is not None else None for t in tensors)
    hit = _BLOCK_MASKS.get(kind)
    if hit is not None and _same_key(hit[0], tensors):
        return hit[1]
    mask = build()
    _BLOCK_MASKS[kind] = (key, mask)
    return mask  # type: ignore[no-any-return]


def _same_key(key: tuple[Any, ...], tensors: tuple[Tensor | None, ...]) -> bool:
    for entry, t in zip(key, tensors, strict=True):
        if (entry is None) != (t is None):
            return False
        if entry is not None and (entry[0]() is not t or entry[1] != t._version):  # type: ignore[union-attr]
            return False
    return True
