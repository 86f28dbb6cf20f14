"""UL2 mixture of denoisers (reference section 7): R and X are T5 span corruption with their own
(mean span, rate), S is a prefix LM; a mode token ([NLU], [NLG], [S2S]) leads every input.

Choices, deliberately:
- Weights default to 40% R, 40% X, 20% S (R: 0.2 + 0.2, X: 0.1 x 4, S: 0.2). The paper reports ~20% S
  as a good balance (§4.5, as used by the Finnish-NLP UL2 models); the paper's appendix code and
  llm-foundry fall back to uniform over the 7 denoisers (1/7 S). Set `weight` per denoiser to change it.
- The S-denoiser's mean target fraction is the paper's r = 0.25: a uniform target fraction on [0, 0.5],
  which is exactly t5's random_prefix_noise_mask at r = 0.25 and llm-foundry's S-denoiser. The UL2
  appendix code instead calls T5's `prefix_lm` (uniform split, mean 0.5); set S `noise_density: 0.5`
  for that.
- The denoiser is drawn per row from `RowRandom` (not per document, as the paper samples per example
  from per-task datasets): a packed row is one task, and every document in it gets the mode token.

Lengths: each denoiser needs a different raw length for the same model length (568, 588, 766, 908,
600, 1006 raw tokens at 512, see the table in section 7). Rows hold the largest; a denoiser that needs
fewer raw tokens uses the first `raw_k` tokens of the row (as llm-foundry truncates to the per-task
maximum) and its output is padded to the common widths: the encoder (or decoder-only) width is the
model length, the decoder width the longest target any denoiser can make.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from objtrain.batch import Batch
from objtrain.errors import UserError
from objtrain.objectives.base import Objective, raw_usage
from objtrain.objectives.noise import (
    Pieces,
    Segments,
    by_length,
    concat_segments,
    fit_documents,
    largest_fitting,
    layout,
    split_documents,
)
from objtrain.objectives.prefix_lm import check_prefix_density, prefix_pieces
from objtrain.objectives.rng import RowRandom
from objtrain.objectives.span import (
    check_span_config,
    finish_stats,
    span_need,
    span_output_lengths,
    span_pieces,
    span_raw_length,
)


@dataclass
class Denoiser:
    kind: Literal["R", "X", "S"] = "R"  # R/X: span corruption; S: prefix LM
    mean_noise_span_length: float = 3.0  # mean span (R/X only)
    noise_density: float = 0.15  # R/X: corruption rate; S: mean target fraction
    weight: float = 1.0  # relative sampling weight
    mode: Literal["nlu", "nlg", "s2s", "none"] = "nlu"  # mode token prepended to the inputs


def default_denoisers() -> list[Denoiser]:
    """The 7 denoisers of the UL2 paper (reference section 7 table), weighted 40% R / 40% X / 20% S."""
    return [
        Denoiser("R", 3.0, 0.15, 0.2, "nlu"),
        Denoiser("R", 8.0, 0.15, 0.2, "nlu"),
        Denoiser("X", 3.0, 0.5, 0.1, "nlg"),
        Denoiser("X", 8.0, 0.5, 0.1, "nlg"),
        Denoiser("X", 64.0, 0.15, 0.1, "nlg"),
        Denoiser("X", 64.0, 0.5, 0.1, "nlg"),
        Denoiser("S", 3.0, 0.25, 0.2, "s2s"),
    ]


def denoiser_label(d: Denoiser) -> str:
    if d.kind == "S":
        return f"S(r={d.noise_density:g})"
    return f"{d.kind}(mu={d.mean_noise_span_length:g},r={d.noise_density:g})"


class UL2(Objective):
    """Mixture of denoisers; encoder-decoder by default, decoder-only in the [inputs][targets] format."""

    name = "ul2"
    model_kinds = ("encdec", "decoder")
    attention = "bidirectional"

    @dataclass
    class Config:
        denoisers: list[Denoiser] = field(default_factory=default_denoisers)  # the paper's 7, 40/40/20
        random_roll: bool = False  # rotate R/X span masks by a random offset (t5#905)

    def setup(self) -> None:
        config = self.config
        self.attention = "bidirectional" if self.model_kind == "encdec" else "prefix"  # type: ignore[misc]
        if not config.denoisers:
            raise UserError("ul2: at least one denoiser is needed")
        for d in config.denoisers:
            if d.weight < 0:
                raise UserError(f"ul2: denoiser {denoiser_label(d)} has a negative weight")
            if d.kind == "S":
                check_prefix_density(d.noise_density, "ul2 S-denoiser")
            else:
                check_span_config(d.noise_density, d.mean_noise_span_length, f"ul2 {d.kind}-denoiser")
        weights = torch.tensor([d.weight for d in config.denoisers], dtype=torch.float64)
        if float(weights.sum()) <= 0:
            raise UserError("ul2: the denoiser weights sum to zero")
        self.cumulative = (weights / weights.sum()).cumsum(0)
        self.labels = [denoiser_label(d) for d in config.denoisers]
        self._model_length: dict[int, int] = {}

    def _mode(self, d: Denoiser) -> int | None:
        return None if d.mode == "none" else int(getattr(self.specials, d.mode))

    def _eos(self, d: Denoiser) -> int | None:
        """Which trailing EOS to split off: all but the decoder-only S-denoiser (see prefix_lm)."""
        return None if d.kind == "S" and self.model_kind == "decoder" else self.specials.eos

    def denoiser_raw_length(self, d: Denoiser, model_length: int) -> int:
        extra = 0 if d.mode == "none" else 1
        if d.kind == "S":
            return model_length - extra
        return span_raw_length(
            model_length, d.noise_density, d.mean_noise_span_length, self.model_kind, extra
        )

    def raw_length(self, model_length: int) -> int:
        if model_length < 8:
            raise UserError(f"ul2: model length must be at least 8, got {model_length}")
        raws = [self.denoiser_raw_length(d, model_length) for d in self.config.denoisers]
        for d, raw in zip(self.config.denoisers, raws, strict=True):
            if d.kind != "S":
                n_tgt = span_output_lengths(raw, d.noise_density, d.mean_noise_span_length)[1]
                n_noise = round(max(raw, 2) * d.noise_density)
                if n_tgt - 1 - n_noise > self.specials.n_sentinels:
                    raise UserError(
                        f"ul2: denoiser {denoiser_label(d)} needs {n_tgt - 1 - n_noise} sentinels at model "
                        f"length {model_length}, the tokenizer reserves {self.specials.n_sentinels}"
                    )
        return max(raws)

    def raw_lengths(self, model_length: int, row_index: Tensor, seed: int) -> Tensor:
        """Each row's own denoiser's need (the row's denoiser is drawn from (seed, row) first, the same
        draw `__call__` makes), so a row of a short-need denoiser is not fed the longest need."""
        self.raw_length(model_length)  # checks the length and the sentinel budget
        needs = [self.denoiser_raw_length(d, model_length) for d in self.config.denoisers]
        return torch.tensor(needs, dtype=torch.int64)[self.choose(row_index, seed)]

    def model_length(self, raw_length: int) -> int:
        """The model length whose rows need `raw_length` raw tokens (largest m with raw_length(m) <= L)."""
        if raw_length not in self._model_length:
            m = largest_fitting(raw_length, lambda m: self.raw_length(m), start=8)
            if m < 8:
                raise UserError(f"ul2: rows of {raw_length} raw tokens are too short")
            self._model_length[raw_length] = m
        return self._model_length[raw_length]

    def widths(self, raw_length: int) -> tuple[int, int]:
        m = self.model_length(raw_length)
        if self.model_kind != "encdec":
            return m, 0
        longest = 0
        for d in self.config.denoisers:
            raw = self.denoiser_raw_length(d, m)
            if d.kind == "S":
                longest = max(longest, raw)
            else:
                longest = max(longest, span_output_lengths(raw, d.noise_density, d.mean_noise_span_length)[1])
        return m, longest

    def choose(self, row_index: Tensor, seed: int) -> Tensor:
        """(B,) index of each row's denoiser, a pure function of (seed, global row)."""
        u = RowRandom(seed, row_index).scalar("ul2/denoiser")
        return torch.searchsorted(self.cumulative, u, right=True).clamp(max=len(self.config.denoisers) - 1)

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        B, L = rows.shape
        m = self.model_length(L)
        widths = self.widths(L)
        choice = self.choose(row_index, seed)
        used = int((document_ids >= 0).sum())  # minus what the fit leaves out, and the unread row tails
        parts: list[Pieces] = []
        stats: dict[str, float] = {}
        span_groups: dict[bool, list[Segments]] = {True: [], False: []}  # by "has a mode token"

        def add(pieces: Pieces, part: dict[str, float]) -> None:
            parts.append(pieces)
            for key, value in part.items():
                stats[key] = stats.get(key, 0.0) + value

        for k, d in enumerate(self.config.denoisers):
            stats[f"share/{self.labels[k]}"] = float((choice == k).sum()) / max(B, 1)
            sel = (choice == k).nonzero().squeeze(1)
            if sel.numel() == 0:
                continue
            raw = self.denoiser_raw_length(d, m)
            seg = split_documents(  # index_select: ~3x cheaper than rows[sel, :raw]
                rows[:, :raw].index_select(0, sel),
                document_ids[:, :raw].index_select(0, sel),
                self.specials.pad,
                self._eos(d),
            )
            used -= int((document_ids[:, raw:].index_select(0, sel) >= 0).sum())  # past the denoiser's need
            seg.row = sel[seg.row]  # batch rows from here on
            seg.n_rows = B
            mode = self._mode(d)
            if d.kind == "S":

                def make_s(
                    sub: Segments, d: Denoiser = d, mode: int | None = mode
                ) -> tuple[Pieces, dict[str, float]]:
                    rr = sub.random(seed, row_index)
                    return prefix_pieces(sub, rr, d.noise_density, self.model_kind, self.specials, mode)

                add(*by_length(seg, make_s, self.specials.pad))
                continue
            # R and X rows go through one span-corruption call, with per-document parameters
            n = seg.n
            seg.extra = {
                "density": torch.full((n,), d.noise_density, dtype=torch.float64, device=rows.device),
                "mean_span": torch.full(
                    (n,), d.mean_noise_span_length, dtype=torch.float64, device=rows.device
                ),
                "mode": torch.full((n,), -1 if mode is None else mode, dtype=torch.int64, device=rows.device),
            }
            span_groups[mode is not None].append(seg)

        for has_mode, segs in span_groups.items():
            if not segs:
                continue

            def make(sub: Segments, has_mode: bool = has_mode) -> tuple[Pieces, dict[str, float]]:
                rr = sub.random(seed, row_index)
                x = sub.extra
                mode = x["mode"] if has_mode else None
                return span_pieces(
                    sub, rr, x["density"], x["mean_span"], self.config.random_roll, self.specials, mode
                )

            # documents fit the widths whole or are cut before corruption: no target token is dropped
            group = concat_segments(segs, self.specials.pad)
            x = group.extra
            base = span_need(group, seed, row_index, x["density"], x["mean_span"], self.config.random_roll)

            def need(
                lengths: Tensor, index: Tensor, base=base, head: int = int(has_mode)
            ) -> tuple[Tensor, Tensor]:
                n_in, n_tgt = base(lengths, index)
                return n_in + head, n_tgt

            group, group_used = fit_documents(group, need, widths, self.specials.pad)
            used += group_used - int(sum(int(sg.lengths.sum() + sg.had_eos.sum()) for sg in segs))
            add(*by_length(group, make, self.specials.pad))
        if parts:
            merged = Pieces.merge(parts, self.specials.pad)
        else:
            empty = torch.zeros(0, 1, dtype=torch.int64, device=rows.device)
            none = torch.zeros(0, dtype=torch.int64, device=rows.device)
            merged = Pieces(empty, none, empty, none, none, none)
        batch, truncated = layout(merged, self.model_kind, B, widths, self.specials)
        batch.stats = finish_stats(stats, batch, truncated, merged)
        batch.stats.update(raw_usage(document_ids, used))
        return batch
