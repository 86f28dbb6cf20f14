"""T5 span corruption (Raffel et al. 2020): noise spans become sentinels in the inputs, the targets
spell the spans out.

Worked example, document `a b c d e f g h` with noise on `c d` and `g h`:
    inputs  = a b S0 e f S1 </s>
    targets = S0 c d S1 g h </s>
Encoder-decoder: the encoder reads the inputs, the decoder predicts the targets (`labels`), reading them
shifted right behind the start id 0. Decoder-only (UL2/llm-foundry format): one sequence
`inputs targets` per document, the inputs a bidirectional prefix, loss on the targets only.

Packed rows: every document is corrupted on its own (sentinels restart at S0, each gets its own EOS;
a document's trailing EOS, as packed stores write it, is never noised and is that EOS), and its input
and target lengths follow from its own length (T5's formula per document, `span_output_lengths`).
`raw_length(m)` is T5's `random_spans_helper`, so a single-document row fills the model length exactly.
Several documents in a row round their counts and spend sentinels per document, so together they can
need a few more positions than the widths hold: `fit_documents` then keeps the documents that fit and
cuts the first one that does not *before* corruption (its raw tail is left unused, counted in
`stats["raw_tokens_unused"]`), so no target token of any document is ever dropped
(`stats["target_tokens_dropped"]` is 0) and padding is the only slack.

`random_roll` rotates each mask by a uniform offset; when the rotation wraps a noise span around the end
it becomes two spans, one sentinel more on each side. The lengths budget that sentinel (rows hold
`random_spans_helper(m - 1)` raw tokens and the widths one more position each), so every input and
every target still ends with its `</s>`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor

from objtrain.batch import Batch
from objtrain.errors import UserError
from objtrain.objectives.base import Objective, raw_usage
from objtrain.objectives.noise import (
    Pieces,
    Segments,
    as_numpy,
    by_length,
    fit_documents,
    largest_fitting,
    layout,
    random_span_ends,
    random_spans_helper,
    random_spans_noise_mask,
    roll_offsets,
    span_counts,
    span_inputs_targets,
    span_lengths_batched,
    span_output_lengths,
    split_documents,
)
from objtrain.rng import RowRandom
from objtrain.specials import Specials


def check_span_config(noise_density: float, mean_noise_span_length: float, what: str) -> None:
    if not 0.0 < noise_density < 1.0:
        raise UserError(f"{what}: noise_density must be in (0, 1), got {noise_density}")
    if mean_noise_span_length < 1.0:
        raise UserError(f"{what}: mean_noise_span_length must be >= 1, got {mean_noise_span_length}")


def span_pieces(
    seg: Segments,
    rr: RowRandom,
    noise_density: float | Tensor,
    mean_noise_span_length: float | Tensor,
    random_roll: bool,
    specials: Specials,
    mode_token: int | Tensor | None = None,
) -> tuple[Pieces, dict[str, float]]:
    """Span-corrupt each segment: inputs `[mode] keep S0 keep S1 ... </s>`, targets `S0 noise S1 ... </s>`.

    Density, mean span and mode token may be (N,) tensors: one call for several UL2 denoisers."""
    mask = random_spans_noise_mask(
        seg.lengths, seg.width, noise_density, mean_noise_span_length, rr, "span/mask", random_roll
    )
    inputs, n_in, targets, n_tgt = span_inputs_targets(seg.tokens, mask, seg.lengths, specials, mode_token)
    noise = float(mask.sum())
    spans = float((n_tgt - 1 - mask.sum(1)).sum())  # one sentinel per span
    stats = {
        "documents": float(seg.n),
        "raw_tokens": float(seg.lengths.sum()),
        "noise_tokens": noise,
        "spans": spans,
    }
    return Pieces(inputs, n_in, targets, n_tgt, seg.row, seg.doc), stats


def span_need(
    seg: Segments,
    seed: int,
    row_index: Tensor,
    noise_density: float | Tensor,
    mean_span: float | Tensor,
    random_roll: bool,
) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """`need(lengths, index)` for `fit_documents`: T5's per-document lengths, plus the sentinel a rolled
    mask adds when its rotation wraps a span. A whole document's wrap is known exactly (its mask is
    drawn here as `span_pieces` will draw it); a cut one is budgeted the extra sentinel. Density and
    mean span may be (N,) per segment (UL2)."""

    density, mean = as_numpy(noise_density), as_numpy(mean_span)

    def per(value: float | np.ndarray, index: np.ndarray) -> float | np.ndarray:
        return value[index] if isinstance(value, np.ndarray) else value

    if not random_roll:
        return lambda lengths, index: span_lengths_batched(lengths, per(density, index), per(mean, index))
    if seg.n == 0:  # nothing to fit
        return lambda lengths, index: (lengths + 1, lengths + 1)
    # the rolled mask at the first and last token only, from the span boundaries: no (N, W) mask
    rr = seg.random(seed, row_index)
    ends = random_span_ends(seg.lengths, noise_density, mean_span, rr, "span/mask")
    offset = roll_offsets(seg.lengths, rr, "span/mask")[:, 0]

    def noise_at(p: Tensor) -> Tensor:
        """Rolled noise at (N,) positions p: the unrolled mask (odd boundaries at or before) at p - offset."""
        q = (p - offset) % seg.lengths.clamp(min=1)
        return ((ends <= q[:, None]).sum(1) % 2 == 1) & (p < seg.lengths)

    wrapped = noise_at(torch.zeros_like(offset)) & noise_at((seg.lengths - 1).clamp(min=0))
    wraps = wrapped.long().cpu().numpy()
    seg_lengths = seg.lengths.cpu().numpy()

    def need(lengths: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        whole = lengths == seg_lengths[index]
        extra = np.where(whole, wraps[index], 1) * (lengths >= 2)
        n_in, n_tgt = span_lengths_batched(lengths, per(density, index), per(mean, index))
        return n_in + extra, n_tgt + extra

    return need


@lru_cache(maxsize=256)
def span_raw_length(
    model_length: int, noise_density: float, mean_span: float, model_kind: str, extra_inputs: int = 0
) -> int:
    """Raw tokens per row for a model length: T5's helper (encoder length) or, decoder-only, the largest
    T with len(inputs) + len(targets) = T + 2 n_spans + 2 <= model length. `extra_inputs` reserves room
    for a mode token."""
    if model_kind == "encdec":
        return random_spans_helper(model_length - extra_inputs, noise_density, mean_span)[0]

    def total(t: int) -> int:
        return sum(span_output_lengths(t, noise_density, mean_span)) + extra_inputs

    return largest_fitting(model_length, total)


def span_widths(
    raw_length: int, noise_density: float, mean_span: float, model_kind: str, extra_inputs: int = 0
) -> tuple[int, int]:
    """Row widths for rows of `raw_length` raw tokens: (encoder, decoder) or (decoder-only, 0)."""
    n_in, n_tgt = span_output_lengths(raw_length, noise_density, mean_span)
    if model_kind == "encdec":
        return n_in + extra_inputs, n_tgt
    return n_in + n_tgt + extra_inputs, 0


def finish_stats(
    stats: dict[str, float],
    batch: Batch,
    truncated: int,
    pieces: Pieces | None = None,
    targets_made: int | None = None,
) -> dict[str, float]:
    """The summary stats of a batch; `targets_made` (or the `pieces`' target lengths) counts the targets
    the corruption made, for `target_tokens_dropped`."""
    out = dict(stats)
    out["truncated_tokens"] = float(truncated)
    n_targets = batch.n_targets  # a pass over the labels: once
    out["target_tokens"] = float(n_targets)
    if pieces is not None:
        targets_made = int(pieces.target_lengths.sum())
    if targets_made is not None:  # targets the corruption made that the batch does not hold
        out["target_tokens_dropped"] = float(targets_made - n_targets)
    if "spans" in out:
        out["mean_span_length"] = out["noise_tokens"] / out["spans"] if out["spans"] else 0.0
    if out.get("raw_tokens") and "noise_tokens" in out:
        out["noise_density"] = out["noise_tokens"] / out["raw_tokens"]
    return out


class SpanCorruption(Objective):
    """T5 span corruption; encoder-decoder by default, decoder-only as a prefix LM over [inputs][targets]."""

    name = "span"
    model_kinds = ("encdec", "decoder")
    attention = "bidirectional"
    # minimal pairs: each token in turn a one-token span behind <extra_id_0> (objtrain/evaluation/blimp.py)
    minimal_pair_forms: ClassVar[dict[str, tuple[str, ...]]] = {"encdec": ("sentinel_span",)}
    infills_with_sentinels = True

    @dataclass
    class Config:
        noise_density: float = 0.15  # fraction of raw tokens that are noise (T5: 0.15)
        mean_noise_span_length: float = 3.0  # mean noise span length (T5: 3.0)
        random_roll: bool = False  # rotate each mask by a random offset (t5#905; T5 default: off)

    def setup(self) -> None:
        config = self.config
        check_span_config(config.noise_density, config.mean_noise_span_length, self.name)
        self.attention = "bidirectional" if self.model_kind == "encdec" else "prefix"  # type: ignore[misc]

    @property
    def roll_extra(self) -> int:
        """Positions per side reserved for the extra sentinel of a wrapped span (see module docstring)."""
        return 1 if self.config.random_roll else 0

    def raw_length(self, model_length: int) -> int:
        c = self.config
        extra = self.roll_extra * (1 if self.model_kind == "encdec" else 2)
        raw = span_raw_length(model_length, c.noise_density, c.mean_noise_span_length, self.model_kind, extra)
        if raw < 1:
            raise UserError(f"span: model length {model_length} is too short for span corruption")
        _, n_spans = span_counts(raw, c.noise_density, c.mean_noise_span_length)
        if n_spans > self.specials.n_sentinels:
            raise UserError(
                f"span: {n_spans} spans per {raw}-token row exceed the {self.specials.n_sentinels} "
                "sentinels the tokenizer reserves: raise mean_noise_span_length or lower the length"
            )
        return raw

    def widths(self, raw_length: int) -> tuple[int, int]:
        c = self.config
        enc, dec = span_widths(raw_length, c.noise_density, c.mean_noise_span_length, self.model_kind)
        if self.model_kind == "encdec":
            return enc + self.roll_extra, dec + self.roll_extra
        return enc + 2 * self.roll_extra, 0

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        c = self.config
        seg = split_documents(rows, document_ids, self.specials.pad, self.specials.eos)
        widths = self.widths(rows.size(1))
        need = span_need(seg, seed, row_index, c.noise_density, c.mean_noise_span_length, c.random_roll)
        seg, used = fit_documents(seg, need, widths, self.specials.pad)
        pieces, stats = by_length(
            seg,
            lambda sub: span_pieces(
                sub,
                sub.random(seed, row_index),
                c.noise_density,
                c.mean_noise_span_length,
                c.random_roll,
                self.specials,
            ),
            self.specials.pad,
        )
        batch, truncated = layout(pieces, self.model_kind, seg.n_rows, widths, self.specials)
        batch.stats = finish_stats(stats, batch, truncated, pieces)
        batch.stats.update(raw_usage(document_ids, used))
        return batch
