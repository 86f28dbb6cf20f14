"""The special-token table: one fixed layout of reserved ids, shared by every objective.

Ids 0..N_FIXED-1 are fixed; the sentinels follow and count *down* from `sentinel_base`, as T5 does
(`<extra_id_k>` = base - k), so span k's sentinel never depends on the vocabulary size. Every one of
these is a sentencepiece *control* symbol: inserted by id only, never matched in raw text, so a document
that quotes `<mask>` encodes as the characters `<`, `m`, ... and cannot smuggle in a control token.

A store tokenized with another tokenizer (a Hugging Face `tokenizer.json`) keeps that tokenizer's ids: each
special token it already has is used where it is, the others are appended after its vocabulary, and the
sentinels form one block counting down as above (`first_sentinel` is then the block's lowest id, not
N_FIXED). Objectives ask this table, never the id order: `is_special`, `is_sentinel`, `ordinary_ids`.

Default sentinel count: 256 covers every UL2 denoiser up to 1024 model tokens (the X-denoiser with mean
span 3 and rate 0.5 needs 256 spans there; 128 at 512, see Tay et al. 2022). Objectives assert
`n_spans <= n_sentinels` instead of silently counting into ordinary ids as T5 does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from typing import Any

import torch

from objtrain.errors import UserError

# name -> (fixed id, piece). Order is the id order.
FIXED_PIECES: tuple[tuple[str, str], ...] = (
    ("pad", "<pad>"),
    ("unk", "<unk>"),
    ("bos", "<s>"),
    ("eos", "</s>"),
    ("mask", "<mask>"),
    ("cls", "<cls>"),
    ("sep", "<sep>"),
    ("fim_prefix", "<fim_prefix>"),
    ("fim_middle", "<fim_middle>"),
    ("fim_suffix", "<fim_suffix>"),
    ("fim_pad", "<fim_pad>"),
    ("nlu", "[NLU]"),  # UL2 mode tokens
    ("nlg", "[NLG]"),
    ("s2s", "[S2S]"),
)
N_FIXED = len(FIXED_PIECES)
DEFAULT_SENTINELS = 256


def sentinel_piece(k: int) -> str:
    return f"<extra_id_{k}>"


@dataclass(frozen=True)
class Specials:
    """Ids of every reserved token. Ordinary (text) tokens are exactly the ids >= `first_ordinary`."""

    pad: int = 0
    unk: int = 1
    bos: int = 2
    eos: int = 3
    mask: int = 4
    cls: int = 5
    sep: int = 6
    fim_prefix: int = 7
    fim_middle: int = 8
    fim_suffix: int = 9
    fim_pad: int = 10
    nlu: int = 11
    nlg: int = 12
    s2s: int = 13
    n_sentinels: int = DEFAULT_SENTINELS
    first_sentinel: int = N_FIXED  # lowest sentinel id (`<extra_id_{n-1}>`); moved in another tokenizer's

    @property
    def fixed_ids(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name, _ in FIXED_PIECES)

    @property
    def own_layout(self) -> bool:
        """objtrain's own layout: the sentinels start at N_FIXED, right after the fixed ids, so every id below
        `first_ordinary` is reserved and every id from it on is text."""
        return self.first_sentinel == N_FIXED

    @property
    def sentinel_base(self) -> int:
        """Id of `<extra_id_0>`; sentinel k is `sentinel_base - k`."""
        return self.first_sentinel + self.n_sentinels - 1

    @property
    def first_ordinary(self) -> int:
        """First text id of objtrain's own layout; another tokenizer's has none (use `ordinary_ids`)."""
        if self.first_sentinel != N_FIXED:
            raise ValueError("this special-token table is another tokenizer's: its text ids are no range")
        return N_FIXED + self.n_sentinels

    def sentinel(self, k: int) -> int:
        if not 0 <= k < self.n_sentinels:
            raise UserError(f"sentinel {k} out of range: the tokenizer reserves {self.n_sentinels}")
        return self.sentinel_base - k

    def sentinel_ids(self, k: torch.Tensor) -> torch.Tensor:
        """Vectorised `sentinel`: callers check `k.max() < n_sentinels` once per batch."""
        return self.sentinel_base - k

    def is_sentinel(self, ids: torch.Tensor) -> torch.Tensor:
        return (ids >= self.first_sentinel) & (ids <= self.sentinel_base)

    def is_special(self, ids: torch.Tensor) -> torch.Tensor:
        if self.own_layout:
            return ids < self.first_ordinary
        fixed = torch.tensor(self.fixed_ids, dtype=ids.dtype, device=ids.device)
        return self.is_sentinel(ids) | torch.isin(ids, fixed)

    def is_special_id(self, token: int) -> bool:
        """`is_special` of one id."""
        if self.own_layout:
            return 0 <= token < self.first_ordinary
        return token in self.fixed_ids or self.first_sentinel <= token <= self.sentinel_base

    def ordinary_ids(self, vocab_size: int) -> torch.Tensor:
        """(n,) int64, ascending: the text ids of a vocabulary of `vocab_size` (every id not reserved).
        In objtrain's own layout this is `arange(first_ordinary, vocab_size)`."""
        return _ordinary_ids(self, vocab_size)

    def sentinel_index(self, token: int) -> int | None:
        """k for `<extra_id_k>`'s id, None for any other id."""
        return self.sentinel_base - token if self.first_sentinel <= token <= self.sentinel_base else None

    def reserved_pieces(self) -> list[str]:
        """objtrain's own layout: pieces in id order: the fixed ones, then sentinels from the highest id
        (`<extra_id_N-1>`) down."""
        fixed = [piece for _, piece in FIXED_PIECES]
        return fixed + [sentinel_piece(k) for k in reversed(range(self.n_sentinels))]

    def to_dict(self) -> dict[str, Any]:
        table = asdict(self)
        table["sentinel_base"] = self.sentinel_base
        if self.first_sentinel == N_FIXED:  # objtrain's own layout, recorded as it always was
            del table["first_sentinel"]
            table["first_ordinary"] = self.first_ordinary
        return table

    @classmethod
    def from_dict(cls, table: dict[str, Any]) -> Specials:
        """The table a store or checkpoint recorded, checked against the fixed layout (or, for another
        tokenizer's layout, that every id is a distinct non-negative integer)."""
        count = table.get("n_sentinels") if isinstance(table, dict) else None
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            found = f"n_sentinels {count!r}" if isinstance(table, dict) else f"a {type(table).__name__}"
            raise UserError(
                f"the special-token table holds {found}, not a count of sentinels: "
                "re-run `objtrain tokenize` to rebuild the store"
            )
        if "first_sentinel" in table:
            return cls._foreign(table)
        specials = cls(n_sentinels=count)
        expected = specials.to_dict()
        for name, value in table.items():
            if name in expected and expected[name] != value:
                raise UserError(
                    f"special token {name!r} has id {value}, objtrain expects {expected[name]}: "
                    "re-run `objtrain tokenize` to rebuild the store"
                )
        return specials

    @classmethod
    def _foreign(cls, table: dict[str, Any]) -> Specials:
        names = [f.name for f in fields(cls)]
        values = {name: table.get(name) for name in names}
        bad = [n for n, v in values.items() if isinstance(v, bool) or not isinstance(v, int) or v < 0]
        if bad:
            raise UserError(
                f"the special-token table has no usable id for {', '.join(bad)}: "
                "re-run `objtrain tokenize` to rebuild the store"
            )
        specials = cls(**values)
        fixed = specials.fixed_ids
        if len(set(fixed)) != len(fixed) or any(specials.sentinel_index(i) is not None for i in fixed):
            raise UserError(
                "the special-token table gives two special tokens one id: "
                "re-run `objtrain tokenize` to rebuild the store"
            )
        return specials


@lru_cache(maxsize=8)
def _ordinary_ids(specials: Specials, vocab_size: int) -> torch.Tensor:
    if specials.own_layout:
        return torch.arange(specials.first_ordinary, max(vocab_size, specials.first_ordinary))
    ids = torch.arange(vocab_size)
    return ids[~specials.is_special(ids)]
