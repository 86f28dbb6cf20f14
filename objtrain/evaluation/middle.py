"""Infilling likelihood: bits per byte of a cut-out middle (Bavarian et al. 2022, the FIM paper's
"FIM loss").

Exact match is 0 for every model of a few million parameters, so it cannot rank them; the code length
of the true middle can. Per task (prefix, middle, suffix) the middle's NLL in nats is summed over its
tokens and divided by ln 2 and the middle's UTF-8 bytes; a set of tasks is a ratio of sums, as bits per
byte always is (section 1).

Each model is scored in its own infilling mode, given prefix and suffix:
- `fim-psm`: `<PRE> prefix <SUF> suffix <MID> middle`; `fim-spm`: `<PRE> <SUF> suffix <MID> prefix
  middle`. The three parts are encoded apart, as character-level FIM training encodes them.
- `sentinel` (span models): the input `prefix <extra_id_0> suffix </s>` (behind UL2's mode token), the
  target `<extra_id_0> middle`; a decoder-only span model reads the input as its bidirectional prefix.
and, for every model that reads left to right, from the prefix alone (`prefix_only`): a decoder's
code length of `prefix + middle` minus that of `prefix`, each encoded whole and read behind one EOS as
`eval` reads documents. Encoding the text whole is how a left-to-right model saw its training data, so
the tokens where prefix and middle meet are the ones it knows (scoring a separately encoded middle would
charge it for a segmentation it never saw). A span model's prefix-only score drops the suffix from its
input. The difference of the two is what the suffix is worth to the model (`suffix_gain`).

A FIM model trained in both orders (0 < `spm_rate` < 1, the default 0.5) is also scored in each order
(`middle_bpb_psm`, `middle_bpb_spm`, `suffix_gain_psm`, `suffix_gain_spm`; its own mode is the one
`infill.infill_mode` names). The orders differ most for a small model: in SPM the middle follows the
prefix as in left-to-right text, in PSM it follows the suffix, so a model that reads mostly the last few
tokens loses more in PSM (a tiny decoder at 3M tokens: -0.15 bits per byte on line middles in PSM, 0.00
in SPM).

`suffix_gain` mixes two things: what the suffix's text tells the model, and what its own format costs (the
middle encoded apart, and in PSM read after the suffix rather than after the prefix). Two scores take them
apart:
- `suffix_worth` (a FIM or span model): the same format with an empty suffix, less with the suffix: what the
  suffix's text alone is worth. For a span model it is `suffix_gain` (its prefix-only score is already its
  own format without the suffix).
- `far_prefix_worth` (a model read left to right): the middle from the prefix's last two lines only (the
  middle's own line up to the cut, and the one before), less from the whole prefix: what the model takes from
  text more than a line away. A model that uses no such text cannot use a suffix either: both need it to
  attend past the line at hand (at 3M tokens a tiny decoder takes 0.007 bits per byte from it).

The middle tokens are the ones EOT/EOS follows in training, but the stop token itself is not scored: a
left-to-right model has no way to say where a middle ends, so only the middle's own bytes count.

Each score comes with its standard error over tasks (delta method for a ratio of sums), so a report can
say whether the evaluation's own noise is well below the seed spread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.data.tokenizer import Tokenizer
from objtrain.evaluation.infill import InfillTask, span_lead
from objtrain.objectives.registry import recorded_class
from objtrain.specials import Specials

LN2 = math.log(2.0)


@dataclass
class Scored:
    """One sequence to score: decoder-only `ids`, or encoder `inputs` with decoder `ids`; the NLL of
    `ids[t + 1]` is summed for t in `scored` (positions whose next token counts)."""

    ids: list[int]
    first: int  # the first position whose next token is scored
    last: int  # one past the last such position
    inputs: list[int] | None = None  # encoder-decoder: the encoder's input
    prefix_len: int = 0  # decoder-only prefix-LM attention over the first prefix_len positions


def units_of(nats: np.ndarray, nbytes: np.ndarray) -> dict[str, list[float]]:
    """Per-unit (document or task) nats and bytes, as JSON lists: two arms scored on the same units give
    the evaluation's own standard error of their difference (`objtrain.stats.seeds.paired_eval_se`)."""
    return {"nats": [round(float(x), 4) for x in nats], "bytes": [float(b) for b in nbytes]}


def ratio_se(nats: np.ndarray, nbytes: np.ndarray) -> tuple[float, float]:
    """Bits per byte of the sums and its standard error over tasks (delta method; nan with < 2 tasks)."""
    total = float(nbytes.sum())
    if total <= 0:
        return float("nan"), float("nan")
    r = float(nats.sum()) / total
    k = len(nats)
    if k < 2:
        return r / LN2, float("nan")
    resid = nats - r * nbytes
    se = math.sqrt(float((resid**2).sum()) / (k * (k - 1))) / (total / k)
    return r / LN2, se / LN2


def _fim_sequence(tokenizer: Tokenizer, task: InfillTask, mode: str) -> Scored:
    s = tokenizer.specials
    pre = tokenizer.encode(task.prefix) if task.prefix else []
    suf = tokenizer.encode(task.suffix) if task.suffix else []
    mid = tokenizer.encode(task.middle)
    if mode == "spm":
        head = [s.fim_prefix, s.fim_suffix, *suf, s.fim_middle, *pre]
    else:
        head = [s.fim_prefix, *pre, s.fim_suffix, *suf, s.fim_middle]
    return Scored([*head, *mid], len(head) - 1, len(head) + len(mid) - 1)


def _sentinel_sequence(
    tokenizer: Tokenizer, task: InfillTask, lead: list[int], start: int, encdec: bool, suffix: bool = True
) -> Scored:
    s = tokenizer.specials
    pre = tokenizer.encode(task.prefix) if task.prefix else []
    suf = tokenizer.encode(task.suffix) if task.suffix and suffix else []
    mid = tokenizer.encode(task.middle)
    inputs = [*lead, *pre, s.sentinel(0), *suf, s.eos]
    if encdec:
        # decoder input: start, <extra_id_0>, middle...; the middle tokens follow positions 1..
        return Scored([start, s.sentinel(0), *mid], 1, 1 + len(mid), inputs=inputs)
    ids = [*inputs, s.sentinel(0), *mid]
    return Scored(ids, len(inputs), len(inputs) + len(mid), prefix_len=len(inputs))


def near_prefix(prefix: str) -> str:
    """The prefix's last two lines: the middle's own line up to the cut, and the line before it."""
    start = prefix.rfind("\n") + 1  # where the middle's line begins
    return prefix[prefix.rfind("\n", 0, max(start - 1, 0)) + 1 :] if start else prefix


def _whole(tokenizer: Tokenizer, text: str, context: int) -> Scored:
    ids = [context, *(tokenizer.encode(text) if text else [])]
    return Scored(ids, 0, len(ids) - 1)


@torch.no_grad()
def score(model: nn.Module, seqs: Sequence[Scored], pad: int, batch_size: int = 16) -> np.ndarray:
    """Summed NLL (nats, float64) of each sequence's scored tokens."""
    device = model.embed.weight.device  # type: ignore[union-attr]
    kind = getattr(getattr(model, "config", None), "kind", "decoder")
    out = np.zeros(len(seqs), dtype=np.float64)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].ids))  # similar lengths share a batch
    for lo in range(0, len(order), batch_size):
        chunk = [seqs[i] for i in order[lo : lo + batch_size]]
        B, L = len(chunk), max(len(c.ids) for c in chunk)
        ids = torch.full((B, L), pad, dtype=torch.int64)
        labels = torch.full((B, L), IGNORE, dtype=torch.int64)
        docs = torch.full((B, L), -1, dtype=torch.int64)
        prefix = torch.zeros((B, L), dtype=torch.bool)
        for b, c in enumerate(chunk):
            row = torch.tensor(c.ids)
            ids[b, : len(c.ids)] = row
            docs[b, : len(c.ids)] = 0
            labels[b, c.first : c.last] = row[c.first + 1 : c.last + 1]
            prefix[b, : c.prefix_len] = True
        positions = torch.arange(L).expand(B, L)
        ids, labels, docs, prefix, positions = (t.to(device) for t in (ids, labels, docs, prefix, positions))
        if kind == "encdec":
            T = max(len(c.inputs or []) for c in chunk)
            enc = torch.full((B, T), pad, dtype=torch.int64)
            enc_docs = torch.full((B, T), -1, dtype=torch.int64)
            for b, c in enumerate(chunk):
                enc[b, : len(c.inputs or [])] = torch.tensor(c.inputs or [])
                enc_docs[b, : len(c.inputs or [])] = 0
            enc, enc_docs = enc.to(device), enc_docs.to(device)
            batch = Batch(
                enc,
                labels,
                torch.arange(T, device=device).expand(B, T),
                enc_docs,
                "bidirectional",
                decoder_input_ids=ids,
                decoder_positions=positions,
                decoder_document_ids=docs,
            )
        elif any(c.prefix_len for c in chunk):
            batch = Batch(ids, labels, positions, docs, "prefix", prefix_mask=prefix)
        else:
            batch = Batch(ids, labels, positions, docs, "causal")
        logits: Tensor = model(batch).logits.float()
        nll = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=IGNORE, reduction="none"
        ).view(B, L)
        sums = nll.double().sum(dim=1).cpu().numpy()
        for j, i in enumerate(order[lo : lo + batch_size]):
            out[i] = sums[j]
    return out


def middle_scores(
    model: nn.Module,
    mode: str,
    tokenizer: Tokenizer,
    specials: Specials,
    training: dict[str, Any],
    tasks: Sequence[InfillTask],
    batch_size: int = 16,
    units: bool = False,
) -> dict[str, Any]:
    """`middle_bpb` (own mode), `middle_bpb_prefix_only`, `suffix_gain`, each with `_se`, and per task kind
    (`_line`, `_lines`, `_span`, ...). `mode` is `infill.infill_mode`'s answer; "none" scores nothing.
    With `units`, also each task's nats and bytes under "units" (`units_of`)."""
    if mode == "none" or not tasks:
        return {}
    kind = getattr(getattr(model, "config", None), "kind", "decoder")
    nbytes = np.array([len(t.middle.encode("utf-8")) for t in tasks], dtype=np.float64)
    lead = span_lead(training, specials)
    start = int(training.get("decoder_start_id", specials.pad))
    own: np.ndarray | None = None
    orders: dict[str, np.ndarray] = {}  # a FIM model trained in both orders: its middle in each
    worth: dict[str, np.ndarray] = {}  # order ("" = own mode) -> nats the suffix's text saves in it

    def fim(order: str) -> np.ndarray:
        def nats(ts: Sequence[InfillTask]) -> np.ndarray:
            return score(model, [_fim_sequence(tokenizer, t, order) for t in ts], specials.pad, batch_size)

        full = nats(tasks)
        worth["" if order == mode[4:] else f"_{order}"] = nats([replace(t, suffix="") for t in tasks]) - full
        return full

    if mode.startswith("fim-"):
        own = fim(mode[4:])
        if both_orders(training):
            other = "spm" if mode == "fim-psm" else "psm"
            orders[mode[4:]] = own
            orders[other] = fim(other)
            worth[f"_{mode[4:]}"] = worth[""]
    elif mode == "sentinel":
        seqs = [_sentinel_sequence(tokenizer, t, lead, start, kind == "encdec") for t in tasks]
        own = score(model, seqs, specials.pad, batch_size)
    far: np.ndarray | None = None  # a decoder read left to right: what the prefix past two lines saves
    if mode == "sentinel":
        seqs = [_sentinel_sequence(tokenizer, t, lead, start, kind == "encdec", suffix=False) for t in tasks]
        prefix_only = score(model, seqs, specials.pad, batch_size)
        assert own is not None
        worth[""] = prefix_only - own
    else:  # a decoder read left to right
        pairs = [(t.prefix, t.middle) for t in tasks]
        prefix_only = _left_to_right(model, tokenizer, specials, pairs, batch_size)
        near = [(near_prefix(t.prefix), t.middle) for t in tasks]
        far = _left_to_right(model, tokenizer, specials, near, batch_size) - prefix_only
    out: dict[str, Any] = {"middle_tasks": float(len(tasks)), "middle_bytes": float(nbytes.sum())}
    if units:
        out["units"] = {
            "middle_bpb": units_of(prefix_only if own is None else own, nbytes),
            "middle_bpb_prefix_only": units_of(prefix_only, nbytes),
        }
    kinds = sorted({t.kind for t in tasks})
    groups: list[tuple[str, np.ndarray]] = [("", np.ones(len(tasks), dtype=bool))]
    if len(kinds) > 1:
        groups += [(f"_{k}", np.array([t.kind == k for t in tasks])) for k in kinds]
    for suffix, sel in groups:
        po, po_se = ratio_se(prefix_only[sel], nbytes[sel])
        out[f"middle_bpb_prefix_only{suffix}"], out[f"middle_bpb_prefix_only{suffix}_se"] = po, po_se
        if far is not None:
            fw, fw_se = ratio_se(far[sel], nbytes[sel])
            out[f"far_prefix_worth{suffix}"], out[f"far_prefix_worth{suffix}_se"] = fw, fw_se
        for name, nats in worth.items():
            w, w_se = ratio_se(nats[sel], nbytes[sel])
            out[f"suffix_worth{name}{suffix}"], out[f"suffix_worth{name}{suffix}_se"] = w, w_se
        if own is None:  # a left-to-right model's own mode is the prefix alone
            out[f"middle_bpb{suffix}"], out[f"middle_bpb{suffix}_se"] = po, po_se
            continue
        for name, nats in [("", own), *((f"_{order}", n) for order, n in sorted(orders.items()))]:
            m, m_se = ratio_se(nats[sel], nbytes[sel])
            gain, gain_se = ratio_se(prefix_only[sel] - nats[sel], nbytes[sel])
            out[f"middle_bpb{name}{suffix}"], out[f"middle_bpb{name}{suffix}_se"] = m, m_se
            out[f"suffix_gain{name}{suffix}"], out[f"suffix_gain{name}{suffix}_se"] = gain, gain_se
    return out


def _left_to_right(
    model: nn.Module,
    tokenizer: Tokenizer,
    specials: Specials,
    pairs: Sequence[tuple[str, str]],
    batch_size: int,
) -> np.ndarray:
    """Each (prefix, middle)'s middle nats read left to right: code length of prefix + middle minus that of
    the prefix, each encoded whole behind one EOS."""
    eos, pad = specials.eos, specials.pad
    both = score(model, [_whole(tokenizer, p + m, eos) for p, m in pairs], pad, batch_size)
    alone = score(model, [_whole(tokenizer, p, eos) for p, _ in pairs], pad, batch_size)
    return both - alone


def both_orders(training: dict[str, Any]) -> bool:
    """Whether a FIM model was trained on PSM and on SPM (0 < spm_rate < 1), so that both are its own
    (`Objective.trained_both_orders`)."""
    cls = recorded_class(training)
    return cls is not None and cls.trained_both_orders(training)
