"""BART denoising (Lewis et al. 2020; fairseq fairseq/data/denoising_dataset.py `DenoisingDataset`).

Per document: masking / deletion / text infilling (chosen by `replace_length`) and insertion, sentence
permutation, rotation; the encoder reads the noised document plus EOS and the decoder reconstructs the
original document plus EOS (loss on every target token).

Worked example, text infilling (`replace_length: 1`), document `a b c d e f`, one span over `c d`
and one zero-length span at `f`:  encoder `a b <mask> e <mask> f </s>`, decoder `a b c d e f </s>`.

Defaults are the BART paper's recipe (§2.2, §5.1): mask 0.3 of the words as Poisson(lambda = 3) spans,
one `<mask>` per span (`replace_length: 1`), 0-length spans insert a `<mask>`, all sentences permuted;
10% of the replacements random (`mask_random: 0.1`, as fairseq#1899 and HF PR #18904 set it). lambda is
3.0 as the paper states; fairseq#1899 and mBART use 3.5. The fairseq task's own defaults (mask 0,
rotate 0.5, replace_length 0) are not used: every field here is explicit.

Every draw is keyed by (seed, row, document, position in the document), so the noise of a document's
first c tokens is the noise of the whole document restricted to them. That is what lets a row be fitted
by a prefix sum: the documents of a row are noised once, whole, and the row keeps the longest prefix of
its raw text whose noised inputs (EOS included) fit the encoder and whose originals plus EOS fit the
decoder; the document cut there is exactly what noising the cut document alone would give (tested).
No target token is dropped and no input truncated; the raw text after the cut is left unused
(`stats["raw_tokens_unused"]`) and padding is the only slack. fairseq's draws are not prefix-stable,
and a fit that re-noised candidate prefixes cost twice the noise itself, so these differ on purpose:
- span starts: each word starts a span with probability mask / E[span length] (lengths Poisson(lambda)
  truncated as fairseq, or 1 word), not exactly ceil(mask * words) words' worth of spans from a budget;
  the expected masked share is the same (`stats["noise_density"]`), its count varies by document;
- masking runs before the permutation, over the original order (fairseq masks the permuted text): a
  span over a sentence end runs into the sentence that follows it in the document, and the permutation
  then moves the noised sentences, each still one contiguous block;
- a zero-length span inserts its `<mask>` before the word it starts at (fairseq: a random position),
  and `insert` inserts one before each token with probability `insert` (fairseq: ceil(len * insert)
  random slots); replacements and insertions are random ordinary ids with probability `mask_random`
  each (fairseq: exactly ceil(n * mask_random) of the insertions).
Permutation and rotation keep fairseq's counts, drawn for the document as the row holds it.

Other differences from fairseq, on purpose:
- no BOS in the encoder input: T5-style layout (decoder start id 0); nothing at the document edges is
  protected except the appended EOS;
- random replacements are drawn from ordinary tokens only (ids >= specials.first_ordinary), never
  specials or pad;
- overlapping spans merge into one, as fairseq's extension loop effectively does, and the random flag of
  a merged run is that of its first span;
- sentence ends come from the tokenizer (`sentences.sentence_end_table`) or from `sentence_end_ids`;
  permutation without either is refused, not silently skipped (fairseq#3803).

A document's trailing EOS (packed stores end documents with one) is kept out of the noise and is the
appended EOS. The transform runs on CPU tensors (the data-loader side), over the (B, L) rows as they
come: no per-document padding.

Rotation: the offset is uniform on [1, L-1] over the document's L noised tokens (EOS excluded), so a
rotated document is never the identity. fairseq draws `randint(1, len - 1)` inclusive over `BOS doc EOS`
and builds `BOS x[offset:-1] x[1:offset] EOS`: its two end offsets (1 and len - 1) both return the
document unchanged, so a "rotated" document is silently unrotated with probability 2 / (L + 1) (a third
of the time for 5-token documents). Here `rotate` is the probability that a document of 2+ tokens really
is rotated, and `stats["rotated_documents"]` counts documents that changed.

Row lengths: text infilling shortens the input (about 0.77 encoder tokens per raw token for the default
recipe on code, `input_ratio`), while the decoder reconstructs the whole original. So a row of model
length m holds raw = (m - 1) / input_ratio tokens: the encoder is m wide and the decoder raw + 1 (the
encoder-decoder model has no reason for equal widths). `input_ratio` only trades padding against unused
raw text: set it to `corrupt --stats`'s measured input/original length for another corpus or recipe
(e.g. 1.0 + insert for token masking).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np
import torch
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.errors import UserError
from objtrain.objectives.base import Objective, raw_usage
from objtrain.objectives.noise import (
    _DOC_STRIDE,
    _cumsum_in_rows,
    flat_nonzero,
    largest_fitting,
    packed_encdec_batch,
    smallest,
)
from objtrain.objectives.sentences import lookup, sentence_end_table, sentence_ids
from objtrain.objectives.span import finish_stats
from objtrain.rng import RowRandom

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


def permutation_slots(n_sent: Tensor, keys_choose: Tensor, keys_order: Tensor, ratio: float) -> Tensor:
    """(D, S) slot of every sentence after shuffling ceil(n_sent * ratio) randomly chosen sentences among
    their own slots (fairseq `permute_sentences`); sentences past a document's n_sent stay put."""
    D, S = keys_choose.shape
    s = torch.arange(S)[None, :]
    valid = s < n_sent[:, None]
    n_perm = torch.ceil(n_sent.double() * ratio).long()
    chosen = (_rank(keys_choose.masked_fill(~valid, _INT64_MAX)) < n_perm[:, None]) & valid
    slots = smallest(torch.where(chosen, s, S + s), S)  # chosen slots ascending, then the rest
    order = smallest(keys_order.masked_fill(~chosen, _INT64_MAX), S)
    source = torch.where(s < n_perm[:, None], order, slots)  # sentence that goes to slots[i]
    src_of_slot = torch.empty_like(slots).scatter_(1, slots, source)
    return torch.empty_like(slots).scatter_(1, src_of_slot, s.expand(D, S).contiguous())


def _spans(starts: Tensor, lengths: Tensor, n_rows: int, width: int) -> Tensor:
    """(n_rows, width) bool: columns covered by [start, start + length) intervals (flat starts)."""
    diff = torch.zeros(n_rows * (width + 1), dtype=torch.int64)
    row = torch.div(starts, width, rounding_mode="floor")
    diff.index_add_(0, starts + row, torch.ones_like(starts))
    diff.index_add_(0, starts + row + lengths, torch.full_like(starts, -1))
    return diff.view(n_rows, width + 1).cumsum(1)[:, :width] > 0


class BartDenoising(Objective):
    """fairseq-style BART noising; encoder-decoder only."""

    name = "bart"
    model_kinds = ("encdec",)
    attention = "bidirectional"
    # minimal pairs: one token in turn infilled from one <mask>, read in the reconstruction
    minimal_pair_forms: ClassVar[dict[str, tuple[str, ...]]] = {"encdec": ("bart_mask",)}
    rebuilds_input = True

    @dataclass
    class Config:
        mask: float = 0.3  # expected fraction of words to corrupt (BART paper: 0.3)
        mask_random: float = 0.1  # share of replacements that are random ordinary tokens (fairseq#1899)
        replace_length: int = 1  # -1: mask every token; 0: delete spans; 1: one <mask> per span (infilling)
        mask_length: Literal["span-poisson", "word"] = "span-poisson"  # span lengths: Poisson, or 1 word
        poisson_lambda: float = 3.0  # mean span length in words (paper: 3; fairseq#1899 / mBART: 3.5)
        whole_words: bool = True  # spans cover whole words (word starts from the tokenizer), as fairseq
        permute_sentences: float = 1.0  # fraction of sentences shuffled (BART paper: all)
        insert: float = 0.0  # probability of an extra <mask>/random token before each token
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
        if needs_random and specials.ordinary_ids(self.vocab_size).numel() == 0:
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
        self.start_rate = self.span_start_rate()
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

    def span_start_rate(self) -> float:
        """Probability that a word starts a span: mask / E[span length], so the expected share of words
        the spans cover (before overlaps merge) is `mask`, as fairseq's budget of ceil(mask * words).
        At most 1: a recipe asking for more than one span per word gets one per word."""
        c = self.config
        if c.mask_length == "word":
            return min(c.mask, 1.0)
        pmf = torch.diff(self.cdf, prepend=torch.zeros(1, dtype=torch.float64))
        mean = float((pmf * torch.arange(pmf.numel(), dtype=torch.float64)).sum())
        return min(c.mask / mean, 1.0)

    def _word_starts(self, rows: Tensor, text: Tensor, first: Tensor) -> Tensor:
        """(B, L) bool: text tokens that start a word (every document's first token does)."""
        if self.word_tables is None:
            return text
        begins, ends = self.word_tables
        t = rows.clamp(max=begins.numel() - 1)
        starts = lookup(begins, t)
        starts[:, 1:] |= lookup(ends, t[:, :-1])
        return (starts | first) & text

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        c, sp = self.config, self.specials
        B, L = rows.shape
        enc_w, dec_w = self.widths(L)
        rows, document_ids = rows.long(), document_ids.long()
        j = torch.arange(L)[None, :]
        valid = document_ids >= 0
        first = valid.clone()  # a document's first token
        first[:, 1:] &= document_ids[:, 1:] != document_ids[:, :-1]
        last = valid.clone()
        last[:, :-1] &= document_ids[:, :-1] != document_ids[:, 1:]
        text = valid & ~(last & (rows == sp.eos))  # a document's trailing EOS is not noised: it is put back
        rank = first.long().cumsum(1) - 1  # the document's rank in its row
        pos = j - torch.where(first, j, 0).cummax(1).values  # position inside the document
        doc_start = flat_nonzero(first)  # (D,) flat position of every document's first token
        D = doc_start.numel()
        if D == 0:
            return self._padding_batch(B, enc_w, dec_w, document_ids)
        doc = (first.view(-1).long().cumsum(0) - 1).clamp(min=0).view(B, L)  # document of every token
        # every draw is keyed like `Segments.random`: (seed, global row, document rank), position
        docs = Draws(
            seed,
            row_index.long()[torch.div(doc_start, L, rounding_mode="floor")] * _DOC_STRIDE
            + rank.take(doc_start),
            doc,
            pos,
        )
        stats: dict[str, Tensor] = {}

        # masking, deletion or infilling, and insertion: per original token, the items it becomes (inserted
        # tokens before it, then itself unless deleted) and the value it is written as
        value, survive = rows, text
        inserts: list[tuple[Tensor, Tensor]] = []  # (flat positions, values), inserted before the token
        if c.mask > 0:
            value, survive, zero_spans = self._mask(docs, rows, text, first, doc_start, stats)
            inserts.append(zero_spans)
        if c.insert > 0:
            at = flat_nonzero(text)
            at = at[docs.uniform(at, "bart/insert/where") < c.insert]
            inserts.append((at, self._insert_values(docs, at, "bart/insert/random")))
        n_items = survive.long()
        for at, _ in inserts:
            n_items.view(-1).index_add_(0, at, torch.ones_like(at))

        # the row keeps the longest prefix of its raw text whose inputs and targets, each document closed
        # by its EOS, fit the widths: the item counts are prefix-stable, so this is a prefix sum
        items_through = n_items.cumsum(1)
        text_through = text.long().cumsum(1)
        kept = valid & (items_through + rank < enc_w) & (text_through + rank < dec_w)
        keep = kept & text
        doc_kept = kept.take(doc_start)  # (D,)
        kept_items = torch.where(keep, n_items, 0)
        n_in = torch.zeros(D, dtype=torch.int64).index_add_(0, doc.view(-1), kept_items.view(-1))
        n_txt = torch.zeros(D, dtype=torch.int64).index_add_(0, doc.view(-1), keep.view(-1).long())
        col = items_through - n_items + rank  # encoder column of the token's first item, in order

        if c.permute_sentences > 0 and self.sentence_ends is not None:
            col = col + self._permute(docs, rows, document_ids, keep, kept_items, doc_start, stats)
            stats["permuted_sentences"] = torch.where(doc_kept, stats["permuted_sentences"], 0)
        doc_row = torch.div(doc_start, L, rounding_mode="floor")
        enc_len = torch.where(doc_kept, n_in + 1, 0)
        enc_start = _cumsum_in_rows(enc_len, doc_row) - enc_len  # column of each document's first item
        rotate: tuple[Tensor, Tensor, Tensor] | None = None
        if c.rotate > 0:
            rr = RowRandom(seed, docs.keys)
            rotated = (rr.scalar("bart/rotate") < c.rotate) & (n_in >= 2) & doc_kept
            drawn = rr.integers(1, (n_in - 1).clamp(min=1), "bart/rotate/offset", low=1)[:, 0]
            stats["rotated_documents"] = rotated
            start = enc_start.take(doc)
            rotate = (
                start,
                (enc_start + torch.where(rotated, drawn, 0)).take(doc),
                n_in.clamp(min=1).take(doc),
            )

        # lay the kept documents side by side: encoder = noised items then EOS, decoder = original then EOS
        spare = B * enc_w  # where the items of tokens not kept are written
        row_base = torch.arange(B)[:, None] * enc_w
        enc = torch.full((spare + 1,), sp.pad, dtype=torch.int64)
        enc_docs = torch.full((spare + 1,), -1, dtype=torch.int64)

        def write(where: Tensor, present: Tensor, values: Tensor) -> None:
            if rotate is not None:  # rotate inside the document: start + (column - start - offset) mod n
                start, shifted, modulus = rotate
                where = (where - shifted).remainder(modulus) + start
            dest = torch.where(present, where + row_base, spare).view(-1)
            enc.scatter_(0, dest, values.view(-1))
            enc_docs.scatter_(0, dest, rank.view(-1))

        before = torch.zeros_like(n_items)  # items already written before each token
        for at, values in inserts:
            present = torch.zeros(B * L, dtype=torch.bool).index_fill_(0, at, True).view(B, L)
            write(col + before, present & keep, torch.zeros_like(rows).view(-1).index_copy_(0, at, values))
            before = before + present.long()
        write(col + before, survive & keep, value)
        docs_kept = flat_nonzero(doc_kept)
        eos_at = (doc_row * enc_w + enc_start + n_in).take(docs_kept)
        enc.index_fill_(0, eos_at, sp.eos)
        enc_docs.index_copy_(0, eos_at, rank.take(doc_start.take(docs_kept)))
        enc_docs = enc_docs[:spare].view(B, enc_w)
        c_enc = torch.arange(enc_w)[None, :]
        is_start = torch.zeros(spare, dtype=torch.bool)
        is_start.index_fill_(0, (doc_row * enc_w + enc_start).take(docs_kept), True)
        enc_pos = c_enc - torch.where(is_start.view(B, enc_w), c_enc, 0).cummax(1).values
        enc_pos = torch.where(enc_docs >= 0, enc_pos, 0)

        dec_spare = B * dec_w
        dest = torch.where(keep, torch.arange(B)[:, None] * dec_w + text_through - 1 + rank, dec_spare).view(
            -1
        )
        labels = torch.full((dec_spare + 1,), IGNORE, dtype=torch.int64).scatter_(0, dest, rows.view(-1))
        dec_docs = torch.full((dec_spare + 1,), -1, dtype=torch.int64).scatter_(0, dest, rank.view(-1))
        dec_pos = torch.zeros(dec_spare + 1, dtype=torch.int64).scatter_(0, dest, pos.view(-1))
        dec_len = torch.where(doc_kept, n_txt + 1, 0)
        eos_at = (doc_row * dec_w + (_cumsum_in_rows(dec_len, doc_row) - dec_len) + n_txt).take(docs_kept)
        labels.index_fill_(0, eos_at, sp.eos)
        dec_docs.index_copy_(0, eos_at, rank.take(doc_start.take(docs_kept)))
        dec_pos.index_copy_(0, eos_at, n_txt.take(docs_kept))
        batch = packed_encdec_batch(
            enc[:spare].view(B, enc_w),
            enc_docs,
            enc_pos,
            labels[:dec_spare].view(B, dec_w),
            dec_docs[:dec_spare].view(B, dec_w),
            dec_pos[:dec_spare].view(B, dec_w),
            sp.pad,
        )

        n_docs = int(docs_kept.numel())
        totals = {"documents": float(n_docs), "raw_tokens": float(n_txt.sum())}
        if n_docs:
            totals["inserted_tokens"] = float(int(kept_items.sum()) - int((survive & keep).sum()))
            for name, counts in stats.items():
                per_token = counts.dim() == 2
                totals[name] = float((counts & keep).sum() if per_token else counts[doc_kept].sum())
        out = finish_stats(totals, batch, 0)
        out["target_tokens_dropped"] = float(int(dec_len.sum()) - out["target_tokens"])
        out.update(raw_usage(document_ids, int(kept.sum())))
        batch.stats = out
        return batch

    def _padding_batch(self, B: int, enc_w: int, dec_w: int, document_ids: Tensor) -> Batch:
        """The batch of rows that hold no document."""
        pad = self.specials.pad
        batch = Batch(
            input_ids=torch.full((B, enc_w), pad),
            labels=torch.full((B, dec_w), IGNORE),
            positions=torch.zeros(B, enc_w, dtype=torch.int64),
            document_ids=torch.full((B, enc_w), -1),
            attention="bidirectional",
            decoder_input_ids=torch.full((B, dec_w), pad),
            decoder_positions=torch.zeros(B, dec_w, dtype=torch.int64),
            decoder_document_ids=torch.full((B, dec_w), -1),
        )
        batch.stats = finish_stats({"documents": 0.0, "raw_tokens": 0.0}, batch, 0)
        batch.stats["target_tokens_dropped"] = 0.0
        batch.stats.update(raw_usage(document_ids, 0))
        return batch

    def _mask(
        self,
        docs: Draws,
        rows: Tensor,
        text: Tensor,
        first: Tensor,
        doc_start: Tensor,
        stats: dict[str, Tensor],
    ) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor]]:
        """Spans over whole words: (B, L) values and survivors, the zero-length spans' inserts (flat
        positions, values), and the per-token counts in `stats`."""
        c, sp = self.config, self.specials
        B, L = rows.shape
        ws = self._word_starts(rows, text, first)
        words_through = ws.long().cumsum(1)  # (B, L) words that start at or before each token
        word = words_through - 1  # (B, L) word index in the row
        # one past a document's last word: the words that start before the next document (whose first
        # token starts no word when the document is only its EOS), or the row's word count
        doc_row = torch.div(doc_start, L, rounding_mode="floor")
        words_end = words_through[:, -1].take(doc_row)
        same_row = doc_row[1:] == doc_row[:-1]
        words_before = (words_through - ws.long()).take(doc_start[1:])
        words_end[:-1] = torch.where(same_row, words_before, words_end[:-1])
        at = flat_nonzero(ws)
        at = at[docs.uniform(at, "bart/starts") < self.start_rate]  # span starts
        if c.mask_length == "span-poisson":
            # numpy's searchsorted: ~10x cheaper than torch's (BART runs on CPU)
            u = docs.uniform(at, "bart/poisson").numpy()
            n_words = torch.from_numpy(np.searchsorted(self.cdf.numpy(), u)).clamp(max=self.cdf.numel() - 1)
        else:
            n_words = torch.ones_like(at)
        zero = n_words == 0  # a zero-length span inserts a <mask> before its word
        real = at[~zero]
        w0 = word.take(real)
        w1 = torch.minimum(w0 + n_words[~zero], words_end.take(docs.doc.take(real)))
        row = torch.div(real, L, rounding_mode="floor")
        covered = _spans(row * L + w0, w1 - w0, B, L).gather(1, word.clamp(min=0)) & text
        run_start = covered.clone()
        run_start[:, 1:] &= ~covered[:, :-1]
        run_start |= covered & first
        token_random = torch.zeros(B, L, dtype=torch.bool)
        if c.replace_length != 0 and c.mask_random > 0:
            at_run = flat_nonzero(run_start)
            token_random.view(-1).index_fill_(
                0, at_run[docs.uniform(at_run, "bart/mask_random") < c.mask_random], True
            )
            if c.replace_length == -1:  # every token of a run takes its run's flag
                run = run_start.long().cumsum(1)
                flag = torch.zeros(B, L + 1, dtype=torch.bool).scatter_(1, run * run_start, token_random)
                token_random = flag.gather(1, run) & covered
        replaced = covered if c.replace_length == -1 else run_start
        value = torch.where(replaced, sp.mask, rows)
        if bool(token_random.any()):
            at_random = flat_nonzero(token_random)
            value.view(-1).index_copy_(0, at_random, self._random_ids(docs, at_random, "bart/random_ids"))
        if c.replace_length == 0:
            survive = text & ~covered
        elif c.replace_length == 1:
            survive = text & (~covered | run_start)
        else:
            survive = text
        stats["noise_tokens"] = covered
        stats["spans"] = run_start
        stats["random_replacements"] = token_random & replaced
        at_zero = at[zero]
        return value, survive, (at_zero, self._insert_values(docs, at_zero, "bart/mask_random"))

    def _insert_values(self, docs: Draws, at: Tensor, random_stream: str) -> Tensor:
        """Values of tokens inserted before flat positions `at`: <mask>, or with probability `mask_random`
        a random ordinary id (the flag read from `random_stream`)."""
        values = torch.full_like(at, self.specials.mask)
        if self.config.mask_random > 0 and self.config.replace_length != 0 and at.numel():
            is_random = docs.uniform(at, random_stream) < self.config.mask_random
            values[is_random] = self._random_ids(docs, at[is_random], random_stream + "/ids")
        return values

    def _random_ids(self, docs: Draws, at: Tensor, stream: str) -> Tensor:
        """Random ordinary ids (`specials.ordinary_ids`: [first_ordinary, vocab_size) in objtrain's own
        layout) at flat positions `at`."""
        u = docs.uniform(at, stream)
        if not self.specials.own_layout:
            ordinary = self.specials.ordinary_ids(self.vocab_size)
            return ordinary[torch.floor(u * ordinary.numel()).to(torch.int64)]
        low = self.specials.first_ordinary
        return low + torch.floor(u * (max(self.vocab_size, low + 1) - low)).to(torch.int64)

    def _permute(
        self,
        docs: Draws,
        rows: Tensor,
        document_ids: Tensor,
        keep: Tensor,
        kept_items: Tensor,
        doc_start: Tensor,
        stats: dict[str, Tensor],
    ) -> Tensor:
        """Sentence permutation of the kept text: (B, L) how far each token's items move with their
        sentence; `stats["permuted_sentences"]` per document."""
        D = doc_start.numel()
        doc = docs.doc
        table = self.sentence_ends
        assert table is not None
        top = int(rows.max()) + 1
        if top > table.numel():
            table = torch.cat([table, torch.zeros(top - table.numel(), dtype=torch.bool)])
        sid = sentence_ids(rows, torch.where(keep, document_ids, -1), table)
        local = torch.where(keep, sid - sid.take(doc_start).take(doc), 0)  # sentence inside its document
        n_sent = torch.zeros(D, dtype=torch.int64).scatter_reduce_(
            0, doc.view(-1), (local + 1).view(-1), "amax"
        )
        S = max(int(n_sent.max()), 1)
        cell = doc * S + local
        sent_len = torch.zeros(D * S, dtype=torch.int64).index_add_(0, cell.view(-1), kept_items.view(-1))
        sent_len = sent_len.view(D, S)
        rr = RowRandom(docs.seed, docs.keys)
        choose, order = rr.bits(S, "bart/permute/choose"), rr.bits(S, "bart/permute/order")
        slot = permutation_slots(n_sent, choose, order, self.config.permute_sentences)
        new_len = torch.zeros_like(sent_len).scatter_(1, slot, sent_len)
        moved = (new_len.cumsum(1) - new_len).gather(1, slot) - (sent_len.cumsum(1) - sent_len)  # (D, S)
        n_perm = torch.ceil(n_sent.double() * self.config.permute_sentences).long()
        stats["permuted_sentences"] = torch.where(n_sent > 1, n_perm, 0)
        return moved.view(-1).take(cell)


@dataclass
class Draws:
    """Random numbers for the tokens of a batch of rows, keyed per document: (seed, document key) with
    the token's position in its document, as `Segments.random` keys a document's (N, W) grid."""

    seed: int
    keys: Tensor  # (D,) document keys
    doc: Tensor  # (B, L) document of every token
    pos: Tensor  # (B, L) position of every token in its document

    def uniform(self, at: Tensor, stream: str) -> Tensor:
        """(M,) float64 in [0, 1) at flat token positions `at`."""
        if not at.numel():
            return torch.zeros(0, dtype=torch.float64)
        bits = RowRandom(self.seed, self.keys).bits_of(self.doc.take(at), self.pos.take(at), stream)
        return _unit64(bits)
