"""UL2 mixture of denoisers (Tay et al. 2022): R and X are T5 span corruption with their own
(mean span, rate), S is a prefix LM; a mode token ([NLU], [NLG], [S2S]) leads every input.

Choices, deliberately:
- Weights default to 40% R, 40% X, 20% S (R: 0.2 + 0.2, X: 0.1 x 4, S: 0.2). The paper reports ~20% S
  as a good balance (§4.5, as used by the Finnish-NLP UL2 models); the paper's appendix code and
  llm-foundry fall back to uniform over the 7 denoisers (1/7 S). Set `weight` per denoiser to change it.
- The S-denoiser's mean target fraction is the paper's r = 0.25: the target fraction t is uniform on
  [0, 2r] (on [2r - 1, 1] for r > 0.5), drawn once per example, and every document of the example keeps
  round(1 + t (L - 1)) target tokens (at most L - 1), as llm-foundry's S-denoiser; in distribution this
  is t5's random_prefix_noise_mask at r = 0.25. The UL2 appendix code instead calls T5's `prefix_lm`
  (uniform split, mean 0.5); set S `noise_density: 0.5` for that.
- The denoiser is drawn per *example* from `RowRandom` (seed, global row): every document of an example
  gets its mode token. Decoder-only rows are one example each. Encoder-decoder rows pack a few examples
  (below), as T5X packs a sampled mixture into rows.

Lengths. One example of one denoiser alone, filling a model length of 512 with its mode token
(`denoiser_raw_length`): encoder-decoder (T5's helper at 511 encoder positions; S: mode and EOS) R(3,.15)
567, R(8,.15) 587, X(3,.5) 765, X(8,.5) 906, X(64,.15) 599, X(64,.5) 1004, S 510 raw tokens; section 7's
table (568, 588, 766, 908, 600, 1006) is the helper at 512, without a mode token. Decoder-only
([mode inputs][targets] in 512): 463, 491, 381, 453, 507, 501 and S 511. Decoder-only rows hold the
largest of these (`raw_length`) and each is fed its own denoiser's need (`raw_lengths`).

Encoder-decoder widths. One denoiser per row cannot fill both widths: R makes ~0.2 targets per input, X
at r = 0.5 one, S 0 to 1, so a decoder as wide as the longest target (the encoder) is half padding. So
the decoder is `ceil(target_ratio * m)` wide (0.41 at the defaults: the mixture's expected targets per
input) and each row packs examples (`plan`): denoisers are drawn by weight until the row holds one
input-heavy example (targets per input <= target_ratio) and one target-heavy one, at most
`examples_per_row`; the stop depends only on the draws so far, so each denoiser's share of the
examples is still its weight (Wald's identity; the shares in stats count examples). The example
lengths solve "inputs fill m, targets fill the decoder" (one length per side, at least max(8, m / 16)
raw tokens); a row's raw need is their sum (3.2 examples of ~210 raw tokens per row at m = 512, rather
than one of 567-1004: the cost of filling the decoder). Rows whose draws stay one-sided for all
`examples_per_row` (2.3% at the defaults) fill the tighter side and pad the other.
`examples_per_row: 1` gives one example per row, with the padding that implies.

Documents. Every (example, document) part is corrupted on its own and its lengths follow T5's formula
per document; the parts of a row fit the widths whole or the first that does not is cut before
corruption (`fit_documents`), so no target token is dropped and what a row leaves unused is counted in
`stats["raw_tokens_unused"]`. Measured on the standard library packed at 568 (256 rows, rows fed their
`raw_lengths`): encoder-decoder padding ~1.4% of inputs and ~1.2% of targets, decoder-only 0.02%, raw
text unused ~1.2% and ~0.5%.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from objtrain.batch import Batch
from objtrain.errors import UserError
from objtrain.objectives.base import Objective, raw_usage
from objtrain.objectives.noise import (
    Pieces,
    Segments,
    by_length,
    check_sentinels,
    document_random,
    encdec_batch_flat,
    exclusive_cumsum,
    fit_documents,
    largest_fitting,
    layout,
    length_groups,
    random_span_ends,
    roll_offsets,
    split_documents_at,
)
from objtrain.objectives.prefix_lm import check_prefix_density, split_pieces
from objtrain.objectives.span import (
    check_span_config,
    finish_stats,
    span_need,
    span_output_lengths,
    span_pieces,
    span_raw_length,
)
from objtrain.rng import RowRandom
from objtrain.specials import Specials


@dataclass
class Denoiser:
    kind: Literal["R", "X", "S"] = "R"  # R/X: span corruption; S: prefix LM
    mean_noise_span_length: float = 3.0  # mean span (R/X only)
    noise_density: float = 0.15  # R/X: corruption rate; S: mean target fraction
    weight: float = 1.0  # relative sampling weight
    mode: Literal["nlu", "nlg", "s2s", "none"] = "nlu"  # mode token prepended to the inputs


def default_denoisers() -> list[Denoiser]:
    """The 7 denoisers of the UL2 paper (Tay et al. 2022), weighted 40% R / 40% X / 20% S."""
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


def s_target_lengths_np(lengths: np.ndarray, fraction: np.ndarray) -> np.ndarray:
    """(N,) target length of S-denoised documents with target fractions `fraction` (llm-foundry's
    `round(1 + u (L - 1))`), capped so the prefix keeps a token: both parts non-empty for L >= 2, a
    1-token document is all target, an empty one (a lone EOS) has none."""
    n = np.round(1.0 + fraction * np.maximum(lengths - 1, 0).astype(np.float64)).astype(np.int64)
    n = np.minimum(n, np.maximum(lengths - 1, 1))
    return np.where(lengths >= 1, n, 0)


def s_target_lengths(lengths: Tensor, fraction: Tensor) -> Tensor:
    """`s_target_lengths_np` on tensors."""
    n = s_target_lengths_np(lengths.cpu().numpy(), fraction.cpu().numpy())
    return torch.from_numpy(n).to(lengths.device)


def s_pieces(
    seg: Segments, fraction: Tensor, mode: Tensor | None, model_kind: str, specials: Specials
) -> tuple[Pieces, dict[str, float]]:
    """S-denoise every segment: inputs `[mode] x[:n_in]`, targets `x[n_in:]` (encoder-decoder: + EOS
    each), the split from each segment's target fraction; `mode` (N,) mode tokens or None."""
    pieces, stats = split_pieces(
        seg, seg.lengths - s_target_lengths(seg.lengths, fraction), model_kind, specials, mode
    )
    # both sides trimmed to their longest (views): a merge with span pieces is then no wider than needed
    n = pieces.row.numel()
    pieces.inputs = pieces.inputs[:, : max(int(pieces.input_lengths.max()) if n else 0, 1)]
    pieces.targets = pieces.targets[:, : max(int(pieces.target_lengths.max()) if n else 0, 1)]
    return pieces, stats


@dataclass
class Plan:
    """The examples of a batch of rows, a pure function of (seed, global row, model length)."""

    denoiser: Tensor  # (B, K) int64 denoiser of every example (meaningless past `count`)
    fraction: Tensor  # (B, K) float64 S target fraction of every example
    length: Tensor  # (B, K) int64 raw tokens of every example, 0 past `count`
    count: Tensor  # (B,) int64 examples in the row


class UL2(Objective):
    """Mixture of denoisers; encoder-decoder by default, decoder-only in the [inputs][targets] format."""

    name = "ul2"
    model_kinds = ("encdec", "decoder")
    attention = "bidirectional"
    infills_with_sentinels = True

    @staticmethod
    def s_mode(settings: Mapping[str, Any]) -> str | None:
        """The S denoiser's mode token name ("s2s", or "none") under recorded settings, or None when the
        run had no S denoiser of positive weight."""
        denoisers = settings.get("denoisers")
        if denoisers is None:
            return "s2s"  # the default mixture has one, with [S2S]
        for d in denoisers:
            if isinstance(d, Mapping) and d.get("kind") == "S" and float(d.get("weight", 1.0)) > 0:
                return str(d.get("mode", "s2s"))
        return None

    @classmethod
    def conditions_on_prefix(cls, settings: Mapping[str, Any]) -> bool:
        return cls.s_mode(settings) is not None

    @classmethod
    def mode_token(cls, settings: Mapping[str, Any], layout: Literal["prefix", "span"]) -> str | None:
        name = cls.s_mode(settings) if layout == "prefix" else "nlu"
        return name if name and name != "none" else None

    # encoder-decoder on CPU: corrupt and lay out the real tokens only (`_encdec_flat`); off, or on other
    # devices, padded pieces (`_padded_layout`), the same batch
    flat_layout = True

    @dataclass
    class Config:
        denoisers: list[Denoiser] = field(default_factory=default_denoisers)  # the paper's 7, 40/40/20
        random_roll: bool = False  # rotate R/X span masks by a random offset (t5#905)
        examples_per_row: int = 8  # encoder-decoder: most examples packed in one row (see docstring)

    def setup(self) -> None:
        config = self.config
        self.attention = "bidirectional" if self.model_kind == "encdec" else "prefix"  # type: ignore[misc]
        if not config.denoisers:
            raise UserError("ul2: at least one denoiser is needed")
        if config.examples_per_row < 1:
            raise UserError(f"ul2: examples_per_row must be at least 1, got {config.examples_per_row}")
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
        self.weights = weights / weights.sum()
        self.cumulative = self.weights.cumsum(0)
        self.labels = [denoiser_label(d) for d in config.denoisers]
        self._model_length: dict[int, int] = {}
        f64 = torch.float64
        self.is_s = torch.tensor([d.kind == "S" for d in config.denoisers])
        self.density = torch.tensor([d.noise_density for d in config.denoisers], dtype=f64)
        self.mean_span = torch.tensor([d.mean_noise_span_length for d in config.denoisers], dtype=f64)
        self.mode_ids = torch.tensor([-1 if d.mode == "none" else self._mode(d) for d in config.denoisers])
        # encoder-decoder lengths per raw token: R/X (1 - r + r/mu, r + r/mu); S (1 - t, t), t its fraction
        rate = torch.where(self.is_s, 0.0, self.density / self.mean_span)
        self.in_rate = torch.where(self.is_s, 1.0 - self.density, 1.0 - self.density + rate)
        self.out_rate = torch.where(self.is_s, self.density, self.density + rate)
        # the decoder width per encoder position: the mixture's targets per input (S at its mean fraction)
        self.target_ratio = float((self.weights * self.out_rate).sum() / (self.weights * self.in_rate).sum())
        ratios = self.out_rate / self.in_rate.clamp(min=1e-9)
        self.two_sided = (
            bool(self.is_s[self.weights > 0].any())
            or float(ratios[self.weights > 0].max() - ratios[self.weights > 0].min()) > 1e-9
        )

    def pair_forms(self) -> tuple[str, ...]:
        """Encoder-decoders: the R-denoiser's form (a one-token span behind its mode token); decoders the
        default (causal, an empty prefix)."""
        if self.model_kind != "encdec":
            return super().pair_forms()
        r = [d for d in self.config.denoisers if d.kind == "R"]
        mode = r[0].mode if r else "nlu"
        return ("sentinel_span",) if mode == "none" else (f"span_{mode}",)

    def _mode(self, d: Denoiser) -> int | None:
        return None if d.mode == "none" else int(getattr(self.specials, d.mode))

    def denoiser_raw_length(self, d: Denoiser, model_length: int) -> int:
        """Raw tokens one example of `d` alone needs to fill `model_length` (decoder-only: the whole
        sequence; encoder-decoder: the encoder)."""
        extra = 0 if d.mode == "none" else 1
        if d.kind == "S":
            return model_length - extra - (1 if self.model_kind == "encdec" else 0)
        return span_raw_length(
            model_length, d.noise_density, d.mean_noise_span_length, self.model_kind, extra
        )

    def check_sentinels(self, model_length: int) -> None:
        for d in self.config.denoisers:
            if d.kind != "S":
                raw = self.denoiser_raw_length(d, model_length)
                n_tgt = span_output_lengths(raw, d.noise_density, d.mean_noise_span_length)[1]
                n_noise = round(max(raw, 2) * d.noise_density)
                if n_tgt - 1 - n_noise > self.specials.n_sentinels:
                    raise UserError(
                        f"ul2: denoiser {denoiser_label(d)} needs {n_tgt - 1 - n_noise} sentinels at model "
                        f"length {model_length}, the tokenizer reserves {self.specials.n_sentinels}"
                    )

    def decoder_width(self, model_length: int) -> int:
        """Encoder-decoder: the decoder width, the mixture's targets per input times the model length."""
        return max(2, math.ceil(self.target_ratio * model_length))

    def raw_length(self, model_length: int) -> int:
        """Raw tokens a row can hold (the width of the rows the loader reads; each row is fed its own
        `raw_lengths`): decoder-only, the largest single-denoiser need; encoder-decoder, the encoder plus
        the decoder width, a bound on what a row's examples can need (every denoiser makes at least one
        input or target position per raw token)."""
        if model_length < 8:
            raise UserError(f"ul2: model length must be at least 8, got {model_length}")
        self.check_sentinels(model_length)
        return self._raw_length(model_length)

    def _raw_length(self, model_length: int) -> int:
        """`raw_length` without the checks (the bisection in `model_length` probes longer lengths)."""
        if self.model_kind == "encdec":
            return model_length + self.decoder_width(model_length)
        return max(self.denoiser_raw_length(d, model_length) for d in self.config.denoisers)

    def raw_lengths(self, model_length: int, row_index: Tensor, seed: int) -> Tensor:
        """Each row's own need: the summed raw lengths of its examples (see `plan`), the same plan
        `__call__` makes, so no row is fed more than its examples use."""
        self.raw_length(model_length)  # checks the length and the sentinel budget
        return self.plan(model_length, row_index, seed).length.sum(1)

    def model_length(self, raw_length: int) -> int:
        """The model length whose rows need `raw_length` raw tokens (largest m with raw_length(m) <= L)."""
        if raw_length not in self._model_length:
            m = largest_fitting(raw_length, self._raw_length, start=8)
            if m < 8:
                raise UserError(f"ul2: rows of {raw_length} raw tokens are too short")
            self.check_sentinels(m)
            self._model_length[raw_length] = m
        return self._model_length[raw_length]

    def widths(self, raw_length: int) -> tuple[int, int]:
        m = self.model_length(raw_length)
        if self.model_kind != "encdec":
            return m, 0
        return m, self.decoder_width(m)

    def choose(self, row_index: Tensor, seed: int) -> Tensor:
        """(B,) denoiser of each row's first example, a pure function of (seed, global row)."""
        u = RowRandom(seed, row_index).scalar("ul2/denoiser")
        return torch.searchsorted(self.cumulative, u, right=True).clamp(max=len(self.config.denoisers) - 1)

    def plan(self, model_length: int, row_index: Tensor, seed: int) -> Plan:
        """The examples of every row, from (seed, global row, model length) only.

        Denoisers are drawn i.i.d. by weight (the first is `choose`'s), and an S example's target
        fraction with them (uniform on [0, 2r], or [2r - 1, 1] for r > 0.5). Decoder-only: one example
        per row, of its denoiser's own raw length. Encoder-decoder: examples are drawn until the row holds
        one whose targets per input are at most the decoder's ratio (input-heavy, as R) and one above it
        (target-heavy, as X at r = 0.5), at most `examples_per_row`; the stop depends only on the draws
        so far, so each denoiser's share of the examples is its weight (Wald's identity). The lengths
        then solve the two linear equations "inputs fill the encoder, targets fill the decoder", every
        input-heavy example at one length and every target-heavy one at another.
        """
        # numpy: ~60 ops on (B, K) values, each far cheaper than a torch op; the float sums stay torch's
        # (its reduction order), so the lengths are bit for bit those of the tensor arithmetic
        m = model_length
        n_den = len(self.config.denoisers)
        K = self.config.examples_per_row if self.model_kind == "encdec" else 1
        rr = RowRandom(seed, row_index)
        u = rr.uniform64(K, "ul2/denoiser").numpy()
        k = np.minimum(np.searchsorted(self.cumulative.numpy(), u, side="right"), n_den - 1)
        is_s = self.is_s.numpy()[k]
        r = self.density.numpy()[k]
        f = rr.uniform64(K, "ul2/s_fraction").numpy()
        fraction = np.where(r <= 0.5, 2.0 * r * f, 2.0 * r - 1.0 + (2.0 - 2.0 * r) * f)
        fraction = np.where(is_s, fraction, 0.0)
        B = row_index.numel()
        if self.model_kind != "encdec":
            needs = np.array([self.denoiser_raw_length(d, m) for d in self.config.denoisers], dtype=np.int64)
            return Plan(
                torch.from_numpy(k),
                torch.from_numpy(fraction),
                torch.from_numpy(needs[k]),
                torch.ones(B, dtype=torch.int64),
            )
        a = np.where(is_s, 1.0 - fraction, self.in_rate.numpy()[k])  # inputs per raw token
        b = np.where(is_s, fraction, self.out_rate.numpy()[k])  # targets per raw token
        head = 1.0 + (self.mode_ids.numpy()[k] >= 0)  # EOS and mode token
        D = self.decoder_width(m)
        heavy_in = b <= self.target_ratio * a
        i = np.arange(K)[None, :]
        both = (np.cumsum(heavy_in, 1) > 0) & (np.cumsum(~heavy_in, 1) > 0)
        first = np.where(both, i, K).min(1)
        count = np.minimum(first + 1, K) if self.two_sided else np.ones(B, dtype=np.int64)
        valid = i < count[:, None]

        def row_sum(x: np.ndarray) -> np.ndarray:
            return torch.from_numpy(x).sum(1).numpy()

        room_e = m - row_sum(head * valid)
        room_d = D - valid.sum(1).astype(np.float64)
        ga, gb = valid & heavy_in, valid & ~heavy_in
        a_in, b_in = row_sum(a * ga), row_sum(b * ga)
        a_tg, b_tg = row_sum(a * gb), row_sum(b * gb)
        shortest = max(8.0, m / 16)
        det = np.maximum(a_in * b_tg - a_tg * b_in, 1e-12)
        s_in = (room_e * b_tg - room_d * a_tg) / det
        s_tg = (room_d * a_in - room_e * b_in) / det
        one_sided = (ga.sum(1) == 0) | (gb.sum(1) == 0)
        tiny = 1e-12
        # one group only: one length, the longest that fits both sides
        s_one = np.minimum(room_e / np.maximum(a_in + a_tg, tiny), room_d / np.maximum(b_in + b_tg, tiny))
        # a length below the shortest example: that group at the shortest, the other fills what is left
        low_in = ~one_sided & (s_in < shortest)
        low_tg = ~one_sided & ~low_in & (s_tg < shortest)
        fill_tg = np.minimum(
            (room_e - a_in * shortest) / np.maximum(a_tg, tiny),
            (room_d - b_in * shortest) / np.maximum(b_tg, tiny),
        )
        fill_in = np.minimum(
            (room_e - a_tg * shortest) / np.maximum(a_in, tiny),
            (room_d - b_tg * shortest) / np.maximum(b_in, tiny),
        )
        s_in, s_tg = (
            np.where(one_sided, s_one, np.where(low_in, shortest, np.where(low_tg, fill_in, s_in))),
            np.where(one_sided, s_one, np.where(low_in, fill_tg, np.where(low_tg, shortest, s_tg))),
        )
        scale = np.where(heavy_in, s_in[:, None], s_tg[:, None])
        length = np.where(valid, np.floor(np.maximum(scale, 1.0)).astype(np.int64), 0)
        # a row never needs more than it holds: at short model lengths the shortest example times the
        # examples drawn can pass the row's width (the loader would skip the excess unread), so the last
        # examples take the room left, and those left none are not made
        before = np.cumsum(length, 1) - length
        length = np.minimum(length, np.maximum(self._raw_length(m) - before, 0))
        count = np.minimum(count, (length > 0).sum(1))
        return Plan(
            torch.from_numpy(k), torch.from_numpy(fraction), torch.from_numpy(length), torch.from_numpy(count)
        )

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        B, L = rows.shape
        device = rows.device
        m = self.model_length(L)
        widths = self.widths(L)
        plan = self.plan(m, row_index, seed)
        K = plan.length.size(1)
        bounds = plan.length.cumsum(1)
        # (B, L) example of every raw position: how many example ends lie at or before it (a cumsum of
        # marks at the ends, cheaper than a searchsorted per position)
        marks = torch.zeros(B, L + 1, dtype=torch.int64, device=device)
        marks.scatter_add_(1, bounds.clamp(max=L), torch.ones_like(bounds))
        example = marks[:, :L].cumsum(1)
        real = document_ids >= 0
        read = real & (example < plan.count[:, None])
        # every (example, document) part is a document of its own; positions past the plan are not read
        key = torch.where(
            read, document_ids * K + example.clamp(max=K - 1), torch.full_like(document_ids, -1)
        )
        # the flat layout reads every document from the rows at its start: no padded copy of the tokens
        flat = self.model_kind == "encdec" and self.flat_layout and device.type == "cpu"
        seg, flat_start = split_documents_at(
            rows, key, self.specials.pad, self.specials.eos, with_tokens=not flat
        )
        seg_example = example.reshape(-1)[flat_start]
        k = plan.denoiser[seg.row, seg_example]
        is_s = self.is_s[k]
        if self.model_kind == "decoder" and seg.had_eos is not None and bool((is_s & seg.had_eos).any()):
            # decoder-only S: the document's own EOS is an ordinary target token (as prefix_lm's)
            back = is_s & seg.had_eos
            tokens = seg.tokens.clone()
            if int(seg.lengths.max()) >= tokens.size(1):
                tokens = torch.nn.functional.pad(tokens, (0, 1), value=self.specials.pad)
            idx = back.nonzero().squeeze(1)
            tokens[idx, seg.lengths[idx]] = self.specials.eos
            seg = Segments(tokens, seg.lengths + back.long(), seg.row, seg.doc, B, seg.had_eos & ~back)
        seg.extra = {
            "density": self.density[k],
            "mean_span": self.mean_span[k],
            "mode": self.mode_ids[k],
            "is_s": is_s,
            "fraction": plan.fraction[seg.row, seg_example],
            "denoiser": k,
        }
        if flat:
            seg.extra["start"] = flat_start
        x = seg.extra
        span_need_fn = span_need(seg, seed, row_index, x["density"], x["mean_span"], self.config.random_roll)
        encdec = self.model_kind == "encdec"
        mode_tokens = (x["mode"] >= 0).long().cpu().numpy()  # 1 where the example gets a mode token
        fraction = x["fraction"].cpu().numpy()
        is_s_np = x["is_s"].cpu().numpy()

        def need(lengths: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            n_in, n_tgt = span_need_fn(lengths, index)
            s_tgt = s_target_lengths_np(lengths, fraction[index])
            s_in = lengths - s_tgt
            if encdec:
                s_in, s_tgt = s_in + (lengths >= 0), s_tgt + 1
            s_side = is_s_np[index]
            return np.where(s_side, s_in, n_in) + mode_tokens[index], np.where(s_side, s_tgt, n_tgt)

        # documents fit the widths whole or are cut before corruption: no target token is dropped
        seg, used = fit_documents(seg, need, widths, self.specials.pad)
        x = seg.extra
        stats: dict[str, float] = {}
        examples = torch.arange(K, device=device)[None, :] < plan.count[:, None]
        per_denoiser = torch.bincount(plan.denoiser[examples], minlength=len(self.labels)).tolist()
        n_examples = sum(per_denoiser)
        for label, count in zip(self.labels, per_denoiser, strict=True):
            stats[f"share/{label}"] = float(count) / max(n_examples, 1)
        stats["examples"] = float(n_examples)

        if flat:
            batch, truncated, made = self._encdec_flat(seg, rows, seed, row_index, widths, stats)
        else:
            batch, truncated, made = self._padded_layout(seg, seed, row_index, widths, stats)
        batch.stats = finish_stats(stats, batch, truncated, targets_made=made)
        # fed but unused: past the plan (rows read at a fixed width), and what the fit left out
        batch.stats.update(raw_usage(document_ids, used))
        return batch

    def _padded_layout(
        self, seg: Segments, seed: int, row_index: Tensor, widths: tuple[int, int], stats: dict[str, float]
    ) -> tuple[Batch, int, int]:
        """Corrupt the fitted segments as padded pieces, one group per (kind, has mode) and length, and lay
        them out. Adds the corruption stats to `stats`; returns the batch, the truncated count and the
        targets made."""
        x = seg.extra
        parts: list[Pieces] = []

        def add(pieces: Pieces, part: dict[str, float]) -> None:
            parts.append(pieces)
            for key_, value in part.items():
                stats[key_] = stats.get(key_, 0.0) + value

        for s_kind in (False, True):
            for has_mode in (True, False):
                pick = (x["is_s"] == s_kind) & ((x["mode"] >= 0) == has_mode)
                if not bool(pick.any()):
                    continue
                sub = seg.select(pick.nonzero().squeeze(1))

                def make(
                    part: Segments, s_kind: bool = s_kind, has_mode: bool = has_mode
                ) -> tuple[Pieces, dict[str, float]]:
                    px = part.extra
                    mode = px["mode"] if has_mode else None
                    if s_kind:
                        return s_pieces(part, px["fraction"], mode, self.model_kind, self.specials)
                    rr = part.random(seed, row_index)
                    return span_pieces(
                        part, rr, px["density"], px["mean_span"], self.config.random_roll, self.specials, mode
                    )

                add(*by_length(sub, make, self.specials.pad))
        if parts:
            merged = Pieces.merge(parts, self.specials.pad)
        else:
            device = seg.lengths.device
            empty = torch.zeros(0, 1, dtype=torch.int64, device=device)
            none = torch.zeros(0, dtype=torch.int64, device=device)
            merged = Pieces(empty, none, empty, none, none, none)
        batch, truncated = layout(merged, self.model_kind, seg.n_rows, widths, self.specials)
        return batch, truncated, int(merged.target_lengths.sum())

    def _encdec_flat(
        self,
        seg: Segments,
        rows: Tensor,
        seed: int,
        row_index: Tensor,
        widths: tuple[int, int],
        stats: dict[str, float],
    ) -> tuple[Batch, int, int]:
        """Encoder-decoder corruption and layout of the fitted segments over their real tokens only, on
        CPU: what `s_pieces` and `span_pieces`, `Pieces.merge` and `encdec_batch` make, bit for bit,
        without the padded (N, W) pieces (a row's S and span examples differ in length by ~2x, and its
        longest part sets every piece's width). Adds the corruption stats to `stats`; returns the batch,
        the truncated count and the targets made."""
        sp = self.specials
        x = seg.extra
        lengths = seg.lengths.numpy()
        n = lengths.size
        is_s = x["is_s"].numpy()
        mode = x["mode"].numpy()
        head = (mode >= 0).astype(np.int64)
        # every real token, segment after segment, read from the rows at the segment's start (`flat_start`
        # in `extra`): numpy over ~40k values (a few dozen ops)
        seg_of = np.repeat(np.arange(n), lengths)
        pos = np.arange(seg_of.size) - exclusive_cumsum(lengths)[seg_of]
        tokens = rows.reshape(-1).numpy()[x["start"].numpy()[seg_of] + pos]
        # a token is noise when it is a target: S, past the prefix; R/X, under its span mask
        n_prefix = lengths - s_target_lengths_np(lengths, x["fraction"].numpy())
        noise = pos >= np.where(is_s, n_prefix, lengths)[seg_of]
        span = np.flatnonzero(~is_s)
        if span.size:
            # R/X masks from their span boundaries: a boundary flips noise on or off, and a segment that
            # ends inside noise flips it back at its end, so the flat parity starts every segment kept
            first = exclusive_cumsum(lengths)
            flips, offset = [], np.zeros(n, dtype=np.int64)
            for group in length_groups(lengths[span]):  # keys padded to the group's longest only
                idx = span[group]
                it = torch.from_numpy(idx)
                rr = document_random(seed, row_index, seg.row[it], seg.doc[it])
                density, mean = x["density"][it], x["mean_span"][it]
                ends = random_span_ends(seg.lengths[it], density, mean, rr, "span/mask").numpy()
                inside = ends < lengths[idx][:, None]
                flips.append((first[idx][:, None] + ends)[inside])
                flips.append((first[idx] + lengths[idx])[inside.sum(1) % 2 == 1])
                if self.config.random_roll:
                    offset[idx] = roll_offsets(seg.lengths[it], rr, "span/mask").numpy()[:, 0]
            masked = np.cumsum(np.bincount(np.concatenate(flips), minlength=tokens.size + 1)[:-1]) % 2 == 1
            if self.config.random_roll:  # token j of a segment reads the unrolled mask at (j - offset) mod L
                masked = masked[first[seg_of] + (pos - offset[seg_of]) % np.maximum(lengths, 1)[seg_of]]
            noise |= masked
        # span starts: noise after a kept token or at its segment's start (S targets are no spans)
        start = noise & ~is_s[seg_of]
        start[1:] &= ~noise[:-1] | (pos[1:] == 0)
        at = np.flatnonzero(start)
        spans = np.bincount(seg_of[at], minlength=n)
        check_sentinels(torch.from_numpy(spans), sp, "span corruption")
        sentinels = sp.sentinel_base - (np.arange(at.size) - exclusive_cumsum(spans)[seg_of[at]])
        # inputs `[mode] kept S0 kept S1 ... </s>`: every kept token, a span's first token as its sentinel
        values = tokens.copy()
        values[at] = sentinels
        kept = np.flatnonzero(~noise | start)
        n_body = np.bincount(seg_of[kept], minlength=n)
        n_in = n_body + head + 1
        in_start = exclusive_cumsum(n_in)
        inputs = np.empty(int(n_in.sum()), dtype=tokens.dtype)
        shift = in_start - exclusive_cumsum(n_body) + head
        inputs[np.arange(kept.size) + shift[seg_of[kept]]] = values[kept]
        inputs[in_start[head > 0]] = mode[head > 0]
        inputs[in_start + n_in - 1] = sp.eos
        # targets `S0 noise S1 noise ... </s>`: a noise token lands after the noise tokens, sentinels and
        # EOS tokens before it
        noisy = np.flatnonzero(noise)
        n_noise = np.bincount(seg_of[noisy], minlength=n)
        n_tgt = n_noise + spans + 1
        targets = np.empty(int(n_tgt.sum()), dtype=tokens.dtype)
        slot = np.arange(noisy.size) + np.cumsum(start)[noisy] + seg_of[noisy]
        targets[slot] = tokens[noisy]
        targets[slot[start[noisy]] - 1] = sentinels
        targets[np.cumsum(n_tgt) - 1] = sp.eos

        def add(part: dict[str, float]) -> None:
            for key, value in part.items():
                stats[key] = stats.get(key, 0.0) + value

        if span.size:
            add(
                {
                    "documents": float(span.size),
                    "raw_tokens": float(lengths[span].sum()),
                    "noise_tokens": float(n_noise[span].sum()),
                    "spans": float(at.size),
                }
            )
        if span.size < n:
            s = np.flatnonzero(is_s)
            add(
                {
                    "documents": float(s.size),
                    "raw_tokens": float(lengths[s].sum()),
                    "prefix_tokens": float(n_prefix[s].sum()),
                    "suffix_tokens": float((lengths[s] - n_prefix[s]).sum()),
                }
            )
        batch, truncated = encdec_batch_flat(
            seg.row.numpy(), seg.doc.numpy(), inputs, n_in, targets, n_tgt, seg.n_rows, *widths, sp
        )
        return batch, truncated, int(n_tgt.sum())
