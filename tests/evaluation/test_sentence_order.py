"""Sentence order: consecutive segments of held-out text in order or swapped, zero-shot by an NSP/SOP head
and as a probe for any encoder."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from objtrain.batch import Batch, ModelOutput
from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.data.tokenizer import Tokenizer
from objtrain.evaluation import sentence_order
from objtrain.evaluation.suite import EvalOptions, evaluate
from objtrain.objectives.sentences import sentence_end_table

PROSE = (
    "The river rose in the night. By morning the road was gone. We walked along the ridge instead! "
    "Nobody had a map, but the old shepherd knew the way. He said the bridge would hold? It did not. "
    "So we waited on the hill until the water fell. Then the long walk home began."
)


def _docs(tokenizer: Tokenizer, n: int = 30) -> list[np.ndarray]:
    words = PROSE.split(". ")
    out = []
    for i in range(n):  # each document a rotation of the sentences: different pairs, same vocabulary
        k = i % len(words)
        text = ". ".join(words[k:] + words[:k])
        out.append(np.array(tokenizer.encode(text), dtype=np.int64))
    return out


def _find(doc: np.ndarray, part: list[int]) -> int:
    n = len(part)
    return next((i for i in range(len(doc) - n + 1) if doc[i : i + n].tolist() == part), -1)


def test_pairs_are_consecutive_whole_sentences_half_of_them_swapped(tokenizer: Tokenizer) -> None:
    docs = _docs(tokenizer)
    s = tokenizer.specials
    pairs, source = sentence_order.build_pairs(docs, tokenizer, 3, 40, 200)
    assert len(pairs.ids) >= 30 and len(source) == len(pairs.ids)
    assert pairs.labels.count("swapped") == len(pairs.ids) // 2
    ends = sentence_end_table(tokenizer).numpy()
    for ids, at, label, d in zip(pairs.ids, pairs.second, pairs.labels, source, strict=True):
        assert ids[0] == s.cls and ids[at - 1] == s.sep and ids[-1] == s.sep
        one, two = ids[1 : at - 1], ids[at:-1]
        a, b = (two, one) if label == "swapped" else (one, two)
        assert 2 <= len(a) + len(b) <= 40 and a and b
        doc = docs[d]
        where = _find(doc, a + b)  # A and B are one stretch of the document, in this order
        assert where >= 0
        stop = where + len(a) + len(b)
        assert ends[doc[where + len(a) - 1]] and (stop == len(doc) or ends[doc[stop - 1]])  # whole sentences
    again, _ = sentence_order.build_pairs(docs, tokenizer, 3, 40, 200)
    assert again.ids == pairs.ids and again.labels == pairs.labels
    other, _ = sentence_order.build_pairs(docs, tokenizer, 4, 40, 200)
    assert other.labels != pairs.labels or other.ids != pairs.ids


def test_the_split_gives_each_document_to_one_side(tokenizer: Tokenizer) -> None:
    pairs, source = sentence_order.build_pairs(_docs(tokenizer), tokenizer, 0, 40, 200)
    parts = sentence_order.split_by_document(pairs, source, 0)
    assert sum(len(p.ids) for p in parts) == len(pairs.ids)
    doc_of = {id(ids): int(d) for ids, d in zip(pairs.ids, source, strict=True)}  # the same lists, moved
    seen = [{doc_of[id(ids)] for ids in p.ids} for p in parts]
    assert not (seen[0] & seen[1]) and not (seen[0] & seen[2]) and not (seen[1] & seen[2])
    assert len(parts[0].ids) > len(parts[2].ids) > 0


class _Oracle(nn.Module):
    """A pair head that knows the documents: class 1 (swapped) unless segment 0 then segment 1 is a stretch
    of one of them. It reads the segments from `segment_ids`, so a wrong segment layout shows."""

    def __init__(self, docs: list[np.ndarray], invert: bool = False) -> None:
        super().__init__()
        self.docs, self.invert = docs, invert
        self.embed = nn.Embedding(1, 1)

    def forward(self, batch: Batch) -> ModelOutput:
        assert batch.seq_labels is not None and batch.segment_ids is not None
        B, L = batch.input_ids.shape
        logits = torch.zeros(B, L, 2)
        for b in range(B):
            ids, seg = batch.input_ids[b], batch.segment_ids[b]
            real = batch.document_ids[b] >= 0
            first = ids[(seg == 0) & real].tolist()[1:-1]  # [CLS] A [SEP]
            second = ids[(seg == 1) & real].tolist()[:-1]  # B [SEP]
            in_order = any(_find(d, first + second) >= 0 for d in self.docs)
            logits[b, 0, int(in_order == self.invert)] = 1.0
        return ModelOutput(logits=torch.zeros(B, L, 3), seq_logits=logits)


def test_the_head_is_read_with_class_one_as_swapped(tokenizer: Tokenizer) -> None:
    docs = _docs(tokenizer)
    pairs, _ = sentence_order.build_pairs(docs, tokenizer, 1, 40, 64)
    assert sentence_order.head_accuracy(_Oracle(docs), pairs, tokenizer.specials.pad, batch_size=5) == 1.0
    assert sentence_order.head_accuracy(_Oracle(docs, invert=True), pairs, tokenizer.specials.pad) == 0.0


def _prose_store(tmp_path: Path, tokenizer: Tokenizer) -> Path:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = PROSE.split(". ")
    paragraphs = [
        ". ".join(words[i % 8 :] + words[: i % 8]) + f" Paragraph {i} ends here." for i in range(200)
    ]
    (corpus / "prose.txt").write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    (tmp_path / "tok.model").write_bytes(tokenizer.model_proto)
    config = TokenizeConfig(tokenizer=tmp_path / "tok.model", doc_split="blank-line", valid_fraction=0.3)
    tokenize_corpus([corpus], tmp_path / "store", config)
    return tmp_path / "store"


def test_eval_scores_it_for_encoders_zero_shot_only_with_a_trained_head(
    debug_checkpoint: Callable[..., Path], tmp_path: Path, tokenizer: Tokenizer
) -> None:
    store = _prose_store(tmp_path, tokenizer)
    options = EvalOptions(skip=("lm", "conditional", "corrupted", "infill", "samples"), probe_seeds=2)
    sop = evaluate(debug_checkpoint("encoder", {"objective": "sop", "seq_len": 64}), store, options)
    assert 0.0 <= sop["sentence_order_accuracy"] <= 1.0 and sop["sentence_order_pairs"] >= 10
    for name in ("accuracy", "mcc", "bow_accuracy", "random_init_accuracy", "accuracy_probe_sd"):
        assert isinstance(sop[f"probe_sentence_order_{name}"], float), name
    mlm = evaluate(debug_checkpoint("encoder", {"objective": "mlm", "seq_len": 64}), store, options)
    assert "sentence_order_accuracy" not in mlm and "probe_sentence_order_accuracy" in mlm
    dec = evaluate(debug_checkpoint("decoder", {"objective": "clm", "seq_len": 64}), store, options)
    assert not any("sentence_order" in k for k in dec)
    options.skip = (*options.skip, "sentence_order")
    skipped = evaluate(debug_checkpoint("encoder", {"objective": "sop", "seq_len": 64}), store, options)
    assert not any("sentence_order" in k for k in skipped)


def test_pairs_from_a_few_long_documents_split_by_runs_of_consecutive_pairs(tokenizer: Tokenizer) -> None:
    """Held-out prose of a few books: whole documents cannot fill three splits, so runs of consecutive
    pairs go to one side each, about 60/20/20, and no pair is in two."""
    long_docs = [np.concatenate(_docs(tokenizer, 30)), np.concatenate(_docs(tokenizer, 12))]
    pairs, source = sentence_order.build_pairs(long_docs, tokenizer, 0, 40, 400)
    assert len(np.unique(source)) == 2 and len(pairs.ids) >= 100
    parts = sentence_order.split_by_document(pairs, source, 0)
    place = {id(ids): i for i, ids in enumerate(pairs.ids)}
    sides = [sorted(place[id(ids)] for ids in p.ids) for p in parts]
    assert sorted(i for side in sides for i in side) == list(range(len(pairs.ids)))
    shares = [len(side) / len(pairs.ids) for side in sides]
    assert 0.5 <= shares[0] <= 0.7 and 0.1 <= shares[1] <= 0.3 and 0.1 <= shares[2] <= 0.3
    for side in sides:  # runs: most neighbours in a side are neighbours in the document
        assert sum(b == a + 1 for a, b in itertools.pairwise(side)) >= 0.8 * (len(side) - 1)
    again = sentence_order.split_by_document(pairs, source, 0)
    assert [p.ids for p in again] == [p.ids for p in parts]
