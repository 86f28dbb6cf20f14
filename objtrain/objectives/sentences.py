"""Sentence boundaries from token ids, for objectives that work on sentences (BART permutation, NSP/SOP).

A token ends a sentence when its piece ends in `.`, `!`, `?` (optionally followed by closing quotes or
brackets) or in a newline, or when it is EOS/SEP. Sentences never cross documents. This keeps an
explicit separator in the data, avoiding fairseq's silent no-op permutation when EOS was stripped
(Lewis et al. 2020, BART's sentence permutation).
"""

from __future__ import annotations

import torch
from torch import Tensor

from objtrain.data.tokenizer import Tokenizer

_ENDERS = ".!?"
_CLOSERS = "\"')]}»”’"


def sentence_end_table(tokenizer: Tokenizer) -> Tensor:
    """(V,) bool: the token can end a sentence."""
    table = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
    specials = tokenizer.specials
    table[[specials.eos, specials.sep]] = True
    for i in specials.ordinary_ids(tokenizer.vocab_size).tolist():
        if tokenizer.is_control(i):  # another tokenizer's own special tokens
            continue
        if tokenizer.is_byte(i):
            table[i] = tokenizer.piece_bytes(i) == b"\n"
            continue
        piece = tokenizer.piece_bytes(i).decode("utf-8", "replace")
        stripped = piece.rstrip(_CLOSERS)
        table[i] = piece.endswith("\n") or (len(stripped) > 0 and stripped[-1] in _ENDERS)
    return table


def lookup(table: Tensor, ids: Tensor) -> Tensor:
    """`table[ids]` for a 1-D table, as a flat gather: ~1.7x faster on CPU than advanced indexing."""
    return table.gather(0, ids.reshape(-1).long()).view(ids.shape)


def sentence_ids(tokens: Tensor, document_ids: Tensor, end_table: Tensor) -> Tensor:
    """(B, L) running sentence index per row: increments after every sentence end and document change.

    Consecutive enders (e.g. `...` or blank lines) close one sentence, as fairseq treats repeated full
    stops. Padding (document id -1) gets its own trailing index.
    """
    ends = lookup(end_table, tokens)
    nxt_differs = torch.ones_like(ends)
    nxt_differs[:, :-1] = ~ends[:, 1:]
    boundary = ends & nxt_differs
    doc_change = torch.zeros_like(ends)
    doc_change[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    starts = doc_change.clone()
    starts[:, 1:] |= boundary[:, :-1] & ~doc_change[:, 1:]
    return starts.long().cumsum(dim=1)
