"""NSP and SOP (reference sections 3 and 4): pairs packed per row, layout, label meaning and balance,
single-document rows, padding, attention kept inside each pair."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import Batch, ModelOutput
from objtrain.data.batches import donor_offsets, leading_batches, read_batch
from objtrain.data.stream import Documents, DocumentStream
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.models import build_model, model_config
from objtrain.objectives.mlm import MaskedLMConfig
from objtrain.objectives.registry import build_objective, objective_defaults
from objtrain.objectives.sentence_pairs import NextSentencePrediction, Pairs, SentenceOrderPrediction
from objtrain.objectives.sentences import sentence_end_table, sentence_ids
from objtrain.rng import RowRandom
from objtrain.specials import Specials

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


def single_document(documents: list[list[int]], B: int, L: int, start: int = 0) -> tuple[Tensor, Tensor]:
    """Rows of one document each (the EOS inside are then sentence ends, not document ends)."""
    rows, _ = pack_rows(documents, B, L, start)
    return rows, torch.zeros_like(rows)


def check_pairs(obj, batch: Batch, rows: Tensor, docs: Tensor, pairs: Pairs, donors=None) -> None:
    """Every pair is `[CLS] A [SEP] B [SEP]` with its own document id, segment ids 0 then 1, positions from
    0, its label on its [CLS] only; A and B are non-empty runs of one document each, shown as they are in
    the raw row (B in the donor text for donor negatives); after the last pair, only padding."""
    B = rows.size(0)
    sid = sentence_ids(rows, torch.where(SP.is_special(rows), -1, docs), sentence_end_table(obj.tokenizer))
    for b in range(B):
        ids, dids = batch.input_ids[b].tolist(), batch.document_ids[b].tolist()
        end = 0
        for k, p in enumerate(torch.nonzero(pairs.placed[b]).flatten().tolist()):
            at, l0, l1 = (int(v[b, p]) for v in (pairs.at, pairs.first_len, pairs.second_len))
            s0, s1 = int(pairs.first_start[b, p]), int(pairs.second_start[b, p])
            assert at == end and l0 >= 1 and l1 >= 1
            n = l0 + l1 + 3
            end = at + n
            assert ids[at] == SP.cls and ids[at + 1 + l0] == SP.sep and ids[at + n - 1] == SP.sep
            assert dids[at:end] == [k] * n
            assert batch.positions[b, at:end].tolist() == list(range(n))
            assert batch.segment_ids[b, at:end].tolist() == [0] * (l0 + 2) + [1] * (l1 + 1)
            label = int(batch.seq_labels[b, at])
            assert label == int(pairs.label[b, p]) and label in (0, 1)
            assert (batch.seq_labels[b, at + 1 : end] == IGNORE).all()
            first = rows[b, s0 : s0 + l0]
            source = donors[0][b] if bool(pairs.from_donor[b, p]) else rows[b]
            source_docs = donors[1][b] if bool(pairs.from_donor[b, p]) else docs[b]
            second = source[s1 : s1 + l1]
            assert ids[at + 1 : at + 1 + l0] == first.tolist()
            assert ids[at + 2 + l0 : end - 1] == second.tolist()
            for seg, seg_docs in ((first, docs[b, s0 : s0 + l0]), (second, source_docs[s1 : s1 + l1])):
                assert not SP.is_special(seg).any() and (seg_docs == seg_docs[0]).all() and seg_docs[0] >= 0
            same_doc = not bool(pairs.from_donor[b, p]) and int(docs[b, s0]) == int(docs[b, s1])
            if label == 0:  # the actual next: B starts right where A ends
                assert same_doc and s0 + l0 == s1
            elif obj.name == "sop":  # the same two segments, swapped
                assert same_doc and s1 + l1 == s0
            elif same_doc:  # NSP: a passage of A's document that does not follow A
                if s1 >= s0 + l0:  # later, with at least one sentence skipped
                    assert s1 > s0 + l0
                    if bool(pairs.sentence_split[b, p]):
                        assert int(sid[b, s1]) - int(sid[b, s0 + l0]) >= 1
                else:  # before A, ending where A starts at the latest
                    assert s1 + l1 <= s0
        assert (batch.document_ids[b, end:] == -1).all() and (batch.seq_labels[b, end:] == IGNORE).all()
        assert (batch.input_ids[b, end:] == SP.pad).all()
    assert batch.n_pairs == int(pairs.placed.sum()) == batch.stats["pairs"]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    L=st.sampled_from([5, 9, 17, 32, 64, 128, 300]),
    name=st.sampled_from(["nsp", "sop", "nsp-donor"]),
    single=st.booleans(),
    short=st.sampled_from([0.0, 0.1, 1.0]),
)
def test_pairs_are_well_formed_and_come_from_the_right_places(
    tokenizer: Tokenizer, documents: list[list[int]], seed: int, L: int, name: str, single: bool, short: float
) -> None:
    """Label meaning (the flipped-convention pitfall, PaddleNLP#6364): 0 = A then its actual continuation;
    NSP 1 = B from another document, the donor text, or a passage of A's document that does not follow
    it; SOP 1 = the same two segments, swapped. Single- and multi-document rows, any length."""
    cls = SentenceOrderPrediction if name == "sop" else NextSentencePrediction
    extra = {"same_document_negatives": False} if name == "nsp-donor" else {}
    obj = build(cls, tokenizer, short_seq_prob=short, **extra)
    rows, docs = (single_document if single else pack_rows)(documents, 6, L, start=seed)
    donors = pack_rows(documents, 6, L, start=seed + 500) if name == "nsp-donor" else None
    index = torch.arange(6) + seed
    batch = obj(rows, docs, index, seed, donors=donors)
    pairs = obj.make_pairs(rows, docs, RowRandom(seed, index), donors)
    check_pairs(obj, batch, rows, docs, pairs, donors)
    if L >= 32:
        assert batch.n_pairs >= 6  # every row of text makes pairs


def test_label_share_and_several_pairs_per_row(tokenizer: Tokenizer, documents: list[list[int]]) -> None:
    """Label 1 at the configured rate within a pair per row (stratified), single- or multi-document rows;
    NSP negatives of single-document rows are passages of the same document."""
    for single in (False, True):
        rows, docs = (single_document if single else pack_rows)(documents, 300, 256)
        for rate in (0.5, 0.3):
            obj = build(NextSentencePrediction, tokenizer, random_next_rate=rate)
            nsp = obj(rows, docs, torch.arange(300), 0)
            assert nsp.stats["pairs"] >= 2 * 300 and nsp.stats["label_1"] == int((nsp.seq_labels == 1).sum())
            assert abs(nsp.stats["label_1_fraction"] - rate) <= 0.02
            if single:
                assert nsp.stats["same_document_negatives"] == nsp.stats["label_1"]
        sop = build(SentenceOrderPrediction, tokenizer)(rows, docs, torch.arange(300), 0)
        assert abs(sop.stats["label_1_fraction"] - 0.5) <= 0.02
        per_row = (sop.seq_labels != IGNORE).sum(1)
        assert bool((per_row >= 2).all())
        ones = (sop.seq_labels == 1).sum(1)
        assert bool(((ones - per_row * 0.5).abs() <= 1).all())  # stratified: within one pair per row


def test_negatives_look_like_positives(tokenizer: Tokenizer, documents: list[list[int]]) -> None:
    """A negative B is about as long as an actual next, ends at a sentence boundary as often, and starts
    mid-sentence as often, so neither its length nor its ends give the label away. Compared per kind of
    split: a pair split at a token (a one-sentence chunk) has a short B whichever its label, and an
    aggregate would let one kind's bias hide the other's."""
    rows, docs = single_document(documents, 300, 256)
    obj = build(NextSentencePrediction, tokenizer)
    pairs = obj.make_pairs(rows, docs, RowRandom(0, torch.arange(300)))
    ends = sentence_end_table(tokenizer)[rows]
    last = (pairs.second_start + pairs.second_len - 1).clamp(0, 255)
    at_end = ends.gather(1, last)
    full = pairs.placed & (pairs.at + pairs.first_len + pairs.second_len + 3 < 256 - 3)  # not the cut pair
    mean = lambda x, m: float(x[m].double().mean())  # noqa: E731
    # A pair split at a token: B as long as the actual next (its exact length where it comes from the tail).
    neg, pos = full & pairs.label & ~pairs.sentence_split, full & ~pairs.label & ~pairs.sentence_split
    assert int(neg.sum()) >= 50 and int(pos.sum()) >= 50
    assert abs(mean(pairs.second_len, neg) / mean(pairs.second_len, pos) - 1) < 0.1
    # Split at a sentence: a B read from the row's tail is cut short where the row's last document is
    # shorter than the actual next and no passage before A has room (the row's first pairs): 20% shorter
    # on average on these 3- to 14-line documents, a weak cue left as it is (module doc).
    neg, pos = full & pairs.label & pairs.sentence_split, full & ~pairs.label & pairs.sentence_split
    assert abs(mean(pairs.second_len, neg) / mean(pairs.second_len, pos) - 1) < 0.25
    neg, pos = full & pairs.label, full & ~pairs.label
    assert abs(mean(at_end, neg) - mean(at_end, pos)) < 0.1
    # B starts mid-sentence (after a position that is not a sentence end) as often in either class.
    sid = sentence_ids(rows, torch.where(SP.is_special(rows), -1, docs), sentence_end_table(tokenizer))
    first = pairs.second_start.clamp(1, 255)
    mid = sid.gather(1, first) == sid.gather(1, first - 1)
    assert abs(mean(mid, neg) - mean(mid, pos)) < 0.1


def test_one_sentence_rows_split_at_a_token(tokenizer: Tokenizer) -> None:
    """A 1-segment chunk is split at a random token position (reference section 4 recommendation)."""
    enders = sentence_end_table(tokenizer)
    plain = [i for i in range(SP.first_ordinary, tokenizer.vocab_size) if not enders[i]][:50]
    g = torch.Generator().manual_seed(0)
    rows = torch.tensor(plain)[torch.randint(0, len(plain), (100, 40), generator=g)]
    docs = torch.zeros_like(rows)
    for cls in (NextSentencePrediction, SentenceOrderPrediction):
        obj = build(cls, tokenizer)
        batch = obj(rows, docs, torch.arange(100), 1)
        assert batch.stats["token_splits"] == batch.stats["pairs"] >= 100
        check_pairs(obj, batch, rows, docs, obj.make_pairs(rows, docs, RowRandom(1, torch.arange(100))))


def test_degenerate_and_long_rows(tokenizer: Tokenizer, documents: list[list[int]]) -> None:
    obj = build(NextSentencePrediction, tokenizer)
    rows = torch.tensor([[SP.pad] * 8, [300, SP.eos, 301, SP.eos, SP.pad, SP.pad, SP.pad, SP.pad]])
    docs = torch.tensor([[-1] * 8, [0, 0, 1, 1, -1, -1, -1, -1]])
    batch = obj(rows, docs, torch.arange(2), 0)  # no two adjacent tokens of one document: no pair
    assert batch.n_pairs == 0 and (batch.document_ids == -1).all() and (batch.input_ids == SP.pad).all()
    rows, docs = pack_rows(documents, 2, 2048)
    batch = obj(rows, docs, torch.arange(2), 0)
    check_pairs(obj, batch, rows, docs, obj.make_pairs(rows, docs, RowRandom(0, torch.arange(2))))
    assert float((batch.document_ids < 0).float().mean()) <= 0.05
    with pytest.raises(UserError, match="cannot hold"):
        obj(rows[:, :4], docs[:, :4], torch.arange(2), 0)
    with pytest.raises(UserError, match="pair_length"):
        build(NextSentencePrediction, tokenizer, pair_length=1)


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
    out = ModelOutput(logits=torch.randn(8, 64, tokenizer.vocab_size), seq_logits=torch.randn(8, 64, 2))
    loss = obj.loss(out, batch)
    mlm = F.cross_entropy(out.logits.reshape(-1, tokenizer.vocab_size), batch.labels.reshape(-1))
    cls = batch.seq_labels != IGNORE  # one label per pair, at its [CLS]
    assert torch.equal(cls, batch.input_ids == SP.cls) and batch.n_pairs == int(cls.sum()) > 8
    seq = F.cross_entropy(out.seq_logits[cls], batch.seq_labels[cls])
    assert loss.pair_sum is not None and loss.n_pairs is not None
    assert torch.allclose(loss.loss_sum / loss.n_targets + loss.pair_sum / loss.n_pairs, mlm + seq)
    assert torch.allclose(loss.loss_sum / loss.n_targets, mlm)  # each term over its own count
    assert torch.allclose(loss.pair_sum / loss.n_pairs, seq) and int(loss.n_pairs) == batch.n_pairs
    assert torch.allclose(loss.metrics["mlm_loss"], mlm) and torch.allclose(loss.metrics["seq_loss"], seq)
    accuracy = (out.seq_logits[cls].argmax(-1) == batch.seq_labels[cls]).float().mean()
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
    assert bool(((labels != IGNORE).sum(1) >= 2).all())  # several pairs in every row
    labels = labels[labels != IGNORE]
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


def stdlib_stream(tokenizer: Tokenizer, stdlib_texts: list[str]) -> DocumentStream:
    """The sample modules as documents, several thousand tokens each (most rows hold one document)."""
    docs = [tokenizer.encode(text) for text in stdlib_texts]
    ids = np.asarray([t for d in docs for t in d], dtype=np.int64)
    return DocumentStream(Documents(ids, np.cumsum([0] + [len(d) for d in docs])), SP.eos, SP.pad, seed=1)


@pytest.mark.parametrize("name", ["nsp", "nsp-donor", "sop"])
def test_padding_on_realistic_rows(tokenizer: Tokenizer, stdlib_texts: list[str], name: str) -> None:
    """Rows of 568 read as training reads them: at most 5% padding of the positions, the label share at
    the rate, no target dropped, and what the pairs leave unused reported."""
    overrides = {"same_document_negatives": False} if name == "nsp-donor" else {}
    obj = build_objective(name[:3], SP, tokenizer=tokenizer, overrides=overrides)
    batches = leading_batches(stdlib_stream(tokenizer, stdlib_texts), obj, 568, 96, 48, seed=2)
    positions = sum(b.document_ids.numel() for b in batches)
    padding = sum(float((b.document_ids < 0).sum()) for b in batches) / positions
    assert padding <= 0.05
    labels = torch.cat([b.seq_labels[b.seq_labels != IGNORE] for b in batches])
    assert len(labels) >= 4 * 96 and abs(float(labels.float().mean()) - 0.5) <= 0.03
    for b in batches:
        assert b.stats["target_tokens_dropped"] == 0
        assert 0 <= b.stats["raw_tokens_unused"] <= b.stats["raw_tokens_fed"]
    if name != "nsp-donor":  # the donor negatives' own next is not put back (module doc)
        unused = sum(b.stats["raw_tokens_unused"] for b in batches)
        assert unused / sum(b.stats["raw_tokens_fed"] for b in batches) <= 0.05


def test_nsp_waste_on_paragraphs_of_long_sentences(tokenizer: Tokenizer, stdlib_texts: list[str]) -> None:
    """Prose as wikitext-2 has it: paragraphs of 1 to 7 long sentences, rows of 256. A full row of raw
    text left 12% of it unused (the positions of [CLS] [SEP] [SEP] and of the B's read before their
    A displaced it); the row's need leaves room for them: at most 5% unused and 5% padding."""
    words = " ".join(" ".join(text.split()) for text in stdlib_texts).replace(".", "").split(" ")
    sentences = [" ".join(words[i : i + 20]) + ".\n" for i in range(0, len(words) - 20, 20)]
    docs, i, k = [], 0, 0
    while i < len(sentences):
        n = 1 + (k * 5) % 7  # paragraphs of 1 to 7 sentences
        docs.append(tokenizer.encode("".join(sentences[i : i + n])))
        i, k = i + n, k + 1
    ids = np.asarray([t for d in docs for t in d], dtype=np.int64)
    stream = DocumentStream(Documents(ids, np.cumsum([0] + [len(d) for d in docs])), SP.eos, SP.pad, seed=1)
    obj = build_objective("nsp", SP, tokenizer=tokenizer)
    batches = leading_batches(stream, obj, 256, 256, 64, seed=0)
    fed = sum(b.stats["raw_tokens_fed"] for b in batches)
    assert sum(b.stats["raw_tokens_unused"] for b in batches) / fed <= 0.05
    positions = sum(b.document_ids.numel() for b in batches)
    assert sum(float((b.document_ids < 0).sum()) for b in batches) / positions <= 0.05
    labels = torch.cat([b.seq_labels[b.seq_labels != IGNORE] for b in batches])
    assert abs(float(labels.float().mean()) - 0.5) <= 0.04


def test_nsp_puts_the_actual_next_of_a_negative_back(tokenizer: Tokenizer, stdlib_texts: list[str]) -> None:
    """BERT's generator puts a negative's unused segments back: the pair after a negative starts its A where
    the negative's A ends (rows of one long document, so no EOS lies between), and no pair shows a raw
    position twice except a negative's B read before its A (the fallback when the row's tail has no room)."""
    obj = build(NextSentencePrediction, tokenizer)
    stream = stdlib_stream(tokenizer, stdlib_texts)
    rows, docs = stream.rows(np.arange(0, 40 * 512, 512), np.full(40, 512), 512)
    pairs = obj.make_pairs(rows, docs, RowRandom(3, torch.arange(40)))
    followed = 0
    for b in range(40):
        placed = torch.nonzero(pairs.placed[b]).flatten().tolist()
        seen = torch.zeros(512, dtype=torch.long)
        for k, p in enumerate(placed):
            s0, l0 = int(pairs.first_start[b, p]), int(pairs.first_len[b, p])
            s1, l1 = int(pairs.second_start[b, p]), int(pairs.second_len[b, p])
            seen[s0 : s0 + l0] += 1
            if not (bool(pairs.label[b, p]) and s1 < s0):
                seen[s1 : s1 + l1] += 1
            # (the row's last pair may be cut from its front to fit)
            if bool(pairs.label[b, p]) and k + 2 < len(placed) and bool((docs[b] == docs[b, 0]).all()):
                assert int(pairs.first_start[b, placed[k + 1]]) == s0 + l0
                followed += 1
        assert int(seen.max()) <= 1
    assert followed >= 20


def test_no_attention_across_pairs(tokenizer: Tokenizer, documents: list[list[int]]) -> None:
    """Each pair is its own document: changing the tokens of one pair leaves the encoder's outputs (and the
    pooled head) of every other pair of the row unchanged, and changes its own."""
    obj = build(SentenceOrderPrediction, tokenizer)
    rows, docs = pack_rows(documents, 2, 128)
    batch = obj(rows, docs, torch.arange(2), 0)
    torch.manual_seed(0)
    cfg = model_config("encoder", "debug", {"n_segments": 2, "n_classes": 2}, vocab_size=tokenizer.vocab_size)
    model = build_model(cfg).eval()
    with torch.no_grad():
        before = model(batch)
        second = batch.document_ids == 1
        changed = Batch(**{**batch.__dict__, "input_ids": batch.input_ids.clone()})
        changed.input_ids[second & ~SP.is_special(batch.input_ids)] = SP.first_ordinary + 7
        after = model(changed)
    assert bool(second.any(dim=1).all())
    others = ~second
    assert torch.allclose(before.hidden[others], after.hidden[others], atol=1e-6)
    assert torch.allclose(before.seq_logits[others], after.seq_logits[others], atol=1e-6)
    assert not torch.allclose(before.hidden[second], after.hidden[second], atol=1e-3)
