"""On-disk token stores and packed stores: flat memory-mapped arrays plus a `meta.json`.

Token store (`objtrain tokenize` output), like nanoGPT's `train.bin` or Megatron's indexed dataset:

    STORE/meta.json        format_version, counts, dtype, vocab size, tokenizer hash, specials, sources
    STORE/tokenizer.model  the sentencepiece model (STORE/tokenizer.json: a Hugging Face one, as given)
    STORE/<split>.bin      tokens of the split's documents back to back, no separators (uint16 or uint32)
    STORE/<split>.idx      int64 offsets, n_docs + 1: document i is bin[idx[i]:idx[i + 1]]

Packed store (`objtrain pack` output): fixed-length rows and the row-local document index of every position.

    PACKED/meta.json             format_version, seq_len, mode, seed, per-split rows/fill/padding, specials
    PACKED/tokenizer.model       copied from the token store, so a packed store stands alone
    PACKED/<split>.tokens.bin    (rows, seq_len) tokens, the store's dtype; padding is `specials.pad`
    PACKED/<split>.docs.bin      (rows, seq_len) int16 (int32 if seq_len > 32767): 0, 1, 2.. per row, -1 = pad

Every array is little-endian and raw (no header), so any language can read it with the shapes in meta.json.
"""

from __future__ import annotations

import mmap
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from objtrain.data.foreign_tokenizer import tokenizer_from_file
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.io import is_count, read_json
from objtrain.specials import Specials

TOKEN_STORE_VERSION = 1
PACKED_STORE_VERSION = 1
SPLITS: tuple[str, ...] = ("train", "valid")
TOKENIZER_FILE = "tokenizer.model"
TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer.json")  # sentencepiece, or a Hugging Face tokenizer's JSON
META_FILE = "meta.json"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def doc_dtype(seq_len: int) -> np.dtype:
    return np.dtype("<i2") if seq_len <= (1 << 15) - 1 else np.dtype("<i4")


def _map(path: Path, dtype: np.dtype, count: int, rerun: str) -> np.ndarray:
    """Read-only memory map of `count` items; checks the file size first (an empty file cannot be mapped)."""
    expected = count * dtype.itemsize
    actual = path.stat().st_size if path.is_file() else -1
    if actual != expected:
        found = "missing" if actual < 0 else f"{actual} bytes"
        raise UserError(f"{path} is {found}, expected {expected} bytes: the store is damaged; re-run {rerun}")
    if count == 0:
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


def _read_meta(path: Path, kind: str, version: int, rerun: str) -> dict[str, Any]:
    path = Path(path)
    what = "token store" if kind == "token_store" else "packed store"
    if path.is_file():  # a text file given where a store goes: never suggest writing a store over it
        make = f"`objtrain tokenize {path} -o STORE`"
        if kind == "packed_store":
            make += " (then `objtrain pack STORE -o PACKED`)"
        raise UserError(f"{path} is a file, not a {what}: make one from it with {make}")
    if not (path / META_FILE).is_file():
        raise UserError(f"{path} is not a {what} (no {META_FILE}): create it with {rerun}")
    meta = read_json(path / META_FILE)
    if not isinstance(meta, dict) or meta.get("kind") != kind:
        found = meta.get("kind") if isinstance(meta, dict) else None
        described = f"a {found.replace('_', ' ')}" if isinstance(found, str) else "no kind of store"
        raise UserError(
            f"{path}: its {META_FILE} describes {described}, not a {kind.replace('_', ' ')}: "
            f"create one with {rerun}"
        )
    if meta.get("format_version") != version:
        raise UserError(
            f"{path} has format_version {meta.get('format_version')}, this objtrain reads {version}: "
            f"re-run {rerun}"
        )
    _check_meta(path, meta, kind, rerun)
    return meta


def _check_meta(path: Path, meta: dict[str, Any], kind: str, rerun: str) -> None:
    """Every field a reader indexes, present and of its type: an edited or cut meta.json is one clear line
    here, not a KeyError (or a file size computed from a string) later."""

    def damaged(problem: str) -> UserError:
        return UserError(f"{path / META_FILE} {problem}: the store is damaged; re-run {rerun}")

    def dtype_of(key: str, kinds: str) -> None:
        try:
            ok = np.dtype(meta[key]).kind in kinds
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise damaged(f"has no usable {key!r} (found {meta.get(key)!r})")

    dtype_of("dtype", "u")
    if not is_count(meta.get("vocab_size"), 1):
        raise damaged(f"has no usable 'vocab_size' (found {meta.get('vocab_size')!r})")
    for key in ("specials", "tokenizer"):
        if not isinstance(meta.get(key), dict):
            raise damaged(f"has no {key!r} section")
    if not isinstance(meta["tokenizer"].get("hash"), str):
        raise damaged("has no tokenizer 'hash'")
    if kind == "packed_store":
        dtype_of("doc_dtype", "i")
        if not is_count(meta.get("seq_len"), 1):
            raise damaged(f"has no usable 'seq_len' (found {meta.get('seq_len')!r})")
    splits = meta.get("splits")
    if not isinstance(splits, dict):
        raise damaged("has no 'splits' section")
    counts = ("rows",) if kind == "packed_store" else ("documents", "tokens")
    for name, info in splits.items():
        for key in counts:
            value = info.get(key) if isinstance(info, dict) else None
            if not is_count(value):
                raise damaged(f"has no usable {key!r} for split {name!r} (found {value!r})")


StoreT = TypeVar("StoreT", bound="_Store")


class _Store:
    """What token and packed stores share: opening and checking `meta.json`, specials, tokenizer."""

    kind: str  # meta.json "kind"
    version: int  # the format_version this objtrain reads
    rerun_template: str  # the command that (re)creates such a store, with {path}

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = Path(path)
        self.meta = meta
        self._rerun = self.rerun_template.format(path=self.path)

    @classmethod
    def open(cls: type[StoreT], path: Path | str) -> StoreT:
        path = Path(path)
        meta = _read_meta(path, cls.kind, cls.version, cls.rerun_template.format(path=path))
        store = cls(path, meta)
        store.tokenizer  # noqa: B018  # a truncated or swapped tokenizer.model fails here, not later
        return store

    @cached_property
    def specials(self) -> Specials:
        return Specials.from_dict(self.meta["specials"])

    @property
    def tokenizer_file(self) -> Path:
        """The tokenizer's file: `tokenizer.model` (sentencepiece) or `tokenizer.json` (Hugging Face)."""
        name = self.meta["tokenizer"].get("file", TOKENIZER_FILE)
        if name not in TOKENIZER_FILES:
            raise UserError(f"{self.path / META_FILE} names tokenizer file {name!r}: re-run {self._rerun}")
        return self.path / name

    @cached_property
    def tokenizer(self) -> Tokenizer:
        tokenizer = tokenizer_from_file(self.tokenizer_file, self.specials)
        if tokenizer.hash != self.meta["tokenizer"]["hash"]:
            raise UserError(f"{self.tokenizer_file} does not match {META_FILE}: re-run {self._rerun}")
        return tokenizer

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.meta["dtype"])

    def _check_split(self, name: str) -> dict[str, Any]:
        if name not in self.meta["splits"]:
            raise UserError(f"{self.path} has no split {name!r} (it has: {', '.join(self.meta['splits'])})")
        return self.meta["splits"][name]


class TokenStore(_Store):
    """A `tokenize` output directory: documents of token ids per split, memory-mapped."""

    kind = "token_store"
    version = TOKEN_STORE_VERSION
    rerun_template = "`objtrain tokenize ... -o {path}`"

    def split(self, name: str = "train") -> TokenSplit:
        info = self._check_split(name)
        offsets = _map(self.path / f"{name}.idx", np.dtype("<i8"), info["documents"] + 1, self._rerun)
        tokens = _map(self.path / f"{name}.bin", self.dtype, info["tokens"], self._rerun)
        # offsets run from 0 to the token count and never go back: a document with a negative length
        # would read another's tokens (or none) without a word
        if len(offsets) and (offsets[0] != 0 or offsets[-1] != len(tokens) or not _non_decreasing(offsets)):
            raise UserError(f"{self.path / name}.idx does not match its tokens: re-run {self._rerun}")
        return TokenSplit(name, tokens, offsets)


def _non_decreasing(offsets: np.ndarray, chunk: int = 1 << 20) -> bool:
    """offsets never go back: checked a chunk at a time, its pages dropped after, so opening a split of
    millions of documents holds no array (nor resident map) the size of its offsets."""
    try:
        parts = (offsets[i : i + chunk + 1] for i in range(0, max(len(offsets) - 1, 0), chunk))
        return all(bool(np.all(part[1:] >= part[:-1])) for part in parts)
    finally:
        release_pages(offsets)


def release_pages(array: np.ndarray) -> None:
    """Drop the pages of a read-only memory map from this process's resident set (Linux; elsewhere a
    no-op). They stay in the page cache, so reading them again costs a minor fault, not a disk read."""
    while array is not None and not isinstance(getattr(array, "_mmap", None), mmap.mmap):
        array = array.base  # type: ignore[assignment]
    if array is not None and hasattr(mmap, "MADV_DONTNEED"):
        array._mmap.madvise(mmap.MADV_DONTNEED)  # type: ignore[attr-defined]


class TokenSplit:
    """Documents of one split. `tokens` (n_tokens,) and `offsets` (n_docs + 1,) are read-only memory maps."""

    def __init__(self, name: str, tokens: np.ndarray, offsets: np.ndarray) -> None:
        self.name = name
        self.tokens = tokens
        self.offsets = offsets

    def __len__(self) -> int:
        return max(len(self.offsets) - 1, 0)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def lengths(self) -> np.ndarray:
        """(n_docs,) int64 tokens per document."""
        return np.diff(self.offsets).astype(np.int64)

    def doc(self, i: int) -> np.ndarray:
        """Tokens of document i (n,), no eos added."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"document {i} out of range ({len(self)} documents)")
        i %= len(self)
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


class PackedStore(_Store):
    """A `pack` output directory: fixed-length rows with per-position document indices."""

    kind = "packed_store"
    version = PACKED_STORE_VERSION
    rerun_template = "`objtrain pack STORE -o {path}`"

    @property
    def seq_len(self) -> int:
        return int(self.meta["seq_len"])

    def split(self, name: str = "train") -> PackedSplit:
        info = self._check_split(name)
        n = info["rows"] * self.seq_len
        tokens = _map(self.path / f"{name}.tokens.bin", self.dtype, n, self._rerun)
        docs = _map(self.path / f"{name}.docs.bin", np.dtype(self.meta["doc_dtype"]), n, self._rerun)
        return PackedSplit(name, tokens.reshape(-1, self.seq_len), docs.reshape(-1, self.seq_len))


class PackedSplit:
    """Rows of one split: `tokens` and `document_ids`, both (rows, seq_len) read-only memory maps."""

    def __init__(self, name: str, tokens: np.ndarray, document_ids: np.ndarray) -> None:
        self.name = name
        self.tokens = tokens
        self.document_ids = document_ids

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def rows(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [start, stop): tokens (n, L) int64 and document ids (n, L) int64, -1 = padding."""
        tokens = torch.from_numpy(self.tokens[start:stop].astype(np.int64))
        docs = torch.from_numpy(self.document_ids[start:stop].astype(np.int64))
        return tokens, docs
