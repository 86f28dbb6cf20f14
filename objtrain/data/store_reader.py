"""Token and packed stores (the formats of `objtrain.data.store`) opened for reading: their specials,
tokenizer and split documents, checked.

Corpus scale: stores are memory maps read at 64-bit offsets; opening one reads its meta, its document
offsets and, for stores up to `FULL_CHECK_TOKENS`, every token once to check ids; larger stores check the
ids of each row as it is read instead (`objtrain.data.stream.DocumentStream`), so a rank touches only the
pages of its own rows.

A packed store is read as a document stream too (its rows, without padding, split at document changes):
the loader cuts rows of the length the objective needs, so model rows always fill `seq_len`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from objtrain.data.store import PackedStore, TokenStore
from objtrain.data.stream import Documents, DocumentStream
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.specials import Specials

# Up to this many tokens a split's ids are all checked against the vocabulary when it is opened (~0.1 s);
# a larger split is checked row by row as it is read, so opening it touches no token pages.
FULL_CHECK_TOKENS = 1 << 27


class DataSource:
    """A token store or packed store: its specials, tokenizer, model-length hint and split documents."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise UserError(f"data not found: {self.path}")
        if is_packed_store(self.path):
            self.store: TokenStore | PackedStore = PackedStore.open(self.path)
            self.packed_length: int | None = self.store.seq_len
        else:
            self.store = TokenStore.open(self.path)
            self.packed_length = None
        self._documents: dict[str, Documents] = {}

    @property
    def specials(self) -> Specials:
        return self.store.specials

    @property
    def tokenizer(self) -> Tokenizer:
        return self.store.tokenizer

    def has_split(self, name: str) -> bool:
        return name in self.store.meta["splits"] and self._count(name) > 0

    def _count(self, name: str) -> int:
        info = self.store.meta["splits"][name]
        return int(info.get("documents", info.get("rows", 0)))

    def stream(self, split: str, seed: int, shuffle: bool = True) -> DocumentStream:
        """The seeded document stream of `split`, closed by this store's EOS, padded with its pad."""
        return DocumentStream(self.documents(split), self.specials.eos, self.specials.pad, seed, shuffle)

    def documents(self, split: str) -> Documents:
        """The split's documents, read and checked once: every token id inside the tokenizer's range."""
        if split in self._documents:
            return self._documents[split]
        rerun = self.store.rerun_template.format(path=self.path)
        if isinstance(self.store, TokenStore):
            s = self.store.split(split)
            docs = Documents(s.tokens, np.asarray(s.offsets, dtype=np.int64))
        else:
            docs = _packed_documents(self.store, split, rerun)
        if len(docs) == 0 or docs.offsets[-1] == 0:
            raise UserError(f"{self.path} has no tokens in its {split!r} split")
        # An id past the vocabulary would fail deep inside the model's embedding (or index another row's
        # weights on a GPU): one pass over the split here names the store instead. A split too large to
        # scan at start is checked as its rows are read (`DocumentStream.rows`).
        vocab = self.tokenizer.vocab_size
        if len(docs.tokens) > FULL_CHECK_TOKENS and np.iinfo(docs.tokens.dtype).max >= vocab:
            docs.check_ids_below = vocab
        elif len(docs.tokens):
            largest = int(np.max(docs.tokens))
            if largest >= vocab:
                raise UserError(
                    f"{self.path}: its {split!r} split holds token id {largest}, outside the tokenizer's "
                    f"{vocab} ids: the store is damaged; re-run {rerun}"
                )
        self._documents[split] = docs
        return docs


def is_packed_store(path: Path) -> bool:
    """A directory whose meta.json says it is a packed store (`objtrain pack` output)."""
    return (Path(path) / "meta.json").is_file() and _kind(Path(path)) == "packed_store"


def _kind(path: Path) -> str:
    try:
        return str(json.loads((path / "meta.json").read_text(encoding="utf-8")).get("kind"))
    except (OSError, ValueError, AttributeError):
        return ""


def _packed_documents(store: PackedStore, split: str, rerun: str) -> Documents:
    """Packed rows back to documents: the non-padding positions, split where the row or document changes."""
    s = store.split(split)
    docs = np.asarray(s.document_ids)
    # `pack` numbers a row's documents 0, 1, 2.. and its padding -1; anything else would cut documents
    # in the wrong places without a word
    if docs.size and (docs.min() < -1 or docs.max() >= store.seq_len):
        raise UserError(
            f"{store.path / split}.docs.bin holds document ids outside -1..{store.seq_len - 1}: "
            f"the store is damaged; re-run {rerun}"
        )
    keep = docs >= 0
    tokens = np.asarray(s.tokens)[keep]
    rows = np.broadcast_to(np.arange(docs.shape[0])[:, None], docs.shape)[keep]
    ids = docs[keep]
    starts = np.flatnonzero(np.r_[True, (rows[1:] != rows[:-1]) | (ids[1:] != ids[:-1])])
    # `pack` wrote each document's EOS; a long document's pieces (shuffled apart by bestfit) are documents
    # of their own, the last one ending in EOS.
    return Documents(tokens, np.r_[starts, len(tokens)].astype(np.int64), closed=True)
