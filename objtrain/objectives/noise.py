"""Batched noise for the denoising objectives: mask makers, transforms and layout, as pure functions.

The shape follows seqio/T5 (`t5/data/preprocessors.py`): a *mask maker* decides which tokens are noise,
a *transform* turns (tokens, mask) into inputs or targets, and an objective is a short composition of
the two. Everything here works on a padded batch of documents ("segments", one per document of a packed
row) with per-segment lengths, so a batch of 64 rows is one set of tensor ops, never a per-token loop.

Worked example (T5's span corruption, Raffel et al. 2020), tokens `[a b c d e f]`, mask `[T T F F T F]`:
    noise_span_to_unique_sentinel  -> [S0 c d S1 f]
    nonnoise_span_to_sentinel      -> [a b S0 e S0]
    drop_noise_tokens              -> [c d f]
    drop_nonnoise_tokens           -> [a b e]
where `Sk` is `<extra_id_k>` = `specials.sentinel(k)`.

Rounding is round-half-to-even in float64 everywhere (torch.round and Python's round agree), so
`random_spans_helper` and the mask maker count exactly the same noise tokens and spans.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.errors import UserError
from objtrain.rng import RowRandom
from objtrain.specials import Specials

_INT64_MAX = (1 << 63) - 1
_DOC_STRIDE = 1 << 20  # segment key = global row * stride + document rank: rows never share keys


# --------------------------------------------------------------------------------------------------
# Length arithmetic (scalar, used to size rows)


def span_counts(length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """(n_noise, n_spans) for one document of `length` tokens, exactly as the mask maker counts them.

    Reference section 5 (t5 random_spans_noise_mask): L' = max(L, 2), n_noise = clamp(round(L'r), 1,
    L'-1), n_spans = max(1, round(n_noise / mu)). For L = 1 the mask is cropped back to one kept token.
    Unlike T5, n_spans is also capped at the kept-token count: every span needs a kept token before it,
    else T5 makes empty keep parts and realises fewer spans than it counted (e.g. L = 3, r = 0.5, mu = 1).
    """
    lp = max(length, 2)
    n_noise = min(max(round(lp * noise_density), 1), lp - 1)
    n_spans = min(max(1, round(n_noise / mean_noise_span_length)), lp - n_noise)
    if length < 2:
        return 0, 0
    return n_noise, n_spans


def span_output_lengths(length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """(inputs, targets) lengths of span corruption of one `length`-token document, EOS included."""
    if length == 0:
        return 0, 0
    n_noise, n_spans = span_counts(length, noise_density, mean_noise_span_length)
    return length - n_noise + n_spans + 1, n_noise + n_spans + 1


@lru_cache(maxsize=256)
def random_spans_helper(
    inputs_length: int,
    noise_density: float,
    mean_noise_span_length: float,
    extra_tokens_per_span_inputs: int = 1,
    extra_tokens_per_span_targets: int = 1,
) -> tuple[int, int]:
    """(raw tokens, targets length) so that span corruption fills `inputs_length` exactly.

    Reference section 5 (t5 random_spans_helper): the largest raw length T with
    n_keep(T) + n_spans(T) + 1 <= inputs_length; then targets = n_noise + n_spans + 1, and for
    noise_density 0.5 both are decremented when targets would be longer than inputs. The counts here
    are clamped as the mask maker clamps them (T5's helper does not clamp; they differ only below ~8
    tokens), so a single-document row of T raw tokens gives exactly the predicted lengths.
    """
    if inputs_length < 2:
        raise UserError(f"span corruption needs a model length of at least 2, got {inputs_length}")

    def lengths(tokens: int) -> tuple[int, int]:
        n_noise, n_spans = span_counts(tokens, noise_density, mean_noise_span_length)
        return (
            tokens - n_noise + n_spans * extra_tokens_per_span_inputs + 1,
            n_noise + n_spans * extra_tokens_per_span_targets + 1,
        )

    # lengths(T)[0] is non-decreasing in T, so bisect for the last T that fits
    lo, hi = 1, 1
    while lengths(hi)[0] <= inputs_length:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if lengths(mid)[0] <= inputs_length else (lo, mid)
    tokens_length = lo
    targets_length = lengths(tokens_length)[1]
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def largest_fitting(model_length: int, size: Callable[[int], int], start: int = 1) -> int:
    """The largest raw length T >= start with size(T) <= model_length, for a non-decreasing `size`
    (start - 1 when even `start` does not fit). Bisection: a few dozen calls, cached by the callers."""
    if size(start) > model_length:
        return start - 1
    lo, hi = start, start + 1
    while size(hi) <= model_length:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if size(mid) <= model_length else (lo, mid)
    return lo


def flat_nonzero(mask: Tensor) -> Tensor:
    """(K,) int64 flat indices of the True entries of a bool tensor, ascending. On CPU numpy's
    flatnonzero, 5-9x faster than torch.nonzero on a (64, 1000) mask."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy()).astype(np.int64, copy=False))
    return mask.reshape(-1).nonzero().squeeze(1)


# --------------------------------------------------------------------------------------------------
# Segments: the documents of a batch of packed rows, as one padded batch


@dataclass
class Segments:
    """Every document of a (B, L) batch of rows as a padded (N, W) batch, in (row, position) order."""

    tokens: Tensor  # (N, W) int64, padded with pad; (N, 0) when the caller reads the rows itself
    lengths: Tensor  # (N,) int64, >= 1
    row: Tensor  # (N,) int64: the batch row the document came from
    doc: Tensor  # (N,) int64: rank of the document inside its row (0, 1, ...)
    n_rows: int
    had_eos: Tensor | None = None  # (N,) bool: a trailing EOS was split off (see `split_documents`)
    extra: dict[str, Tensor] = field(default_factory=dict)  # (N,) per-document parameters (UL2)

    @property
    def n(self) -> int:
        return int(self.lengths.numel())

    @property
    def width(self) -> int:
        return int(self.tokens.size(1))

    def in_length(self, width: int | None = None) -> Tensor:
        """(N, width) bool: position < the segment's length."""
        w = self.width if width is None else width
        return torch.arange(w, device=self.lengths.device)[None, :] < self.lengths[:, None]

    def select(self, index: Tensor) -> Segments:
        """The segments `index` (ascending keeps the (row, document) order), trimmed to their width."""
        width = max(int(self.lengths[index].max()) if index.numel() else 0, 1)
        return Segments(
            self.tokens[:, :width].index_select(0, index),
            self.lengths[index],
            self.row[index],
            self.doc[index],
            self.n_rows,
            None if self.had_eos is None else self.had_eos[index],
            {key: value[index] for key, value in self.extra.items()},
        )

    def random(self, seed: int, row_index: Tensor) -> RowRandom:
        """Randomness keyed on (seed, global row, document rank): a document's noise does not depend on
        the batch it is read in."""
        return document_random(seed, row_index, self.row, self.doc)


def document_random(seed: int, row_index: Tensor, row: Tensor, doc: Tensor) -> RowRandom:
    """`Segments.random` of the documents (row, doc) (N,): keyed on (seed, global row, document rank)."""
    return RowRandom(seed, row_index[row] * _DOC_STRIDE + doc)


def split_documents(
    rows: Tensor, document_ids: Tensor, pad_id: int = 0, eos_id: int | None = None
) -> Segments:
    """Cut rows (B, L) into their documents: a new document starts where the id changes; -1 is padding.

    With `eos_id`, a document's trailing EOS (packed stores end every document with one; a document cut
    by the row end has none) is split off: it is never noised and the objective appends the EOS itself,
    so a document ends with exactly one EOS either way.
    """
    return split_documents_at(rows, document_ids, pad_id, eos_id)[0]


def split_documents_at(
    rows: Tensor,
    document_ids: Tensor,
    pad_id: int = 0,
    eos_id: int | None = None,
    with_tokens: bool = True,
) -> tuple[Segments, Tensor]:
    """`split_documents`, and the (N,) start of every document in the flattened rows (row * L + column),
    which callers would otherwise find again. Without `with_tokens` the segments' tokens are (N, 0), for
    callers that read each document from the rows at its start (no padded copy)."""
    B, L = rows.shape
    device = rows.device
    change = document_ids[:, 1:] != document_ids[:, :-1]  # (B, L-1): a document ends / starts here
    if B and L and not bool(change.any()) and bool((document_ids[:, 0] >= 0).all()) and with_tokens:
        return _one_document_per_row(rows, pad_id, eos_id), torch.arange(B, device=device) * L
    valid = document_ids >= 0
    starts = valid.clone()
    starts[:, 1:] &= change
    flat_starts = flat_nonzero(starts)  # (N,)
    n = int(flat_starts.numel())
    if n == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        flags = torch.zeros(0, dtype=torch.bool, device=device)
        seg = Segments(torch.zeros(0, 0, dtype=torch.int64, device=device), empty, empty, empty, B, flags)
        return seg, empty
    ends = valid
    ends[:, :-1] &= change
    flat_ends = flat_nonzero(ends)
    lengths = flat_ends - flat_starts + 1
    had_eos = torch.zeros(n, dtype=torch.bool, device=device)
    if eos_id is not None:  # decided before gathering, so the tokens are masked once
        had_eos = rows.reshape(-1)[flat_ends] == eos_id
        full_lengths, lengths = lengths, lengths - had_eos.long()
    else:
        full_lengths = lengths
    if not with_tokens:
        tokens = rows.new_zeros(n, 0)
    elif eos_id is None and n == B and bool((lengths == L).all()):  # one whole document per row
        tokens = rows
    else:
        # windows of the flat rows at every start (a strided view, then one row gather: ~3x cheaper than a
        # gather of n * width single elements); what runs past a document is masked to pad below
        width = int(full_lengths.max())
        j = torch.arange(width, device=device)
        flat = torch.nn.functional.pad(rows.reshape(-1), (0, width))
        tokens = flat.unfold(0, width, 1).index_select(0, flat_starts)
        tokens.masked_fill_(j[None, :] >= lengths[:, None], pad_id)
    row = torch.div(flat_starts, L, rounding_mode="floor")
    per_row = starts.sum(1)
    doc = torch.arange(n, device=device) - (per_row.cumsum(0) - per_row)[row]
    return Segments(tokens, lengths, row, doc, B, had_eos), flat_starts


def _one_document_per_row(rows: Tensor, pad_id: int, eos_id: int | None) -> Segments:
    """`split_documents` for rows that are each one whole document (no padding): no gathers."""
    B, L = rows.shape
    arange = torch.arange(B, device=rows.device)
    lengths = torch.full((B,), L, dtype=torch.int64, device=rows.device)
    had_eos = torch.zeros(B, dtype=torch.bool, device=rows.device)
    tokens = rows
    if eos_id is not None:
        had_eos = rows[:, -1] == eos_id
        if bool(had_eos.any()):
            lengths = lengths - had_eos.long()
            tokens = rows.clone()
            tokens[:, -1] = torch.where(had_eos, pad_id, rows[:, -1])
    return Segments(tokens, lengths, arange, torch.zeros_like(arange), B, had_eos)


_GROUP_COST = 32_768  # fixed cost of one more group of tensor ops, in padded cells (measured on CPU)


def by_length(
    seg: Segments, make: Callable[[Segments], tuple[Pieces, dict[str, float]]], pad: int = 0
) -> tuple[Pieces, dict[str, float]]:
    """Apply `make` to groups of segments of similar length, so a row of many short documents is not
    padded to its batch's longest document; pieces come back merged in (row, document) order and stats
    summed. A segment's result does not depend on its group.

    Lengths are binned by powers of two; contiguous bins are then joined to minimise padded cells plus
    a fixed per-group cost (a small dynamic programme over at most ~12 bins), so batches of similar
    lengths stay one group.
    """
    if seg.n == 0:
        return make(seg)
    groups = length_groups(seg.lengths.cpu().numpy())
    if len(groups) == 1:
        return make(seg)
    parts, stats = [], {}
    for group in groups:
        idx = torch.from_numpy(group).to(seg.lengths.device)
        pieces, part = make(seg.select(idx))  # trimmed to the group's widest segment
        parts.append(pieces)
        for key, value in part.items():
            stats[key] = stats.get(key, 0.0) + value
    return Pieces.merge(parts, pad), stats


def length_groups(lengths: np.ndarray) -> list[np.ndarray]:
    """`by_length`'s groups of (N,) lengths: ascending index arrays, shortest lengths first (one group
    holding everything when splitting would not pay). numpy: a handful of ops on (N,) values."""
    binned = np.frexp(np.maximum(lengths, 16) - 1)[1]  # ceil(log2(length)), exactly
    bins, which = np.unique(binned, return_inverse=True)  # ascending
    if bins.size <= 1:
        return [np.arange(lengths.size)]
    counts = np.bincount(which).tolist()
    widest = np.zeros(bins.size, dtype=np.int64)
    np.maximum.at(widest, which, lengths)
    widest = widest.tolist()
    n = len(counts)
    best = [0.0] + [float("inf")] * n  # best[i]: cost of bins[:i]; a group covers bins[j:i]
    cut = [0] * (n + 1)
    for i in range(1, n + 1):
        for j in range(i):
            cost = best[j] + _GROUP_COST + sum(counts[j:i]) * widest[i - 1]
            if cost < best[i]:
                best[i], cut[i] = cost, j
    bounds, i = [], n
    while i > 0:
        bounds.append((cut[i], i))
        i = cut[i]
    if len(bounds) == 1:
        return [np.arange(lengths.size)]
    return [np.flatnonzero((which >= j) & (which <= i - 1)) for j, i in reversed(bounds)]


# --------------------------------------------------------------------------------------------------
# Mask makers: (lengths (N,), width) -> (N, width) bool noise mask, False beyond each length


def as_numpy(value: float | Tensor) -> float | np.ndarray:
    return value.cpu().numpy() if isinstance(value, Tensor) else value


def span_counts_np(
    lengths: np.ndarray, noise_density: float | np.ndarray, mean_span: float | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """span_counts over (N,) int64 lengths; density and mean span may be (N,) float64 arrays (UL2).
    numpy: a dozen ops on ~100 values, where each torch op costs more than its work."""
    lp = np.maximum(lengths, 2)
    n_noise = np.minimum(
        np.maximum(np.round(lp.astype(np.float64) * noise_density).astype(np.int64), 1), lp - 1
    )
    n_spans = np.minimum(
        np.maximum(np.round(n_noise.astype(np.float64) / mean_span).astype(np.int64), 1), lp - n_noise
    )
    return n_noise, n_spans


def _span_counts_batched(
    lengths: Tensor, noise_density: float | Tensor, mean_span: float | Tensor
) -> tuple[Tensor, Tensor]:
    """`span_counts_np` on tensors: density and mean span may be (N,) float64 tensors (UL2)."""
    n_noise, n_spans = span_counts_np(lengths.cpu().numpy(), as_numpy(noise_density), as_numpy(mean_span))
    return torch.from_numpy(n_noise).to(lengths.device), torch.from_numpy(n_spans).to(lengths.device)


def sort_keys(rr: RowRandom, n: int, stream: str) -> Tensor:
    """(N, n) distinct int64 sort keys: 32 random bits above the position, two keys per 64-bit draw
    (half the hashing of `RowRandom.permutation_keys`); ties of the 32 bits break by position."""
    half = (n + 1) // 2
    bits = rr.bits(half, stream)
    high = (bits >> 32) & 0xFFFFFFFF
    low = bits & 0xFFFFFFFF
    keys = torch.stack([high, low], dim=2).reshape(bits.size(0), 2 * half)[:, :n]  # key i: draw i // 2
    return (keys << 31) | torch.arange(n, device=bits.device)


def smallest(keys: Tensor, k: int) -> Tensor:
    """(N, k) int64 columns of the k smallest keys of every row, ascending by key: `torch.topk(keys, k,
    largest=False, sorted=True).indices`. Keys must be distinct except for ties no caller reads (the
    INT64_MAX that fills invalid columns). On CPU numpy's argpartition and a sort of the k picked:
    ~2x faster than topk and ~8x faster than torch's argsort on a (150, 570) grid."""
    W = keys.size(1)
    k = min(k, W)
    if keys.device.type != "cpu":
        return torch.topk(keys, k, dim=1, largest=False, sorted=True).indices
    kn = keys.numpy()
    if 0 < k < W:
        part = np.argpartition(kn, k - 1, axis=1)[:, :k]
        order = np.argsort(np.take_along_axis(kn, part, axis=1), axis=1)
        picked = np.take_along_axis(part, order, axis=1)
    else:
        picked = np.argsort(kn, axis=1)[:, :k]
    return torch.from_numpy(picked.astype(np.int64, copy=False))


def _segment_by_keys(keys: Tensor, n_items: Tensor, n_segments: Tensor) -> Tensor:
    """Core of `random_segmentation`: the n_segments-1 gaps with the smallest `keys` (invalid gaps
    hold INT64_MAX) become boundaries; returns the (M, K) part sizes. Valid keys are distinct and hold
    their gap index in their low 31 bits (`sort_keys`, `random_spans_noise_mask`)."""
    M = keys.size(0)
    device = keys.device
    k_max = max(int(n_segments.max()) if M else 1, 1)
    if k_max == 1:
        return n_items[:, None].clone()
    if keys.device.type == "cpu":
        # `smallest` from the key values: numpy's partition of values is ~2x cheaper than argpartition,
        # and the low bits give the gap back (INT64_MAX fills land only in unused columns)
        kn = keys.numpy()
        k = min(k_max - 1, kn.shape[1])
        low = np.partition(kn, k - 1, axis=1)[:, :k] if k < kn.shape[1] else kn
        low = np.sort(low, axis=1)[:, : k_max - 1]
        picked = torch.from_numpy(low & 0x7FFFFFFF)
    else:
        picked = smallest(keys, k_max - 1)
    used = torch.arange(k_max - 1, device=device)[None, :] < (n_segments - 1)[:, None]
    cuts = torch.where(used, picked + 1, n_items[:, None])  # item index starting a part, sorted below
    if cuts.device.type == "cpu":  # numpy's sort: ~5x faster than torch's on CPU; sorted values are unique
        cuts = torch.from_numpy(np.sort(cuts.numpy(), axis=1))
    else:
        cuts = cuts.sort(dim=1).values
    zero = torch.zeros(M, 1, dtype=torch.int64, device=device)
    bounds = torch.cat([zero, cuts, n_items[:, None]], dim=1)
    return bounds[:, 1:] - bounds[:, :-1]


def random_segmentation(n_items: Tensor, n_segments: Tensor, rr: RowRandom, stream: str) -> Tensor:
    """(N, K) sizes of a uniformly random split of n_items[i] items into n_segments[i] non-empty parts.

    As t5's `_random_segmentation`: choose n_segments-1 of the n_items-1 gaps between items as
    boundaries, here the gaps with the smallest random keys (a partial top-k, not a full sort), then
    take differences of the sorted boundaries. K = max(n_segments); parts past n_segments are empty.
    """
    gaps = max(int(n_items.max()) - 1 if n_items.numel() else 0, 0)
    j = torch.arange(gaps, device=n_items.device)[None, :]
    keys = sort_keys(rr, gaps, stream).masked_fill(j >= (n_items - 1)[:, None], _INT64_MAX)
    return _segment_by_keys(keys, n_items, n_segments)


def random_spans_noise_mask(
    lengths: Tensor,
    width: int,
    noise_density: float | Tensor,
    mean_noise_span_length: float | Tensor,
    rr: RowRandom,
    stream: str = "spans",
    random_roll: bool = False,
) -> Tensor:
    """(N, width) bool: T5 span noise, `keep1 noise1 keep2 noise2 ... keep_k noise_k`, cropped to L.

    Reference section 5 (t5 random_spans_noise_mask). Without roll the first token is kept and the last
    is noise; `random_roll` rotates each mask by a uniform offset (t5#905: short inputs are otherwise
    only corrupted at the tail). The spans are `random_span_ends`'.
    """
    N = lengths.numel()
    device = lengths.device
    if N == 0:
        return torch.zeros(0, width, dtype=torch.bool, device=device)
    span_ends = random_span_ends(lengths, noise_density, mean_noise_span_length, rr, stream)
    buf = max(width, 2) + 1
    marks = torch.zeros(N, buf, dtype=torch.int64, device=device).scatter_add_(
        1, span_ends.clamp(max=buf - 1), torch.ones_like(span_ends)
    )
    j = torch.arange(width, device=device)[None, :]
    mask = (marks.cumsum(1)[:, :width] & 1).bool() & (j < lengths[:, None])
    if random_roll:
        offset = roll_offsets(lengths, rr, stream)
        src = (j - offset) % lengths.clamp(min=1)[:, None]
        mask = mask.gather(1, src.clamp(max=width - 1)) & (j < lengths[:, None])
    return mask


def random_span_ends(
    lengths: Tensor,
    noise_density: float | Tensor,
    mean_noise_span_length: float | Tensor,
    rr: RowRandom,
    stream: str = "spans",
) -> Tensor:
    """(N, 2k - 1) int64 boundaries of `random_spans_noise_mask` before its roll, ascending: where
    keep 1, noise 1, keep 2, ... end; the mask is noise where an odd number of them lie at or before a
    position. Unused spans pile up at max(L, 2), past the document.

    The keep and noise segmentations share one draw per gap (its high and low 32 bits), each side's keys
    only as wide as its own longest count of items (noise is mostly the narrow side: 15% of a T5 document).
    """
    device = lengths.device
    lp = lengths.clamp(min=2)
    n_noise, n_spans = _span_counts_batched(lengths, noise_density, mean_noise_span_length)
    n_keep = lp - n_noise
    widths = [max(int(n.max()) - 1, 1) for n in (n_keep, n_noise)]
    bits = rr.bits(max(widths), stream)
    sizes = []
    # 31 random bits from each half of a draw, above the gap index: distinct keys, so top-k and argsort
    # pick the same gaps whatever the batch (built in place: fewer temporaries)
    for n_items, width, high in ((n_keep, widths[0], True), (n_noise, widths[1], False)):
        g = torch.arange(width, device=device)
        draws = bits[:, :width]
        keys = torch.bitwise_right_shift(draws, 33) if high else torch.bitwise_and(draws, 0x7FFFFFFF)
        keys.bitwise_left_shift_(31).add_(g)
        keys.masked_fill_(g[None, :] >= (n_items - 1)[:, None], _INT64_MAX)
        sizes.append(_segment_by_keys(keys, n_items, n_spans))
    k = sizes[0].size(1)
    interleaved = torch.stack(sizes, dim=2).reshape(lengths.numel(), 2 * k)
    return interleaved.cumsum(1)[:, :-1]


def roll_offsets(lengths: Tensor, rr: RowRandom, stream: str = "spans") -> Tensor:
    """(N, 1) int64 in [0, L): the rotation `random_spans_noise_mask` applies with `random_roll`."""
    return rr.integers(1, lengths.clamp(min=1), stream + "/roll")


def iid_noise_mask(
    lengths: Tensor, width: int, noise_density: float, rr: RowRandom, stream: str = "iid"
) -> Tensor:
    """(N, width) bool: every token is noise with probability `noise_density` (t5 iid_noise_mask)."""
    j = torch.arange(width, device=lengths.device)[None, :]
    return (rr.uniform64(width, stream) < noise_density) & (j < lengths[:, None])


def prefix_split(lengths: Tensor, noise_density: float, rr: RowRandom, stream: str = "prefix") -> Tensor:
    """(N,) prefix length n_in of each document; the rest is the target.

    r <= 0.5: t5 random_prefix_noise_mask (t5/data/preprocessors.py): max_in = L-1,
    min_in = min(max_in, max(1, round((1-2r)*max_in))), n_in ~ UniformInt[min_in, max_in]; r = 0.5 is a
    uniform split on [1, L-1] and the mean target fraction is r. r > 0.5 (which T5 rejects) follows
    llm-foundry: the target fraction is uniform on [2r-1, 1], here n_in ~ UniformInt[1, round((2-2r)*max_in)].
    A 1-token document has n_in = 0: all target.
    """
    max_in = (lengths - 1).clamp(min=0)
    if noise_density <= 0.5:
        lo = torch.minimum(max_in, torch.round((1 - 2 * noise_density) * max_in.double()).long().clamp(min=1))
        hi = max_in
    else:
        lo = torch.minimum(max_in, torch.ones_like(max_in))
        hi = torch.minimum(max_in, torch.round((2 - 2 * noise_density) * max_in.double()).long().clamp(min=1))
    return rr.integers(1, hi + 1, stream, low=lo)[:, 0]


def prefix_noise_mask(lengths: Tensor, width: int, n_in: Tensor) -> Tensor:
    """(N, width) bool: True on the target part [n_in, L)."""
    j = torch.arange(width, device=lengths.device)[None, :]
    return (j >= n_in[:, None]) & (j < lengths[:, None])


# --------------------------------------------------------------------------------------------------
# Transforms: (tokens (N, W), mask (N, W)) -> (out (N, W'), lengths (N,)); compaction by boolean masks


def compact(values: Tensor, keep: Tensor, fill: int) -> tuple[Tensor, Tensor]:
    """Move values[keep] to the front of each row, in order. Never by value: a literal `<pad>` (id 0)
    inside the text survives (transformers #15443)."""
    N, W = values.shape
    pos = torch.where(keep, keep.cumsum(1) - 1, W)
    out = torch.full((N, W + 1), fill, dtype=values.dtype, device=values.device)
    out.scatter_(1, pos, values)
    return out[:, :W], keep.sum(1)


def span_starts(mask: Tensor) -> Tensor:
    """(N, W) bool: first position of every maximal True run."""
    starts = mask.clone()
    starts[:, 1:] &= ~mask[:, :-1]
    return starts


def check_sentinels(n_spans: Tensor, specials: Specials, what: str) -> None:
    most = int(n_spans.max()) if n_spans.numel() else 0
    if most > specials.n_sentinels:
        raise UserError(
            f"{what} needs {most} sentinels for one document but the tokenizer reserves "
            f"{specials.n_sentinels}: raise the mean span length, lower the noise density or the length"
        )


def _inside(mask: Tensor, lengths: Tensor) -> Tensor:
    return torch.arange(mask.size(1), device=mask.device)[None, :] < lengths[:, None]


def noise_span_to_unique_sentinel(
    tokens: Tensor, mask: Tensor, lengths: Tensor, specials: Specials, what: str = "span corruption"
) -> tuple[Tensor, Tensor]:
    """Replace the k-th noise span by `<extra_id_k>` and drop the rest of the span (t5, same name)."""
    mask = mask & _inside(mask, lengths)
    starts = span_starts(mask)
    k = starts.cumsum(1) - 1
    check_sentinels(k[:, -1:] + 1, specials, what)
    values = torch.where(starts, specials.sentinel_ids(k), tokens)
    return compact(values, (~mask | starts) & _inside(mask, lengths), specials.pad)


def nonnoise_span_to_unique_sentinel(
    tokens: Tensor, mask: Tensor, lengths: Tensor, specials: Specials
) -> tuple[Tensor, Tensor]:
    """The complement of `noise_span_to_unique_sentinel` over each segment's own length."""
    return noise_span_to_unique_sentinel(tokens, ~mask, lengths, specials)


def noise_span_to_sentinel(
    tokens: Tensor, mask: Tensor, lengths: Tensor, sentinel: int, pad: int
) -> tuple[Tensor, Tensor]:
    """Replace every noise span by the same id `sentinel` (t5 noise_span_to_sentinel)."""
    inside = _inside(mask, lengths)
    mask = mask & inside
    starts = span_starts(mask)
    values = tokens.masked_fill(starts, sentinel)
    return compact(values, (~mask | starts) & inside, pad)


def nonnoise_span_to_sentinel(
    tokens: Tensor, mask: Tensor, lengths: Tensor, sentinel: int, pad: int
) -> tuple[Tensor, Tensor]:
    return noise_span_to_sentinel(tokens, ~mask, lengths, sentinel, pad)


def drop_noise_tokens(tokens: Tensor, mask: Tensor, lengths: Tensor, pad: int) -> tuple[Tensor, Tensor]:
    return compact(tokens, ~mask & _inside(mask, lengths), pad)


def drop_nonnoise_tokens(tokens: Tensor, mask: Tensor, lengths: Tensor, pad: int) -> tuple[Tensor, Tensor]:
    return compact(tokens, mask & _inside(mask, lengths), pad)


def sentinel_then_noise(tokens: Tensor, mask: Tensor, specials: Specials) -> tuple[Tensor, Tensor]:
    """Targets `S0 noise_1 S1 noise_2 ...`: every noise span preceded by its own sentinel.

    For an unrolled T5 mask (first token kept) this equals t5's `nonnoise_span_to_unique_sentinel`
    targets without the leading keep. For a rolled mask that *starts* with noise T5's numbering shifts
    by one between inputs and targets; here sentinel k always names the same span on both sides, so
    merge-back holds for every mask.
    """
    N, W = tokens.shape
    starts = span_starts(mask)
    n_starts = starts.cumsum(1)
    check_sentinels(n_starts[:, -1:], specials, "span corruption")
    pos = mask.cumsum(1) + n_starts - 1  # output position of each noise token
    out_w = 2 * W + 1
    out = torch.full((N, out_w), specials.pad, dtype=tokens.dtype, device=tokens.device)
    out.scatter_(1, torch.where(mask, pos, out_w - 1), tokens)
    out.scatter_(1, torch.where(starts, pos - 1, out_w - 1), specials.sentinel_ids(n_starts - 1))
    n = mask.sum(1) + starts.sum(1)
    out = out[:, : max(int(n.max()) if N else 0, 1)]
    return out, n


def span_inputs_targets(
    tokens: Tensor, mask: Tensor, lengths: Tensor, specials: Specials, mode_token: int | Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Both sides of span corruption in one pass (shared span starts and counts), EOS included:
    inputs `[mode] keep S0 keep S1 ... </s>` (`noise_span_to_unique_sentinel`) and targets
    `S0 noise S1 noise ... </s>` (`sentinel_then_noise`). Returns (inputs, n_in, targets, n_tgt)."""
    device = tokens.device
    if tokens.size(1) == 0:  # only empty documents (e.g. a lone EOS): one padding column to work on
        tokens = torch.full((tokens.size(0), 1), specials.pad, dtype=tokens.dtype, device=device)
        mask = torch.zeros(tokens.shape, dtype=torch.bool, device=device)
    N, W = tokens.shape
    inside = torch.arange(W, device=device)[None, :] < lengths[:, None]
    mask = mask & inside
    starts = span_starts(mask)
    n_starts = starts.cumsum(1)
    check_sentinels(n_starts[:, -1:], specials, "span corruption")
    sentinels = (specials.sentinel_base + 1) - n_starts  # <extra_id_k>, k = spans started so far - 1
    head = 0 if mode_token is None else 1
    keep = (~mask | starts) & inside
    kept = keep.cumsum(1)
    in_w = W + 2 + head
    inputs = torch.full((N, in_w), specials.pad, dtype=tokens.dtype, device=device)
    inputs.scatter_(1, torch.where(keep, kept + (head - 1), in_w - 1), torch.where(starts, sentinels, tokens))
    n_in = kept[:, -1] + head
    inputs.scatter_(1, n_in[:, None], specials.eos)
    if mode_token is not None:
        inputs[:, 0] = mode_token
    before = mask.cumsum(1).add_(n_starts)  # output position of each noise token, plus one
    # sized from the lengths (EOS at n_tgt, a spare column after it), not 2W + 2: a smaller fill
    top = int(before[:, -1].max()) + 1 if N else 1
    tgt_w = top + 1
    targets = torch.full((N, tgt_w), specials.pad, dtype=tokens.dtype, device=device)
    targets.scatter_(1, torch.where(starts, before - 2, tgt_w - 1), sentinels)
    pos = before.sub_(1)
    targets.scatter_(1, torch.where(mask, pos, tgt_w - 1), tokens)
    n_tgt = pos[:, -1] + 1
    targets.scatter_(1, n_tgt[:, None], specials.eos)
    return inputs[:, : in_w - 1], n_in + 1, targets[:, :top], n_tgt + 1


def append_token(seqs: Tensor, lengths: Tensor, token: int, fill: int = 0) -> tuple[Tensor, Tensor]:
    """Write `token` after the last real position of every row (EOS)."""
    N = seqs.size(0)
    out = torch.cat([seqs, torch.full((N, 1), fill, dtype=seqs.dtype, device=seqs.device)], dim=1)
    out.scatter_(1, lengths[:, None], torch.full((N, 1), token, dtype=seqs.dtype, device=seqs.device))
    return out, lengths + 1


def shift_within(seqs: Tensor, lengths: Tensor, shift: Tensor, fill: int) -> Tensor:
    """(N, W) take positions [shift, shift + lengths) of each row to the front (a per-row left shift)."""
    W = seqs.size(1)
    j = torch.arange(W, device=seqs.device)[None, :]
    src = (j + shift[:, None]).clamp(max=W - 1)
    return seqs.gather(1, src).masked_fill(j >= lengths[:, None], fill)


# --------------------------------------------------------------------------------------------------
# Layout: per-document (inputs, targets) -> a packed Batch for an encoder-decoder or a decoder


@dataclass
class Pieces:
    """Corrupted documents before layout: inputs and targets per segment (EOS already included)."""

    inputs: Tensor  # (N, Wi) int64
    input_lengths: Tensor  # (N,)
    targets: Tensor  # (N, Wt) int64
    target_lengths: Tensor  # (N,)
    row: Tensor  # (N,) batch row, non-decreasing
    doc: Tensor  # (N,) document rank inside the row
    counts: dict[str, Tensor] = field(default_factory=dict)  # (N,) per-piece stats (BART), summed later

    def select(self, index: Tensor) -> Pieces:
        """The pieces `index`, in that order."""
        return Pieces(
            self.inputs.index_select(0, index),
            self.input_lengths[index],
            self.targets.index_select(0, index),
            self.target_lengths[index],
            self.row[index],
            self.doc[index],
            {key: value[index] for key, value in self.counts.items()},
        )

    @staticmethod
    def merge(parts: list[Pieces], pad: int) -> Pieces:
        """Concatenate pieces built from disjoint row groups, back in (row, document) order."""
        row = torch.cat([p.row for p in parts])
        doc = torch.cat([p.doc for p in parts])
        order = torch.argsort(row * _DOC_STRIDE + doc)
        slot = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))

        def stack(fields: list[Tensor]) -> Tensor:
            """The fields right-padded to the widest and stacked in (row, document) order: one fill and one
            copy per part."""
            out = fields[0].new_full((order.numel(), max([f.size(1) for f in fields] + [1])), pad)
            lo = 0
            for f in fields:
                out[:, : f.size(1)].index_copy_(0, slot[lo : lo + f.size(0)], f)
                lo += f.size(0)
            return out

        return Pieces(
            stack([p.inputs for p in parts]),
            torch.cat([p.input_lengths for p in parts])[order],
            stack([p.targets for p in parts]),
            torch.cat([p.target_lengths for p in parts])[order],
            row[order],
            doc[order],
            {key: torch.cat([p.counts[key] for p in parts])[order] for key in parts[0].counts},
        )


def _offsets(row: Tensor, lengths: Tensor, n_rows: int) -> Tensor:
    """Start column of every segment inside its row (segments sorted by row)."""
    ends = lengths.cumsum(0)
    starts = ends - lengths
    per_row = torch.bincount(row, minlength=n_rows)
    row_first = per_row.cumsum(0) - per_row
    return starts - starts[row_first[row]] if row.numel() else starts


def pack_segments(
    row: Tensor,
    doc: Tensor,
    lengths: Tensor,
    fields: list[tuple[Tensor, int | bool]],
    n_rows: int,
    width: int,
) -> tuple[list[Tensor], Tensor, Tensor, int]:
    """Lay segments side by side in their rows: fields (N, W) -> (B, width), plus document ids.

    Tokens past `width` are dropped (returned as the truncated count); the rest is padding.
    """
    device = lengths.device
    W = fields[0][0].size(1)
    if row.numel() == n_rows and bool((row == torch.arange(n_rows, device=device)).all()):
        return _pack_one_per_row(doc, lengths, fields, width)
    start = _offsets(row, lengths, n_rows)
    # a segment's position j lands at column start + j: kept iff j < min(length, width - start), so
    # the truncated count and the kept positions come from per-segment limits, not (N, W) reductions
    real = lengths.clamp(max=W)
    kept = torch.minimum(real, width - start).clamp(min=0)
    truncated = int((real - kept).sum())
    size = n_rows * width
    total = int(kept.sum())
    if kept.numel() * W > 3 * total:
        # mostly padding (UL2 encoder-decoder pieces are 4-10x wider than their text): move the kept
        # positions only; below ~3x the dense scatter, fewer ops, is faster (measured)
        seg_of = torch.repeat_interleave(torch.arange(kept.numel(), device=device), kept, output_size=total)
        j = torch.arange(total, device=device) - (kept.cumsum(0) - kept)[seg_of]  # position in its segment
        src = seg_of * W + j
        dest = (row * width + start)[seg_of] + j
        outs = []
        for values, fill in fields:
            out = torch.full((size,), fill, dtype=values.dtype, device=device)
            out.scatter_(0, dest, values.reshape(-1).index_select(0, src))
            outs.append(out.view(n_rows, width))
        docs = torch.full((size,), -1, dtype=torch.int64, device=device)
        docs.scatter_(0, dest, doc[seg_of])
        pos = torch.zeros(size, dtype=torch.int64, device=device)
        pos.scatter_(0, dest, j)
        return outs, docs.view(n_rows, width), pos.view(n_rows, width), truncated
    # mostly text: scatter every cell, dropped ones to a spare slot (fewer ops)
    j = torch.arange(W, device=device)[None, :]
    dest = (row * width + start)[:, None] + j
    flat = torch.where(j < kept[:, None], dest, size).view(-1)
    outs = []
    for values, fill in fields:
        out = torch.full((size + 1,), fill, dtype=values.dtype, device=device)
        out.scatter_(0, flat, values.reshape(-1))
        outs.append(out[:size].view(n_rows, width))
    docs = torch.full((size + 1,), -1, dtype=torch.int64, device=device)
    docs.scatter_(0, flat, doc[:, None].expand(-1, W).reshape(-1))
    docs = docs[:size].view(n_rows, width)
    pos = torch.zeros(size + 1, dtype=torch.int64, device=device)
    pos.scatter_(0, flat, j.expand(lengths.numel(), -1).reshape(-1))
    return outs, docs, pos[:size].view(n_rows, width), truncated


def _pack_one_per_row(
    doc: Tensor, lengths: Tensor, fields: list[tuple[Tensor, int | bool]], width: int
) -> tuple[list[Tensor], Tensor, Tensor, int]:
    """`pack_segments` when every row holds exactly one segment: slice and pad, no scatter."""
    W = fields[0][0].size(1)
    device = lengths.device
    j = torch.arange(width, device=device)[None, :]
    real = j < lengths[:, None]
    outs = []
    for values, fill in fields:
        if width <= W:
            out = values[:, :width]
        else:
            tail = torch.full((values.size(0), width - W), fill, dtype=values.dtype, device=device)
            out = torch.cat([values, tail], dim=1)
        outs.append(torch.where(real, out, fill))
    docs = torch.where(real, doc[:, None], -1)
    positions = torch.where(real, j, 0)
    truncated = int((lengths - width).clamp(min=0).sum())
    return outs, docs, positions, truncated


def encdec_batch(
    pieces: Pieces, n_rows: int, enc_width: int, dec_width: int, specials: Specials
) -> tuple[Batch, int]:
    """Encoder = inputs; decoder = targets shifted right behind the start id (T5: pad = 0).

    A document whose encoder part is cut away entirely also loses its decoder part, so every decoder
    document has encoder positions to cross-attend to (no empty softmax).
    """
    p = pieces
    (enc,), enc_docs, enc_pos, cut_in = pack_segments(
        p.row, p.doc, p.input_lengths, [(p.inputs, specials.pad)], n_rows, enc_width
    )
    starts = _offsets(p.row, p.input_lengths, n_rows)
    tgt_len = torch.where(starts < enc_width, p.target_lengths, torch.zeros_like(p.target_lengths))
    dropped = int((p.target_lengths - tgt_len).sum())
    (labels,), dec_docs, dec_pos, cut_out = pack_segments(
        p.row, p.doc, tgt_len, [(p.targets, IGNORE)], n_rows, dec_width
    )
    batch = packed_encdec_batch(enc, enc_docs, enc_pos, labels, dec_docs, dec_pos, specials.pad)
    return batch, cut_in + cut_out + dropped


def packed_encdec_batch(
    enc: Tensor,
    enc_docs: Tensor,
    enc_pos: Tensor,
    labels: Tensor,
    dec_docs: Tensor,
    dec_pos: Tensor,
    pad: int,
) -> Batch:
    """The encoder-decoder Batch of packed rows. Decoder inputs are the packed labels one column right
    inside each document, the start id (pad) at its first position: one small shift, not a second
    shifted copy of every piece to pack."""
    dec = torch.full_like(labels, pad)
    dec[:, 1:] = torch.where(dec_pos[:, 1:] > 0, labels[:, :-1], pad)
    return Batch(
        input_ids=enc,
        labels=labels,
        positions=enc_pos,
        document_ids=enc_docs,
        attention="bidirectional",
        decoder_input_ids=dec,
        decoder_positions=dec_pos,
        decoder_document_ids=dec_docs,
    )


def exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    """(N,) sums of the values before each: where each of N pieces held end to end starts."""
    return np.cumsum(values) - values


def pack_flat(
    row: np.ndarray,
    doc: np.ndarray,
    lengths: np.ndarray,
    flat: np.ndarray,
    flat_start: np.ndarray,
    n_rows: int,
    width: int,
    fill: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """`pack_segments` of one field for segments held end to end in `flat` (segment i's tokens from
    `flat_start[i]`, its first `lengths[i]` laid out): values, document ids and positions (n_rows,
    width), each segment's start column, and the truncated count. Only real tokens move, no (N, W) grid.
    numpy, as the callers' (N,) bookkeeping."""
    n = lengths.size
    start = exclusive_cumsum(lengths)
    if n:  # start column inside the row (segments sorted by row)
        per_row = np.bincount(row, minlength=n_rows)
        start = start - start[exclusive_cumsum(per_row)[row]]
    kept = np.clip(np.minimum(lengths, width - start), 0, None)
    truncated = int((lengths - kept).sum())
    seg_of = np.repeat(np.arange(n), kept)
    j = np.arange(seg_of.size) - exclusive_cumsum(kept)[seg_of]  # position in its segment
    dest = (row * width + start)[seg_of] + j
    size = n_rows * width
    values = np.full(size, fill, dtype=flat.dtype)
    values[dest] = flat[flat_start[seg_of] + j]
    docs = np.full(size, -1, dtype=np.int64)
    docs[dest] = doc[seg_of]
    positions = np.zeros(size, dtype=np.int64)
    positions[dest] = j
    shape = (n_rows, width)
    return values.reshape(shape), docs.reshape(shape), positions.reshape(shape), start, truncated


def encdec_batch_flat(
    row: np.ndarray,
    doc: np.ndarray,
    inputs: np.ndarray,
    input_lengths: np.ndarray,
    targets: np.ndarray,
    target_lengths: np.ndarray,
    n_rows: int,
    enc_width: int,
    dec_width: int,
    specials: Specials,
) -> tuple[Batch, int]:
    """`encdec_batch` of pieces held as two flat sequences, every piece's inputs (targets) end to end
    in (row, document) order: the same Batch and truncated count, without padded (N, W) pieces."""
    enc, enc_docs, enc_pos, starts, cut_in = pack_flat(
        row, doc, input_lengths, inputs, exclusive_cumsum(input_lengths), n_rows, enc_width, specials.pad
    )
    # a piece whose encoder part is cut away entirely loses its decoder part (see `encdec_batch`)
    tgt_len = np.where(starts < enc_width, target_lengths, 0)
    dropped = int((target_lengths - tgt_len).sum())
    labels, dec_docs, dec_pos, _, cut_out = pack_flat(
        row, doc, tgt_len, targets, exclusive_cumsum(target_lengths), n_rows, dec_width, IGNORE
    )
    fields = (enc, enc_docs, enc_pos, labels, dec_docs, dec_pos)
    return packed_encdec_batch(*map(torch.from_numpy, fields), specials.pad), cut_in + cut_out + dropped


def decoder_batch(pieces: Pieces, n_rows: int, width: int, specials: Specials) -> tuple[Batch, int]:
    """Decoder-only layout `[inputs][targets]` per document (UL2 / llm-foundry).

    Inputs are the bidirectional prefix; `labels[t] = seq[t+1]` for t in [n_in-1, n_in+n_tgt-2], so the
    last prefix position predicts the first target from the whole prefix, and no label is a prefix token
    (a prefix-LM pitfall). With an empty prefix the first target has nothing to be predicted from.
    """
    p = pieces
    N, Wi = p.inputs.shape
    Wt = p.targets.size(1)
    W = max(Wi + Wt, 1)
    device = p.inputs.device
    j = torch.arange(W, device=device)[None, :]
    li = p.input_lengths[:, None]
    lt = p.target_lengths[:, None]
    from_in = j < li
    # inputs widened to W (only read below each input length <= Wi): a pad, not a gather
    a = torch.nn.functional.pad(p.inputs, (0, W - Wi)) if Wi else torch.zeros(N, W, dtype=torch.int64)
    b = p.targets.gather(1, (j - li).clamp(0, max(Wt - 1, 0))) if Wt else torch.zeros(N, W, dtype=torch.int64)
    seq = torch.where(from_in, a, b)
    nxt = torch.cat([seq[:, 1:], seq[:, :1]], dim=1)
    labelled = (j >= li - 1) & (j <= li + lt - 2)
    labels = torch.where(labelled, nxt, torch.full_like(nxt, IGNORE))
    (ids, lab, prefix), docs, pos, cut = pack_segments(
        p.row,
        p.doc,
        p.input_lengths + p.target_lengths,
        [(seq, specials.pad), (labels, IGNORE), (from_in, False)],
        n_rows,
        width,
    )
    batch = Batch(
        input_ids=ids, labels=lab, positions=pos, document_ids=docs, attention="prefix", prefix_mask=prefix
    )
    return batch, cut


def layout(
    pieces: Pieces, model_kind: str, n_rows: int, widths: tuple[int, int], specials: Specials
) -> tuple[Batch, int]:
    """`encdec_batch` with (encoder, decoder) widths, or `decoder_batch` with width widths[0]."""
    if model_kind == "encdec":
        return encdec_batch(pieces, n_rows, widths[0], widths[1], specials)
    return decoder_batch(pieces, n_rows, widths[0], specials)


# --------------------------------------------------------------------------------------------------
# Fitting whole documents into fixed widths (lossless packing of corrupted documents)


def span_lengths_batched(
    lengths: np.ndarray, noise_density: float | np.ndarray, mean_span: float | np.ndarray, extra: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) lengths, EOS included, of span corruption of (N,) documents: `span_output_lengths`
    per document (a lone EOS, length 0, is EOS on both sides). `extra` is added to both sides of every
    document that gets noise (one more span when `random_roll` wraps a span around the end)."""
    n_noise, n_spans = span_counts_np(lengths, noise_density, mean_span)
    has = lengths >= 2
    n_noise = np.where(has, n_noise, 0)
    n_spans = np.where(has, n_spans + extra, 0)
    return lengths - n_noise + n_spans + 1, n_noise + n_spans + 1


def _cumsum_in_rows(values: Tensor, row: Tensor) -> Tensor:
    """Inclusive cumulative sum of (N,) non-negative values within runs of equal `row`."""
    total = values.cumsum(0)
    first = torch.ones_like(row, dtype=torch.bool)
    first[1:] = row[1:] != row[:-1]
    base = torch.where(first, total - values, torch.zeros_like(total)).cummax(0).values
    return total - base


def fit_documents(
    seg: Segments,
    need: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
    widths: tuple[int, int],
    pad: int = 0,
) -> tuple[Segments, int]:
    """Keep each row's documents, in order, while their corrupted lengths fit the row's widths.

    `need(lengths, index)` gives (inputs, targets) lengths of documents `index` cut to `lengths` (the
    per-document formula, EOS included; (k,) int64 numpy arrays in and out); widths are (encoder,
    decoder), or (width, 0) when inputs and targets share one sequence. The first document of a row that
    does not fit whole is cut in *raw* space to the longest prefix whose outputs fit, and later documents
    are left out, so corruption never loses a target token: what does not fit is raw text left unused,
    and padding is the only slack.
    Returns the kept segments and the raw tokens they use (EOS tokens included).

    The (N,) bookkeeping is numpy: a few dozen ops on ~100 numbers, each ~5x cheaper than a torch op.
    """
    if seg.n == 0:
        return seg, 0
    device = seg.lengths.device
    lengths = seg.lengths.cpu().numpy()
    a, b = need(lengths, np.arange(seg.n))
    one_sequence = widths[1] == 0
    if one_sequence:
        a, b, limit_b = a + b, np.zeros_like(b), 0
    else:
        limit_b = widths[1]
    row = seg.row.cpu().numpy()
    first_in_row = np.ones(seg.n, dtype=bool)
    first_in_row[1:] = row[1:] != row[:-1]
    ca, cb = _cumsum_in_runs(a, first_in_row), _cumsum_in_runs(b, first_in_row)
    fits = (ca <= widths[0]) & (cb <= limit_b)
    had_eos = seg.had_eos.cpu().numpy() if seg.had_eos is not None else np.zeros(seg.n, dtype=bool)
    if fits.all():
        return seg, int(lengths.sum() + had_eos.sum())
    prev_fits = first_in_row.copy()
    prev_fits[1:] |= fits[:-1]
    first_fail = ~fits & prev_fits  # fits is a prefix of each row's documents
    new_len = np.where(fits, lengths, 0)
    cut = np.flatnonzero(first_fail)
    if cut.size:
        room_a = widths[0] - (ca - a)[cut]
        room_b = limit_b - (cb - b)[cut]
        new_len[cut] = _longest_fitting_prefix(
            need, cut, lengths[cut], a[cut], b[cut], room_a, room_b, one_sequence
        )
    keep = (new_len > 0) | fits  # a lone EOS (length 0) that fits is kept
    cut_docs = first_fail & keep
    used = int(new_len.sum() + (had_eos & fits).sum())
    j = torch.arange(seg.width, device=seg.tokens.device)[None, :]
    flags = torch.from_numpy((had_eos & ~cut_docs)[keep]).to(device)
    kept_len = torch.from_numpy(new_len[keep]).to(device)

    def pad_cut(tokens: Tensor) -> Tensor:
        """Pad the cut documents past their new lengths (whole ones are padded already)."""
        c = torch.from_numpy(np.flatnonzero(cut_docs[keep])).to(device)
        if c.numel():
            short = tokens.index_select(0, c).masked_fill_(j >= kept_len[c][:, None], pad)
            tokens.index_copy_(0, c, short)
        return tokens

    if keep.all():  # only cuts, nothing left out: no rows to select
        tokens = pad_cut(seg.tokens.clone())
        return Segments(tokens, kept_len, seg.row, seg.doc, seg.n_rows, flags, dict(seg.extra)), used
    k = torch.from_numpy(np.flatnonzero(keep)).to(device)
    tokens = pad_cut(seg.tokens.index_select(0, k))  # one copy
    out = Segments(
        tokens,
        kept_len,
        seg.row[k],
        seg.doc[k],
        seg.n_rows,
        flags,
        {key: value[k] for key, value in seg.extra.items()},
    )
    return out, used


def _cumsum_in_runs(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Inclusive cumulative sum of (N,) non-negative values within runs that start where `first`."""
    total = np.cumsum(values)
    return total - np.maximum.accumulate(np.where(first, total - values, 0))


_WINDOW = 16  # candidates each side of the guessed cut: one rounded count off moves it ~1/rate tokens


def _longest_fitting_prefix(
    need: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
    index: np.ndarray,
    full: np.ndarray,
    full_a: np.ndarray,
    full_b: np.ndarray,
    room_a: np.ndarray,
    room_b: np.ndarray,
    one_sequence: bool,
) -> np.ndarray:
    """(k,) longest prefix length in [0, full) of documents `index` whose `need` fits (room_a, room_b):
    what bisection over [0, full) finds, `need` being non-decreasing in the length.

    Bisection costs ~log2(full) calls of `need`; here one call tests a window of candidates around the
    proportional guess, and only documents whose boundary lies outside their window (rare) fall back
    to bisection."""

    def fits(lengths: np.ndarray, at: np.ndarray, ra: np.ndarray, rb: np.ndarray) -> np.ndarray:
        ma, mb = need(lengths, at)
        if one_sequence:
            ma, mb = ma + mb, np.zeros_like(mb)
        return (ma <= ra) & (mb <= rb) & (lengths > 0)

    # proportional to the room left after the EOS, which every prefix needs whatever its length
    guess = full * (room_a - 1).clip(min=0) // (full_a - 1).clip(min=1)
    if not one_sequence:
        guess = np.minimum(guess, full * (room_b - 1).clip(min=0) // (full_b - 1).clip(min=1))
    top = (full - 1).clip(min=1)
    cand = np.minimum(np.maximum(guess[:, None] + np.arange(-_WINDOW, _WINDOW + 1)[None, :], 1), top[:, None])
    n = cand.shape[1]
    ok = fits(cand.reshape(-1), np.repeat(index, n), np.repeat(room_a, n), np.repeat(room_b, n)).reshape(
        -1, n
    )
    # the window decides when its low end fits (or is 1) and its high end does not (or is full - 1)
    decided = (ok[:, 0] | (cand[:, 0] == 1)) & (~ok[:, -1] | (cand[:, -1] == top))
    best = np.where(ok, cand, 0).max(1)
    best = np.where(full <= 1, 0, best)
    rest = np.flatnonzero(~decided & (full > 1))
    if rest.size:
        lo = np.zeros_like(rest)  # fits (nothing)
        hi = full[rest].copy()  # does not fit
        while (hi - lo > 1).any():
            mid = (lo + hi) // 2
            ok_mid = fits(mid, index[rest], room_a[rest], room_b[rest])
            lo = np.where(ok_mid, mid, lo)
            hi = np.where(ok_mid, hi, mid)
        best[rest] = lo
    return best
