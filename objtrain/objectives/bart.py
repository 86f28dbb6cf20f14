"""BART denoising (reference section 8; fairseq fairseq/data/denoising_dataset.py `DenoisingDataset`).

Per document, in fairseq's order: sentence permutation, masking (token masking / deletion / text
infilling, chosen by `replace_length`), insertion, rotation; the encoder reads the noised document plus
EOS and the decoder reconstructs the original document plus EOS (loss on every target token).

Worked example, text infilling (`replace_length: 1`), document `a b c d e f`, one span over `c d`
and one zero-length span before `f`:  encoder `a b <mask> e <mask> f </s>`, decoder `a b c d e f </s>`.

Defaults are the BART paper's recipe (§2.2, §5.1): mask 0.3 of the words as Poisson(lambda = 3) spans,
one `<mask>` per span (`replace_length: 1`), 0-length spans insert a `<mask>`, all sentences permuted;
10% of the replacements random (`mask_random: 0.1`, as fairseq#1899 and HF PR #18904 set it). lambda is
3.0 as the paper states; fairseq#1899 and mBART use 3.5. The fairseq task's own defaults (mask 0,
rotate 0.5, replace_length 0) are not used: every field here is explicit.

Differences from fairseq, on purpose:
- no BOS in the encoder input: T5-style layout (decoder start id 0); nothing at the document edges is
  protected except the appended EOS;
- random replacements are drawn from ordinary tokens only (ids >= specials.first_ordinary), never
  specials or pad (reference section 15.4);
- overlapping spans merge into one, as fairseq's extension loop effectively does, and the random flag of
  a merged run is that of its first span;
- sentence ends come from the tokenizer (`sentences.sentence_end_table`) or from `sentence_end_ids`;
  permutation without either is refused, not silently skipped (fairseq#3803).

A document's trailing EOS (packed stores end documents with one) is kept out of the noise and is the
appended EOS. The transform runs on CPU tensors (the data-loader side).

Rotation: the offset is uniform on [1, L-1] over the document's L tokens (EOS excluded), so a rotated
document is never the identity. fairseq draws `randint(1, len - 1)` inclusive over `BOS doc EOS` and
builds `BOS x[offset:-1] x[1:offset] EOS`: its two end offsets (1 and len - 1) both return the document
unchanged, so a "rotated" document is silently unrotated with probability 2 / (L + 1) (a third of the
time for 5-token documents). Here `rotate` is the probability that a document of 2+ tokens really is
rotated, and `stats["rotated_documents"]` counts documents that changed.

Row lengths: text infilling shortens the input (about 0.77 encoder tokens per raw token for the default
recipe on code, `input_ratio`), while the decoder reconstructs the whole original. So a row of model
length m holds raw = (m - 1) / input_ratio tokens: the encoder is m wide and the decoder raw + 1 (the
encoder-decoder model has no reason for equal widths). A noised length depends on the text (word
starts, sentence ends), so the documents of a row are fitted after noising: those whose noised inputs
fit m are kept, the first that does not is cut *before* noising to a prefix whose noised input fits
(found by noising candidate prefixes, see `BartDenoising.fit`), and the rest of the row is raw text left
unused (`stats["raw_tokens_unused"]`). No target token is dropped and no input is truncated; padding
(a few percent) is the only slack. `input_ratio` only trades padding against unused raw text: set it to
`corrupt --stats`'s measured input/original length for another corpus or recipe (e.g. 1.0 + insert for
token masking).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from objtrain.batch import Batch
from objtrain.errors import UserError
from objtrain.objectives.base import Objective, raw_usage
from objtrain.objectives.noise import (
    Pieces,
    Segments,
    _cumsum_in_rows,
    append_token,
    by_length,
    compact,
    encdec_batch,
    largest_fitting,
    smallest,
    split_documents,
)
from objtrain.objectives.rng import RowRandom
from objtrain.objectives.sentences import lookup, sentence_end_table, sentence_ids
from objtrain.objectives.span import finish_stats

_INT64_MAX = (1 << 63) - 1


def _unit64(bits: Tensor) -> Tensor:
    """int64 random bits as `RowRandom.uniform64` turns them into a float64 in [0, 1)."""
    return ((bits >> 11) & ((1 << 53) - 1)).to(torch.float64) * (1.0 / (1 << 53))


def poisson_cdf(lam: float, k_max: int = 128) -> Tensor:
    """(K,) float64 CDF of Poisson(lam) truncated as fairseq truncates it (k <= 128, pmf >= 1e-7)."""
    pmf = []
    p = math.exp(-lam)
    fact = 1.0
    for k in range(k_max + 1):
        if k > 0:
            fact *= k
            p = math.exp(-lam) * lam**k / fact
        pmf.append(p)
        if p < 1e-7:
            break
    t = torch.tensor(pmf, dtype=torch.float64)
    return (t / t.sum()).cumsum(0)


def _rank(keys: Tensor) -> Tensor:
    """(N, W) rank of every key inside its row (0 = smallest)."""
    order = smallest(keys, keys.size(1))
    return torch.empty_like(order).scatter_(
        1, order, torch.arange(keys.size(1)).expand_as(order).contiguous()
    )


def permute_sentences(
    tokens: Tensor, lengths: Tensor, ends: Tensor, ratio: float, rr: RowRandom
) -> tuple[Tensor, Tensor]:
    """Shuffle ceil(n_sentences * ratio) randomly chosen sentences among their own slots.

    tokens (N, W), `ends` the (V',) sentence-end table. Returns (tokens, permuted sentence count (N,)).
    """
    N, W = tokens.shape
    if N == 0 or W == 0:
        return tokens, torch.zeros(N, dtype=torch.int64)
    j = torch.arange(W)[None, :]
    inside = j < lengths[:, None]
    docs = torch.where(inside, 0, -1)
    table = ends
    top = int(tokens.max()) + 1
    if top > table.numel():
        table = torch.cat([table, torch.zeros(top - table.numel(), dtype=torch.bool)])
    sid = sentence_ids(tokens, docs, table)  # (N, W): 0.. per row, padding after the last
    n_sent = sid.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0] + 1
    S = int(n_sent.max())
    s = torch.arange(S)[None, :]
    valid = s < n_sent[:, None]
    n_perm = torch.ceil(n_sent.double() * ratio).long()
    keys = rr.bits(S, "bart/permute/choose").masked_fill(~valid, _INT64_MAX)
    chosen = (_rank(keys) < n_perm[:, None]) & valid
    slots = smallest(torch.where(chosen, s, S + s), S)  # chosen slots ascending, then the rest
    order = smallest(rr.bits(S, "bart/permute/order").masked_fill(~chosen, _INT64_MAX), S)
    i = torch.arange(S)[None, :]
    source = torch.where(i < n_perm[:, None], order, slots)  # sentence that goes to slots[i]
    src_of_slot = torch.empty_like(slots).scatter_(1, slots, source)
    slot_of_src = torch.empty_like(slots).scatter_(1, src_of_slot, s.expand(N, S).contiguous())
    sid_c = sid.clamp(max=S - 1)
    sent_len = torch.zeros(N, S, dtype=torch.int64).scatter_add_(1, sid_c, inside.long())
    old_start = sent_len.cumsum(1) - sent_len
    new_len = sent_len.gather(1, src_of_slot)
    new_start = new_len.cumsum(1) - new_len
    offset = j - old_start.gather(1, sid_c)
    pos = new_start.gather(1, slot_of_src.gather(1, sid_c)) + offset
    out = torch.zeros(N, W + 1, dtype=tokens.dtype)
    out.scatter_(1, torch.where(inside, pos, W), tokens)
    return out[:, :W], torch.where(n_sent > 1, n_perm, 0)


class BartDenoising(Objective):
    """fairseq-style BART noising; encoder-decoder only."""

    name = "bart"
    model_kinds = ("encdec",)
    attention = "bidirectional"

    @dataclass
    class Config:
        mask: float = 0.3  # fraction of words to corrupt (BART paper: 0.3)
        mask_random: float = 0.1  # share of replacements that are random ordinary tokens (fairseq#1899)
        replace_length: int = 1  # -1: mask every token; 0: delete spans; 1: one <mask> per span (infilling)
        mask_length: Literal["span-poisson", "word"] = "span-poisson"  # span lengths: Poisson, or 1 word
        poisson_lambda: float = 3.0  # mean span length in words (paper: 3; fairseq#1899 / mBART: 3.5)
        whole_words: bool = True  # spans cover whole words (word starts from the tokenizer), as fairseq
        permute_sentences: float = 1.0  # fraction of sentences shuffled (BART paper: all)
        insert: float = 0.0  # extra <mask>/random tokens inserted, as a fraction of the length
        rotate: float = 0.0  # probability of rotating the document to a random start
        sentence_end_ids: list[int] = field(default_factory=list)  # sentence enders; [] = from tokenizer
        vocab_size: int = 0  # random replacements draw from [first_ordinary, V); 0 = tokenizer's size
        input_ratio: float = 0.77  # expected encoder tokens per raw token: rows hold (m - 1) / input_ratio

    def setup(self) -> None:
        config, specials, tokenizer = self.config, self.specials, self.tokenizer
        c = config
        for key in ("mask", "mask_random", "permute_sentences", "insert", "rotate"):
            if not 0.0 <= getattr(c, key) <= 1.0:
                raise UserError(f"bart: {key} must be in [0, 1], got {getattr(c, key)}")
        if not 0.1 <= c.input_ratio <= 1.0 + c.insert:
            raise UserError(f"bart: input_ratio must be in [0.1, 1 + insert], got {c.input_ratio}")
        if c.replace_length not in (-1, 0, 1):
            raise UserError(f"bart: replace_length must be -1, 0 or 1, got {c.replace_length}")
        if c.poisson_lambda <= 0:
            raise UserError(f"bart: poisson_lambda must be positive, got {c.poisson_lambda}")
        self.vocab_size = c.vocab_size or (tokenizer.vocab_size if tokenizer is not None else 0)
        needs_random = c.mask_random > 0 and (c.mask > 0 or c.insert > 0) and c.replace_length != 0
        if needs_random and self.vocab_size <= specials.first_ordinary:
            raise UserError(
                "bart: mask_random > 0 needs the vocabulary size: pass a tokenizer or set vocab_size"
            )
        self.sentence_ends: Tensor | None = None
        if c.permute_sentences > 0:
            if c.sentence_end_ids:
                table = torch.zeros(max(c.sentence_end_ids) + 1, dtype=torch.bool)
                table[c.sentence_end_ids] = True
                self.sentence_ends = table
            elif tokenizer is not None:
                self.sentence_ends = sentence_end_table(tokenizer)
            else:
                raise UserError(
                    "bart: permute_sentences needs sentence ends: pass a tokenizer, set sentence_end_ids, "
                    "or set permute_sentences: 0"
                )
        self.word_tables: tuple[Tensor, Tensor] | None = None
        if c.whole_words and c.mask > 0:
            if tokenizer is None:
                raise UserError(
                    "bart: whole_words needs a tokenizer (word starts); or set whole_words: false"
                )
            self.word_tables = tokenizer.word_boundary_tables
        self.cdf = poisson_cdf(c.poisson_lambda)
        self._model_length: dict[int, int] = {}

    def raw_length(self, model_length: int) -> int:
        """Raw tokens per row: (m - 1) / input_ratio, so the noised documents plus EOS fill m encoder
        positions on average; the decoder, which reconstructs the longer original, is raw + 1 wide."""
        if model_length < 2:
            raise UserError(f"bart: model length {model_length} is too short")
        return max(1, math.floor((model_length - 1) / self.config.input_ratio + 1e-9))

    def model_length(self, raw_length: int) -> int:
        """The model (encoder) length whose rows hold `raw_length` raw tokens: the largest m with
        raw_length(m) <= raw_length (the inverse the training loader and `corrupt` rely on)."""
        if raw_length not in self._model_length:
            m = largest_fitting(raw_length, self.raw_length, start=2)
            self._model_length[raw_length] = max(m, 2)
        return self._model_length[raw_length]

    def widths(self, raw_length: int) -> tuple[int, int]:
        """(encoder, decoder) widths for rows of `raw_length` raw tokens."""
        return self.model_length(raw_length), raw_length + 1

    # ----------------------------------------------------------------------------------------------

    def _word_starts(self, tokens: Tensor, inside: Tensor) -> Tensor:
        if self.word_tables is None:
            return inside.clone()
        begins, ends = self.word_tables
        V = begins.numel()
        t = tokens.clamp(max=V - 1)
        starts = lookup(begins, t)
        starts[:, 1:] |= lookup(ends, t[:, :-1])
        starts[:, 0] = True
        return starts & inside

    def _mask_or_random(self, rr: RowRandom, random: Tensor, stream: str) -> Tensor:
        """(N, W) `<mask>`, with a random ordinary id where `random` holds: `rr.integers(W, V, stream,
        low=first_ordinary)` read there, hashing only those (few) positions, not the whole grid."""
        out = torch.full(random.shape, self.specials.mask, dtype=torch.int64)
        r, c = random.nonzero(as_tuple=True)
        if r.numel():
            u = _unit64(RowRandom(rr.seed, rr.rows[r]).bits_at(c[:, None], stream)[:, 0])
            low = self.specials.first_ordinary
            out[r, c] = low + torch.floor(u * (max(self.vocab_size, low + 1) - low)).to(torch.int64)
        return out

    def _mask(
        self, tokens: Tensor, lengths: Tensor, rr: RowRandom
    ) -> tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]:
        """Masking / deletion / infilling. Returns (tokens, lengths, zero-length span count, (N,) counts)."""
        c = self.config
        N, W = tokens.shape
        j = torch.arange(W)[None, :]
        inside = j < lengths[:, None]
        ws = self._word_starts(tokens, inside)
        word_of = ws.long().cumsum(1) - 1  # (N, W) word index of every token
        n_words = ws.sum(1)
        n_mask = torch.ceil(n_words.double() * c.mask).long()  # fairseq: math.ceil(n_words * p)
        Wn = max(int(n_words.max()), 1)
        k_max = max(int(n_mask.max()), 1)
        if c.mask_length == "span-poisson":
            K = k_max + 16
            u = rr.uniform64(K, "bart/poisson")
            # numpy's searchsorted: ~10x cheaper than torch's on a (N, K) grid (BART runs on CPU)
            span = torch.from_numpy(np.searchsorted(self.cdf.numpy(), u.numpy())).clamp(
                max=self.cdf.numel() - 1
            )
            total = span.cumsum(1)
            before = total - span
            used = before < n_mask[:, None]
            span = torch.minimum(span, n_mask[:, None] - before).clamp(min=0)
            short = (n_mask - total[:, -1]).clamp(min=0)  # only if K draws fell short: extend the last
            span[:, -1] += short
            used[:, -1] |= short > 0
        else:
            K = k_max
            span = torch.ones(N, K, dtype=torch.int64)
            used = torch.arange(K)[None, :] < n_mask[:, None]
        inserts = (used & (span == 0)).sum(1)
        lengths_nz, n_spans = compact(span, used & (span > 0), 0)
        # span starts: n_spans distinct words, uniformly (fairseq: randperm over word starts)
        w = torch.arange(Wn)[None, :]
        keys = rr.bits(Wn, "bart/starts").masked_fill(w >= n_words[:, None], _INT64_MAX)
        k = max(int(n_spans.max()), 1)
        first = smallest(keys, k)
        valid = torch.arange(k)[None, :] < n_spans[:, None]
        where = torch.where(valid, first, Wn)  # invalid picks land in a spare column
        chosen = torch.zeros(N, Wn + 1, dtype=torch.bool).scatter_(1, where, valid)[:, :Wn]
        span_len = torch.where(valid, lengths_nz[:, :k], 0)
        span_w = torch.zeros(N, Wn + 1, dtype=torch.int64).scatter_(1, where, span_len)[:, :Wn]
        stop = torch.minimum(w + span_w, n_words[:, None])
        diff = torch.zeros(N, Wn + 1, dtype=torch.int64)
        diff.scatter_add_(1, w.expand(N, -1), chosen.long())
        diff.scatter_add_(1, torch.where(chosen, stop, Wn), -chosen.long())
        covered_w = diff.cumsum(1)[:, :Wn] > 0
        # the random flag is read at the chosen words only: `uniform64(Wn, ...)` there, not the whole grid
        u = _unit64(rr.bits_at(first, "bart/mask_random"))
        random_w = torch.zeros(N, Wn + 1, dtype=torch.bool).scatter_(1, where, valid & (u < c.mask_random))[
            :, :Wn
        ]
        word_idx = word_of.clamp(0, Wn - 1)
        covered = covered_w.gather(1, word_idx) & inside
        run_start = covered.clone()
        run_start[:, 1:] &= ~covered[:, :-1]
        run = run_start.long().cumsum(1)  # run number of every token (1-based inside runs)
        start_random = random_w.gather(1, word_idx) & run_start
        run_random = torch.zeros(N, W + 1, dtype=torch.bool).scatter_(
            1, torch.where(run_start, run, 0), start_random
        )
        token_random = run_random.gather(1, run) & covered
        replacement = self._mask_or_random(rr, token_random, "bart/random_ids")
        stats = {
            "noise_tokens": covered.sum(1),
            "spans": run_start.sum(1),
            "random_replacements": (token_random & (run_start if c.replace_length == 1 else covered)).sum(1)
            if c.replace_length != 0
            else torch.zeros_like(lengths),
        }
        if c.replace_length == -1:
            return torch.where(covered, replacement, tokens), lengths, inserts, stats
        if c.replace_length == 0:
            out, n = compact(tokens, inside & ~covered, self.specials.pad)
            return out, n, inserts, stats
        values = torch.where(run_start, replacement, tokens)
        out, n = compact(values, inside & (~covered | run_start), self.specials.pad)
        return out, n, inserts, stats

    def _insert(self, tokens: Tensor, lengths: Tensor, n_ins: Tensor, rr: RowRandom) -> tuple[Tensor, Tensor]:
        """Insert n_ins[i] tokens at uniform random positions: <mask>, random for ceil(n * mask_random).

        Only the rows that insert anything are drawn and rebuilt (often a third of them insert nothing:
        the default recipe inserts only for zero-length spans); the others are padded copies."""
        N, W = tokens.shape
        W2 = W + max(int(n_ins.max()), 0)
        new_len = lengths + n_ins
        sel = (n_ins > 0).nonzero().squeeze(1)
        M = sel.numel()
        rs = RowRandom(rr.seed, rr.rows[sel]) if M < N else rr
        ins, lens = (n_ins[sel], new_len[sel]) if M < N else (n_ins, new_len)
        j = torch.arange(W2)[None, :]
        keys = rs.bits(W2, "bart/insert/where").masked_fill(j >= lens[:, None], _INT64_MAX)
        n_random = torch.ceil(ins.double() * self.config.mask_random).long()
        k = int(ins.max())
        if 4 * k <= W2:  # only ranks below n_ins matter: a partial top-k instead of ranking every key
            lowest = smallest(keys, k)  # rank r at [:, r]
            r = torch.arange(k)[None, :]
            flags = torch.zeros(M, W2 + 1, dtype=torch.bool)
            inserted = flags.scatter(1, torch.where(r < ins[:, None], lowest, W2), True)[:, :W2]
            is_random = flags.scatter_(1, torch.where(r < n_random[:, None], lowest, W2), True)[:, :W2]
        else:
            rank = _rank(keys)
            inserted = rank < ins[:, None]
            is_random = rank < n_random[:, None]
        new = self._mask_or_random(rs, is_random, "bart/insert/ids")
        src = ((~inserted).long().cumsum(1) - 1).clamp(0, max(W - 1, 0))
        rows = tokens.index_select(0, sel) if M < N else tokens
        old = rows.gather(1, src) if W else torch.zeros(M, W2, dtype=torch.int64)
        out = torch.where(inserted, new, old)
        if M < N:
            full = torch.nn.functional.pad(tokens, (0, W2 - W), value=self.specials.pad)
            out = full.index_copy_(0, sel, out)
        return out.masked_fill_(j >= new_len[:, None], self.specials.pad), new_len

    def _rotate(self, tokens: Tensor, lengths: Tensor, rr: RowRandom) -> tuple[Tensor, Tensor]:
        """With probability `rotate`, start the document at a uniform offset in [1, L-1].

        Never the identity, unlike fairseq, whose offsets 1 and len - 1 (of `BOS doc EOS`) both give the
        document back unchanged: see the module docstring."""
        W = tokens.size(1)
        rotated = (rr.scalar("bart/rotate") < self.config.rotate) & (lengths >= 2)
        offset = rr.integers(1, (lengths - 1).clamp(min=1), "bart/rotate/offset", low=1)[:, 0]
        offset = torch.where(rotated, offset, 0)
        j = torch.arange(W)[None, :]
        src = (j + offset[:, None]) % lengths.clamp(min=1)[:, None]
        out = tokens.gather(1, src.clamp(max=max(W - 1, 0))).masked_fill(
            j >= lengths[:, None], self.specials.pad
        )
        return out, rotated

    def noise(self, seg: Segments, rr: RowRandom) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """(N, W') noised documents (no EOS yet), their lengths, and (N,) per-document stat counts
        (summed over the documents a batch keeps, see `BartDenoising.fit`)."""
        c = self.config
        tokens, lengths = seg.tokens, seg.lengths
        stats: dict[str, Tensor] = {"documents": torch.ones_like(lengths), "raw_tokens": lengths}
        if seg.n == 0:
            return tokens, lengths, stats
        if c.permute_sentences > 0 and self.sentence_ends is not None:
            tokens, n_perm = permute_sentences(tokens, lengths, self.sentence_ends, c.permute_sentences, rr)
            stats["permuted_sentences"] = n_perm
        inserts = torch.zeros_like(lengths)
        if c.mask > 0:
            tokens, lengths, inserts, mask_stats = self._mask(tokens, lengths, rr)
            stats.update(mask_stats)
        n_ins = inserts + torch.ceil(lengths.double() * c.insert).long()
        if int(n_ins.sum()) > 0:
            tokens, lengths = self._insert(tokens, lengths, n_ins, rr)
        stats["inserted_tokens"] = n_ins
        if c.rotate > 0:
            tokens, rotated = self._rotate(tokens, lengths, rr)
            stats["rotated_documents"] = rotated.long()
        return tokens, lengths, stats

    def pieces(self, seg: Segments, rr: RowRandom) -> Pieces:
        """Encoder input = noised document + EOS; target = the document + EOS; the noise's stats as
        per-document `counts`."""
        noised, n_noised, counts = self.noise(seg, rr)
        inputs, n_in = append_token(noised, n_noised, self.specials.eos, self.specials.pad)
        targets, n_tgt = append_token(seg.tokens, seg.lengths, self.specials.eos, self.specials.pad)
        return Pieces(inputs, n_in, targets, n_tgt, seg.row, seg.doc, counts)

    def fit(
        self, seg: Segments, pieces: Pieces, widths: tuple[int, int], seed: int, row_index: Tensor
    ) -> tuple[Pieces, int]:
        """The documents of each row, in order, whose noised inputs (EOS included) fit the encoder width
        and whose originals plus EOS fit the decoder width (several documents cut by row ends, which have
        no EOS of their own, can need a few more target positions than raw tokens); the first that does
        not is cut *before* noising to a prefix that fits.

        A noised length depends on the tokens (word starts, sentences), so the cut is found by noising
        candidate prefixes, keyed like the document itself: first the prefix the document's own noised
        ratio predicts, then up to seven retries, each scaled by the overshoot and aimed a little lower;
        a document no prefix of which fits is left out, and so are the later documents of the row. What
        is left out is raw text the batch does not use (`stats["raw_tokens_unused"]`); no target token is
        ever dropped. Returns the pieces of the kept documents (whole ones from `pieces`, cut ones from the
        accepted candidate: a document's noise depends only on its tokens and key, so noising them again
        would give the same) and the raw tokens they use (EOS tokens included).
        """
        width, target_width = widths
        had_eos = seg.had_eos if seg.had_eos is not None else torch.zeros_like(seg.lengths, dtype=torch.bool)
        n_in = pieces.input_lengths
        n_tgt = pieces.target_lengths  # the document plus EOS
        before = _cumsum_in_rows(n_in, seg.row) - n_in
        before_t = _cumsum_in_rows(n_tgt, seg.row) - n_tgt
        fits = (before + n_in <= width) & (before_t + n_tgt <= target_width)
        if bool(fits.all()):
            return pieces, int(seg.lengths.sum() + had_eos.sum())
        first_fail = ~fits & (before < width) & (before_t < target_width)
        first_fail &= torch.cat([torch.ones(1, dtype=torch.bool), (seg.row[1:] != seg.row[:-1]) | fits[:-1]])
        whole = fits.nonzero().squeeze(1)
        cut = first_fail.nonzero().squeeze(1)
        room = width - before[cut]
        length = torch.minimum(seg.lengths[cut], target_width - before_t[cut] - 1)  # the decoder's room
        # the prefix the document's own ratio predicts, then shrink by the overshoot
        c = torch.minimum(length, (room - 1) * seg.lengths[cut] // (n_in[cut] - 1).clamp(min=1))
        c = torch.minimum(c, seg.lengths[cut] - 1)
        accepted = torch.zeros_like(c)
        todo = torch.ones_like(c, dtype=torch.bool)
        parts = [pieces.select(whole)]
        for attempt in range(8):
            todo &= c >= 1
            if not bool(todo.any()):
                break
            k = todo.nonzero().squeeze(1)
            sub = self._prefixes(seg, cut[k], c[k])
            candidate = self.pieces(sub, sub.random(seed, row_index))
            noised = candidate.input_lengths
            ok = noised <= room[k]
            parts.append(candidate.select(ok.nonzero().squeeze(1)))
            accepted[k[ok]] = c[k[ok]]
            todo[k[ok]] = False
            # scale by the overshoot, aiming a little lower each retry (a prefix is a new noise draw)
            aim = ((room[k] - 1).double() * (1.0 - 0.02 * (attempt + 1))).long()
            shrink = torch.minimum(c[k] - 1, c[k] * aim // (noised - 1).clamp(min=1))
            c[k] = torch.where(ok, c[k], shrink)
        used = int(seg.lengths[whole].sum() + had_eos[whole].sum() + accepted.sum())
        return Pieces.merge(parts, self.specials.pad), used

    def _prefixes(self, seg: Segments, index: Tensor, lengths: Tensor) -> Segments:
        """Documents `index` cut to their first `lengths` tokens (no EOS of their own: it is appended)."""
        width = max(int(lengths.max()) if lengths.numel() else 0, 1)
        tokens = seg.tokens[:, :width].index_select(0, index)
        j = torch.arange(width)[None, :]
        tokens = tokens.masked_fill(j >= lengths[:, None], self.specials.pad)
        flags = torch.zeros_like(lengths, dtype=torch.bool)
        return Segments(tokens, lengths, seg.row[index], seg.doc[index], seg.n_rows, flags)

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        seg = split_documents(rows, document_ids, self.specials.pad, self.specials.eos)
        enc_w, dec_w = self.widths(rows.size(1))

        def make(sub: Segments) -> tuple[Pieces, dict[str, float]]:
            return self.pieces(sub, sub.random(seed, row_index)), {}

        pieces, _ = by_length(seg, make, self.specials.pad)
        pieces, used = self.fit(seg, pieces, (enc_w, dec_w), seed, row_index)
        if pieces.row.numel():  # the stats of the documents the batch holds
            stats = {key: float(value.sum()) for key, value in pieces.counts.items()}
        else:
            stats = {"documents": 0.0, "raw_tokens": 0.0}
        batch, truncated = encdec_batch(pieces, seg.n_rows, enc_w, dec_w, self.specials)
        batch.stats = finish_stats(stats, batch, truncated, pieces)
        batch.stats.update(raw_usage(document_ids, used))
        return batch
