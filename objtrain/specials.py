"""The special-token table: one fixed layout of reserved ids, shared by every objective.

Ids 0..N_FIXED-1 are fixed; the sentinels follow and count *down* from `sentinel_base`, as T5 does
(`<extra_id_k>` = base - k), so span k's sentinel never depends on the vocabulary size. Every one of
these is a sentencepiece *control* symbol: inserted by id only, never matched in raw text, so a document
that quotes `<mask>` encodes as the characters `<`, `m`, ... and cannot smuggle in a control token.

Default sentinel count: 256 covers every UL2 denoiser up to 1024 model tokens (the X-denoiser with mean
span 3 and rate 0.5 needs 256 spans there; 128 at 512, see reference section 7). Objectives assert
`n_spans <= n_sentinels` instead of silently counting into ordinary ids as T5 does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
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

    @property
    def sentinel_base(self) -> int:
        """Id of `<extra_id_0>`; sentinel k is `sentinel_base - k`."""
        return N_FIXED + self.n_sentinels - 1

    @property
    def first_ordinary(self) -> int:
        return N_FIXED + self.n_sentinels

    def sentinel(self, k: int) -> int:
        if not 0 <= k < self.n_sentinels:
            raise UserError(f"sentinel {k} out of range: the tokenizer reserves {self.n_sentinels}")
        return self.sentinel_base - k

    def sentinel_ids(self, k: torch.Tensor) -> torch.Tensor:
        """Vectorised `sentinel`: callers check `k.max() < n_sentinels` once per batch."""
        return self.sentinel_base - k

    def is_sentinel(self, ids: torch.Tensor) -> torch.Tensor:
        return (ids >= N_FIXED) & (ids < self.first_ordinary)

    def is_special(self, ids: torch.Tensor) -> torch.Tensor:
        return ids < self.first_ordinary

    def reserved_pieces(self) -> list[str]:
        """Pieces in id order: the fixed ones, then sentinels from the highest id (`<extra_id_N-1>`) down."""
        fixed = [piece for _, piece in FIXED_PIECES]
        return fixed + [sentinel_piece(k) for k in reversed(range(self.n_sentinels))]

    def to_dict(self) -> dict[str, Any]:
        table = asdict(self)
        table["sentinel_base"] = self.sentinel_base
        table["first_ordinary"] = self.first_ordinary
        return table

    @classmethod
    def from_dict(cls, table: dict[str, Any]) -> Specials:
        """The table a store or checkpoint recorded, checked against the fixed layout."""
        count = table.get("n_sentinels") if isinstance(table, dict) else None
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            found = f"n_sentinels {count!r}" if isinstance(table, dict) else f"a {type(table).__name__}"
            raise UserError(
                f"the special-token table holds {found}, not a count of sentinels: "
                "re-run `objtrain tokenize` to rebuild the store"
            )
        specials = cls(n_sentinels=count)
        expected = specials.to_dict()
        for name, value in table.items():
            if name in expected and expected[name] != value:
                raise UserError(
                    f"special token {name!r} has id {value}, objtrain expects {expected[name]}: "
                    "re-run `objtrain tokenize` to rebuild the store"
                )
        return specials
