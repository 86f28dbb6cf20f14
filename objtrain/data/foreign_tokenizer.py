"""A Hugging Face tokenizer (`tokenizer.json`, read with the `tokenizers` library) behind objtrain's
`Tokenizer` methods, so a store can be tokenized with an existing model's vocabulary.

Ids stay the tokenizer's own: a model trained on such a store and the tokenizer agree on every id. objtrain's
special tokens (pad, unk, bos, eos, mask, cls, sep, the FIM and UL2 mode tokens, the sentinels) are found
or added:

- a fixed special whose piece (`<pad>`, `</s>`, `<fim_prefix>`, ...) or a common spelling of it (`[PAD]`,
  `<|endoftext|>` for eos, `<|fim_prefix|>`, ...) is one of the tokenizer's *special* added tokens takes
  that token's id; `<unk>` takes the model's unknown token where it has one;
- the sentinels take the tokenizer's `<extra_id_k>` tokens when it has all of them as one block counting
  down (T5's layout), else they are appended as such a block;
- everything else is appended after the tokenizer's vocabulary, in the table's order.

The table is recorded in the store's `meta.json` (`specials`, with `first_sentinel`), and the store keeps
`tokenizer.json` exactly as given. Every special token is a control token, as in objtrain's own tokenizer:
inserted by id only and never matched in text (`encode_special_tokens`), so a document quoting `</s>`
encodes as those characters. Text round-trips exactly when the tokenizer is lossless (byte-level BPE such
as GPT-2's, Llama 3's, Qwen's; Metaspace with byte fallback); `meta.json` records whether a probe string
came back byte for byte (`tokenizer.round_trip`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import torch

from objtrain.data.tokenizer import WORD_START, Tokenizer
from objtrain.errors import UserError
from objtrain.extras import require
from objtrain.specials import FIXED_PIECES, Specials, sentinel_piece

# Other spellings of objtrain's fixed special tokens that published tokenizers use.
ALIASES: dict[str, tuple[str, ...]] = {
    "pad": ("[PAD]", "<|pad|>", "<|padding|>"),
    "unk": ("[UNK]", "<|unk|>"),
    "bos": ("[BOS]", "<|begin_of_text|>", "<|startoftext|>"),
    "eos": ("[EOS]", "<|endoftext|>", "<|end_of_text|>", "<eos>"),
    "mask": ("[MASK]", "<|mask|>"),
    "cls": ("[CLS]",),
    "sep": ("[SEP]",),
    "fim_prefix": ("<|fim_prefix|>",),
    "fim_middle": ("<|fim_middle|>",),
    "fim_suffix": ("<|fim_suffix|>",),
    "fim_pad": ("<|fim_pad|>",),
}
NAMED = ("pad", "unk", "bos", "eos", "mask", "cls", "sep")  # transformers' own special-token slots
# Tabs, repeated spaces, newlines, CRLF, accents, CJK, an emoji, a literal special and the word marker.
PROBE = "def f(x):\n\tif x:  # two  spaces\r\n        return 'é中文😀 <mask> </s> \u2581'\n"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _byte_level_table() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte (`bytes_to_unicode`), inverted: char -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _parse(data: bytes, where: str) -> Any:
    """A `tokenizers.Tokenizer` from tokenizer.json bytes, or one line saying the file is not one."""
    tokenizers = require("tokenizers", "a Hugging Face tokenizer")
    try:
        text = data.decode("utf-8")
        table = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UserError(f"{where} is not a Hugging Face tokenizer (not a JSON file)") from None
    if not isinstance(table, dict) or not isinstance(table.get("model"), dict):
        raise UserError(f"{where} is not a Hugging Face tokenizer (no 'model' section)")
    try:
        return tokenizers.Tokenizer.from_str(text)
    except Exception as exc:  # the library raises a bare Exception naming the first field it could not read
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"{where} is not a Hugging Face tokenizer ({reason})") from None


def _base_size(tok: Any) -> int:
    vocab = tok.get_vocab(with_added_tokens=True)
    return max(tok.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1)


def _special_added(tok: Any) -> dict[str, int]:
    return {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}


def _model_unk(tok: Any) -> int | None:
    unk = getattr(tok.model, "unk_token", None)
    if isinstance(unk, str):
        return tok.token_to_id(unk)
    unk_id = getattr(tok.model, "unk_id", None)  # a unigram model names its unknown piece by id
    return unk_id if isinstance(unk_id, int) else None


def plan_specials(tok: Any, n_sentinels: int) -> Specials:
    """objtrain's special-token table for `tok`: its own special tokens where it has them, the rest added
    after its vocabulary (module doc)."""
    specials = _special_added(tok)
    next_id = _base_size(tok)
    used: set[int] = set()
    ids: dict[str, int] = {}
    for name, piece in FIXED_PIECES:
        found = _model_unk(tok) if name == "unk" else None
        for spelling in (piece, *ALIASES.get(name, ())):
            if found is None and spelling in specials and specials[spelling] not in used:
                found = specials[spelling]
        if found is None or found in used:
            found, next_id = next_id, next_id + 1
        ids[name] = found
        used.add(found)
    block = [specials.get(sentinel_piece(k)) for k in range(n_sentinels)]
    if (
        n_sentinels
        and None not in block
        and block == [block[0] - k for k in range(n_sentinels)]  # type: ignore[operator]
        and used.isdisjoint(block)
    ):
        first_sentinel = block[-1]
    else:
        first_sentinel = next_id
    return Specials(**ids, n_sentinels=n_sentinels, first_sentinel=first_sentinel)  # type: ignore[arg-type]


class HFTokenizer(Tokenizer):
    """A `tokenizer.json` with objtrain's special-token table (module doc). Thread-safe for encoding."""

    file_name = "tokenizer.json"
    kind = "huggingface"

    def __init__(self, data: bytes, specials: Specials, where: str = "tokenizer.json") -> None:
        self.model_proto = data  # the file's bytes, kept as given: stores and checkpoints hold this
        self.specials = specials
        # the library's own thread pool would disable itself with a warning in forked loader workers
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.tok = _parse(data, where)
        self.tok.encode_special_tokens = True  # special tokens are inserted by id, never matched in text
        self.base_size = _base_size(self.tok)
        self._own_specials = set(_special_added(self.tok).values())
        self._added: dict[int, str] = {}
        for name, piece in FIXED_PIECES:
            token = getattr(specials, name)
            if token >= self.base_size:
                self._added[token] = piece
        for k in range(specials.n_sentinels):
            if specials.sentinel(k) >= self.base_size:
                self._added[specials.sentinel(k)] = sentinel_piece(k)
        self._size = max(self.base_size, max(self._added, default=-1) + 1)
        self._check(where)

    def _check(self, where: str) -> None:
        missing = sorted(set(range(self.base_size, self._size)) - set(self._added))
        if missing:
            raise UserError(f"{where}: the special-token table leaves id {missing[0]} unassigned: damaged")
        unk = _model_unk(self.tok)
        for name, _ in FIXED_PIECES:
            token = getattr(self.specials, name)
            if token < self.base_size and token not in self._own_specials and token != unk:
                raise UserError(
                    f"{where}: special token {name!r} has id {token}, an ordinary token of this tokenizer "
                    f"({self.tok.id_to_token(token)!r}): the store was made with another tokenizer"
                )

    @classmethod
    def from_file(cls, path: Path, specials: Specials) -> HFTokenizer:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"tokenizer not found: {path}")
        return cls(path.read_bytes(), specials, str(path))

    @classmethod
    def plan(cls, path: Path, n_sentinels: int) -> HFTokenizer:
        """A new table for the tokenizer at `path` (a tokenizer.json), as `objtrain tokenize` makes one."""
        data = Path(path).read_bytes()
        return cls(data, plan_specials(_parse(data, str(path)), n_sentinels), str(path))

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def model_type(self) -> str:
        """The tokenizer's model: BPE, Unigram, WordPiece or WordLevel."""
        return type(self.tok.model).__name__

    @cached_property
    def hash(self) -> str:
        """Of the file and the special-token table: the same file with other added ids is another
        tokenizer."""
        table = json.dumps(self.specials.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(self.model_proto + b"\0" + table).hexdigest()[:16]

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str], num_threads: int = -1) -> list[list[int]]:
        # the fast variant skips character offsets, which objtrain never reads: about twice the speed
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)
        return [e.ids for e in encode(texts, add_special_tokens=False)]

    def _text_ids(self, ids: Iterable[int]) -> list[int]:
        return [i for i in map(int, ids) if i < self.base_size and i not in self._reserved]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode(self._text_ids(ids), skip_special_tokens=True)

    def decode_batch(self, batch: list[list[int]]) -> list[str]:
        return self.tok.decode_batch([self._text_ids(ids) for ids in batch], skip_special_tokens=True)

    @cached_property
    def _reserved(self) -> frozenset[int]:
        """objtrain's special ids and the tokenizer's own special tokens: they decode to nothing."""
        own = {i for i in range(self.base_size) if self.specials.is_special_id(i)}
        return frozenset(own | self._own_specials)

    @cached_property
    def round_trip(self) -> bool:
        """Whether a probe of hard text (module doc) decodes back byte for byte."""
        return self.decode(self.encode(PROBE)) == PROBE

    @property
    def byte_fallback(self) -> bool:  # type: ignore[override]
        return self.round_trip

    @cached_property
    def _decoder(self) -> dict[str, Any]:
        decoder = json.loads(self.tok.to_str()).get("decoder") or {}
        return decoder

    @cached_property
    def _byte_level(self) -> bool:
        decoder = self._decoder
        parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
        return any(part.get("type") == "ByteLevel" for part in parts if isinstance(part, dict))

    @cached_property
    def _byte_fallback_decoder(self) -> bool:
        decoder = self._decoder
        parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
        return any(part.get("type") == "ByteFallback" for part in parts if isinstance(part, dict))

    @property
    def concatenative(self) -> bool:  # type: ignore[override]
        """Byte-level tokenizers decode by joining each token's bytes; others (Metaspace's stripped first
        space, WordPiece's `##`) need the library's decoder."""
        return self._byte_level

    @cached_property
    def _added_content(self) -> dict[int, str]:
        return {i: t.content for i, t in self.tok.get_added_tokens_decoder().items() if not t.special}

    def is_control(self, token_id: int) -> bool:
        return token_id >= self.base_size or token_id in self._reserved

    def is_unknown(self, token_id: int) -> bool:
        return token_id == self.specials.unk

    def is_byte(self, token_id: int) -> bool:
        if self._byte_level or not self._byte_fallback_decoder or token_id >= self.base_size:
            return False
        return _BYTE_PIECE.fullmatch(self.tok.id_to_token(token_id) or "") is not None

    def piece_bytes(self, token_id: int) -> bytes:
        if self.is_control(token_id) or self.is_unknown(token_id):
            return b""
        if token_id in self._added_content:  # an added, non-special token is plain text
            return self._added_content[token_id].encode("utf-8")
        piece = self.tok.id_to_token(token_id) or ""
        if self._byte_level:
            table = _byte_level_table()
            return bytes(table[c] for c in piece if c in table)
        if self.is_byte(token_id):
            return bytes([int(piece[3:5], 16)])
        if piece.startswith("##"):  # WordPiece: a word's continuation
            return piece[2:].encode("utf-8")
        return piece.replace(WORD_START, " ").encode("utf-8")

    def piece(self, token_id: int) -> str:
        token_id = int(token_id)
        if token_id in self._added:
            return self._added[token_id]
        return self.tok.id_to_token(token_id) or f"<{token_id}>"

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.piece(int(i)) for i in ids]

    def id_of(self, piece: str) -> int:
        for token, name in self._added.items():
            if name == piece:
                return token
        found = self.tok.token_to_id(piece)
        return self.specials.unk if found is None else int(found)

    @cached_property
    def word_boundary_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """As `Tokenizer.word_boundary_tables`, from each token's bytes: a token starting with a space starts
        a word, and so does any token after one that ends in whitespace or after a special token."""
        begins = torch.zeros(self.vocab_size, dtype=torch.bool)
        ends = torch.zeros(self.vocab_size, dtype=torch.bool)
        for i in range(self.vocab_size):
            if self.is_control(i):
                begins[i] = ends[i] = True
                continue
            data = self.piece_bytes(i)
            begins[i] = data[:1] == b" "
            ends[i] = data[-1:] in (b" ", b"\n", b"\t", b"\r")
        return begins, ends

    def __iter__(self) -> Iterator[str]:
        return (self.piece(i) for i in range(self.vocab_size))


def find_tokenizer_json(path: Path) -> Path | None:
    """`path` itself when it names a .json file, or the `tokenizer.json` of a directory; else None."""
    path = Path(path)
    if path.is_file() and path.name.endswith(".json"):
        return path
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return path / "tokenizer.json"
    return None


def save_hf_files(tokenizer: HFTokenizer, directory: Path) -> None:
    """The tokenizer of an export: tokenizer.json with objtrain's added special tokens registered at their
    ids (so `AutoTokenizer` encodes as objtrain does and knows every special id), and tokenizer_config.json
    naming them."""
    tokenizers = require("tokenizers", "exporting a Hugging Face tokenizer")
    tok = _parse(tokenizer.model_proto, "the store's tokenizer.json")
    for token, piece in sorted(tokenizer._added.items()):
        tok.add_special_tokens([tokenizers.AddedToken(piece, special=True, normalized=False)])
        if tok.token_to_id(piece) != token:
            raise UserError(
                f"cannot export the tokenizer: {piece!r} lands at id {tok.token_to_id(piece)} in "
                f"tokenizer.json, the model has it at {token} (the tokenizer already holds that piece)"
            )
    tok.save(str(Path(directory) / "tokenizer.json"))
    specials = tokenizer.specials
    named = {f"{name}_token": tokenizer.piece(getattr(specials, name)) for name in NAMED}
    extra = [tokenizer.piece(getattr(specials, name)) for name, _ in FIXED_PIECES if name not in NAMED]
    extra += [sentinel_piece(k) for k in range(specials.n_sentinels)]
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **named,
        "additional_special_tokens": extra,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000_000,
    }
    (Path(directory) / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def tokenizer_from_file(path: Path, specials: Specials) -> Tokenizer:
    """The tokenizer a store or checkpoint keeps: a sentencepiece model, or a Hugging Face `tokenizer.json`
    (then `specials` says where objtrain's special tokens are)."""
    if Path(path).name.endswith(".json"):
        return HFTokenizer.from_file(path, specials)
    return Tokenizer.from_file(path, specials)
