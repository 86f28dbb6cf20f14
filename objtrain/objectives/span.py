"""T5 span corruption (reference section 5): noise spans become sentinels in the inputs, the targets
spell the spans out.

Worked example, document `a b c d e f g h` with noise on `c d` and `g h`:
    inputs  = a b S0 e f S1 </s>
    targets = S0 c d S1 g h </s>
Encoder-decoder: the encoder reads the inputs, the decoder predicts the targets (`labels`), reading them
shifted right behind the start id 0. Decoder-only (UL2/llm-foundry format): one sequence
`inputs targets` per document, the inputs a bidirectional prefix, loss on the targets only.

Packed rows: every document is corrupted on its own (sentinels restart at S0, each gets its own EOS;
a document's trailing EOS, as packed stores write it, is never noised and is that EOS).
`raw_length(m)` is T5's `random_spans_helper`, so a single-document row fills the model length exactly;
a row of several documents spends one EOS and rounds its counts per document, so it can come out a
few tokens longer (the tail is truncated, counted in `stats["truncated_tokens"]`) or shorter (padded).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from torch import Tensor

from objtrain.batch import Batch
from objtrain.errors import UserError
from objtrain.objectives.base import Objective
from objtrain.objectives.noise import (
    Pieces,
    Segments,
    by_length,
    largest_fitting,
    layout,
    random_spans_helper,
    random_spans_noise_mask,
    span_counts,
    span_inputs_targets,
    span_output_lengths,
    split_documents,
)
from objtrain.objectives.rng import RowRandom
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


def finish_stats(stats: dict[str, float], batch: Batch, truncated: int) -> dict[str, float]:
    out = dict(stats)
    out["truncated_tokens"] = float(truncated)
    out["target_tokens"] = float(batch.n_targets)
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

    @dataclass
    class Config:
        noise_density: float = 0.15  # fraction of raw tokens that are noise (T5: 0.15)
        mean_noise_span_length: float = 3.0  # mean noise span length (T5: 3.0)
        random_roll: bool = False  # rotate each mask by a random offset (t5#905; T5 default: off)

    def setup(self) -> None:
        config = self.config
        check_span_config(config.noise_density, config.mean_noise_span_length, self.name)
        self.attention = "bidirectional" if self.model_kind == "encdec" else "prefix"  # type: ignore[misc]

    def raw_length(self, model_length: int) -> int:
        c = self.config
        raw = span_raw_length(model_length, c.noise_density, c.mean_noise_span_length, self.model_kind)
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
        return span_widths(raw_length, c.noise_density, c.mean_noise_span_length, self.model_kind)

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        c = self.config
        seg = split_documents(rows, document_ids, self.specials.pad, self.specials.eos)
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
        batch, truncated = layout(
            pieces, self.model_kind, seg.n_rows, self.widths(rows.size(1)), self.specials
        )
        batch.stats = finish_stats(stats, batch, truncated)
        return batch
