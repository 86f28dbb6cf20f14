"""Sentence order: are two consecutive segments of held-out text in order or swapped? (ALBERT, SOP)

ALBERT's argument for SOP over NSP is an asymmetry: a model trained on NSP solves NSP from topic alone and
scores near chance on sentence order (52.0% against SOP's 86.5%, ALBERT Table 5), while an SOP model solves
both. The task here is built as SOP builds its training pairs (`objectives.sentence_pairs`), from the
evaluated split:

- sentences as the training objectives find them (`sentences.sentence_ids`: a piece ending in `.`, `!`,
  `?` or a newline ends one); each document is walked from its start in chunks of whole sentences of at
  most `pair_length` tokens (the run's own NSP/SOP `pair_length`, else 128; at most (row length - 6) / 2,
  the length the objective's own pairs have, `sentence_pairs.chunk_length`), and each chunk of two
  sentences or more is split at a sentence start strictly inside it, drawn under the eval seed: A = the
  chunk before it, B = the rest (a sentence longer than the budget is skipped: a pair needs two whole
  segments);
- half of the pairs, drawn under the eval seed, are shown swapped (label 1, SOP's convention: 0 = in
  order), laid out as training lays them out, `[CLS] first [SEP] second [SEP]`, segment 1 on the second
  and its [SEP] (read only by models trained with segments).

Scores:
- `sentence_order_accuracy` (zero-shot): the model's own pair head where it has a trained one (NSP or SOP),
  class 1 read as "swapped" (for an NSP head, "not the next segment"), over all pairs;
- `probe_sentence_order_accuracy` (any encoder): the linear probe of `probe.py` on the pairs' frozen
  features, with its baselines, splitting the pairs by document (60% train, 20% dev for the layer and
  penalty, 20% test), so no document gives pairs to two splits; held-out text of fewer than
  `MIN_DOCUMENTS` documents (a few books) is split by runs of consecutive pairs instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.data.tokenizer import Tokenizer
from objtrain.evaluation.probe import LabelledIds, padded, pair_segment_ids
from objtrain.objectives.sentence_pairs import chunk_length
from objtrain.objectives.sentences import sentence_end_table, sentence_ids

DEFAULT_PAIR_LENGTH = 128  # NSP/SOP's own default
LABELS = ("in_order", "swapped")  # sorted: the probe's class 1 is "swapped", as SOP's label 1


def pair_budget(training: Mapping[str, Any], seq_len: int) -> int:
    """Text tokens of a pair: as long as the pairs the objective trains on in rows of `seq_len`
    (`sentence_pairs.chunk_length`: the run's NSP/SOP `pair_length`, else 128, at most (seq_len - 6) / 2).

    Pairs as long as the whole row less 3 specials were twice the trained length at `pair_length` 128 and
    `seq_len` 128 (125 tokens against 61): a head then reads positions training never showed it (positions
    restart at every packed pair), and on a synthetic order task it learns to 1.0 its accuracy fell to
    0.71 on such pairs (tests/objectives/test_sentence_order_training.py)."""
    settings = training.get("objective_config")
    length = settings.get("pair_length") if isinstance(settings, Mapping) else None
    length = length if isinstance(length, int) and length >= 2 else DEFAULT_PAIR_LENGTH
    return chunk_length(length, seq_len)


def sentence_starts(doc: np.ndarray, end_table: torch.Tensor) -> np.ndarray:
    """Positions (ascending, > 0) where a sentence of `doc` starts, as the sentence-pair objectives find
    them."""
    tokens = torch.from_numpy(np.asarray(doc, dtype=np.int64))[None]
    index = sentence_ids(tokens, torch.zeros_like(tokens), end_table)[0].numpy()
    return np.flatnonzero(np.diff(index) > 0) + 1


def build_pairs(
    documents: Sequence[np.ndarray], tokenizer: Tokenizer, seed: int, budget: int, limit: int
) -> tuple[LabelledIds, np.ndarray]:
    """Up to `limit` pairs (module docstring) and the document each comes from."""
    end_table = sentence_end_table(tokenizer)
    s = tokenizer.specials
    firsts: list[np.ndarray] = []
    seconds: list[np.ndarray] = []
    source: list[int] = []
    for index, doc in enumerate(documents):
        if len(firsts) >= limit:
            break
        doc = np.asarray(doc, dtype=np.int64)
        rng = np.random.default_rng((seed, 0, index))
        bounds = np.append(sentence_starts(doc, end_table), len(doc))
        c = 0
        while c < len(doc) and len(firsts) < limit:
            ahead = bounds[(bounds > c) & (bounds <= c + budget)]
            if len(ahead) < 2:  # no two whole sentences within the budget: move to the next sentence
                later = bounds[bounds > c]
                c = int(later[0]) if len(later) else len(doc)
                continue
            end = int(ahead[-1])
            split = int(rng.choice(ahead[:-1]))
            firsts.append(doc[c:split])
            seconds.append(doc[split:end])
            source.append(index)
            c = end
    n = len(firsts)
    # exactly half swapped (the odd one out in order), which pairs under the seed
    swapped = np.zeros(n, dtype=bool)
    swapped[np.random.default_rng((seed, 1)).permutation(n)[: n // 2]] = True
    out = LabelledIds([], [])
    for a, b, swap in zip(firsts, seconds, swapped, strict=True):
        one, two = (b, a) if swap else (a, b)
        out.ids.append([s.cls, *one.tolist(), s.sep, *two.tolist(), s.sep])
        out.second.append(len(one) + 2)
        out.labels.append(LABELS[int(swap)])
        out.texts.append(tokenizer.decode(one.tolist()) + " [SEP] " + tokenizer.decode(two.tolist()))
    return out, np.asarray(source, dtype=np.int64)


# Held-out prose may be a few books: with fewer documents than this the split cannot give whole documents
# to three sides in about the right shares, so it splits each document into runs of consecutive pairs.
MIN_DOCUMENTS = 10
RUNS = 20  # runs of consecutive pairs in all when the documents are few


def split_by_document(
    pairs: LabelledIds, source: np.ndarray, seed: int
) -> tuple[LabelledIds, LabelledIds, LabelledIds]:
    """(train, dev, test): about 60/20/20% of the pairs, whole documents to each, in a seeded order; from
    fewer than `MIN_DOCUMENTS` documents, whole runs of consecutive pairs (about `RUNS` in all) instead. Pairs
    never overlap, so no stretch of text is in two splits either way."""
    n = len(source)
    unit = source.astype(np.int64)
    if len(np.unique(source)) < MIN_DOCUMENTS:
        per_run = max(1, -(-n // RUNS))
        rank = np.zeros(n, dtype=np.int64)  # each pair's place among its document's pairs, in order
        for d in np.unique(source):
            at = np.flatnonzero(source == d)
            rank[at] = np.arange(len(at))
        unit = unit * (n + 1) + rank // per_run
    units = np.unique(unit)
    order = np.random.default_rng((seed, 2)).permutation(units)
    sizes = np.array([int((unit == u).sum()) for u in order])
    cum = np.cumsum(sizes) / max(n, 1)
    part = np.searchsorted([0.6, 0.8], cum, side="left")  # 0 train, 1 dev, 2 test by cumulative share
    which = dict(zip(order.tolist(), part.tolist(), strict=True))
    out = (LabelledIds([], []), LabelledIds([], []), LabelledIds([], []))
    for i, u in enumerate(unit.tolist()):
        target = out[which[u]]
        target.texts.append(pairs.texts[i])
        target.labels.append(pairs.labels[i])
        target.ids.append(pairs.ids[i])
        target.second.append(pairs.second[i])
    return out


@torch.no_grad()
def head_accuracy(model: nn.Module, pairs: LabelledIds, pad: int, batch_size: int = 32) -> float:
    """Share of pairs whose order the model's pair head (NSP/SOP, at [CLS]) gets right, class 1 = swapped."""
    device = model.embed.weight.device  # type: ignore[union-attr]
    correct = 0
    for lo in range(0, len(pairs.ids), batch_size):
        ids, valid, _ = padded(pairs.ids[lo : lo + batch_size], pad)
        B, L = ids.shape
        second = torch.tensor(pairs.second[lo : lo + batch_size])
        seq_labels = torch.full((B, L), IGNORE, dtype=torch.int64)
        seq_labels[:, 0] = 0  # a labelled [CLS] makes the encoder run its pair head
        batch = Batch(
            ids.to(device),
            torch.full((B, L), IGNORE, dtype=torch.int64, device=device),
            torch.arange(L).expand(B, L).to(device),
            torch.where(valid, 0, -1).to(device),
            "bidirectional",
            segment_ids=pair_segment_ids(valid, second).to(device),
            seq_labels=seq_labels.to(device),
        )
        logits = model(batch).seq_logits
        assert logits is not None
        pred = logits[:, 0].argmax(-1).cpu()
        gold = torch.tensor([LABELS.index(y) for y in pairs.labels[lo : lo + batch_size]])
        correct += int((pred == gold).sum())
    return correct / max(len(pairs.ids), 1)
