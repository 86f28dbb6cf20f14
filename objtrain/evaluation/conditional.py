"""Conditional bits per byte: the second half of a held-out document given its first half, every model in its
own form (the fair form is conditional: UL2 and T5 score a target given its input, Tay et al. 2022, Raffel
et al. 2020).

Left-to-right bits per byte charges an encoder-decoder for text it never learnt to write without an input
(its encoder reads one EOS), and a prefix LM for a prefix it never had; conditional scoring asks every
generating model the same question, in the layout it was trained on:

- decoder (CLM, MTP head 1, ...): `first second`, causal; the first half's last token predicts the second's
  first token, as a document starts in training (no context token before it);
- prefix LM (decoder-only prefix_lm, a mixture with a prefix-LM component, UL2's S denoiser): `[mode] first`
  as the bidirectional prefix, `second` read on from it;
- FIM decoder, its own order with an empty suffix: PSM `<PRE> first <SUF> <MID> second`, SPM
  `<PRE> <SUF> <MID> first second`;
- span models (T5 span corruption; UL2 without an S denoiser): the second half as one span at the end, encoder
  (or bidirectional prefix) `[mode] first <extra_id_0> </s>`, target `<extra_id_0> second`;
- encoder-decoder prefix LM (prefix_lm, UL2's S, a mixture with either): encoder `[mode] first </s>`, decoder
  `second`, as T5's prefix_lm layout;
- BART: encoder `first <mask> </s>` (text infilling of the rest), decoder `first second`: the first half is
  reconstructed, only the second is scored.
Encoders (MLM, NSP, SOP, ...) generate nothing left to right and get no score.

Documents and split. Windows of the evaluated split's documents with at least `MIN_TOKENS` tokens, at most
`conditional_docs` of them, taken a window of each document in turn: a document no longer than the row
budget (`seq_len - 4`, the same for every model kind, so that arms at one row length score the same text) is
one window; a longer one is cut into disjoint windows of exactly that many tokens, each starting at a word,
the first at an offset drawn under the eval seed. So a held-out split of a few books is scored on hundreds of
windows, not on one window a book (seven windows of 63 tokens for the prose store's held-out books before).
The split point is a token that starts a word (a piece that begins with a space, or any piece after
whitespace) in the middle fifth of the window (40% to 60% of its tokens), drawn under the eval seed, so both
halves are whole words and a model that encodes the halves apart (FIM) sees the tokens the whole text has.
Draws use `numpy.random.default_rng((seed, document index))`: a document's windows and splits do not depend
on how many others are scored.

Bytes are the UTF-8 bytes of the second half's text (each token's bytes, the word marker as one space), the
scored tokens exactly; the trailing stop token is not scored (it has no bytes). The result is a ratio of
corpus sums with its standard error over documents (delta method), and per-document nats and bytes with
`units` for paired comparisons.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from objtrain.data.tokenizer import Tokenizer
from objtrain.evaluation.infill import infill_mode
from objtrain.evaluation.middle import Scored, ratio_se, score, units_of
from objtrain.objectives.registry import recorded_parts
from objtrain.specials import Specials

MIN_TOKENS = 8  # shorter documents leave halves of a token or two: skipped
OVERHEAD = 4  # row positions kept for the layouts' sentinels, mode token and EOS (same for every kind)


def conditional_mode(kind: str, training: Mapping[str, Any]) -> str:
    """The layout a model is scored in (see the module docstring): causal, prefix, fim-psm, fim-spm, sentinel,
    encoder-input, bart, or none (encoders). The recorded objectives say which
    (`Objective.conditions_on_prefix`, `Objective.rebuilds_input`, `Objective.infill_form`); a mixture asks
    its components."""
    if kind == "encoder":
        return "none"
    parts = recorded_parts(training)
    prefix = any(cls.conditions_on_prefix(settings) for cls, settings in parts)
    if kind == "encdec":
        if prefix:
            return "encoder-input"
        return "bart" if any(cls.rebuilds_input for cls, _ in parts) else "sentinel"
    if prefix:
        return "prefix"
    mode = infill_mode(kind, dict(training))
    return mode if mode in ("fim-psm", "fim-spm", "sentinel") else "causal"


def _lead(training: Mapping[str, Any], specials: Specials, mode: str) -> list[int]:
    """The mode token the model reads first (`Objective.mode_token`: UL2's S denoiser's in the prefix
    layouts, [NLU] for spans), or none."""
    layout = "prefix" if mode in ("prefix", "encoder-input") else "span"
    for cls, settings in recorded_parts(training):
        name = cls.mode_token(settings, layout)
        if name:
            return [int(getattr(specials, name))]
    return []


def split_documents(
    documents: Sequence[np.ndarray], tokenizer: Tokenizer, seed: int, budget: int, limit: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(first, second) token halves of at most `limit` windows of the documents with at least MIN_TOKENS
    tokens, taken a window of each document in turn (module docstring)."""
    begins, ends = (t.numpy() for t in tokenizer.word_boundary_tables)
    per_document: list[list[tuple[np.ndarray, np.ndarray]]] = []
    for index, doc in enumerate(documents):
        doc = np.asarray(doc, dtype=np.int64)
        if len(doc) < MIN_TOKENS:
            continue
        rng = np.random.default_rng((seed, index))
        starts = np.ones(len(doc), dtype=bool)  # token t starts a word
        starts[1:] = begins[doc[1:]] | ends[doc[:-1]]
        windows = []
        if len(doc) <= budget:
            windows.append((doc, starts))
        else:
            # disjoint windows of `budget` tokens, each from a word start, the first at a drawn offset
            at = int(rng.integers(0, min(budget, len(doc) - budget) + 1))
            word_at, last = np.flatnonzero(starts), len(doc) - budget  # a window starts at or before last
            while (i := int(np.searchsorted(word_at, at))) < len(word_at) and word_at[i] <= last:
                at = int(word_at[i])  # the first word start at or after `at`
                windows.append((doc[at : at + budget], starts[at : at + budget]))
                at += budget
        halves = []
        for window, window_starts in windows:
            n = len(window)
            lo, hi = max(1, round(0.4 * n)), min(n - 1, round(0.6 * n))
            cuts = lo + np.flatnonzero(window_starts[lo : hi + 1])
            cut = int(rng.choice(cuts)) if len(cuts) else n // 2
            halves.append((window[:cut], window[cut:]))
        per_document.append(halves)
    # a window of each document in turn: a few long documents (books) give many windows, many short ones
    # (source files) one each, and `limit` reads as many documents as it can
    out: list[tuple[np.ndarray, np.ndarray]] = []
    for turn in range(max((len(h) for h in per_document), default=0)):
        for halves in per_document:
            if turn < len(halves) and len(out) < limit:
                out.append(halves[turn])
    return out


Layout = Callable[[list[int], list[int], Specials, list[int], int], Scored]


def _causal(first: list[int], second: list[int], s: Specials, lead: list[int], start: int) -> Scored:
    return Scored([*first, *second], len(first) - 1, len(first) + len(second) - 1)


def _prefix(first: list[int], second: list[int], s: Specials, lead: list[int], start: int) -> Scored:
    ids = [*lead, *first, *second]
    head = len(lead) + len(first)
    return Scored(ids, head - 1, head + len(second) - 1, prefix_len=head)


def _fim(spm: bool) -> Layout:
    def layout(first: list[int], second: list[int], s: Specials, lead: list[int], start: int) -> Scored:
        if spm:
            head = [s.fim_prefix, s.fim_suffix, s.fim_middle, *first]
        else:
            head = [s.fim_prefix, *first, s.fim_suffix, s.fim_middle]
        return Scored([*head, *second], len(head) - 1, len(head) + len(second) - 1)

    return layout


def _encoder_input(first: list[int], second: list[int], s: Specials, lead: list[int], start: int) -> Scored:
    return Scored([start, *second], 0, len(second), inputs=[*lead, *first, s.eos])


def _rebuilt(first: list[int], second: list[int], s: Specials, lead: list[int], start: int) -> Scored:
    return Scored(
        [start, *first, *second], len(first), len(first) + len(second), inputs=[*first, s.mask, s.eos]
    )


def _sentinel(encdec: bool) -> Layout:
    def layout(first: list[int], second: list[int], s: Specials, lead: list[int], start: int) -> Scored:
        inputs = [*lead, *first, s.sentinel(0), s.eos]
        if encdec:
            return Scored([start, s.sentinel(0), *second], 1, 1 + len(second), inputs=inputs)
        ids = [*inputs, s.sentinel(0), *second]
        return Scored(ids, len(inputs), len(inputs) + len(second), prefix_len=len(inputs))

    return layout


# conditional_mode's answers (and the encoder-decoder span layout): how each lays out a document
LAYOUTS: dict[str, Layout] = {
    "causal": _causal,
    "prefix": _prefix,
    "fim-psm": _fim(spm=False),
    "fim-spm": _fim(spm=True),
    "encoder-input": _encoder_input,
    "bart": _rebuilt,
    "sentinel": _sentinel(encdec=False),
    "sentinel-encdec": _sentinel(encdec=True),
}


def sequence(
    mode: str, first: list[int], second: list[int], specials: Specials, lead: list[int], start: int
) -> Scored:
    """One document's layout in `mode`, scoring exactly the tokens of `second`."""
    if mode not in LAYOUTS:
        raise ValueError(f"no conditional layout {mode!r}")
    return LAYOUTS[mode](first, second, specials, lead, start)


MODE_NOTES = {
    "causal": "first half, then the second read on (causal)",
    "prefix": "first half as the bidirectional prefix",
    "fim-psm": "FIM PSM with an empty suffix, the second half as the middle",
    "fim-spm": "FIM SPM with an empty suffix, the second half as the middle",
    "sentinel": "second half as one span at the end (sentinel)",
    "encoder-input": "first half as the encoder input, second half decoded",
    "bart": "encoder reads the first half and <mask>, decoder rebuilds it; second half scored",
}

# Layouts a model's objective never trains on: a span model (T5: spans of mean length 3, Raffel et al.
# 2020, section 3.3.4) reads the whole second half here as one span, and at every position of it puts
# probability on closing the span. Its conditional_bpb measures that layout as much as the model, so a
# ranking across kinds leaves it out (`untrained_layout`).
UNTRAINED_LAYOUTS = ("sentinel",)


def untrained_layout(note: str) -> bool:
    """Whether an eval result's `conditional_mode` (a `MODE_NOTES` text) is an `UNTRAINED_LAYOUTS` one."""
    return any(note.startswith(MODE_NOTES[mode]) for mode in UNTRAINED_LAYOUTS)


@torch.no_grad()
def conditional_scores(
    model: nn.Module,
    kind: str,
    training: Mapping[str, Any],
    tokenizer: Tokenizer,
    documents: Sequence[np.ndarray],
    byte_table: torch.Tensor,
    seed: int,
    seq_len: int,
    limit: int = 256,
    batch_size: int = 16,
    units: bool = False,
) -> dict[str, Any]:
    """`conditional_bpb` with its standard error, the documents and bytes scored, and the layout used (module
    docstring); {} for encoders or when no document is long enough."""
    mode = conditional_mode(kind, training)
    if mode == "none":
        return {}
    specials = tokenizer.specials
    halves = split_documents(documents, tokenizer, seed, max(seq_len - OVERHEAD, MIN_TOKENS), limit)
    if not halves:
        return {"conditional_skipped": f"no held-out document has {MIN_TOKENS} tokens or more"}
    lead = _lead(training, specials, mode)
    start = int(training.get("decoder_start_id", specials.pad))
    layout = f"{mode}-encdec" if mode == "sentinel" and kind == "encdec" else mode
    seqs = [sequence(layout, a.tolist(), b.tolist(), specials, lead, start) for a, b in halves]
    nats = score(model, seqs, specials.pad, batch_size)
    table = byte_table.to(torch.int64).numpy()
    nbytes = np.array([float(table[b].sum()) for _, b in halves], dtype=np.float64)
    bpb, se = ratio_se(nats, nbytes)
    out: dict[str, Any] = {
        "conditional_bpb": bpb,
        "conditional_bpb_se": se,
        "conditional_docs": float(len(halves)),  # windows scored (a long document gives several)
        "conditional_tokens": float(sum(len(b) for _, b in halves)),
        "conditional_bytes": float(nbytes.sum()),
        "conditional_mode": MODE_NOTES[mode] + (f", mode token {tokenizer.piece(lead[0])}" if lead else ""),
    }
    if units:
        out["units"] = {"conditional_bpb": units_of(nats, nbytes)}
    return out
