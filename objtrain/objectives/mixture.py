"""A mixture of objectives: every row is given to one component, drawn by weight from `RowRandom`.

This is how blends are built: CLM + FIM at a rate, CLM + prefix LM, span + prefix LM (T5-style), ...
The component is a pure function of (seed, global row), so a row's transform does not depend on the
batch size or on which other rows share its batch.

Layout: components must share a model kind (the mixture trains the intersection of their kinds) and
the token loss (objectives with their own heads, such as NSP or MTP, are refused). Their batches are
padded to common widths: the widest any component produces for this row length, found once per row
length by running each component on an empty batch. When the components use different attention
patterns the merged batch is "prefix" with an explicit `prefix_mask`: causal rows get all False,
bidirectional rows all True, prefix rows keep theirs.

Row lengths: the mixture's `raw_length(m)` (the width of the rows read) is the largest of its
components'; each row is fed its own component's `raw_lengths` (the loader streams exactly that many
tokens, the rest of the row is padding), and a component that needs fewer raw tokens gets the first
`raw_length_c(m)` positions of each of its rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import MODEL_KINDS, Batch, ModelKind
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.objectives.base import Objective, Recorded, raw_usage
from objtrain.objectives.noise import largest_fitting
from objtrain.objectives.registry import build_objective, find_class, objective_class
from objtrain.rng import RowRandom
from objtrain.specials import Specials

_PAD_VALUES: dict[str, int | bool] = {
    "input_ids": 0,
    "labels": IGNORE,
    "positions": 0,
    "document_ids": -1,
    "prefix_mask": False,
    "segment_ids": 0,
    "decoder_input_ids": 0,
    "decoder_positions": 0,
    "decoder_document_ids": -1,
}
_ENCODER_FIELDS = ("input_ids", "positions", "document_ids", "prefix_mask", "segment_ids")
_DECODER_FIELDS = ("decoder_input_ids", "decoder_positions", "decoder_document_ids")


def default_components() -> list[dict[str, Any]]:
    return [{"objective": "span", "weight": 0.5}, {"objective": "prefix_lm", "weight": 0.5}]


def shared_kinds(names: list[str]) -> tuple[ModelKind, ...]:
    """The model kinds every one of the objectives `names` trains, in the first one's order."""
    kinds = [objective_class(n).model_kinds for n in names]
    return tuple(k for k in kinds[0] if all(k in ks for ks in kinds))


def _width(batch: Batch, name: str) -> int:
    value = getattr(batch, name)
    return int(value.size(-1)) if isinstance(value, Tensor) else 0


class Mixture(Objective):
    """Per-row mixture of configured objectives."""

    name = "mixture"
    model_kinds = MODEL_KINDS
    attention = "prefix"

    @dataclass
    class Config:
        # each: {objective: <name>, weight: <float>, any of that objective's keys as overrides}
        components: list[dict[str, Any]] = field(default_factory=default_components)

    @classmethod
    def model_kinds_of(cls, config: Any) -> tuple[ModelKind, ...]:
        """The kinds its components share, first as the mixture itself picks (none: the components are
        malformed or share no kind, which building the mixture reports)."""
        return shared_kinds([c["objective"] for c in config.components])

    @classmethod
    def recorded_components(cls, settings: Mapping[str, Any]) -> list[Recorded]:
        """Its components as recorded (the default ones when the record lists none), each with its own
        settings; a component of another version's name is left out."""
        out: list[Recorded] = []
        for component in settings.get("components") or default_components():
            if isinstance(component, Mapping) and (found := find_class(component.get("objective"))):
                out.append((found, {k: v for k, v in component.items() if k not in ("objective", "weight")}))
        return out

    def __init__(
        self,
        config: Config,
        specials: Specials,
        tokenizer: Tokenizer | None = None,
        model_kind: ModelKind | None = None,
    ) -> None:
        if not config.components:
            raise UserError("mixture: `components` is empty")
        names, weights, overrides = [], [], []
        for i, comp in enumerate(config.components):
            if not isinstance(comp, dict) or "objective" not in comp:
                raise UserError(f"mixture: component {i} needs an `objective` name")
            rest = {k: v for k, v in comp.items() if k not in ("objective", "weight")}
            name = comp["objective"]
            if name == "mixture":
                raise UserError("mixture: a mixture cannot contain a mixture; list its components instead")
            weight = comp.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0:
                raise UserError(f"mixture: component {i} ({name}) needs a non-negative numeric weight")
            names.append(name)
            weights.append(float(weight))
            overrides.append(rest)
        if sum(weights) <= 0:
            raise UserError("mixture: the component weights sum to zero")
        shared = shared_kinds(names)
        if not shared:
            kinds = [objective_class(n).model_kinds for n in names]
            described = "; ".join(f"{n}: {', '.join(k)}" for n, k in zip(names, kinds, strict=True))
            raise UserError(f"mixture: the components share no model kind ({described})")
        self.model_kinds = shared  # type: ignore[misc]
        super().__init__(config, specials, tokenizer=tokenizer, model_kind=model_kind)
        self.components: list[Objective] = [
            build_objective(n, specials, tokenizer=tokenizer, model_kind=self.model_kind, overrides=o)
            for n, o in zip(names, overrides, strict=True)
        ]
        for n, comp in zip(names, self.components, strict=True):
            if type(comp).loss is not Objective.loss:
                raise UserError(f"mixture: {n} has its own loss and heads; only token-loss objectives mix")
        self.labels = [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]
        w = torch.tensor(weights, dtype=torch.float64)
        self.cumulative = (w / w.sum()).cumsum(0)
        patterns = {comp.attention for comp in self.components}
        self.attention = patterns.pop() if len(patterns) == 1 else "prefix"  # type: ignore[misc]
        self._widths: dict[int, tuple[int, int]] = {}
        self._model_length: dict[int, int] = {}

    def pair_forms(self) -> tuple[str, ...]:
        """Every component's minimal-pair forms, in component order, each once."""
        return tuple(dict.fromkeys(f for comp in self.components for f in comp.pair_forms()))

    def raw_length(self, model_length: int) -> int:
        return max(comp.raw_length(model_length) for comp in self.components)

    def raw_lengths(self, model_length: int, row_index: Tensor, seed: int) -> Tensor:
        """Each row's own component's need (`Objective.raw_lengths`), not the largest component's: a row
        given to a component that needs fewer raw tokens is fed only those, so no mixture weights leave
        the rest of the row unread (span's 568 against prefix LM's 511 wasted ~5% at 512)."""
        choice = self.choose(row_index, seed)
        needs = torch.zeros_like(row_index, dtype=torch.int64)
        for k, comp in enumerate(self.components):
            sel = (choice == k).nonzero().squeeze(1)
            if sel.numel():
                needs[sel] = comp.raw_lengths(model_length, row_index[sel], seed)
        return needs

    def model_length(self, raw_length: int) -> int:
        """Largest model length whose rows fit in `raw_length` raw tokens (cached per row length)."""
        if raw_length not in self._model_length:
            m = largest_fitting(raw_length, self.raw_length, start=8)
            if m < 8:
                raise UserError(f"mixture: rows of {raw_length} raw tokens are too short")
            self._model_length[raw_length] = m
        return self._model_length[raw_length]

    def _component_raw(self, raw_length: int) -> list[int]:
        m = self.model_length(raw_length)
        return [min(comp.raw_length(m), raw_length) for comp in self.components]

    def widths(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> tuple[int, int]:
        """(encoder or decoder-only, decoder) widths for this row length: each component on 0 rows."""
        L = rows.size(1)
        if L not in self._widths:
            enc = dec = 0
            for comp, raw in zip(self.components, self._component_raw(L), strict=True):
                probe = comp(rows[:0, :raw], document_ids[:0, :raw], row_index[:0], seed)
                enc = max(enc, _width(probe, "input_ids"))
                dec = max(dec, _width(probe, "decoder_input_ids"))
            self._widths[L] = (enc, dec)
        return self._widths[L]

    def choose(self, row_index: Tensor, seed: int) -> Tensor:
        """(B,) component of each row, a pure function of (seed, global row)."""
        u = RowRandom(seed, row_index).scalar("mixture/component")
        return torch.searchsorted(self.cumulative, u, right=True).clamp(max=len(self.components) - 1)

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        B, L = rows.shape
        enc_w, dec_w = self.widths(rows, document_ids, row_index, seed)
        raws = self._component_raw(L)
        choice = self.choose(row_index, seed)
        parts: list[tuple[Tensor, Batch]] = []
        stats: dict[str, float] = {}
        for k, comp in enumerate(self.components):
            sel = (choice == k).nonzero().squeeze(1)
            stats[f"share/{self.labels[k]}"] = float(sel.numel()) / max(B, 1)
            if sel.numel() == 0:
                continue
            part = comp(  # index_select: ~3x cheaper than rows[sel, :raw]
                rows[:, : raws[k]].index_select(0, sel),
                document_ids[:, : raws[k]].index_select(0, sel),
                row_index[sel],
                seed,
            )
            parts.append((sel, part))
            for key, value in part.stats.items():
                stats[f"{self.labels[k]}/{key}"] = value
        if not parts:  # an empty batch: lay out the first component's empty output
            parts.append(
                (
                    choice[:0],
                    self.components[0](rows[:0, : raws[0]], document_ids[:0, : raws[0]], row_index[:0], seed),
                )
            )
        batch = self._merge(parts, B, enc_w, dec_w)
        usage = [(p.stats.get("raw_tokens_fed"), p.stats.get("raw_tokens_unused")) for _, p in parts]
        if all(fed is not None and unused is not None for fed, unused in usage):
            # a component reads the first raws[k] tokens of its rows: the rest of the row is unused too
            used = sum(float(fed) - float(unused) for fed, unused in usage)  # type: ignore[arg-type]
            stats.update(raw_usage(document_ids, used))
        batch.stats = stats
        return batch

    def _merge(self, parts: list[tuple[Tensor, Batch]], B: int, enc_w: int, dec_w: int) -> Batch:
        fields: dict[str, Tensor] = {}
        if self.attention == "prefix":
            for _, part in parts:
                if part.prefix_mask is None:
                    full = part.attention == "bidirectional"
                    part.prefix_mask = torch.full_like(part.input_ids, full, dtype=torch.bool)
        names = [
            n for n in (*_ENCODER_FIELDS, "labels", *_DECODER_FIELDS) if getattr(parts[0][1], n) is not None
        ]
        for name in names:
            if any(getattr(part, name) is None for _, part in parts):
                raise UserError(f"mixture: components disagree on whether batches have {name}")
            decoder_side = name in _DECODER_FIELDS or (name == "labels" and parts[0][1].is_encdec)
            width = dec_w if decoder_side else enc_w
            first = getattr(parts[0][1], name)
            out = torch.full((B, width), _PAD_VALUES[name], dtype=first.dtype, device=first.device)
            for sel, part in parts:
                value = getattr(part, name)
                if value.size(1) > width:
                    raise UserError(
                        f"mixture: a component made {name} wider ({value.size(1)}) than its probe"
                    )
                out[:, : value.size(1)].index_copy_(0, sel, value)  # cheaper than out[sel, :w] = value
            fields[name] = out
        for _, part in parts:
            if part.seq_labels is not None or part.mtp_labels is not None:
                raise UserError("mixture: components with sequence or MTP labels cannot be mixed")
        return Batch(attention=self.attention, **fields)  # type: ignore[arg-type]
