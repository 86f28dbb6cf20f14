"""Fill-in-the-middle (reference section 9): PSM/SPM layout, merge-back, rates, rate 0 == CLM, lengths."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.objectives.clm import CausalLM
from objtrain.objectives.fim import FillInTheMiddle, cut_points, fragments, token_level_fim
from objtrain.objectives.registry import build_objective, objective_defaults
from objtrain.rng import RowRandom
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary
PRE, MID, SUF = SP.fim_prefix, SP.fim_middle, SP.fim_suffix


def pack(documents: list[list[int]], L: int) -> tuple[list[int], list[int]]:
    """Documents (each with its EOS) packed into one row of L tokens, cut or padded."""
    tokens = [t for d in documents for t in d]
    docs = [i for i, d in enumerate(documents) for _ in d]
    pad = max(L - len(tokens), 0)
    return (tokens + [SP.pad] * pad)[:L], (docs + [-1] * pad)[:L]


def synthetic(
    seed: int, B: int, L: int, n_docs: int = 4, slack: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of up to `n_docs` EOS-terminated documents; `slack` padding keeps every FIM token in the row."""
    g = torch.Generator().manual_seed(seed)
    rows, docs = [], []
    for _ in range(B):
        documents = []
        room = L - slack
        for _ in range(int(torch.randint(1, n_docs + 1, (1,), generator=g))):
            n = int(torch.randint(0, 12, (1,), generator=g))
            doc = [*torch.randint(O, O + 300, (n,), generator=g).tolist(), SP.eos]
            if len(doc) > room:
                break
            documents.append(doc)
            room -= len(doc)
        r, d = pack(documents, L)
        rows.append(r)
        docs.append(d)
    return torch.tensor(rows), torch.tensor(docs)


def fim(tokenizer: Tokenizer | None = None, **kw) -> FillInTheMiddle:
    level = "char" if tokenizer is not None else "token"
    return FillInTheMiddle(FillInTheMiddle.Config(**{"level": level, **kw}), SP, tokenizer)


def output_fragments(batch: Batch, b: int) -> list[list[int]]:
    """The model row (input + the last label) split by document id."""
    last = batch.labels[b, -1:]
    ids = torch.cat([batch.input_ids[b], last if int(last) != IGNORE else last[:0]]).tolist()
    docs = [*batch.document_ids[b].tolist(), batch.document_ids[b, -1].item()]
    out: dict[int, list[int]] = {}
    for t, d in zip(ids, docs, strict=False):
        if d >= 0:
            out.setdefault(d, []).append(t)
    return list(out.values())


def unpermute(fragment: list[int]) -> tuple[list[int], bool]:
    """Undo PSM or SPM: returns (prefix + middle + suffix + tail, looks_spm). PSM with an empty prefix
    also begins <PRE><SUF>; both readings then restore the same tokens."""
    assert fragment[0] == PRE and [fragment.count(s) for s in (PRE, MID, SUF)] == [1, 1, 1]
    mid = fragment.index(MID)
    suf = fragment.index(SUF)
    tail = [SP.eos] if fragment[-1] == SP.eos else []
    body_end = len(fragment) - len(tail)
    if suf == 1:  # SPM: <PRE> <SUF> suffix <MID> prefix middle
        return fragment[mid + 1 : body_end] + fragment[2:mid] + tail, True
    return fragment[1:suf] + fragment[mid + 1 : body_end] + fragment[suf + 1 : mid] + tail, False


@pytest.mark.parametrize("spm", [False, True])
def test_golden_layouts(spm: bool) -> None:
    """Hand-checked: document `a b c d e </s>` cut at i=1, j=3 (prefix a, middle b c, suffix d e)."""
    a, b, c, d, e = range(O, O + 5)
    rows = torch.tensor([[a, b, c, d, e, SP.eos, SP.pad, SP.pad, SP.pad]])
    docs = torch.tensor([[0, 0, 0, 0, 0, 0, -1, -1, -1]])
    f = fragments(rows, docs, SP, 1.0, 0.0, RowRandom(0, torch.arange(1)))
    f = dataclasses.replace(
        f, lo_u=torch.full_like(f.lo_u, 0.2), hi_u=torch.full_like(f.hi_u, 0.6), spm=f.fim & spm
    )  # boundaries floor(0.2 * 6) = 1 and floor(0.6 * 6) = 3
    out, out_docs = token_level_fim(rows, docs, f, SP)
    if spm:
        assert out.tolist() == [[PRE, SUF, d, e, MID, a, b, c, SP.eos]]
    else:
        assert out.tolist() == [[PRE, a, SUF, d, e, MID, b, c, SP.eos]]
    assert out_docs.tolist() == [[0] * 9]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), L=st.integers(4, 60), spm=st.sampled_from([0.0, 0.5, 1.0]))
def test_token_level_merge_back(seed: int, L: int, spm: float) -> None:
    """Pitfall 15.7 (merge-back) and the section 9 invariants: one each of PRE/SUF/MID per transformed
    fragment, SPM begins <PRE><SUF>, re-ordering gives back the document, EOS stays after the middle,
    length is kept. Pitfall 15.5: fragments are split at document boundaries."""
    rows, docs = synthetic(seed, 4, L, slack=15)
    batch = fim(fim_rate=1.0, spm_rate=spm)(rows, docs, torch.arange(4), seed)
    assert batch.input_ids.shape == (4, L - 1)
    for b in range(4):
        originals = [rows[b][docs[b] == d].tolist() for d in docs[b].unique().tolist() if d >= 0]
        fragments = output_fragments(batch, b)
        assert len(fragments) == len(originals)
        for got, want in zip(fragments, originals, strict=True):
            if len(want) == 1:  # an empty document (EOS only) is left alone
                assert got == want
                continue
            restored, _ = unpermute(got)
            assert restored == want
            if spm == 1.0:
                assert got[:2] == [PRE, SUF]
            assert got[-1] == SP.eos  # the model learns to stop after the middle


def test_char_level_merge_back(tokenizer: Tokenizer, stdlib_texts: list[str]) -> None:
    """Pitfall 15.7 at character level: decoding the re-ordered parts gives back the document's text."""
    texts = [t[i : i + 150] for t in stdlib_texts for i in range(0, 1200, 300)]
    documents = [[*tokenizer.encode(t), SP.eos] for t in texts]
    packed = [pack(documents[i : i + 2], 400) for i in range(0, len(documents), 2)]
    rows, docs = torch.tensor([r for r, _ in packed]), torch.tensor([d for _, d in packed])
    batch = fim(tokenizer, fim_rate=1.0)(rows, docs, torch.arange(len(rows)), 0)
    assert batch.stats["fim"] == 2 * len(rows) and 0 < batch.stats["spm"] < batch.stats["fim"]
    for b in range(len(rows)):
        for d, got in enumerate(output_fragments(batch, b)):
            restored, _ = unpermute(got)
            assert restored[-1] == SP.eos
            assert tokenizer.decode(restored[:-1]) == texts[2 * b + d]


def test_rates() -> None:
    rows, docs = synthetic(0, 400, 64)
    batch = fim(fim_rate=0.3, spm_rate=0.7)(rows, docs, torch.arange(400), 1)
    s = batch.stats
    assert s["fragments"] > 800
    assert abs(s["fim"] / s["fragments"] - 0.3) < 0.05
    assert abs(s["spm"] / s["fim"] - 0.7) < 0.07


def test_rate_zero_is_clm_byte_for_byte(tokenizer: Tokenizer) -> None:
    rows, docs = synthetic(3, 16, 48)
    clm = CausalLM(CausalLM.Config(), SP)(rows, docs, torch.arange(16), 5)
    for obj in (fim(fim_rate=0.0), fim(tokenizer, fim_rate=0.0)):
        batch = obj(rows, docs, torch.arange(16), 5)
        for name, tensor in clm.tensors().items():
            assert torch.equal(tensor, batch.tensors()[name]), name


def test_loss_everywhere_but_fim_pad(tokenizer: Tokenizer) -> None:
    """Pitfall 15.3: FIM trains every position except <fim_pad> (bigcode does not mask it). A document
    spelt one character per token re-encodes much shorter, so the row is right-padded with <fim_pad>:
    document id -1, no label, and every in-document target is trained."""
    text = "return self " * 12
    spelt = [*(tokenizer.id_of("\u2581" if c == " " else c) for c in text[:100]), SP.eos]
    assert tokenizer.decode(spelt[:-1]) == text[:100]
    rows = torch.tensor([spelt] * 4)
    batch = fim(tokenizer, fim_rate=1.0)(rows, torch.zeros_like(rows), torch.arange(4), 2)
    pad = batch.input_ids == SP.fim_pad
    assert bool(pad.any(dim=1).all()) and batch.stats["fim_pad"] > 0
    assert bool((batch.document_ids[pad] == -1).all())
    assert bool((batch.labels[batch.document_ids < 0] == IGNORE).all())
    assert not bool((batch.labels == SP.fim_pad).any())
    real = batch.document_ids >= 0
    nxt = (batch.document_ids[:, 1:] == batch.document_ids[:, :-1]) & real[:, 1:]
    assert torch.equal((batch.labels != IGNORE)[:, :-1], nxt)
    for b in range(4):  # the padded rows still hold the whole transformed document
        restored, _ = unpermute(output_fragments(batch, b)[0])
        assert tokenizer.decode(restored[:-1]) == text[:100] and restored[-1] == SP.eos


def test_long_rows_truncate_to_the_input_length() -> None:
    rows = torch.randint(O, O + 300, (3, 200))
    rows[:, 99] = SP.eos
    docs = (torch.arange(200) >= 100).long().expand(3, 200)
    batch = fim(fim_rate=1.0)(rows, docs, torch.arange(3), 0)
    assert batch.input_ids.shape == (3, 199)
    first = output_fragments(batch, 0)[0]
    assert unpermute(first)[0] == rows[0, :100].tolist()
    assert batch.stats["fim"] == 6


def test_short_rows_and_errors() -> None:
    obj = fim(fim_rate=1.0)
    for L in (0, 1, 2):
        rows = torch.full((2, L), O)
        batch = obj(rows, torch.zeros_like(rows), torch.arange(2), 0)
        assert batch.input_ids.shape == (2, max(L - 1, 0))
    with pytest.raises(UserError, match="tokenizer"):
        FillInTheMiddle(FillInTheMiddle.Config(), SP)
    with pytest.raises(UserError, match="fim_rate"):
        build_objective("fim", SP, overrides={"fim_rate": 1.5, "level": "token"})


@pytest.mark.parametrize("char", [False, True])
def test_batch_size_independent_and_yaml(tokenizer: Tokenizer, char: bool) -> None:
    """Pitfall 15.6: seeded per (seed, row index), whatever the batch; the YAML mirrors the defaults."""
    rows, docs = synthetic(4, 8, 40)
    if char:  # real text for the tokenizer
        rows = torch.where(rows == SP.eos, rows, rows % 500 + O)
    obj = fim(tokenizer if char else None)
    whole = obj(rows, docs, torch.arange(8), 3)
    parts = [obj(rows[s], docs[s], torch.arange(8)[s], 3) for s in (slice(0, 3), slice(3, 8))]
    for name, tensor in whole.tensors().items():
        assert torch.equal(tensor, torch.cat([p.tensors()[name] for p in parts])), name
    assert objective_defaults("fim") == dataclasses.asdict(FillInTheMiddle.Config())
    assert build_objective("fim", SP, tokenizer).raw_length(512) == 513


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    L=st.integers(2, 120),
    rate=st.sampled_from([0.5, 1.0]),
    spm=st.sampled_from([0.0, 0.5, 1.0]),
    end=st.sampled_from(["cut", "boundary", "full"]),
)
def test_a_document_is_transformed_whatever_follows_it(
    make_packed_rows: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    keep_first_documents: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    seed: int,
    L: int,
    rate: float,
    spm: float,
    end: str,
) -> None:
    """Context-level FIM transforms every fragment on its own, from draws at its start: a row whose
    documents from some k on are padding gives exactly the same model positions for its first k documents
    (tokens, labels, positions), EOS-only and one-token documents included, and holds nothing else."""
    obj = fim(fim_rate=rate, spm_rate=spm)
    rows, docs = make_packed_rows(seed, 6, L, end)
    index = torch.arange(6) * 5 + seed
    full = obj(rows, docs, index, seed)
    first, k = keep_first_documents(docs, seed)
    alone = obj(rows, first, index, seed)
    ours = (full.document_ids >= 0) & (full.document_ids < k[:, None])
    for name in ("input_ids", "labels", "positions", "document_ids"):
        a, b = getattr(full, name), getattr(alone, name)
        assert torch.equal(a[ours], b[ours]), name
    assert bool((alone.document_ids[~ours] == -1).all()) and bool((alone.labels[~ours] == IGNORE).all())


def test_piece_decoder_is_sentencepieces_decode(tokenizer: Tokenizer) -> None:
    """The table decoder gives sentencepiece's text to the character on any ids: byte pieces alone and in
    runs (valid, truncated and stray UTF-8), reserved tokens among them (they split byte runs), <unk>."""
    import random

    from objtrain.objectives.fim import PieceDecoder

    sp = tokenizer.sp
    decoder = PieceDecoder(tokenizer)
    byte_ids = [i for i in range(sp.get_piece_size()) if sp.is_byte(i)]
    rng = random.Random(0)
    V = tokenizer.vocab_size
    batch = [
        [rng.choice(byte_ids) if rng.random() < 0.5 else rng.randrange(V) for _ in range(n)]
        for n in [rng.randint(0, 40) for _ in range(5000)]
    ]
    text = "naïve café — ü € 😀 ∑ x\t\n  y ▁ \x00"
    batch.append(tokenizer.encode(text))
    assert decoder(batch) == sp.decode(batch)
    assert decoder([tokenizer.encode(text)]) == [text]


def test_char_level_batches_are_the_same_with_sentencepieces_decode(
    tokenizer: Tokenizer, stdlib_texts: list[str]
) -> None:
    """The faster decode changes no batch: char-level FIM with sentencepiece's decode gives the same
    tensors."""
    text = "".join(stdlib_texts)
    ids = tokenizer.encode(text[:60_000])
    eos_every = [*range(300, len(ids), 517)]
    tokens = torch.tensor(ids)
    for i in eos_every:
        tokens[i] = SP.eos
    B, L = 24, 257
    rows = tokens[: B * L].view(B, L)
    docs = (rows == SP.eos).long().cumsum(1)
    docs = docs - torch.where(rows == SP.eos, 1, 0)
    obj = fim(tokenizer)
    fast = obj(rows, docs, torch.arange(B), 7)
    obj.decoder = None  # char_level_fim falls back to sentencepiece's decode
    slow = obj(rows, docs, torch.arange(B), 7)
    assert fast.stats == slow.stats and fast.stats["fim"] > 0
    for name, tensor in slow.tensors().items():
        assert torch.equal(tensor, fast.tensors()[name]), name


def test_window_reencoding_keeps_every_part_and_almost_every_token(
    tokenizer: Tokenizer, stdlib_texts: list[str]
) -> None:
    """Re-encoding only around the cuts gives each part's exact text, and the very tokens of encoding the
    part whole but where sentencepiece breaks a tie between two segmentations of the same text (runs of
    spaces) differently; both are checked against the reference: decode, cut, encode each part whole."""
    import random

    from objtrain.objectives.fim import PieceDecoder, WindowEncoder, whole_parts

    rng = random.Random(0)
    text = "".join(stdlib_texts)
    ids = tokenizer.encode(text[:400_000])
    decoder = PieceDecoder(tokenizer)
    window = WindowEncoder(tokenizer, decoder)
    same = total = 0
    for _ in range(60):
        pieces, cuts = [], []
        for _ in range(16):
            a = rng.randrange(len(ids) - 2)
            pieces.append(ids[a : a + rng.choice([1, 2, 7, 60, 400, 1500])])
            cuts.append((rng.random(), rng.random()))
        reference: list[list[int]] = []  # the algorithm as it stands in the reference, spelled out
        for piece, (lo, hi) in zip(pieces, cuts, strict=True):
            whole = tokenizer.decode(piece)
            i, j = cut_points(whole, lo, hi)
            reference += [tokenizer.encode(part) for part in (whole[:i], whole[i:j], whole[j:])]
        assert whole_parts(pieces, cuts, tokenizer, decoder) == reference
        got = window(pieces, cuts)
        assert [decoder([p])[0] for p in got] == [decoder([p])[0] for p in reference]
        same += sum(g == r for g, r in zip(got, reference, strict=True))
        total += len(reference)
    assert same >= 0.95 * total, (same, total)


def test_whole_reencoding_batches_are_todays(tokenizer: Tokenizer, stdlib_texts: list[str]) -> None:
    """`reencode: whole` is the reference algorithm: its batches equal those of a row-by-row rebuild that
    encodes each part whole; `window` keeps the row length and the transformed fragments' count."""
    text = "".join(stdlib_texts)
    ids = torch.tensor(tokenizer.encode(text[:80_000]))
    ids[torch.arange(200, len(ids), 611)] = SP.eos
    B, L = 16, 300
    rows = ids[: B * L].view(B, L)
    docs = (rows == SP.eos).long().cumsum(1) - (rows == SP.eos).long()
    whole = fim(tokenizer, reencode="whole")(rows, docs, torch.arange(B), 5)
    window = fim(tokenizer)(rows, docs, torch.arange(B), 5)
    assert whole.stats["fim"] == window.stats["fim"] > 0
    assert window.input_ids.shape == whole.input_ids.shape == (B, L - 1)
    rr = RowRandom(5, torch.arange(B))
    f = fragments(rows, docs, SP, 0.5, 0.5, rr)
    for b in range(B):
        expected: list[int] = []
        for s in torch.nonzero(f.is_start[b])[:, 0].tolist():
            e = s + int((docs[b] == docs[b, s]).sum())
            piece, n = rows[b, s:e].tolist(), int(f.content[b, s])
            if not bool(f.fim[b, s]):
                expected += piece
                continue
            full = tokenizer.decode(piece[:n])
            i, j = cut_points(full, float(f.lo_u[b, s]), float(f.hi_u[b, s]))
            pre, mid, suf = (tokenizer.encode(p) for p in (full[:i], full[i:j], full[j:]))
            spm = bool(f.spm[b, s])
            expected += [PRE, SUF, *suf, MID, *pre, *mid] if spm else [PRE, *pre, SUF, *suf, MID, *mid]
            expected += piece[n:]
        expected = (expected + [SP.fim_pad] * L)[:L]
        assert whole.input_ids[b].tolist() == expected[:-1]
