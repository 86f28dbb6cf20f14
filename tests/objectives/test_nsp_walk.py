"""The NSP put-back walk pinned to its reference: the implementation in `sentence_pairs` runs the walk on
numpy lookup tables for speed; the version below is the plain torch walk it replaced (one batched
`searchsorted` per lookup), kept as the specification. Both must give the same pairs and, through the whole
objective, bit-identical batches on any rows: packed, single-document, short documents, rows ending on a
document boundary, padded rows, one-token rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor

from objtrain.batch import Batch
from objtrain.data.stream import Documents, DocumentStream
from objtrain.data.tokenizer import Tokenizer
from objtrain.objectives import sentence_pairs
from objtrain.objectives.registry import build_objective
from objtrain.objectives.sentence_pairs import Pairs, Text, _gather, truncated_lengths
from objtrain.rng import RowRandom
from objtrain.specials import Specials

SP = Specials()


class _ReferenceColumns:
    """Column k of `rr.uniform64(n, stream)` (any n > k), as (B, 1): hashed in blocks of columns, not one
    call per column (the walk asks for four per step)."""

    def __init__(self, rr: RowRandom) -> None:
        self.rr = rr
        self.grids: dict[str, Tensor] = {}

    def __call__(self, k: int, stream: str) -> Tensor:
        grid = self.grids.get(stream)
        if grid is None or grid.size(1) <= k:
            grid = self.rr.uniform64(max(16, 2 * (k + 1)), stream)
            self.grids[stream] = grid
        return grid[:, k : k + 1]


def reference_put_back_pairs(own: Text, pair_length: int, config: Any, rr: RowRandom) -> Pairs:
    """NSP pairs of raw rows with same-row negatives, the unused segments put back (`sentence_pairs` module
    doc, "NSP put-back"): a walk over the pairs of a row, vectorised over the batch, one step per pair."""
    doc = own.doc
    B, L = doc.shape
    device = doc.device
    K = pair_length
    real = doc >= 0
    # first real position at or after each position (L where none): chunks start on text, never on an EOS
    idx = torch.arange(L + 1, device=device).expand(B, L + 1)
    text_at = torch.where(torch.cat([real, torch.ones_like(real[:, :1])], 1), idx, L)
    next_real = text_at.flip(1).cummin(1).values.flip(1)
    # last real position before each position 0..L (-1 where none)
    last_real = torch.where(torch.cat([torch.zeros_like(real[:, :1]), real], 1), idx - 1, -1).cummax(1).values
    cur = torch.zeros(B, 1, dtype=torch.long, device=device)
    at = torch.zeros_like(cur)
    # Negatives read their B from the end of the row backwards: `tail` bounds the text still free there. It
    # starts at the row's last sentence start (the row's end when the row ends on an EOS or padding), so a
    # B ends at a sentence boundary as an actual next does; the text after it, the row's cut last sentence,
    # is read by the front last (`rest`), once it reaches the tail.
    last_start = own.nth_start((own.before[:, L:] - 1).clamp(min=0))
    ends_clean = ~real[:, L - 1 :]
    tail = torch.where(ends_clean | (own.before[:, L:] == 0), L, last_start)
    rest = tail.clone()
    closed = torch.zeros_like(cur, dtype=torch.bool)  # the front reads the rest: no more B from the tail
    column = _ReferenceColumns(rr)
    fields: dict[str, list[Tensor]] = {n: [] for n in Pairs.__dataclass_fields__ if n != "flags"}
    flags: dict[str, list[Tensor]] = {"same_document_negatives": [], "donor_negatives": []}
    for step in range(L + 1):
        cur = next_real.gather(1, cur.clamp(max=L))
        jump = (cur >= tail) & (rest < L)
        cur = torch.where(jump, next_real.gather(1, rest), cur)
        tail = torch.where(jump, L, tail)
        rest = torch.where(jump, L, rest)
        closed = closed | jump
        room = L - at - 3  # text tokens the next pair may hold
        active = (cur < tail) & (room >= 2)
        if not bool(active.any()):
            break
        # the chunk: `length` tokens (short with short_seq_prob), moved forward to a sentence start within
        # half a chunk, inside its document run, before the tail, and no longer than the room left
        u = column(step, "pairs/length")
        drawn = torch.where(
            u < config.short_seq_prob, 2 + (u * ((K - 1) / max(config.short_seq_prob, 1e-300))).long(), K
        ).clamp(max=K)
        c = cur.clamp(max=L - 1)
        limit = torch.minimum(own.run_end(c), tail)
        nominal = cur + torch.minimum(drawn, room)
        nxt = own.next_start(nominal.clamp(0, L))
        snap = (nxt < limit) & (nxt <= nominal + max(K // 2, 1)) & (nxt - cur <= room)
        end = torch.minimum(torch.where(snap, nxt, nominal), limit)
        size = end - cur
        valid = active & (size >= 2)
        # the split: a random sentence start strictly inside, else a random token (as `chunk_rows`)
        u = column(step, "pairs/split")
        bounds = torch.cat([(cur + 1).clamp(max=L), end.clamp(0, L)], 1)
        first, last = own.before.gather(1, bounds).chunk(2, 1)
        inner = last - first
        at_sentence = valid & (inner > 0)
        by_sentence = own.nth_start(first + (u * inner.clamp(min=0)).long())
        by_token = cur + 1 + (u * (size - 1).clamp(min=0)).long()
        split = torch.where(at_sentence, by_sentence, torch.where(valid, by_token, cur))
        want = end - split
        # i.i.d. per pair, as BERT's coin: which pairs a row makes depends on the labels before them (a
        # put-back shifts the rest), so labels balanced along the row would bias the share; fresh draws do not
        negative = valid & (column(step, "nsp/random") < config.random_next_rate)
        # B from the tail: the sentence start nearest to `tail - want`, at or after the sentence start
        # following the split (one sentence skipped: never the actual next), to the tail or its run's end
        # inside the document run of the last text before the tail (a B from an earlier run would leave the
        # rest of that run unread); a run shorter than `want` gives all of itself
        skip = own.next_start((split + 1).clamp(max=L))
        t1 = last_real.gather(1, tail)  # last real position before the tail (-1 where none)
        run_from = own.run_start.gather(1, t1.clamp(min=0))
        floor_ = torch.maximum(run_from, skip)
        b_end = t1 + 1
        aim = torch.maximum(b_end - want, floor_).clamp(0, L)
        n_before = own.before.gather(1, aim)
        q_after = own.nth_start(n_before)
        q_before = own.nth_start((n_before - 1).clamp(min=0))
        before_ok = (n_before > 0) & (q_before >= floor_)
        use_before = before_ok & ((aim - q_before < q_after - aim) | (q_after >= b_end))
        q = torch.where(use_before, q_before, q_after)
        # A pair split at a token (a one-sentence chunk) takes a B that starts at a token too, after the
        # actual next and as long as it: else "B starts mid-sentence" would tell every such pair positive.
        floor_t = torch.maximum(run_from, end)
        q_tok = b_end - want
        token_b = valid & ~at_sentence
        q = torch.where(token_b, q_tok, q)
        floor_ = torch.where(token_b, floor_t, floor_)
        from_tail = (t1 >= 0) & (q >= floor_) & (q < b_end) & ~closed
        # else before A (text already shown: nothing is lost), a random sentence start with room first
        roomy, before_a = own.before.gather(1, torch.cat([(cur - want + 1).clamp(0, L), cur], 1)).chunk(2, 1)
        # a tail run shorter than half the actual next gives way to a roomy passage before A: B's length
        # would otherwise tell negatives apart where documents are short
        from_tail = from_tail & ((b_end - run_from >= want // 2) | (roomy == 0))
        b_start, b_len = q, b_end - q
        if bool((negative & ~from_tail).any()):  # only then: the draws are per (row, step) all the same
            u = column(step, "nsp/random_start")
            n = torch.where(roomy > 0, roomy, before_a)
            q_early = own.nth_start((u * n).long()).clamp(max=L - 1)
            # token-type: a random text position before A with room for the whole B where there is one
            span = torch.where(cur - want + 1 > 0, cur - want + 1, cur).clamp(min=0)
            q_tok_early = next_real.gather(1, (u * span).long().clamp(0, L)).clamp(max=L - 1)
            q_early = torch.where(token_b, q_tok_early, q_early)
            n = torch.where(token_b, span, n)
            early_limit = torch.minimum(own.run_end(q_early), cur)
            early_end = torch.where(
                token_b, torch.minimum(q_early + want, early_limit), own.end_near(q_early, want, early_limit)
            )
            negative = negative & (from_tail | (n > 0))
            b_start = torch.where(from_tail, q, q_early)
            b_len = torch.where(from_tail, b_len, early_end - q_early)
        a = split - cur
        b = torch.where(negative, b_len, want)
        a, b = truncated_lengths(a, b, torch.minimum(room, a + b).clamp(min=0))
        fields["first_start"].append(split - a)
        fields["first_len"].append(a)
        fields["second_start"].append(torch.where(negative, b_start, split))
        fields["second_len"].append(b)
        fields["at"].append(at)
        fields["placed"].append(valid)
        fields["label"].append(negative)
        fields["from_donor"].append(torch.zeros_like(valid))
        fields["sentence_split"].append(at_sentence)
        same = _gather(own.doc, b_start) == _gather(own.doc, cur)
        flags["same_document_negatives"].append(negative & same)
        flags["donor_negatives"].append(torch.zeros_like(valid))
        at = at + torch.where(valid, a + b + 3, 0)
        tail = torch.where(negative & from_tail, q, tail)
        # a negative's actual next is put back: the next chunk starts at the split (BERT's `i -= unused`)
        moved = torch.where(active, end.clamp(min=cur + 1), cur)
        cur = torch.where(valid, torch.where(negative, split, end), moved)
    if not fields["at"]:  # no text at all: one empty column
        zero = torch.zeros(B, 1, dtype=torch.long, device=device)
        off = torch.zeros_like(zero, dtype=torch.bool)
        for name in fields:
            fields[name].append(off if name in ("placed", "label", "from_donor", "sentence_split") else zero)
        for name in flags:
            flags[name].append(off)
    out = {name: torch.cat(v, 1) for name, v in fields.items()}
    return Pairs(**out, flags={name: torch.cat(v, 1) for name, v in flags.items()})


def stdlib_rows(tokenizer: Tokenizer, texts: list[str], B: int, L: int, seed: int) -> tuple[Tensor, Tensor]:
    """B rows of width L read from short documents (a few lines each) at random offsets, with random
    lengths: full rows, rows cut inside a document, and padded rows ending on a document boundary."""
    lines = [line for text in texts for line in text.splitlines(keepends=True)]
    g = np.random.default_rng(seed)
    docs, i = [], 0
    while i < len(lines):
        n = int(g.integers(1, 12))
        docs.append(tokenizer.encode("".join(lines[i : i + n])))
        i += n
    ids = np.asarray([t for d in docs for t in d], dtype=np.int64)
    stream = DocumentStream(
        Documents(ids, np.cumsum([0] + [len(d) for d in docs])), SP.eos, SP.pad, seed=seed
    )
    offsets = g.integers(0, len(ids), B)
    lengths = np.where(g.random(B) < 0.7, L, g.integers(1, L + 1, B))
    return stream.rows(offsets, lengths, L)


def compare(objective: Any, rows: Tensor, docs: Tensor, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rr = RowRandom(seed, torch.arange(rows.size(0)) + 1000 * seed)
    own = sentence_pairs.text_structure(rows, docs, objective.specials, objective.end_table)
    K = objective.chunk_length(rows.size(1))
    got = sentence_pairs.put_back_pairs(own, K, objective.config, rr)
    want = reference_put_back_pairs(own, K, objective.config, rr)
    for name in Pairs.__dataclass_fields__:
        if name == "flags":
            assert got.flags.keys() == want.flags.keys()
            for flag in want.flags:
                assert torch.equal(got.flags[flag], want.flags[flag]), flag
        else:
            assert torch.equal(getattr(got, name), getattr(want, name)), name
    index = torch.arange(rows.size(0)) + 1000 * seed
    new = objective(rows, docs, index, seed)
    with monkeypatch.context() as m:
        m.setattr(sentence_pairs, "put_back_pairs", reference_put_back_pairs)
        old = objective(rows, docs, index, seed)
    same_batches(new, old)


def same_batches(new: Batch, old: Batch) -> None:
    assert new.tensors().keys() == old.tensors().keys()
    for name, tensor in old.tensors().items():
        assert tensor.dtype == new.tensors()[name].dtype and torch.equal(tensor, new.tensors()[name]), name
    assert new.stats == old.stats


@pytest.mark.parametrize("L", [5, 9, 33, 128, 300, 1024])
@pytest.mark.parametrize(
    "overrides",
    [{}, {"short_seq_prob": 1.0}, {"short_seq_prob": 0.0, "random_next_rate": 1.0}, {"pair_length": 17}],
)
def test_walk_matches_its_reference_on_text(
    tokenizer: Tokenizer,
    stdlib_texts: list[str],
    monkeypatch: pytest.MonkeyPatch,
    L: int,
    overrides: dict[str, Any],
) -> None:
    objective = build_objective("nsp", SP, tokenizer=tokenizer, overrides=overrides)
    for seed in range(3):
        rows, docs = stdlib_rows(tokenizer, stdlib_texts, 12, L, seed)
        compare(objective, rows, docs, seed, monkeypatch)
        # one document per row: the EOS inside are sentence ends only
        compare(objective, rows, torch.where(docs >= 0, 0, -1), seed, monkeypatch)


@pytest.mark.parametrize("end", ["cut", "boundary", "full"])
def test_walk_matches_its_reference_on_packed_rows(
    tokenizer: Tokenizer,
    make_packed_rows: Callable[[int, int, int, str], tuple[Tensor, Tensor]],
    monkeypatch: pytest.MonkeyPatch,
    end: str,
) -> None:
    """Rows of EOS-only, one-token, short and long documents, ending as `end` says."""
    objective = build_objective("nsp", SP, tokenizer=tokenizer)
    for seed, L in enumerate([6, 40, 256, 700]):
        rows, docs = make_packed_rows(seed, 16, L, end)
        compare(objective, rows, docs, seed, monkeypatch)


def test_walk_matches_its_reference_on_empty_rows(
    tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    objective = build_objective("nsp", SP, tokenizer=tokenizer)
    rows = torch.full((3, 16), SP.pad)
    docs = torch.full((3, 16), -1)
    rows[1, :3], docs[1, :3] = torch.tensor([SP.first_ordinary, SP.first_ordinary + 1, SP.eos]), 0
    compare(objective, rows, docs, 0, monkeypatch)
