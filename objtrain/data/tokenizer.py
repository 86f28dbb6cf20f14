"""A sentencepiece tokenizer that keeps text exactly, with objtrain's special-token table.

Training settings and why:
- identity normalisation, no dummy prefix, no whitespace folding: indentation, tabs, repeated spaces and
  newlines survive, so decode(encode(text)) == text byte for byte;
- byte fallback: any character outside the vocabulary becomes its UTF-8 bytes, never `<unk>`. It can be
  turned off for a closed alphabet (a character model of Shakespeare, DNA, chess moves): then every
  character of the training sample gets a piece, the 256 byte pieces are not reserved, and a character
  never seen in training becomes `<unk>`;
- every reserved token is a *control* symbol (see `objtrain.specials`): insertable by id only.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterable, Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Literal

import sentencepiece as spm
import torch

from objtrain.errors import UserError
from objtrain.specials import FIXED_PIECES, Specials

ModelType = Literal["unigram", "bpe", "char"]
WORD_START = "\u2581"  # sentencepiece's word-start marker


def train_sentencepiece(
    lines: Iterable[str],
    vocab_size: int,
    model_type: ModelType = "unigram",
    specials: Specials | None = None,
    num_threads: int = 1,
    byte_fallback: bool = True,
) -> bytes:
    """Train a model on `lines` (each ideally one line of text) and return its serialised proto."""
    specials = specials or Specials()
    n_bytes = 256 if byte_fallback else 0
    if vocab_size <= specials.first_ordinary + n_bytes:
        for_bytes = " and 256 for byte fallback" if byte_fallback else ""
        raise UserError(
            f"--vocab-size {vocab_size} is too small: {specials.first_ordinary} ids are reserved for "
            f"special tokens{for_bytes}; use at least {specials.first_ordinary + n_bytes + 1}"
        )
    if byte_fallback:
        return _train(lines, vocab_size, model_type, specials, num_threads, True, ())
    # sentencepiece learns from lines and never sees their line breaks: with no byte pieces to fall back
    # on, each character of the sample it left out becomes a piece of its own (but NUL, which it cannot
    # hold as a piece and which stays <unk>)
    lines = list(lines)
    characters = set().union(*map(set, lines))
    # every character needs a piece of its own; sentencepiece's char trainer fails on too few with no
    # message at all (or, a piece short, quietly drops one), so the size is checked here for every model
    needed = specials.first_ordinary + len(characters - {"\x00"})
    if vocab_size < needed:
        raise UserError(
            f"--vocab-size {vocab_size} is too small for this corpus without byte fallback: its "
            f"{needed - specials.first_ordinary} distinct characters each need a piece besides the "
            f"{specials.first_ordinary} special tokens; pass --vocab-size {needed} or more, or drop "
            "--no-byte-fallback"
        )
    extra = sorted(characters & {"\n", "\r"})
    model = _train(lines, vocab_size, model_type, specials, num_threads, False, extra)
    known = spm.SentencePieceProcessor(model_proto=model)
    missing = sorted(c for c in characters - {"\x00"} if specials.unk in known.encode(c))
    if missing:
        model = _train(lines, vocab_size, model_type, specials, num_threads, False, [*extra, *missing])
    return model


def _train(
    lines: Iterable[str],
    vocab_size: int,
    model_type: ModelType,
    specials: Specials,
    num_threads: int,
    byte_fallback: bool,
    extra_pieces: Sequence[str],
) -> bytes:
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines),
            model_writer=model,
            model_type=model_type,
            vocab_size=vocab_size,
            pad_id=specials.pad,
            unk_id=specials.unk,
            bos_id=specials.bos,
            eos_id=specials.eos,
            control_symbols=specials.reserved_pieces()[4:],  # pad, unk, bos, eos have ids 0..3 already
            user_defined_symbols=list(extra_pieces),
            byte_fallback=byte_fallback,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            allow_whitespace_only_pieces=True,
            split_digits=True,
            max_sentence_length=1 << 16,
            # without byte fallback, a character left out of the vocabulary would become <unk> even in
            # the training text: cover them all
            character_coverage=0.9995 if byte_fallback else 1.0,
            hard_vocab_limit=model_type != "char",
            num_threads=num_threads,
            minloglevel=2,
        )
    except RuntimeError as exc:
        raise UserError(_training_error(str(exc), vocab_size)) from None
    return model.getvalue()


def _training_error(text: str, vocab_size: int) -> str:
    """sentencepiece's `INTERNAL: src/...cc(744) [...]` failures, said in plain words with the size to use."""
    too_high = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", text)
    if too_high:
        largest = int(too_high.group(2))
        return (
            f"--vocab-size {vocab_size} is more than this corpus can fill: the largest vocabulary it "
            f"supports is {largest}; pass --vocab-size {largest} or less, or give more text"
        )
    too_small = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", text)
    if too_small:
        needed = int(too_small.group(2))
        return (
            f"--vocab-size {vocab_size} is too small for the distinct characters of this corpus: "
            f"pass --vocab-size {needed} or more"
        )
    last = text.strip().splitlines()[-1] if text.strip() else ""
    where = re.match(r"^INTERNAL: \S+\(\d+\) \[([^\]]*)\]\s*", last)  # the library's source location
    if where:
        # a bare failed check (`[(vocab_size) >= (0)]`) says more than nothing after the colon
        last = last[where.end() :] or f"sentencepiece's check {where.group(1)} failed"
    return f"tokenizer training failed: {last or text.strip() or 'no reason given by sentencepiece'}"


class Tokenizer:
    """Encode/decode text; look up pieces; know which ids start a word. Thread-safe for encoding.

    This class wraps a sentencepiece model in objtrain's own layout; `HFTokenizer`
    (`objtrain.data.foreign_tokenizer`) wraps a Hugging Face `tokenizer.json` behind the same methods.
    """

    file_name = "tokenizer.model"  # the file a store or checkpoint keeps it in
    kind = "sentencepiece"

    def __init__(self, model_proto: bytes, specials: Specials) -> None:
        self.model_proto = model_proto
        self.specials = specials
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self._check_layout()

    @classmethod
    def from_file(cls, path: Path, specials: Specials) -> Tokenizer:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"tokenizer model not found: {path}")
        proto = path.read_bytes()
        if not proto:  # sentencepiece loads an empty model without complaint, logging to stderr
            raise UserError(f"{path} is empty, not a sentencepiece model")
        try:
            return cls(proto, specials)
        except RuntimeError:
            raise UserError(f"{path} is not a sentencepiece model") from None
        except UserError as exc:  # a model of another layout: say which file
            raise UserError(f"{path}: {exc}") from None

    def _check_layout(self) -> None:
        pieces = self.specials.reserved_pieces()
        if self.sp.get_piece_size() <= len(pieces):
            raise UserError("tokenizer is smaller than objtrain's special-token table")
        for i, piece in enumerate(pieces):
            if self.sp.id_to_piece(i) != piece:
                raise UserError(
                    f"tokenizer id {i} is {self.sp.id_to_piece(i)!r}, objtrain expects {piece!r}: "
                    "train the tokenizer with `objtrain tokenize`"
                )

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    @cached_property
    def hash(self) -> str:
        return hashlib.sha256(self.model_proto).hexdigest()[:16]

    def encode(self, text: str) -> list[int]:
        if WORD_START in text:
            return self._encode_with_markers(text)
        return self.sp.encode(text)

    def encode_batch(self, texts: list[str], num_threads: int = -1) -> list[list[int]]:
        """Encode many texts at once on sentencepiece's own thread pool."""
        ids = self.sp.encode(texts, num_threads=num_threads)
        for i, text in enumerate(texts):
            if WORD_START in text:
                ids[i] = self._encode_with_markers(text)
        return ids

    @cached_property
    def byte_fallback(self) -> bool:
        """Whether characters outside the vocabulary become byte pieces (else `<unk>`)."""
        return self.sp.piece_to_id("<0x00>") != self.specials.unk

    @cached_property
    def _marker_bytes(self) -> list[int]:
        if not self.byte_fallback:
            return [self.specials.unk]
        return [self.sp.piece_to_id(f"<0x{b:02X}>") for b in WORD_START.encode("utf-8")]

    def _encode_with_markers(self, text: str) -> list[int]:
        """Text that itself holds ▁: sentencepiece would decode it as a space, so spell each one as its
        three UTF-8 byte-fallback tokens, which decode back to ▁ (`<unk>` without byte fallback)."""
        parts = self.sp.encode(text.split(WORD_START))
        ids = list(parts[0])
        for part in parts[1:]:
            ids += self._marker_bytes
            ids += part
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of the ordinary tokens; reserved tokens decode to nothing (see `piece` to show them)."""
        return self.sp.decode([int(i) for i in ids])

    def decode_batch(self, batch: list[list[int]]) -> list[str]:
        return self.sp.decode(batch)

    # Pieces as bytes of text, for tables built once per tokenizer (bits per byte, FIM's fast decoder,
    # sentence ends, word starts).
    concatenative = True  # decoding joins `piece_bytes` of the tokens (reserved ones give nothing)

    def is_control(self, token_id: int) -> bool:
        """A reserved token: decodes to nothing."""
        return self.sp.is_control(token_id)

    def is_unknown(self, token_id: int) -> bool:
        return self.sp.is_unknown(token_id)

    def is_byte(self, token_id: int) -> bool:
        """A byte-fallback piece `<0xNN>`: one byte of a character the vocabulary lacks."""
        return self.sp.is_byte(token_id)

    def piece_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes token `token_id` stands for in decoded text (b"" for reserved and `<unk>`)."""
        if self.sp.is_control(token_id) or self.sp.is_unknown(token_id):
            return b""
        piece = self.sp.id_to_piece(token_id)
        if self.sp.is_byte(token_id):
            return bytes([int(piece[3:5], 16)])
        return piece.replace(WORD_START, " ").encode("utf-8")

    def piece(self, token_id: int) -> str:
        return self.sp.id_to_piece(int(token_id))

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.sp.id_to_piece(int(i)) for i in ids]

    def id_of(self, piece: str) -> int:
        return self.sp.piece_to_id(piece)

    @cached_property
    def word_boundary_tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Two (V,) bool tables, `begins` and `ends`, for vectorised word starts (whole-word masking).

        Token t starts a word iff `begins[x[t]] | ends[x[t-1]]`: a piece that begins with ▁ (a space),
        or any piece after one that ends in whitespace (newline, tab) or after a special token. This
        catches `def` at the start of a line, which has no ▁. Byte pieces begin a word only when they
        are not a UTF-8 continuation byte *and* follow whitespace, so a multi-byte character is never cut.
        """
        begins = torch.zeros(self.vocab_size, dtype=torch.bool)
        ends = torch.zeros(self.vocab_size, dtype=torch.bool)
        for i in range(self.vocab_size):
            piece = self.sp.id_to_piece(i)
            if i < self.specials.first_ordinary:
                begins[i] = ends[i] = True
            elif self.sp.is_byte(i):
                ends[i] = int(piece[3:5], 16) in (0x09, 0x0A, 0x0D, 0x20)
            else:
                begins[i] = piece.startswith(WORD_START)
                ends[i] = piece[-1].isspace() or piece.endswith(WORD_START)
        return begins, ends

    def __iter__(self) -> Iterator[str]:
        return (self.sp.id_to_piece(i) for i in range(self.vocab_size))


def fixed_special_names() -> list[str]:
    return [name for name, _ in FIXED_PIECES]
