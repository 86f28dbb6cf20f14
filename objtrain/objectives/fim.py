"""Fill-in-the-middle (Bavarian et al. 2022; bigcode Megatron-LM gpt_dataset.py `permute`, FIM paper).

Context-level FIM: a packed row of T+1 raw tokens is split at document boundaries; every non-empty
document fragment is transformed on its own with probability `fim_rate`, the fragments are rejoined,
and the row is truncated to its original length (or right-padded with `<fim_pad>` when character-level
re-encoding made it shorter). The result is trained exactly as CLM (`clm.causal_batch`).

A fragment `content [</s>]` (the EOS is there when the document ends inside the row) is cut at two
sorted uniform boundaries into prefix, middle and suffix (each may be empty), then laid out as
    PSM: <fim_prefix> prefix <fim_suffix> suffix <fim_middle> middle </s>
    SPM: <fim_prefix> <fim_suffix> suffix <fim_middle> prefix middle </s>
SPM is the paper's variant 2 (gpt-neox#932), where prefix and middle are contiguous. The EOS stays after
the middle so the model learns to stop infilling. Loss: every position except `<fim_pad>` (pitfall
15.3: bigcode does not mask it); `<fim_pad>` only ever fills padding, which carries no label.

`level: char` (default; the paper's recommendation) draws the boundaries over the characters of the
decoded fragment and re-encodes the three parts: mid-token completion is trainable, at the cost of a
Python loop over the FIM-selected fragments. Re-encoding can change the token count (and a fragment cut
mid-character at the row start decodes to a replacement character), so rows are truncated or padded.
`level: token` draws the boundaries over tokens: fully vectorised, no tokenizer, exactly invertible.

Re-encoding (`reencode`, char level). `whole` encodes each of the three parts whole, as the reference
algorithm does; it was the only way until the loader had to keep up with a GPU, and sentencepiece then took
most of a batch's time. `window` (default) keeps the fragment's own tokens between the last word start at
or before each cut and the first one at or after it, and encodes only the text in between (`WindowEncoder`),
about a tenth of the characters. The cut points are the same character positions and every part decodes to
exactly the same text; the tokens are the same but where sentencepiece's float Viterbi breaks a near-tie
between two segmentations of the same text differently, because the part's text no longer begins at the
same place: about 1% of parts on standard-library code, nearly all of them a run of spaces split as
4 + 16 instead of 8 + 12. So `window` batches are not bit-identical to `whole` ones; set `reencode: whole`
to reproduce them. The window applies to objtrain's own sentencepiece models, whose words split at spaces
(identity normalisation, no dummy prefix); other tokenizers always encode whole.

Decoding (`PieceDecoder`) joins each token's UTF-8 bytes from a table built once and decodes them in one
call, ~30x faster than sentencepiece's decode, which was a quarter of a char-level batch; the text is
sentencepiece's to the character (reserved tokens give nothing and split runs of byte pieces, `<unk>` gives
" ⁇ ", each byte of an invalid sequence one U+FFFD; tested against sentencepiece), so batches are
unchanged.
"""

from __future__ import annotations

import codecs
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from objtrain.batch import Batch, runs_of
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.objectives.base import Objective, raw_usage
from objtrain.objectives.clm import causal_batch, causal_raw_used
from objtrain.objectives.mlm import below
from objtrain.rng import RowRandom
from objtrain.specials import Specials


def _replace_each_byte(error: UnicodeDecodeError) -> tuple[str, int]:
    """One U+FFFD per byte of an invalid UTF-8 sequence, as sentencepiece decodes byte pieces (Python's
    own "replace" gives one per maximal invalid subsequence)."""
    return "\ufffd" * (error.end - error.start), error.end


codecs.register_error("objtrain-replace-each-byte", _replace_each_byte)


class PieceDecoder:
    """`tokenizer.decode_batch` of many id lists at once, from a table of each token's bytes (module doc).
    Only for tokenizers whose decoding joins their tokens' bytes (`Tokenizer.concatenative`)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.table: list[bytes] = []
        self.reserved: set[int] = set()
        for i in range(tokenizer.vocab_size):
            if tokenizer.is_control(i):  # specials and sentinels decode to nothing
                self.table.append(b"")
                self.reserved.add(i)
            elif tokenizer.is_unknown(i):
                self.table.append(" \u2047 ".encode())
            else:  # a byte piece <0xNN> is its byte; the word marker is a space
                self.table.append(tokenizer.piece_bytes(i))

    def _text(self, ids: list[int]) -> str:
        table = self.table
        return b"".join([table[i] for i in ids]).decode("utf-8", "objtrain-replace-each-byte")

    def __call__(self, batch: list[list[int]]) -> list[str]:
        out = []
        for ids in batch:
            if self.reserved.isdisjoint(ids):
                out.append(self._text(ids))
            else:  # a reserved token ends a run of byte pieces, as in sentencepiece
                runs = itertools.groupby(ids, self.reserved.__contains__)
                out.append("".join(self._text(list(run)) for reserved, run in runs if not reserved))
        return out


def cut_points(text: str, lo: float, hi: float) -> tuple[int, int]:
    """The two sorted character boundaries, drawn uniformly from {0, ..., len(text)}."""
    c = len(text) + 1
    i, j = math.floor(lo * c), math.floor(hi * c)
    return (i, j) if i <= j else (j, i)


def whole_parts(
    pieces: list[list[int]],
    cuts: list[tuple[float, float]],
    tokenizer: Tokenizer,
    decode: Callable[[list[list[int]]], list[str]],
) -> list[list[int]]:
    """Prefix, middle and suffix tokens of each fragment (three lists a fragment): each part's text
    encoded whole, as the reference algorithm does."""
    parts: list[str] = []
    for (lo, hi), text in zip(cuts, decode(pieces), strict=True):
        i, j = cut_points(text, lo, hi)
        parts += [text[:i], text[i:j], text[j:]]
    return tokenizer.encode_batch(parts, num_threads=1)


class WindowEncoder:
    """`whole_parts` that re-encodes only the text between each cut and the nearest word start on
    either side of it, and keeps the fragment's own tokens between those word starts (module doc).

    A word start is a space after a non-space character at a token start. objtrain's sentencepiece
    models split words there (whitespace pre-tokenisation, identity normalisation, no dummy prefix), so
    a part's encoding is the encodings of its pieces between word starts joined. Fragments holding a
    reserved token or invalid UTF-8 (cut mid-character at the row start) are encoded whole."""

    def __init__(self, tokenizer: Tokenizer, decoder: PieceDecoder) -> None:
        self.tokenizer = tokenizer
        self.decoder = decoder
        self.length = np.array([len(b) for b in decoder.table], dtype=np.int64)
        self.start = np.concatenate(([0], np.cumsum(self.length)[:-1]))
        self.bytes = np.frombuffer(b"".join(decoder.table) or b"\0", dtype=np.uint8)
        self.reserved = np.zeros(len(decoder.table), dtype=bool)
        self.reserved[list(decoder.reserved)] = True

    def __call__(self, pieces: list[list[int]], cuts: list[tuple[float, float]]) -> list[list[int]]:
        if not pieces:
            return []
        ids = np.concatenate([np.asarray(p, dtype=np.int64) for p in pieces])
        counts = np.array([len(p) for p in pieces], dtype=np.int64)
        tok_at = np.concatenate(([0], np.cumsum(counts)))  # first token of each fragment
        size = self.length[ids]
        byte_at = np.concatenate(([0], np.cumsum(size)))  # first byte of each token (and the end)
        total = int(byte_at[-1])
        # every token's bytes, gathered in one go from the table
        raw = self.bytes[np.repeat(self.start[ids] - byte_at[:-1], size) + np.arange(total)]
        blob = raw.tobytes()
        continuation = np.concatenate(([0], np.cumsum((raw & 0xC0) == 0x80)))
        # word starts: tokens that begin with a space after a non-space byte, not first in their fragment
        first_byte = raw[np.minimum(byte_at[:-1], total - 1)] if total else np.zeros(0, dtype=np.uint8)
        before = raw[np.maximum(byte_at[:-1] - 1, 0)] if total else np.zeros(0, dtype=np.uint8)
        frag = np.repeat(np.arange(len(pieces)), counts)
        word = (size > 0) & (first_byte == 0x20) & (before != 0x20) & (np.arange(len(ids)) > tok_at[frag])
        frag_byte = byte_at[tok_at]
        char_at = (byte_at[:-1] - frag_byte[frag]) - (
            continuation[byte_at[:-1]] - continuation[frag_byte[frag]]
        )
        starts = np.flatnonzero(word)
        bounds = np.searchsorted(starts, tok_at)
        has_reserved = np.add.reduceat(self.reserved[ids].astype(np.int64), tok_at[:-1]) > 0  # none empty

        texts: list[str] = []
        plans: list[list[tuple[int, int, int]]] = []  # per part: (text index, first token, end token)
        for f, piece in enumerate(pieces):
            text: str | None = None
            if not has_reserved[f]:
                try:
                    text = blob[frag_byte[f] : frag_byte[f + 1]].decode("utf-8")
                except UnicodeDecodeError:
                    text = None
            words = starts[bounds[f] : bounds[f + 1]]
            if text is None:
                text = self.decoder([piece])[0]
                words = words[:0]
            i, j = cut_points(text, *cuts[f])
            chars = char_at[words]
            tokens = words - tok_at[f]
            for a, b in ((0, i), (i, j), (j, len(text))):
                lo, hi = np.searchsorted(chars, a, "left"), np.searchsorted(chars, b, "right") - 1
                if lo <= hi:  # text up to the first word start, the tokens kept, the text after the last
                    s, t = int(chars[lo]), int(chars[hi])
                    plans.append(
                        [(len(texts), 0, 0), (-1, int(tokens[lo]), int(tokens[hi])), (len(texts) + 1, 0, 0)]
                    )
                    texts += [text[a:s], text[t:b]]
                else:
                    plans.append([(len(texts), 0, 0)])
                    texts.append(text[a:b])
        # short texts, many empty: sentencepiece's per-call cost dominates, and its batch call costs more
        # per text than a loop of single calls
        encode = self.tokenizer.encode
        encoded = [encode(t) if t else [] for t in texts]
        out: list[list[int]] = []
        for f, piece in enumerate(pieces):
            for plan in plans[3 * f : 3 * f + 3]:
                part: list[int] = []
                for at, first, end in plan:
                    part += encoded[at] if at >= 0 else piece[first:end]
                out.append(part)
        return out


@dataclass
class Fragments:
    """Per position (B, L) view of the document fragments of packed rows."""

    start: Tensor  # first position of the position's fragment
    offset: Tensor  # position - start
    content: Tensor  # content length of the fragment (without its trailing EOS)
    fim: Tensor  # bool: the fragment is transformed
    spm: Tensor  # bool: ... in SPM order
    is_start: Tensor  # bool: the position starts a fragment
    lo_u: Tensor  # float64 uniforms for the two boundaries, read at the fragment start
    hi_u: Tensor


def fragments(
    rows: Tensor, document_ids: Tensor, specials: Specials, fim_rate: float, spm_rate: float, rr: RowRandom
) -> Fragments:
    """Find fragments (runs of one document id; padding runs are never transformed) and draw their fate.

    Each fragment's random numbers are read at its start position, so they depend only on the row."""
    B, L = rows.shape
    idx = torch.arange(L, device=rows.device).expand(B, L)
    is_start, frag, start, length = runs_of(document_ids)
    last = (start + length - 1).clamp(max=L - 1)
    ends_with_eos = rows.gather(1, last) == specials.eos
    content = length - ends_with_eos.long()
    real = document_ids >= 0
    # hash only the (B, F) fragment starts, then spread to their fragments: the same numbers as
    # hashing every position and reading them at the start
    F = int(frag[:, -1].max()) + 1 if B and L else 1
    start_of = torch.zeros(B, F + 1, dtype=torch.int64, device=rows.device)
    start_of.scatter_(1, torch.where(is_start, frag, F), idx)

    def at_starts(stream: str) -> Tensor:  # (B, F)
        return rr.bits_at(start_of[:, :F], stream)

    def uniform_at_start(stream: str) -> Tensor:  # RowRandom.uniform64 from the same bits, then spread
        u = ((at_starts(stream) >> 11) & ((1 << 53) - 1)).to(torch.float64) * (1.0 / (1 << 53))
        return u.gather(1, frag)

    fim = below(at_starts("fim/apply"), fim_rate).gather(1, frag) & real & (content > 0)
    spm = below(at_starts("fim/spm"), spm_rate).gather(1, frag) & fim
    return Fragments(
        start=start,
        offset=idx - start,
        content=content,
        fim=fim,
        spm=spm,
        is_start=is_start,
        lo_u=uniform_at_start("fim/lo"),
        hi_u=uniform_at_start("fim/hi"),
    )


def token_level_fim(
    rows: Tensor, document_ids: Tensor, f: Fragments, specials: Specials
) -> tuple[Tensor, Tensor]:
    """Token-level FIM of (B, L) rows, vectorised: every token and sentinel is scattered to its slot.

    Within a fragment with boundaries i <= j over n content tokens, offset o goes to:
        PSM  prefix 1+o, <SUF> 1+i, suffix 2+i+(o-j), <MID> 2+i+n-j, middle 3+n-j+o, EOS 3+n
        SPM  <SUF> 1, suffix 2+(o-j), <MID> 2+n-j, prefix and middle 3+n-j+o, EOS 3+n
    (<PRE> at 0), shifted by 3 for every transformed fragment before it. Slots >= L are dropped.
    """
    B, L = rows.shape
    n = f.content
    a = torch.floor(f.lo_u * (n + 1).double()).long()
    b = torch.floor(f.hi_u * (n + 1).double()).long()
    i, j = torch.minimum(a, b), torch.maximum(a, b)
    o = f.offset
    suffix_at = torch.where(f.spm, 2 + (o - j), 2 + i + (o - j))
    mid_at = torch.where(f.spm | (o >= i), 3 + n - j + o, 1 + o)
    within = torch.where(o >= n, 3 + n, torch.where(o >= j, suffix_at, mid_at))
    within = torch.where(f.fim, within, o)
    fim_starts = f.is_start & f.fim
    before = (fim_starts.long().cumsum(dim=1) - fim_starts.long()).gather(1, f.start)
    base = f.start + 3 * before

    out = torch.empty((B, L + 1), dtype=rows.dtype, device=rows.device)
    out_docs = torch.empty((B, L + 1), dtype=document_ids.dtype, device=rows.device)

    def put(dest: Tensor, values: Tensor, docs: Tensor, where: Tensor) -> None:
        dest = torch.where(where & (dest < L), dest, L)  # column L collects everything dropped
        out.scatter_(1, dest, values)
        out_docs.scatter_(1, dest, docs)

    everything = torch.ones_like(f.fim)
    put(base + within, rows, document_ids, everything)
    sentinel_at = {
        specials.fim_prefix: torch.zeros_like(n),
        specials.fim_suffix: torch.where(f.spm, 1, 1 + i),
        specials.fim_middle: torch.where(f.spm, 2 + n - j, 2 + i + n - j),
    }
    for token, at in sentinel_at.items():
        put(base + at, torch.full_like(rows, token), document_ids, fim_starts)
    return out[:, :L], out_docs[:, :L]


def char_level_fim(
    rows: Tensor,
    document_ids: Tensor,
    f: Fragments,
    specials: Specials,
    tokenizer: Tokenizer,
    decode: Callable[[list[list[int]]], list[str]] | None = None,
    window: WindowEncoder | None = None,
) -> tuple[Tensor, Tensor, int]:
    """Character-level FIM: decode each selected fragment, cut it at two uniform character boundaries,
    re-encode the three parts (whole, or only around the cuts with `window`; one batched encode per
    batch), then rebuild the rows that changed in Python (the accepted exception to vectorisation).

    Returns (rows, document_ids, number of <fim_pad> added)."""
    B, L = rows.shape
    out, out_docs = rows.clone(), document_ids.clone()
    busy = torch.zeros(B, dtype=torch.bool, device=rows.device)
    busy[torch.nonzero(f.fim & f.is_start)[:, 0]] = True
    frag_row, frag_start = torch.nonzero(f.is_start & busy[:, None], as_tuple=True)  # row-major order
    if frag_row.numel() == 0:
        return out, out_docs, 0
    r_, s_ = frag_row.tolist(), frag_start.tolist()
    fim, spm, n_, lo, hi, doc = (
        t[frag_row, frag_start].tolist() for t in (f.fim, f.spm, f.content, f.lo_u, f.hi_u, document_ids)
    )
    end = [s_[k + 1] if k + 1 < len(r_) and r_[k + 1] == r_[k] else L for k in range(len(r_))]
    row_tokens = {r: rows[r].tolist() for r in sorted(set(r_))}

    chosen = [k for k in range(len(r_)) if fim[k]]
    pieces = [row_tokens[r_[k]][s_[k] : s_[k] + n_[k]] for k in chosen]
    cuts = [(lo[k], hi[k]) for k in chosen]
    if window is not None:
        encoded = iter(window(pieces, cuts))
    else:
        encoded = iter(whole_parts(pieces, cuts, tokenizer, decode or tokenizer.decode_batch))

    p, m, x = specials.fim_prefix, specials.fim_middle, specials.fim_suffix
    n_pad = 0
    rebuilt: dict[int, tuple[list[int], list[int]]] = {}
    for k in range(len(r_)):
        tokens, docs = rebuilt.setdefault(r_[k], ([], []))
        piece = row_tokens[r_[k]][s_[k] : end[k]]
        if fim[k]:
            pre, mid, suf, tail = next(encoded), next(encoded), next(encoded), piece[n_[k] :]
            piece = [p, x, *suf, m, *pre, *mid, *tail] if spm[k] else [p, *pre, x, *suf, m, *mid, *tail]
        tokens += piece
        docs += [doc[k]] * len(piece)
    for tokens, docs in rebuilt.values():
        missing = L - len(tokens)
        if missing > 0:
            n_pad += missing
            tokens += [specials.fim_pad] * missing
            docs += [-1] * missing
        del tokens[L:], docs[L:]
    which = torch.tensor(list(rebuilt), dtype=torch.int64, device=rows.device)
    # numpy builds a tensor from nested lists about ten times faster than torch.tensor
    new_rows, new_docs = (
        torch.from_numpy(np.array([v[i] for v in rebuilt.values()], dtype=np.int64)).to(rows.device)
        for i in (0, 1)
    )
    out[which], out_docs[which] = new_rows, new_docs
    return out, out_docs, n_pad


class FillInTheMiddle(Objective):
    """Context-level FIM (PSM + SPM) on packed rows, trained as CLM; T model positions need T + 1 raw."""

    name = "fim"
    model_kinds = ("decoder",)
    attention = "causal"
    scores_left_to_right = True
    fim_sentinels = True

    def record(self) -> dict[str, Any]:
        """`fim_mode`: the order the model was trained on most (SPM when `spm_rate` > 0.5, else PSM)."""
        return {"fim_mode": "spm" if float(self.config.spm_rate) > 0.5 else "psm"}

    @classmethod
    def infill_form(cls, kind: str, training: Mapping[str, Any]) -> str:
        if kind != "decoder":
            return "none"
        settings = training.get("objective_config") or {}
        if isinstance(settings, dict) and settings.get("fim_rate") == 0:
            return "left-to-right"  # FIM at rate 0 is CLM: it never saw the sentinels
        return f"fim-{training.get('fim_mode') or 'psm'}"

    @classmethod
    def trained_both_orders(cls, training: Mapping[str, Any]) -> bool:
        """0 < spm_rate < 1: trained on PSM and on SPM."""
        settings = training.get("objective_config") or {}
        if not isinstance(settings, dict):
            return False
        try:
            rate = float(settings.get("spm_rate", 0.0))
        except (TypeError, ValueError):
            return False
        return 0.0 < rate < 1.0

    @dataclass
    class Config:
        fim_rate: float = 0.5  # share of documents transformed (FIM paper, StarCoder: 0.5)
        spm_rate: float = 0.5  # of the transformed: SPM order, else PSM (bigcode --fim-spm-rate 0.5)
        level: Literal["char", "token"] = "char"  # where the two boundaries fall (paper: characters)
        # char level: re-encode each part whole, or only the text around its cuts (module doc)
        reencode: Literal["window", "whole"] = "window"

        def __post_init__(self) -> None:
            for name in ("fim_rate", "spm_rate"):
                value = getattr(self, name)
                if not 0.0 <= value <= 1.0:
                    raise ValueError(f"{name} must be in [0, 1], got {value}")

    def setup(self) -> None:
        config, tokenizer = self.config, self.tokenizer
        if config.level == "char" and tokenizer is None:
            raise UserError(
                "fim: level 'char' needs the tokenizer (to decode and re-encode); or set level=token"
            )
        self.decoder = (
            PieceDecoder(tokenizer)
            if config.level == "char" and tokenizer is not None and tokenizer.concatenative
            else None
        )
        # the word-start split the window relies on holds for objtrain's own sentencepiece models
        self.window = (
            WindowEncoder(tokenizer, self.decoder)
            if config.reencode == "window" and self.decoder is not None and type(tokenizer) is Tokenizer
            else None
        )

    def raw_length(self, model_length: int) -> int:
        return model_length + 1

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        rows, document_ids = rows.long(), document_ids.long()
        rr = RowRandom(seed, row_index)
        f = fragments(rows, document_ids, self.specials, self.config.fim_rate, self.config.spm_rate, rr)
        n_pad = 0
        if not bool(f.fim.any()):
            out, out_docs = rows, document_ids
        elif self.config.level == "token":
            out, out_docs = token_level_fim(rows, document_ids, f, self.specials)
        else:
            assert self.tokenizer is not None
            out, out_docs, n_pad = char_level_fim(
                rows, document_ids, f, self.specials, self.tokenizer, self.decoder, self.window
            )
        batch = causal_batch(out, out_docs, cross_document=False)
        real_fragments = f.is_start & (document_ids >= 0) & (f.content > 0)
        batch.stats = {
            "fragments": float(real_fragments.sum()),
            "fim": float((f.is_start & f.fim).sum()),
            "spm": float((f.is_start & f.spm).sum()),
            "fim_pad": float(n_pad),
            "targets": float(batch.n_targets),
        }
        # raw tokens the batch holds: its positions minus the sentinels and <fim_pad> FIM added (what the
        # three sentinels of a transformed fragment push past the row end is the unused raw text); at
        # `level: char` the transformed fragments are re-encoded, so there this counts their new tokens
        s = self.specials
        held = ~torch.isin(out, out.new_tensor([s.fim_prefix, s.fim_middle, s.fim_suffix, s.fim_pad]))
        used = min(causal_raw_used(out_docs, batch.labels, held), int((document_ids >= 0).sum()))
        batch.stats.update(raw_usage(document_ids, used))
        return batch
