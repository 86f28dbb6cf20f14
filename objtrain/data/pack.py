"""Token store -> packed store: documents (each followed by eos) laid into fixed-length rows.

Two modes:
- `concat`: the split's documents joined with eos into one stream, cut every `seq_len` tokens; the last row is
  padded. Every token appears once, in order (nanoGPT / GPT-style packing). Row order is the stream's order.
- `bestfit`: best-fit-decreasing bin packing (the packing of "Fewer Truncations Improve Language Modeling",
  Ding et al. 2024): a document that fits a row (length + eos <= seq_len) is never split; a longer one is cut
  into full rows plus one remainder piece, which is packed like any document. Rows are shuffled by `seed`,
  because decreasing-size order would put all long documents first. A split of more than `WINDOW_DOCS`
  documents (or `WINDOW_TOKENS` tokens) is packed window by window, each window of consecutive documents on
  its own (its rows shuffled by (seed, window)), so memory stays bounded; a smaller split is one window,
  packed exactly as before.

Each position also gets its row-local document index (0, 1, 2... in row order, -1 = padding), so attention
can stay inside documents and positions can restart per document.

Everything but the best-fit assignment loop (one step per document, O(log seq_len) each) is vectorised numpy
over chunks of rows, so memory stays bounded whatever the store size: the input is memory-mapped, and the
pages of it a chunk read are dropped from the process after the chunk (they stay in the page cache), so
the resident set does not grow with the store either.
"""

from __future__ import annotations

import bisect
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np

from objtrain.data.store import (
    META_FILE,
    PACKED_STORE_VERSION,
    SPLITS,
    TokenSplit,
    TokenStore,
    doc_dtype,
    release_pages,
)
from objtrain.errors import UserError, did_you_mean
from objtrain.io import atomic_dir, check_output_free, write_json
from objtrain.memory import check_fits

PackMode = Literal["concat", "bestfit"]
PACK_MODES: tuple[str, ...] = ("concat", "bestfit")
MIN_SEQ_LEN = 2  # one token and its eos
CHUNK_TOKENS = 1 << 22  # positions assembled per step: bounds memory at ~100 MB of int64 scratch
# scratch per assembled position: int64 indices and values (~3 x 8 bytes), the row's tokens and documents
BYTES_PER_POSITION = 32
# bestfit windows: the layout of a window holds ~60 bytes per piece and the assignment loop ~150 bytes per
# document, so these bound it at ~100 MB whatever the store size.
WINDOW_DOCS = 1 << 19
WINDOW_TOKENS = 1 << 28


@dataclass
class PackConfig:
    seq_len: int = 1024
    mode: PackMode = "bestfit"
    seed: int = 0
    splits: tuple[str, ...] = SPLITS


@dataclass
class PackCounts:
    rows: int = 0
    documents: int = 0
    tokens: int = 0  # real positions: document tokens plus one eos per document
    padding: int = 0
    documents_split: int = 0  # documents spread over more than one row

    @property
    def fill(self) -> float:
        return self.tokens / max(self.tokens + self.padding, 1)


@dataclass
class PackSummary:
    path: Path
    seq_len: int
    mode: str
    splits: dict[str, PackCounts]
    seconds: float

    def total(self) -> PackCounts:
        out = PackCounts()
        for counts in self.splits.values():
            for name in ("rows", "documents", "tokens", "padding", "documents_split"):
                setattr(out, name, getattr(out, name) + getattr(counts, name))
        return out


@dataclass
class Layout:
    """Where each piece of a document goes. Pieces are sorted by (row, offset); all arrays (n_pieces,)."""

    n_rows: int
    row: np.ndarray  # row of the piece
    offset: np.ndarray  # first position of the piece in its row
    source: np.ndarray  # index of its first token in the split's token array
    size: np.ndarray  # positions it fills, its eos included
    eos: np.ndarray  # bool: the piece ends its document, so its last position is eos
    local_doc: np.ndarray  # row-local document index
    doc: np.ndarray  # document index in the split


def _pieces(lengths: np.ndarray, offsets: np.ndarray, seq_len: int) -> tuple[np.ndarray, ...]:
    """Cut each document plus its eos (m = n + 1 positions) into pieces of seq_len and one remainder.

    Returns (doc, source, size, eos) per piece, in document order.
    """
    m = lengths + 1
    n_pieces = -(-m // seq_len)
    doc = np.repeat(np.arange(len(lengths)), n_pieces)
    first_piece = np.cumsum(n_pieces) - n_pieces
    k = np.arange(len(doc)) - np.repeat(first_piece, n_pieces)  # piece number within its document
    start = k * seq_len
    size = np.minimum(m[doc] - start, seq_len)
    eos = start + size == m[doc]
    return doc, offsets[doc] + start, size, eos


def best_fit(sizes: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Best-fit decreasing: each item, largest first, goes to the open bin with the least room that holds it.

    sizes (n,) all <= seq_len. Returns bin (n,), offset (n,) in the bin, and the number of bins. Open bins are
    kept in buckets by remaining capacity with a sorted list of the capacities present, so each step is a
    bisect over at most seq_len values: O(n log seq_len) in all, deterministic (ties: stable order).
    """
    order = np.argsort(-sizes, kind="stable")
    caps: list[int] = []  # sorted remaining capacities that have open bins
    bins_at: dict[int, list[int]] = {}
    fill: list[int] = []
    bin_of = [0] * len(sizes)
    offset_of = [0] * len(sizes)
    for item, size in zip(order.tolist(), sizes[order].tolist(), strict=True):
        k = bisect.bisect_left(caps, size)
        if k < len(caps):
            cap = caps[k]
            stack = bins_at[cap]
            b = stack.pop()
            if not stack:
                del caps[k], bins_at[cap]
        else:
            b, cap = len(fill), seq_len
            fill.append(0)
        bin_of[item], offset_of[item] = b, fill[b]
        fill[b] += size
        left = cap - size
        if left > 0:
            if left in bins_at:
                bins_at[left].append(b)
            else:
                bins_at[left] = [b]
                bisect.insort(caps, left)
    return np.asarray(bin_of, dtype=np.int64), np.asarray(offset_of, dtype=np.int64), len(fill)


def bestfit_layout(lengths: np.ndarray, offsets: np.ndarray, seq_len: int, seed: int | list[int]) -> Layout:
    """Layout of documents with these lengths (n_docs,) and token offsets (n_docs + 1,) in bestfit mode
    (`offsets` may start past 0: a window of a split's documents; `source` is then the split's index)."""
    doc, source, size, eos = _pieces(lengths, offsets, seq_len)
    full = size == seq_len
    n_full = int(full.sum())
    bins = np.empty(len(size), dtype=np.int64)
    offset = np.zeros(len(size), dtype=np.int64)
    bins[full] = np.arange(n_full)  # a full piece is a row of its own
    part_bins, part_offsets, n_part = best_fit(size[~full], seq_len)
    bins[~full], offset[~full] = part_bins + n_full, part_offsets
    n_rows = n_full + n_part
    row_of_bin = np.empty(n_rows, dtype=np.int64)
    row_of_bin[np.random.default_rng(seed).permutation(n_rows)] = np.arange(n_rows)
    row = row_of_bin[bins]
    order = np.lexsort((offset, row))
    row, offset, source, size, eos, doc = (a[order] for a in (row, offset, source, size, eos, doc))
    first_in_row = np.searchsorted(row, row, side="left")
    return Layout(n_rows, row, offset, source, size, eos, np.arange(len(row)) - first_in_row, doc)


def _ranges(starts: np.ndarray, sizes: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n), vectorised: (sizes.sum(),) of `dtype`."""
    total = int(sizes.sum())
    before = np.cumsum(sizes) - sizes
    return np.repeat((starts - before).astype(dtype), sizes) + np.arange(total, dtype=dtype)


def _segments(n: int, start: np.ndarray, value: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """(n,) array holding value[k] on [start[k], start[k + 1]): start sorted, start[0] == 0. One np.repeat
    of a few values per row instead of a per-position pass (a cumsum over rows is 4x slower)."""
    return np.repeat(value.astype(dtype), np.diff(start, append=n))


def assemble_rows(
    split: TokenSplit, layout: Layout, seq_len: int, eos: int, pad: int, r0: int, r1: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows [r0, r1) of a bestfit layout: tokens (n, L), token dtype; document indices (n, L) int16/32."""
    lo, hi = np.searchsorted(layout.row, [r0, r1])
    row, offset, size, ends = (
        layout.row[lo:hi] - r0,
        layout.offset[lo:hi],
        layout.size[lo:hi],
        layout.eos[lo:hi],
    )
    n = r1 - r0
    out_start = row * seq_len + offset
    fill = np.zeros(n, dtype=np.int64)
    fill[row] = offset + size  # pieces are sorted by offset: the last one of a row sets its fill
    padding = (np.arange(seq_len) >= fill[:, None]).reshape(-1)
    eos_at = (out_start + size - 1)[ends]
    real = ~padding
    real[eos_at] = False
    index_dt = np.dtype(np.int32) if split.n_tokens < 2**31 else np.dtype(np.int64)
    tokens = np.empty(n * seq_len, dtype=split.tokens.dtype)
    tokens[real] = np.take(split.tokens, _ranges(layout.source[lo:hi], size - ends, index_dt))
    tokens[eos_at] = eos
    tokens[padding] = pad
    # Document ids: one segment per piece, and one of -1 for each row's padding.
    padded = np.flatnonzero(fill < seq_len)
    start = np.concatenate([out_start, padded * seq_len + fill[padded]])
    value = np.concatenate([layout.local_doc[lo:hi], np.full(len(padded), -1)])
    order = np.argsort(start, kind="stable")
    docs = _segments(n * seq_len, start[order], value[order], doc_dtype(seq_len))
    return tokens.reshape(n, seq_len), docs.reshape(n, seq_len)


def concat_window(offsets: np.ndarray, s0: int, s1: int) -> tuple[int, np.ndarray, np.ndarray]:
    """The documents [a, b) that meet stream positions [s0, s1) of the concat stream, as (a, starts, ends):
    the stream positions of each one's first token and of its eos. Two binary searches over the
    (memory-mapped) offsets find them, so packing never holds an array of every document: a store of 100 M
    documents would otherwise pin 1.6 GB for the whole pack."""
    n_docs = len(offsets) - 1
    # Document i fills stream positions [offsets[i] + i, offsets[i + 1] + i]: its tokens, then its eos.
    a = bisect.bisect_left(range(n_docs), s0, key=lambda i: int(offsets[i + 1]) + i)
    b = bisect.bisect_left(range(n_docs), s1, lo=a, key=lambda i: int(offsets[i]) + i)
    ids = np.arange(a, b, dtype=np.int64)
    window = np.asarray(offsets[a : b + 1], dtype=np.int64)
    return a, window[:-1] + ids, window[1:] + ids


def concat_rows(
    split: TokenSplit, seq_len: int, eos: int, pad: int, r0: int, r1: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rows [r0, r1) of the concat stream (documents each followed by eos): tokens and document indices,
    (n, L) each, in the token dtype and int16/int32."""
    n = r1 - r0
    s0, s1 = r0 * seq_len, min(r1 * seq_len, split.n_tokens + len(split))
    a, starts, ends = concat_window(split.offsets, s0, s1)
    # Documents before a end before s0, so `a` eos precede s0; those of the window ending before s1 follow.
    k0, k1 = a, a + int(np.searchsorted(ends, s1))
    length = s1 - s0
    tokens = np.empty(n * seq_len, dtype=split.tokens.dtype)
    eos_at = ends[: k1 - a] - s0
    real = np.ones(length, dtype=bool)
    real[eos_at] = False
    tokens[:length][real] = split.tokens[s0 - k0 : s1 - k1]
    tokens[eos_at] = eos
    tokens[length:] = pad
    # Document ids: a segment starts at every document start and every row start; its value is the
    # document's index minus that of the document the row opens with (window-local: `a` cancels).
    start = np.union1d(starts[starts >= s0] - s0, np.arange(0, length, seq_len))
    glob = np.searchsorted(starts, start + s0, side="right")
    value = glob - glob[np.searchsorted(start, start // seq_len * seq_len)]
    if length < n * seq_len:
        start, value = np.append(start, length), np.append(value, -1)
    docs = _segments(n * seq_len, start, value, doc_dtype(seq_len))
    return tokens.reshape(n, seq_len), docs.reshape(n, seq_len)


def windows(offsets: np.ndarray) -> list[tuple[int, int]]:
    """Document ranges [d0, d1) of at most `WINDOW_DOCS` documents and about `WINDOW_TOKENS` tokens (at least
    one document each) that bestfit packs one at a time."""
    n = len(offsets) - 1
    out, d0 = [], 0
    while d0 < n:
        by_tokens = int(np.searchsorted(offsets, offsets[d0] + WINDOW_TOKENS, side="right")) - 1
        d1 = min(d0 + WINDOW_DOCS, max(by_tokens, d0 + 1), n)
        out.append((d0, d1))
        d0 = d1
    return out or [(0, 0)]


def _count(split: TokenSplit, seq_len: int, mode: str, n_rows: int) -> PackCounts:
    """The split's counts, over chunks of documents: no full-length temporaries on a store of millions."""
    n_docs = len(split)
    positions = split.n_tokens + n_docs
    n_split = 0
    step = 1 << 20
    for d0 in range(0, n_docs, step):
        offsets = np.asarray(split.offsets[d0 : min(d0 + step, n_docs) + 1], dtype=np.int64)
        if mode == "concat":
            docs = np.arange(d0, d0 + len(offsets) - 1)
            n_split += int(((offsets[:-1] + docs) // seq_len != (offsets[1:] + docs) // seq_len).sum())
        else:
            n_split += int((np.diff(offsets) + 1 > seq_len).sum())
        release_pages(split.offsets)
    return PackCounts(n_rows, n_docs, positions, n_rows * seq_len - positions, n_split)


def _write_split(
    split: TokenSplit,
    config: PackConfig,
    eos: int,
    pad: int,
    token_file: BinaryIO,
    doc_file: BinaryIO,
) -> PackCounts:
    seq_len = config.seq_len
    token_dt, dt = split.tokens.dtype, doc_dtype(seq_len)
    step = max(CHUNK_TOKENS // seq_len, 1)

    def write(tokens: np.ndarray, docs: np.ndarray) -> None:
        tokens.astype(token_dt, copy=False).tofile(token_file)
        docs.astype(dt, copy=False).tofile(doc_file)
        release_pages(split.tokens)

    if config.mode == "concat":
        n_rows = -(-(split.n_tokens + len(split)) // seq_len)
        for r0 in range(0, n_rows, step):
            write(*concat_rows(split, seq_len, eos, pad, r0, min(r0 + step, n_rows)))
            release_pages(split.offsets)
        return _count(split, seq_len, config.mode, n_rows)
    n_rows = 0
    offsets = np.asarray(split.offsets)
    for w, (d0, d1) in enumerate(windows(offsets)):
        seed = config.seed if w == 0 else [config.seed, w]  # one window: the rows of an unwindowed pack
        lengths = np.diff(offsets[d0 : d1 + 1]).astype(np.int64)
        layout = bestfit_layout(lengths, offsets[d0 : d1 + 1], seq_len, seed)
        for r0 in range(0, layout.n_rows, step):
            write(*assemble_rows(split, layout, seq_len, eos, pad, r0, min(r0 + step, layout.n_rows)))
        n_rows += layout.n_rows
        del layout
        release_pages(split.offsets)
    return _count(split, seq_len, config.mode, n_rows)


def _check(config: PackConfig) -> None:
    if config.mode not in PACK_MODES:
        raise UserError(
            f"unknown --mode {config.mode!r}{did_you_mean(config.mode, PACK_MODES)} "
            f"(choose from: {', '.join(PACK_MODES)})"
        )
    if config.seq_len < MIN_SEQ_LEN:
        raise UserError(
            f"--seq-len {config.seq_len} is too small: a row needs at least {MIN_SEQ_LEN} tokens "
            "(one token and its eos)"
        )
    for name in config.splits:
        if name not in SPLITS:
            raise UserError(f"unknown --split {name!r} (choose from: {', '.join(SPLITS)}, all)")
    # rows are assembled a block of at least one at a time: one that no memory holds is refused now
    rows = max(CHUNK_TOKENS // config.seq_len, 1)
    check_fits(rows * config.seq_len * BYTES_PER_POSITION, f"--seq-len {config.seq_len}")


def pack_store(
    store_path: Path, output: Path, config: PackConfig | None = None, force: bool = False
) -> PackSummary:
    """Pack the token store at `store_path` into a packed store at `output` (written atomically)."""
    config = config or PackConfig()
    _check(config)
    store = TokenStore.open(store_path)
    output = Path(output)
    if output.resolve() == Path(store_path).resolve():
        raise UserError(f"the packed store would replace its own token store {output}: choose another -o")
    check_output_free(output, force, inputs=[store_path], replaces=("an objtrain store", (META_FILE,)))
    if all(store.split(name).n_tokens == 0 for name in config.splits):
        which = " and ".join(config.splits) + (" splits are" if len(config.splits) > 1 else " split is")
        raise UserError(f"{store_path}: its {which} empty, nothing to pack")
    start = time.perf_counter()
    specials = store.specials
    counts: dict[str, PackCounts] = {}
    with atomic_dir(output, force=force) as tmp:
        for name in config.splits:
            split = store.split(name)
            with (
                open(tmp / f"{name}.tokens.bin", "wb") as tok_f,
                open(tmp / f"{name}.docs.bin", "wb") as doc_f,
            ):
                counts[name] = _write_split(split, config, specials.eos, specials.pad, tok_f, doc_f)
                for handle in (tok_f, doc_f):
                    handle.flush()
                    os.fsync(handle.fileno())
        shutil.copyfile(store.tokenizer_file, tmp / store.tokenizer_file.name)
        write_json(tmp / META_FILE, _meta(store, config, counts))
    return PackSummary(output, config.seq_len, config.mode, counts, time.perf_counter() - start)


def _meta(store: TokenStore, config: PackConfig, counts: dict[str, PackCounts]) -> dict[str, Any]:
    return {
        "kind": "packed_store",
        "format_version": PACKED_STORE_VERSION,
        "seq_len": config.seq_len,
        "mode": config.mode,
        "seed": config.seed,
        "dtype": store.meta["dtype"],
        "doc_dtype": doc_dtype(config.seq_len).str,
        "vocab_size": store.meta["vocab_size"],
        "splits": {name: {**asdict(c), "fill": round(c.fill, 6)} for name, c in counts.items()},
        "tokenizer": store.meta["tokenizer"],
        "specials": store.meta["specials"],
        "token_store": {
            "path": str(store.path),
            "documents": store.meta["documents"],
            "tokens": store.meta["tokens"],
            "bytes": store.meta["bytes"],
            "splits": store.meta["splits"],
        },
    }
