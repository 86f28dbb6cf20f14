"""NSP and SOP (reference sections 3 and 4): layout, label meaning and balance, single-document rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from objtrain import IGNORE
from objtrain.batch import Batch, ModelOutput
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.objectives.mlm import MaskedLMConfig
from objtrain.objectives.registry import build_objective, objective_defaults
from objtrain.objectives.rng import RowRandom
from objtrain.objectives.sentence_pairs import (
    NextSentencePrediction,
    SentenceOrderPrediction,
    pick,
    pick_where,
)
from objtrain.objectives.sentences import sentence_end_table, sentence_ids
from objtrain.specials import Specials
from objtrain.training.data import Documents, DocumentStream, donor_offsets, leading_batches, read_batch

SP = Specials()
NO_MLM = MaskedLMConfig(selection_rate=0.0)


@pytest.fixture(scope="module")
def documents(tokenizer: Tokenizer, stdlib_texts: list[str]) -> list[list[int]]:
    """Stdlib source cut into documents of 3 to 14 lines (every line ends a sentence), each with EOS."""
    lines = [line for text in stdlib_texts for line in text.splitlines(keepends=True)]
    docs, i, k = [], 0, 0
    while i < len(lines):
        n = 3 + (k * 7) % 12
        docs.append([*tokenizer.encode("".join(lines[i : i + n])), SP.eos])
        i, k = i + n, k + 1
    return docs


def pack_rows(
    documents: list[list[int]], B: int, L: int, start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """B rows of L tokens from consecutive documents (several per row, the last one cut)."""
    rows, docs = [], []
    k = start
    for _ in range(B):
        toks: list[int] = []
        ids: list[int] = []
        d = 0
        while len(toks) < L:
            doc = documents[k % len(documents)]
            toks += doc
            ids += [d] * len(doc)
            k, d = k + 1, d + 1
        rows.append(toks[:L])
        docs.append(ids[:L])
    return torch.tensor(rows), torch.tensor(docs)


def build(cls, tokenizer: Tokenizer, mlm: MaskedLMConfig = NO_MLM, **kw):
    return cls(cls.Config(mlm=mlm, **kw), SP, tokenizer)


def check_layout(batch, rows: torch.Tensor, T: int) -> None:
    """[CLS] A [SEP] B [SEP] pad..., segment ids switch once, A and B non-empty, pairs fit T."""
    for b in range(rows.size(0)):
        ids = batch.input_ids[b].tolist()
        n = int((batch.document_ids[b] >= 0).sum())
        assert n <= T and batch.document_ids[b, :n].eq(0).all() and batch.document_ids[b, n:].eq(-1).all()
        assert ids[0] == SP.cls and ids[n - 1] == SP.sep and ids[1 : n - 1].count(SP.sep) == 1
        sep0 = ids.index(SP.sep)
        seg = batch.segment_ids[b, :n].tolist()
        assert seg == [0] * (sep0 + 1) + [1] * (n - sep0 - 1)
        if int(batch.seq_labels[b]) == IGNORE:
            assert n == 3
        else:
            assert sep0 >= 2 and n - sep0 >= 3  # A and B non-empty
            assert int(batch.seq_labels[b]) in (0, 1)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 1000), L=st.sampled_from([5, 9, 32, 128]), sop=st.booleans())
def test_pairs_come_from_the_right_places(
    tokenizer: Tokenizer, documents: list[list[int]], seed: int, L: int, sop: bool
) -> None:
    """Label meaning (the flipped-convention pitfall, PaddleNLP#6364): 0 = A then its actual continuation;
    NSP 1 = B from another document, or a later passage of A's with text skipped in between; SOP 1 = the
    same two segments, swapped."""
    cls = SentenceOrderPrediction if sop else NextSentencePrediction
    obj = build(cls, tokenizer)
    rows, docs = pack_rows(documents, 6, L, start=seed)
    batch = obj(rows, docs, torch.arange(6), seed)
    check_layout(batch, rows, L)
    pair = obj.make_pairs(rows, docs, RowRandom(seed, torch.arange(6)))
    for b in range(6):
        label = int(batch.seq_labels[b])
        if label == IGNORE:
            continue
        s0, l0, s1, l1 = (
            int(v[b]) for v in (pair.first_start, pair.first_len, pair.second_start, pair.second_len)
        )
        assert batch.input_ids[b, 1 : 1 + l0].tolist() == rows[b, s0 : s0 + l0].tolist()
        assert batch.input_ids[b, 2 + l0 : 2 + l0 + l1].tolist() == rows[b, s1 : s1 + l1].tolist()
        d0, d1 = docs[b, s0], docs[b, s1]
        assert bool((docs[b, s0 : s0 + l0] == d0).all() and (docs[b, s1 : s1 + l1] == d1).all())
        if label == 0:
            assert d0 == d1 and s0 + l0 <= s1
        elif sop:
            assert d0 == d1 and s1 + l1 <= s0
        else:
            assert d0 != d1 or s0 + l0 < s1


def test_label_balance(tokenizer: Tokenizer, documents: list[list[int]]) -> None:
    """About 50/50 labels; NSP negatives exist only in rows holding a second document."""
    rows, docs = pack_rows(documents, 600, 128)
    several = docs.max(dim=1).values > 0
    assert int(several.sum()) > 300
    nsp = build(NextSentencePrediction, tokenizer)(rows, docs, torch.arange(600), 0)
    assert nsp.stats["pairs"] == 600 and nsp.stats["sentence_splits"] == 600
    assert abs(float(nsp.seq_labels.float().mean()) - 0.5) < 0.06
    assert nsp.stats["same_document_negatives"] <= int(nsp.seq_labels[~several].sum())
    assert nsp.stats["label_1"] == int(nsp.seq_labels.sum())
    sop = build(SentenceOrderPrediction, tokenizer)(rows, docs, torch.arange(600), 0)
    assert abs(sop.stats["label_1_fraction"] - 0.5) < 0.06


def test_single_document_rows_never_get_a_wrong_label(
    tokenizer: Tokenizer, documents: list[list[int]]
) -> None:
    """Pitfall 15.5 and section 3 (NVIDIA/DeepLearningExamples#421, BERT-pytorch#110): with one document a
    "random" B can be the actual next. objtrain's negative is then a later passage with at least one
    sentence skipped (label 1 stays true), or, with same_document_negatives off, a passage of another row
    (BERT's random document), so the share of label 1 holds on single-document rows too."""
    rows, _ = pack_rows(documents, 200, 96)
    docs = torch.zeros_like(rows)  # the EOS inside the row are then sentence ends, not document ends
    obj = build(NextSentencePrediction, tokenizer)
    nsp = obj(rows, docs, torch.arange(200), 0)
    assert nsp.stats["pairs"] == 200
    assert nsp.stats["same_document_negatives"] == nsp.stats["label_1"]
    assert abs(nsp.stats["label_1_fraction"] - 0.5) < 0.12
    pair = obj.make_pairs(rows, docs, RowRandom(0, torch.arange(200)))
    sid = sentence_ids(rows, docs, sentence_end_table(tokenizer))
    for b in torch.nonzero(nsp.seq_labels == 1).flatten().tolist():
        a_end, b_start = int(pair.first_start[b] + pair.first_len[b]), int(pair.second_start[b])
        assert a_end < b_start
        between = sid[b, a_end - 1 : b_start + 1]  # from A's last token to B's first
        assert int(between[-1]) - int(between[0]) >= 2  # a whole sentence lies in between
    donors = (rows.roll(1, dims=0), docs.roll(1, dims=0))  # stand-in donor text: other stretches of source
    off = build(NextSentencePrediction, tokenizer, same_document_negatives=False, mlm=NO_MLM)(
        rows, docs, torch.arange(200), 0, donors=donors
    )
    assert off.stats["pairs"] == 200 and off.stats["label_1"] > 0
    assert off.stats["donor_negatives"] == off.stats["label_1"]  # every negative is donor text
    for b in torch.nonzero(off.seq_labels == 1).flatten().tolist():
        real = off.input_ids[b] != SP.pad
        sep = torch.nonzero(off.input_ids[b] == SP.sep).flatten().tolist()
        second = off.input_ids[b, sep[0] + 1 : sep[1]].tolist()
        assert bool(real.any()) and second
        row = donors[0][b].tolist()
        assert any(row[i : i + len(second)] == second for i in range(len(row) - len(second) + 1))
    assert abs(off.stats["label_1_fraction"] - 0.5) < 0.12
    sop = build(SentenceOrderPrediction, tokenizer)(rows, docs, torch.arange(200), 0)
    assert abs(sop.stats["label_1_fraction"] - 0.5) < 0.12


def test_one_sentence_rows_split_at_a_token(tokenizer: Tokenizer) -> None:
    """A 1-segment chunk is split at a random token position (reference section 4 recommendation)."""
    enders = sentence_end_table(tokenizer)
    plain = [i for i in range(SP.first_ordinary, tokenizer.vocab_size) if not enders[i]][:50]
    g = torch.Generator().manual_seed(0)
    rows = torch.tensor(plain)[torch.randint(0, len(plain), (100, 40), generator=g)]
    docs = torch.zeros_like(rows)
    for cls in (NextSentencePrediction, SentenceOrderPrediction):
        batch = build(cls, tokenizer)(rows, docs, torch.arange(100), 1)
        assert batch.stats["token_splits"] == 100 and batch.stats["pairs"] == 100
        check_layout(batch, rows, 40)


def test_degenerate_and_long_rows(tokenizer: Tokenizer, documents: list[list[int]]) -> None:
    obj = build(NextSentencePrediction, tokenizer)
    rows = torch.tensor([[SP.pad] * 8, [300, SP.eos, 301, SP.eos, SP.pad, SP.pad, SP.pad, SP.pad]])
    docs = torch.tensor([[-1] * 8, [0, 0, 1, 1, -1, -1, -1, -1]])
    batch = obj(rows, docs, torch.arange(2), 0)
    assert batch.seq_labels.tolist() == [IGNORE, IGNORE]
    assert batch.input_ids[:, :3].tolist() == [[SP.cls, SP.sep, SP.sep]] * 2
    rows, docs = pack_rows(documents, 2, 2048)
    batch = obj(rows, docs, torch.arange(2), 0)
    check_layout(batch, rows, 2048)
    with pytest.raises(UserError, match="cannot hold"):
        obj(rows[:, :4], docs[:, :4], torch.arange(2), 0)


def test_mlm_on_the_pair(tokenizer: Tokenizer, documents: list[list[int]]) -> None:
    rows, docs = pack_rows(documents, 64, 128)
    batch = build(SentenceOrderPrediction, tokenizer, mlm=MaskedLMConfig())(rows, docs, torch.arange(64), 0)
    selected = batch.labels != IGNORE
    plain = build(SentenceOrderPrediction, tokenizer)(rows, docs, torch.arange(64), 0)
    assert not bool(selected[SP.is_special(plain.input_ids)].any())  # never [CLS]/[SEP]/pad
    assert torch.equal(batch.labels[selected], plain.input_ids[selected])
    ordinary = int((~SP.is_special(plain.input_ids)).sum())
    assert abs(int(selected.sum()) / ordinary - 0.15) < 0.01


def test_loss_is_mlm_mean_plus_pair_mean(tokenizer: Tokenizer, documents: list[list[int]]) -> None:
    """BERT's unweighted sum of means; pitfall 15.8: the masked-token loss is reported on its own."""
    obj = build(NextSentencePrediction, tokenizer, mlm=MaskedLMConfig())
    rows, docs = pack_rows(documents, 8, 64)
    batch = obj(rows, docs, torch.arange(8), 0)
    out = ModelOutput(logits=torch.randn(8, 64, tokenizer.vocab_size), seq_logits=torch.randn(8, 2))
    loss = obj.loss(out, batch)
    mlm = F.cross_entropy(out.logits.reshape(-1, tokenizer.vocab_size), batch.labels.reshape(-1))
    seq = F.cross_entropy(out.seq_logits, batch.seq_labels)
    assert loss.pair_sum is not None and loss.n_pairs is not None
    assert torch.allclose(loss.loss_sum / loss.n_targets + loss.pair_sum / loss.n_pairs, mlm + seq)
    assert torch.allclose(loss.loss_sum / loss.n_targets, mlm)  # each term over its own count
    assert torch.allclose(loss.pair_sum / loss.n_pairs, seq) and int(loss.n_pairs) == batch.n_pairs
    assert torch.allclose(loss.metrics["mlm_loss"], mlm) and torch.allclose(loss.metrics["seq_loss"], seq)
    accuracy = (out.seq_logits.argmax(-1) == batch.seq_labels).float().mean()
    assert torch.allclose(loss.metrics["seq_accuracy"], accuracy)


def test_batch_size_independent_and_yaml(tokenizer: Tokenizer, documents: list[list[int]]) -> None:
    """Pitfall 15.6: the random next comes from the row itself, so no row depends on its batch."""
    rows, docs = pack_rows(documents, 8, 64)
    for cls in (NextSentencePrediction, SentenceOrderPrediction):
        obj = build(cls, tokenizer, mlm=MaskedLMConfig(whole_word=True))
        whole = obj(rows, docs, torch.arange(8), 3)
        parts = [obj(rows[s], docs[s], torch.arange(8)[s], 3) for s in (slice(0, 3), slice(3, 8))]
        for name, tensor in whole.tensors().items():
            assert torch.equal(tensor, torch.cat([p.tensors()[name] for p in parts])), name
        assert objective_defaults(cls.name) == dataclasses.asdict(cls.Config())
        assert build_objective(cls.name, SP, tokenizer).raw_length(128) == 128
        with pytest.raises(UserError, match="tokenizer"):
            cls(cls.Config(), SP)


def test_pick_where_matches_pick_on_the_needed_rows() -> None:
    g = torch.Generator().manual_seed(1)
    candidates = torch.rand(6, 30, generator=g) < 0.2
    candidates[:, 0] = True
    need = torch.tensor([True, False, True, True, False, False])
    rr = RowRandom(3, torch.arange(6) * 7)
    full = pick(candidates, rr, "s")
    assert torch.equal(pick_where(candidates, need, rr, "s"), torch.where(need, full, 0))
    assert torch.equal(pick_where(candidates, torch.ones(6, dtype=torch.bool), rr, "s"), full)


def long_document_stream(tokenizer: Tokenizer, stdlib_texts: list[str]) -> DocumentStream:
    """A corpus of one document (tinyshakespeare-like): every row holds a single document."""
    ids = np.asarray([t for text in stdlib_texts[:40] for t in tokenizer.encode(text)], dtype=np.int64)
    return DocumentStream(Documents(ids, np.asarray([0, len(ids)])), SP.eos, SP.pad, seed=3)


def test_nsp_donor_negatives_whatever_the_packing(tokenizer: Tokenizer, stdlib_texts: list[str]) -> None:
    """same_document_negatives=false on single-document rows: label 1 at the configured rate (0.5 +- 0.03),
    each B read from the row's donor text, which never overlaps the row itself."""
    obj = build_objective("nsp", SP, tokenizer=tokenizer, overrides={"same_document_negatives": False})
    stream = long_document_stream(tokenizer, stdlib_texts)
    assert obj.donor_length(128) == 128
    batches = leading_batches(stream, obj, 128, 1536, 256, seed=5, within_epoch=False)
    labels = torch.cat([b.seq_labels for b in batches])
    assert bool((labels != IGNORE).all())
    assert abs(float((labels == 1).float().mean()) - 0.5) <= 0.03
    assert sum(b.stats["donor_negatives"] for b in batches) == int((labels == 1).sum())
    rows = np.arange(1536)
    lengths = obj.raw_lengths(128, torch.from_numpy(rows), 5).numpy()
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    at = donor_offsets(rows, offsets, 128, 5, stream.epoch_tokens)
    assert bool((at >= offsets + lengths).all() and (at + 128 <= offsets + stream.epoch_tokens).all())


@pytest.mark.parametrize("same_document", [True, False])
def test_nsp_rows_do_not_depend_on_their_batch(
    tokenizer: Tokenizer, stdlib_texts: list[str], same_document: bool
) -> None:
    """A row's pair, masking and label are a function of (its index, seed) only: 16 rows read as one batch,
    as 4 micro-batches of 4, or in reverse order, come out identical."""
    obj = build_objective(
        "nsp", SP, tokenizer=tokenizer, overrides={"same_document_negatives": same_document}
    )
    stream = long_document_stream(tokenizer, stdlib_texts)
    rows = np.arange(100, 116, dtype=np.int64)
    offsets = rows * 130
    lengths = np.full(16, 128, dtype=np.int64)

    def read(sel: np.ndarray) -> Batch:
        return read_batch(stream, obj, rows[sel], offsets[sel], lengths[sel], 128, 9)

    whole = read(np.arange(16))
    parts = [read(np.arange(i, i + 4)) for i in range(0, 16, 4)]
    backwards = read(np.arange(15, -1, -1))
    for name in ("input_ids", "labels", "segment_ids", "seq_labels"):
        assert torch.equal(getattr(whole, name), torch.cat([getattr(p, name) for p in parts])), name
        assert torch.equal(getattr(whole, name), getattr(backwards, name).flip(0)), name


def test_nsp_without_donor_text_is_refused(tokenizer: Tokenizer, documents: list[list[int]]) -> None:
    rows, docs = pack_rows(documents, 4, 64)
    obj = build(NextSentencePrediction, tokenizer, same_document_negatives=False)
    with pytest.raises(UserError, match="donor text"):
        obj(rows, docs, torch.arange(4), 0)
