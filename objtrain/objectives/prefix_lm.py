"""Prefix LM (Raffel et al. 2020; Dong et al. 2019): split every document into a prefix (read
bidirectionally) and a target (predicted left to right).

Worked example, document `a b c d e` split after 2 tokens:
    decoder-only:    input_ids `a b c d e`, prefix_mask `1 1 0 0 0`, labels `- c d e -`
                     (the last prefix token predicts the first target: labels[t] = token t+1)
    encoder-decoder: encoder `a b </s>`, decoder targets `c d e </s>`

The split follows t5 random_prefix_noise_mask (`noise_density` r = mean target fraction; r = 0.5 is a
uniform split on [1, L-1]); r > 0.5 extends it as llm-foundry does (see `noise.prefix_split`). Both
parts are non-empty for documents of two or more tokens; a 1-token document is all target (decoder-only:
it then carries no label, there being nothing before it to predict it from).

Packed rows: every document is split on its own (encoder-decoder: without its trailing EOS, which
both sides get back). Decoder-only keeps the row length (raw = model length);
encoder-decoder adds one EOS to each side, so both sides fit in the raw length and the rest is padding,
except for a 1-token document the row cuts before its EOS: all target, token + EOS, one position more
than its raw text. Behind documents of at most one token there is no room to spare, so the documents are
fitted as span corruption fits them (`fit_documents`): what does not fit is left out before the split
(counted in `stats["raw_tokens_unused"]`), never a target's EOS truncated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from objtrain.batch import Batch
from objtrain.errors import UserError
from objtrain.objectives.base import Objective, raw_usage
from objtrain.objectives.noise import (
    Pieces,
    Segments,
    append_token,
    by_length,
    document_random,
    fit_documents,
    layout,
    prefix_split,
    shift_within,
    split_documents,
)
from objtrain.objectives.span import finish_stats
from objtrain.rng import RowRandom
from objtrain.specials import Specials


def prefix_pieces(
    seg: Segments,
    rr: RowRandom,
    noise_density: float,
    model_kind: str,
    specials: Specials,
    mode_token: int | None = None,
) -> tuple[Pieces, dict[str, float]]:
    """Split every segment at a random point (`prefix_split`): see `split_pieces`."""
    n_in = prefix_split(seg.lengths, noise_density, rr, "prefix_lm/split")
    mode = None if mode_token is None else torch.full_like(seg.lengths, mode_token)
    return split_pieces(seg, n_in, model_kind, specials, mode)


def split_pieces(
    seg: Segments, n_in: Tensor, model_kind: str, specials: Specials, mode: Tensor | None = None
) -> tuple[Pieces, dict[str, float]]:
    """Split every segment after its first `n_in` (N,) tokens: inputs = `[mode] x[:n_in]`, targets =
    `x[n_in:]` (encoder-decoder: + EOS each); `mode` (N,) a mode token per segment, or None (prefix LM
    and UL2's S denoiser)."""
    j = torch.arange(seg.width, device=seg.tokens.device)[None, :]
    inputs = seg.tokens.masked_fill(j >= n_in[:, None], specials.pad)
    n_tgt = seg.lengths - n_in
    targets = shift_within(seg.tokens, n_tgt, n_in, specials.pad)
    if model_kind == "encdec":
        inputs, n_in_out = append_token(inputs, n_in, specials.eos, specials.pad)
        targets, n_tgt_out = append_token(targets, n_tgt, specials.eos, specials.pad)
    else:
        n_in_out, n_tgt_out = n_in, n_tgt
    if mode is not None:
        inputs = torch.cat([mode[:, None].to(inputs.dtype), inputs], dim=1)
        n_in_out = n_in_out + 1
    stats = {
        "documents": float(seg.n),
        "raw_tokens": float(seg.lengths.sum()),
        "prefix_tokens": float(n_in.sum()),
        "suffix_tokens": float(n_tgt.sum()),
    }
    return Pieces(inputs, n_in_out, targets, n_tgt_out, seg.row, seg.doc), stats


def prefix_need(
    seg: Segments, seed: int, row_index: Tensor, noise_density: float
) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """`need(lengths, index)` for `fit_documents`: encoder-decoder (inputs, targets) lengths, EOS included,
    of documents `index` cut to `lengths`, split as `prefix_pieces` splits them."""

    def need(lengths: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = torch.from_numpy(index).to(seg.row.device)
        rr = document_random(seed, row_index, seg.row[at], seg.doc[at])
        n = torch.from_numpy(lengths).to(seg.row.device)
        n_in = prefix_split(n, noise_density, rr, "prefix_lm/split").cpu().numpy()
        return n_in + 1, lengths - n_in + 1

    return need


def check_prefix_density(noise_density: float, what: str) -> None:
    if not 0.0 < noise_density <= 1.0:
        raise UserError(
            f"{what}: noise_density (mean target fraction) must be in (0, 1], got {noise_density}"
        )


class PrefixLM(Objective):
    """Prefix LM: bidirectional prefix, left-to-right loss on the suffix only."""

    name = "prefix_lm"
    model_kinds = ("decoder", "encdec")
    attention = "prefix"
    scores_left_to_right = True

    @classmethod
    def conditions_on_prefix(cls, settings: Mapping[str, Any]) -> bool:
        return True

    @dataclass
    class Config:
        noise_density: float = 0.5  # mean target fraction; 0.5 = uniform split on [1, L-1] (T5 prefix_lm)

    def setup(self) -> None:
        config, specials = self.config, self.specials
        check_prefix_density(config.noise_density, self.name)
        self.attention = "prefix" if self.model_kind == "decoder" else "bidirectional"  # type: ignore[misc]
        # encoder-decoder: a document's own EOS is split off and re-appended to both sides;
        # decoder-only: the row is the document itself, its EOS an ordinary target
        self.eos_to_split = specials.eos if self.model_kind == "encdec" else None

    def raw_length(self, model_length: int) -> int:
        if model_length < 2:
            raise UserError(f"prefix_lm: model length must be at least 2, got {model_length}")
        return model_length

    def widths(self, raw_length: int) -> tuple[int, int]:
        return raw_length, raw_length

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        seg = split_documents(rows, document_ids, self.specials.pad, self.eos_to_split)
        widths = self.widths(rows.size(1))
        used = None
        if self.model_kind == "encdec":  # a cut 1-token document can need one target position too many
            need = prefix_need(seg, seed, row_index, self.config.noise_density)
            seg, used = fit_documents(seg, need, widths, self.specials.pad)
        pieces, stats = by_length(
            seg,
            lambda sub: prefix_pieces(
                sub, sub.random(seed, row_index), self.config.noise_density, self.model_kind, self.specials
            ),
            self.specials.pad,
        )
        batch, truncated = layout(pieces, self.model_kind, seg.n_rows, widths, self.specials)
        # encoder-decoder: every target made is in the batch (decoder-only: a 1-token document makes a
        # target that nothing before it can predict, so it carries no label, see the module docstring)
        batch.stats = finish_stats(stats, batch, truncated, pieces if used is not None else None)
        # decoder-only: every real token is in the prefix or the target, only what the layout truncates
        # is lost; encoder-decoder: what the fit kept (a document's EOS is re-appended to both sides)
        if used is None:
            used = max(int((document_ids >= 0).sum()) - truncated, 0)
        batch.stats.update(raw_usage(document_ids, used))
        return batch
