"""Packed rows as a store lays them out, for the cut-document properties of the objectives that fit whole
documents into fixed widths (span, UL2, prefix LM encoder-decoder; BART has its own in test_bart.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from objtrain.batch import Batch
from objtrain.objectives.base import Objective
from objtrain.specials import Specials

SP = Specials()
O = SP.first_ordinary
ROW_ENDS = ("cut", "boundary", "full")


def packed_rows(seed: int, B: int, L: int, end: str) -> tuple[torch.Tensor, torch.Tensor]:
    """B rows of L positions: documents of ordinary tokens each closed by its EOS, with EOS-only and
    one-token documents frequent, then short, then long ones (a scale drawn per row). `end` is how a row
    ends: 'cut' inside its last document (or, by chance, at a boundary), 'boundary' after a whole document
    with padding behind, 'full' with a document's EOS in the last position."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.full((B, L), SP.pad, dtype=torch.int64)
    docs = torch.full((B, L), -1, dtype=torch.int64)
    for b in range(B):
        scale = [2, 8, 60, 400][int(torch.randint(0, 4, (1,), generator=g))]
        tokens: list[int] = []
        ids: list[int] = []
        ends: list[int] = []  # where each whole document ends (exclusive)
        while len(tokens) <= L:
            u = float(torch.rand(1, generator=g))
            n = 0 if u < 0.2 else 1 if u < 0.4 else 1 + int(torch.randint(0, 2 * scale, (1,), generator=g))
            d = len(ends)
            tokens += [*torch.randint(O, O + 500, (n,), generator=g).tolist(), SP.eos]
            ids += [d] * (n + 1)
            ends.append(len(tokens))
        keep = L
        if end != "cut":
            keep = max([e for e in ends if e <= L], default=0)
        if end == "full" and keep < L:  # one more document, exactly as long as the room left
            d = ids[keep - 1] + 1 if keep else 0
            n = L - keep - 1
            tokens[keep:L] = [*torch.randint(O, O + 500, (n,), generator=g).tolist(), SP.eos]
            ids[keep:L] = [d] * (n + 1)
            keep = L
        rows[b, :keep] = torch.tensor(tokens[:keep], dtype=torch.int64)
        docs[b, :keep] = torch.tensor(ids[:keep], dtype=torch.int64)
    return rows, docs


def raw_prefixes(batch: Batch, rows: torch.Tensor, parts: torch.Tensor) -> list[tuple[int, int]]:
    """Per row, the bounds (lo, hi) of how many leading raw positions the batch holds, read from the batch.

    `parts` (B, L) numbers the units corrupted on their own (documents; UL2: (example, document) parts),
    -1 where nothing is read. Every part's text tokens are counted in its inputs and targets; the parts a
    row holds must be its first ones, all whole but the last, so the held text is a prefix of the row.
    Whether the last part's own EOS is held cannot always be read from the batch (span corruption puts an
    EOS after every part, held or not), so when that part's text is all there and an EOS follows it,
    hi = lo + 1."""
    out = []
    for b in range(rows.size(0)):
        held = sorted(set(batch.document_ids[b].tolist()) - {-1})
        assert held == list(range(len(held)))  # a prefix of the row's parts, in order
        starts = [int(p) for p in torch.nonzero(parts[b] >= 0).flatten()]
        firsts = [p for p in starts if p == 0 or int(parts[b, p]) != int(parts[b, p - 1])]
        assert len(held) <= len(firsts)
        lo = hi = 0
        for d in held:
            start = firsts[d]
            assert start == hi  # right after the previous part, its EOS included
            unit = rows[b][parts[b] == parts[b, start]]
            content = int((unit >= O).sum())
            count = int((batch.input_ids[b][batch.document_ids[b] == d] >= O).sum())
            if batch.is_encdec:
                assert batch.decoder_document_ids is not None
                count += int((batch.labels[b][batch.decoder_document_ids[b] == d] >= O).sum())
            assert count <= content
            if d < held[-1]:
                assert count == content, "a part before the row's last held one is shortened"
            lo = start + count
            hi = start + unit.numel() if count == content else lo
        out.append((lo, hi))
    return out


@pytest.fixture(scope="session")
def make_packed_rows() -> Callable[[int, int, int, str], tuple[torch.Tensor, torch.Tensor]]:
    return packed_rows


def check_prefix_alone(
    objective: Objective,
    rows: torch.Tensor,
    docs: torch.Tensor,
    index: torch.Tensor,
    seed: int,
    full: Batch,
    parts: torch.Tensor,
    longest: bool,
) -> None:
    """`full` (the objective over `rows`) holds a raw prefix of each row: the length its own stats say it
    uses (a row does not depend on its batch), within what the batch shows of the units `parts`. That prefix
    corrupted alone gives `full` exactly and uses all of it; with `longest`, one more raw token would be
    left unused (the prefix is the longest that fits)."""
    shown = raw_prefixes(full, rows, parts)
    fed = (docs >= 0).sum(1).tolist()
    one = [objective(rows[b : b + 1], docs[b : b + 1], index[b : b + 1], seed) for b in range(len(fed))]
    held = [f - int(batch.stats["raw_tokens_unused"]) for f, batch in zip(fed, one, strict=True)]
    assert all(lo <= h <= hi for h, (lo, hi) in zip(held, shown, strict=True)), (held, shown)
    assert full.stats["raw_tokens_unused"] == sum(fed) - sum(held)
    j = torch.arange(rows.size(1))[None, :]
    alone = objective(rows, docs.masked_fill(j >= torch.tensor(held)[:, None], -1), index, seed)
    for name, tensor in full.tensors().items():
        assert torch.equal(tensor, alone.tensors()[name]), name
    assert alone.stats["raw_tokens_unused"] == 0
    if not longest:
        return
    for b in range(rows.size(0)):
        if held[b] < fed[b]:
            more = docs[b : b + 1].masked_fill(j >= held[b] + 1, -1)
            assert objective(rows[b : b + 1], more, index[b : b + 1], seed).stats["raw_tokens_unused"] > 0


@pytest.fixture(scope="session")
def prefix_alone() -> Callable[..., None]:
    return check_prefix_alone


def first_documents(docs: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(document ids with every document from a random one k on made padding, k) per row: the row as it
    would be had it ended (or been padded) after its first k documents."""
    g = torch.Generator().manual_seed(seed)
    n = docs.max(1).values + 1
    k = (torch.rand(docs.size(0), generator=g) * (n + 1).double()).long().clamp(max=n)
    return docs.masked_fill(docs >= k[:, None], -1), k


@pytest.fixture(scope="session")
def keep_first_documents() -> Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]:
    return first_documents
