"""Sentence-pair objectives: BERT next-sentence prediction (Devlin et al. 2019) and ALBERT sentence-order
prediction (section 4), each with MLM on the pairs (section 2), several pairs packed per row.

Layout (T model positions, raw length T): pairs back to back, `[CLS] A1 [SEP] B1 [SEP] [CLS] A2 [SEP] B2
[SEP] ...`, then padding (at most 4 positions unless the row runs out of text). Each pair is its own
document (`document_ids` 0, 1, ... in row order), so attention never crosses pairs and `positions` restart
at every [CLS]; `segment_ids` are 0 for [CLS], A and the first [SEP], 1 for B and the last [SEP] (and 0 on
padding). `seq_labels` (B, T) holds each pair's label at its [CLS] position and IGNORE everywhere else
(the model's pooled head runs at every position; the loss reads it at the [CLS] positions, so a row's
pairs each get BERT's pooled-[CLS] classification). 1 = random next (NSP) / swapped (SOP), 0 = actual next
in order (BERT's convention; the flipped-label pitfall of section 3). `Batch.n_pairs` counts the labelled
[CLS] positions, so the pair loss is a mean over every pair of the step.

How a row becomes pairs, vectorised over the batch (all draws from the row's own random streams, per pair
by its chunk number, so nothing depends on the other rows of a batch):
1. Sentences are those of `sentences.sentence_ids` (a sentence starts after the last of a run of sentence
   enders, and at every document change); special tokens (EOS) are not content.
2. Chunks: every document run of the raw row is cut into chunks of about `pair_length` tokens (at most
   (T - 6) / 2, so a full row holds two pairs or more): a cut is placed every `pair_length` tokens from
   the run's start and moved forward to the next sentence start when one comes within half a chunk, so
   chunks hold whole sentences as BERT's do. With probability `short_seq_prob` a chunk's length is
   instead uniform in [2, pair_length] (BERT's short_seq_prob; drawn for the first 2 T / pair_length + 4
   chunks of a run, more than a row holds unless most are short): a short pair simply leaves room for the
   next one instead of padding. Every document run of a multi-document row gives its own chunks, so the
   other documents of a row are used rather than thrown away. A chunk of one token cannot make a pair
   and is skipped.
3. Each chunk becomes a pair: the split s is a random sentence start strictly inside it (a chunk with
   none, a 1-sentence chunk, is split at a random token instead: a split at a random token, as used by
   both NSP and SOP, where BERT and ALBERT would draw a random document, albert#234). A = the chunk
   before s, next = the chunk from s on.
4. Labels are stratified over the pairs of a row: pair k (k-th chunk able to make a pair) has label 1
   when floor((k + 1) r + u) > floor(k r + u), u uniform per row, r the rate. Every pair is label 1 with
   probability r, and a row's share is r within one pair, so the share of a few hundred rows is r to
   within a percent. The model cannot use the pattern: it never sees across pairs, and positions
   restart at every [CLS].
5. NSP negatives (label 1): B is text that does not follow A. It starts at a sentence start and ends at
   the sentence boundary nearest to len(next) tokens later (or at its document's end), so it is about
   as long as the actual next and ends as the actual next does (a chunk ends at a sentence boundary):
   neither its length nor a mid-sentence ending tells a negative apart, and the layout keeps its
   length. With `same_document_negatives` (default), B starts at a random sentence start of the same raw
   row (another document of it, or A's) that lies before A (B then stops at A's start at the latest) or
   at or after the sentence start following s, so at least one sentence is skipped and label 1 stays
   true in rows holding a single document (long documents, or a one-document corpus such as
   tinyshakespeare); BERT would draw from the same document and could return the actual next
   (NVIDIA/DeepLearningExamples#421). Starts with room for the whole B are preferred. Without it, B is
   drawn as BERT does, from another place of the corpus: the loader hands each row *donor* text
   (`donor_length`: one row's width) read at a place drawn from (seed, row) that never overlaps the row,
   and the negative of the pair whose split is at s reads B from the first donor sentence start at or
   after min(s, width - len(next)) (that position itself when no sentence starts after it): the
   negatives of one row read their B's at different places of one donor text, spread as their pairs
   are over the row, so one donor of a row's width serves them all. Either way, a B whose document
   would end before len(next) tokens starts instead at the first sentence of the next document when
   that has more room (short documents would otherwise leave short B's and padding).
   `stats["label_1_fraction"]`, `stats["same_document_negatives"]` and `stats["donor_negatives"]`
   report what was realised; a pair left without any source for B (rare) keeps its actual next, label 0.
   SOP: label 1 swaps A and next; SOP needs one document only.
6. Layout: the pairs are laid out in order, each taking len(A) + len(B) + 3 positions. The first pair
   that does not fit is shortened to the room left as BERT's truncate_seq_pair shortens a pair (the
   longer of A and B first), A from its front and B from its back, so a positive B still starts right
   after A; the pairs after it are dropped. So a row pads only when it holds less text than it has
   positions (the end of the data, or negatives whose B ends early). `raw_tokens_unused` counts the raw
   positions shown nowhere: what the cut and dropped pairs leave (about 3 tokens per pair, as the raw
   row is T tokens too), the EOS, and the actual next of every NSP negative.
7. MLM (the `mlm` keys, MaskedLM's) masks the pairs; [CLS]/[SEP] are special and never selected.

NSP put-back (the default, `same_document_negatives: true`; the steps above still describe SOP and NSP
with donor text). BERT's generator puts the segments a negative leaves unused back for the next pair;
showing a negative's actual next nowhere cost ~21% of the raw tokens fed. So NSP walks each row's
pairs in order, one step per pair, vectorised over the batch: a chunk is cut from the front cursor as in
step 2 and split as in step 3; label 1 is an i.i.d. draw per pair at `random_next_rate` (BERT's coin;
which pairs a row makes now depends on the labels before them, and the stratified labels of step 4 would
then bias the share); a positive moves the cursor to the chunk's end, a negative only to its split, so the
actual next starts the following chunk. A negative's B is read from the end of the row backwards (the
`tail`), which the front never reaches: a passage starting at the sentence start nearest to len(next)
tokens before the tail, after at least one skipped sentence, inside the run of the last text before the
tail, the first one ending at the row's last sentence start (not at its cut). Where the tail has no such
passage, or its run is shorter than half the actual next while an earlier one is not, B is read before A as
in step 5 (text already shown: its positions are counted once). When the front reaches the tail, it reads
the row's cut last sentence, and the pairs after that take their B before A. The row's raw text is thus
read once except those fallbacks. A pair split at a token (a one-sentence chunk) takes, as a negative, a
B that starts at a token too (after the actual next, exactly as long): B's starting mid-sentence would
otherwise mark every such pair positive (27% of the pairs on wikitext-2 paragraphs at 256).

Raw need (`raw_lengths`): a row's [CLS] [SEP] [SEP] (3 positions a pair) and its fallback B's take
positions that no raw token fills, so a full row of raw text cannot all be shown (12% of it went unused on
wikitext-2 paragraphs at 256). NSP asks for fewer raw tokens than positions, the width less 3 per expected
pair and an eighth of a chunk for the fallbacks, and the rest is padding. Measured (`corrupt --stats`, 256
to 2,048 rows): wikitext-2 paragraphs (sentencepiece 2,000) at 256: 3.9-4.2% unused, 3.5% padding; at 512:
3.1%, 1.4%; the standard library at 512: 0.4%, 2.2%; at 256: 0.4%, 4.4%. With donor text
(`same_document_negatives: false`) the row's own text after the pairs would go unread, so that mode keeps
steps 2 to 6 and their waste (26-33%); its need leaves room for the [CLS] [SEP] [SEP] only.

Loss: MLM mean + sentence-pair mean, an unweighted sum as BERT's run_pretraining.py; each mean is over
the whole optimizer step (all micro-batches and ranks), through `LossOutput.pair_sum`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import Batch, ModelOutput
from objtrain.errors import UserError
from objtrain.objectives.base import LossOutput, Objective, raw_usage, token_loss
from objtrain.objectives.mlm import MaskedLMConfig, mask_tokens, resolve_vocab_size, word_starts
from objtrain.objectives.sentences import lookup, sentence_end_table
from objtrain.rng import RowRandom
from objtrain.specials import Specials


@dataclass
class Text:
    """Sentence structure of raw rows (B, L), looked up at a few points per row rather than stored per
    position: the document of each position (-1 on specials and padding), the start of each position's
    run of one document id, the inclusive count of sentence starts (never position 0) up to each position
    and the count before each position ((B, L + 1)), and the inclusive count of run starts; `searchsorted`
    on a count finds the n-th start. Several lookups share one gather (the calls below are few and small,
    so their number, not their size, is the cost)."""

    doc: Tensor
    run_start: Tensor
    count: Tensor
    before: Tensor
    run_count: Tensor

    def nth_start(self, rank: Tensor) -> Tensor:
        """(B, P) position of the sentence start with 0-based `rank` in its row (L where none)."""
        return torch.searchsorted(self.count, rank + 1)

    def next_start(self, at: Tensor) -> Tensor:
        """(B, P) the first sentence start at or after `at` (0..L; L where none)."""
        return self.nth_start(self.before.gather(1, at))

    def run_end(self, at: Tensor) -> Tensor:
        """(B, P) the end of the run holding position `at` (0..L-1)."""
        return torch.searchsorted(self.run_count, self.run_count.gather(1, at) + 1)

    def end_near(self, start: Tensor, want: Tensor, limit: Tensor) -> Tensor:
        """(B, P) end of a passage read from `start` for about `want` tokens: the sentence boundary nearest
        to start + want, or `limit` (its document's end) when that comes first. Ending where a sentence
        ends, as the actual next does, leaves no "B stops mid-sentence" cue to tell negatives apart."""
        L = self.doc.size(1)
        target = start + want
        at = target.clamp(0, L - 1)
        # Starts before `at` + 1 and before `at`: the last start at or before it and the first at or after.
        n_incl, n_excl = self.before.gather(1, torch.cat([at + 1, at], dim=1)).chunk(2, dim=1)
        before, after = self.nth_start(torch.cat([n_incl - 1, n_excl], dim=1)).chunk(2, dim=1)
        after = torch.minimum(after, limit)
        use_before = (n_incl > 0) & (before > start) & (target - before <= after - target)
        end = torch.where(use_before, before, after)
        return torch.where(target >= limit, limit, end)


def text_structure(rows: Tensor, document_ids: Tensor, specials: Specials, end_table: Tensor) -> Text:
    """Sentence starts as `sentences.sentence_ids` draws them (after the last of a run of sentence enders,
    and at every document change), without the running index."""
    B, L = rows.shape
    doc = torch.where(specials.is_special(rows) | (document_ids < 0), -1, document_ids)
    change = torch.ones_like(rows, dtype=torch.bool)
    change[:, 1:] = doc[:, 1:] != doc[:, :-1]
    ends = lookup(end_table.to(rows.device), rows)
    starts = change.clone()
    starts[:, 1:] |= ends[:, :-1] & ~ends[:, 1:]
    starts &= doc >= 0
    starts[:, 0] = False
    idx = torch.arange(L, device=rows.device).expand(B, L)
    run_start = torch.where(change, idx, 0).cummax(1).values
    count = starts.cumsum(1)
    before = torch.cat([torch.zeros_like(count[:, :1]), count], dim=1)
    return Text(doc, run_start, count, before, change.cumsum(1))


def truncated_lengths(a: Tensor, b: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """BERT truncate_seq_pair's final lengths: shorten the longer part (B on ties) until a + b <= target."""
    half = (target + 1) // 2
    a_new = torch.minimum(a, torch.maximum(half, target - b))
    return a_new, torch.minimum(b, target - a_new)


def stratified(rate: float, valid: Tensor, rr: RowRandom, stream: str) -> Tensor:
    """(B, P) bool: label 1 for the valid pairs by systematic sampling along the row (module doc, step 4)."""
    k = (valid.long().cumsum(1) - 1).double()
    u = rr.scalar(stream)[:, None]
    return valid & (torch.floor((k + 1) * rate + u) > torch.floor(k * rate + u))


@dataclass
class Chunks:
    """The pairs a row's chunks make, per (row, chunk) (B, P), in raw-row coordinates."""

    start: Tensor  # first position of the chunk (= A's start)
    split: Tensor  # A = [start, split), the actual next = [split, end)
    end: Tensor
    valid: Tensor  # bool: the chunk holds two tokens or more
    sentence_split: Tensor  # bool: split at a sentence start (else at a token)


def chunk_rows(own: Text, pair_length: int, short_seq_prob: float, rr: RowRandom) -> Chunks:
    """Cut the document runs of raw rows into chunks and split each (module doc, steps 2 and 3)."""
    doc = own.doc
    B, L = doc.shape
    device = doc.device
    real = doc >= 0
    idx = torch.arange(L, device=device).expand(B, L)
    # Chunk lengths from each run's start: the first 2 ceil(L / K) + 4 chunks are K long or, with
    # short_seq_prob, uniform in [2, K] (one draw decides both); ceil(L / K) more of K follow, so the grid
    # covers any row (only a run of many short chunks gets to them).
    K = pair_length
    u = rr.uniform64(2 * -(-L // K) + 4, "pairs/length")
    drawn = torch.where(u < short_seq_prob, 2 + (u * ((K - 1) / max(short_seq_prob, 1e-300))).long(), K)
    length = torch.cat([drawn.clamp(max=K), torch.full((B, -(-L // K)), K, device=device)], dim=1)
    grid = torch.zeros(B, L + 1, dtype=torch.bool, device=device)
    grid.scatter_(1, length.cumsum(1).clamp(max=L), True)
    on_grid = (grid.gather(1, idx - own.run_start) & real).cumsum(1)
    G = int(on_grid[:, -1].max()) if L else 0
    g = torch.searchsorted(on_grid, torch.arange(1, G + 1, device=device).repeat(B, 1))  # L where none
    # Moved forward to the next sentence start of the same run within half a chunk, else kept.
    nxt = own.next_start(g)
    snap = (nxt < own.run_end(g.clamp(max=L - 1))) & (nxt <= g + max(K // 2, 1))
    is_start = torch.cat([(idx == own.run_start) & real, torch.zeros_like(real[:, :1])], dim=1)
    count = is_start.scatter_(1, torch.where(snap, nxt, g), True)[:, :L].cumsum(1)
    P = max(int(count[:, -1].max()) if L else 0, 1)
    start = torch.searchsorted(count, torch.arange(1, P + 1, device=device).repeat(B, 1))  # L where none
    following = torch.cat([start[:, 1:], torch.full_like(start[:, :1], L)], dim=1)
    end = torch.minimum(following, own.run_end(start.clamp(max=L - 1)))
    size = end - start  # <= 0 for chunks a row does not have
    valid = size >= 2
    # Split: a random sentence start strictly inside the chunk, else a random token.
    u = rr.uniform64(P, "pairs/split")
    first, last = own.before.gather(1, torch.cat([(start + 1).clamp(max=L), end.clamp(0, L)], 1)).chunk(2, 1)
    inner = last - first
    at_sentence = valid & (inner > 0)
    by_sentence = own.nth_start(first + (u * inner.clamp(min=0)).long())
    by_token = start + 1 + (u * (size - 1).clamp(min=0)).long()
    split = torch.where(at_sentence, by_sentence, torch.where(valid, by_token, start))
    return Chunks(start, split, end, valid, at_sentence)


@dataclass
class Second:
    """What follows A in each pair (B, P): where it is read and how long it is, the label, whether the two
    parts are swapped, whether it is read from the donor text, and flags to count in the stats."""

    start: Tensor
    length: Tensor
    label: Tensor  # bool
    swap: Tensor  # bool
    from_donor: Tensor  # bool
    flags: dict[str, Tensor]


@dataclass
class Pairs:
    """The pairs of each row as laid out (B, P), P = the most chunks in a row of the batch: the raw ranges
    of the first and second segment shown (the second in the donor text where `from_donor`), the model
    position of each pair's [CLS], whether the pair is in the row at all, and its label."""

    first_start: Tensor
    first_len: Tensor
    second_start: Tensor
    second_len: Tensor
    at: Tensor
    placed: Tensor  # bool
    label: Tensor  # bool: 1 = random next (NSP) / swapped (SOP)
    from_donor: Tensor  # bool
    sentence_split: Tensor  # bool: A and the actual next were split at a sentence start
    flags: dict[str, Tensor]  # bool per objective-specific statistic


class _SentencePairs(Objective):
    """Shared chunking, layout, MLM and loss of NSP and SOP; subclasses choose what follows A."""

    model_kinds = ("encoder",)
    attention = "bidirectional"
    feeds_segments = True

    def setup(self) -> None:
        specials, tokenizer = self.specials, self.tokenizer
        if tokenizer is None:
            raise UserError(f"{self.name}: needs the tokenizer (to find sentence ends)")
        c = self.config
        if c.pair_length < 2:
            raise UserError(f"{self.name}: pair_length must be at least 2, got {c.pair_length}")
        if not 0.0 <= c.short_seq_prob <= 1.0:
            raise UserError(f"{self.name}: short_seq_prob must be in [0, 1], got {c.short_seq_prob}")
        self.mlm_config: MaskedLMConfig = self.config.mlm
        self.vocab_size = resolve_vocab_size(self.mlm_config, specials, tokenizer, self.name)
        self.end_table = sentence_end_table(tokenizer)
        self.word_tables = tokenizer.word_boundary_tables if self.mlm_config.whole_word else None

    def choose(self, chunks: Chunks, own: Text, rr: RowRandom, donor: Text | None) -> Second:
        raise NotImplementedError

    def chunk_length(self, width: int) -> int:
        """Chunk length for rows of `width`: `pair_length`, but small enough for two pairs per row."""
        return chunk_length(self.config.pair_length, width)

    def make_pairs(
        self, rows: Tensor, document_ids: Tensor, rr: RowRandom, donors: tuple[Tensor, Tensor] | None = None
    ) -> Pairs:
        """Chunks, labels, second segments and layout of raw rows (B, L) (module doc, steps 2 to 6)."""
        L = rows.size(1)
        own = text_structure(rows, document_ids, self.specials, self.end_table)
        chunks = chunk_rows(own, self.chunk_length(L), self.config.short_seq_prob, rr)
        donor = None
        if donors is not None:
            donor = text_structure(donors[0].long(), donors[1].long(), self.specials, self.end_table)
        second = self.choose(chunks, own, rr, donor)

        # Layout (module doc, step 6): exclusive cumulative footprints; the first pair past the end is cut.
        a, b = chunks.split - chunks.start, second.length
        footprint = torch.where(chunks.valid, a + b + 3, 0)
        at = footprint.cumsum(1) - footprint
        room = L - at - 3
        placed = chunks.valid & (room >= 2)
        a, b = truncated_lengths(a, b, torch.minimum(room, a + b).clamp(min=0))
        a_from = chunks.split - a
        swap = second.swap
        return Pairs(
            first_start=torch.where(swap, second.start, a_from),
            first_len=torch.where(swap, b, a),
            second_start=torch.where(swap, a_from, second.start),
            second_len=torch.where(swap, a, b),
            at=at,
            placed=placed,
            label=second.label & placed,
            from_donor=second.from_donor & ~swap & placed,
            sentence_split=chunks.sentence_split,
            flags={name: flag & placed for name, flag in second.flags.items()},
        )

    def __call__(
        self,
        rows: Tensor,
        document_ids: Tensor,
        row_index: Tensor,
        seed: int,
        donors: tuple[Tensor, Tensor] | None = None,
    ) -> Batch:
        rows, document_ids = rows.long(), document_ids.long()
        L = rows.size(1)
        if L < 5:
            raise UserError(f"{self.name}: rows of {L} tokens cannot hold [CLS] A [SEP] B [SEP]")
        if self.donor_length(L) and donors is None:
            raise UserError(
                f"{self.name}: same_document_negatives=false draws each negative from another place of the "
                "corpus: read rows through the data loader, which hands each row its donor text"
            )
        rr = RowRandom(seed, row_index)
        pairs = self.make_pairs(rows, document_ids, rr, donors)
        tokens, docs, positions, segments, seq_labels, used = self.render(rows, pairs, donors)

        word = None
        if self.word_tables is not None:
            begins, ends = (t.to(rows.device) for t in self.word_tables)
            word = word_starts(tokens, docs, begins, ends)
        inputs, labels, stats = mask_tokens(
            tokens, docs, self.mlm_config, self.specials, self.vocab_size, rr, word
        )
        n_pairs = int(pairs.placed.sum())
        n_one = int(pairs.label.sum())
        stats.update(
            pairs=float(n_pairs),
            label_1=float(n_one),
            label_1_fraction=n_one / max(n_pairs, 1),
            sentence_splits=float((pairs.sentence_split & pairs.placed).sum()),
            token_splits=float((~pairs.sentence_split & pairs.placed).sum()),
            target_tokens_dropped=0.0,  # MLM targets are chosen after the layout: none is ever cut
        )
        stats.update({name: float(flag.sum()) for name, flag in pairs.flags.items()})
        stats.update(raw_usage(document_ids, used))
        return Batch(
            input_ids=inputs,
            labels=labels,
            positions=positions,
            document_ids=docs,
            attention="bidirectional",
            segment_ids=segments,
            seq_labels=seq_labels,
            stats=stats,
        )

    def render(
        self, rows: Tensor, pairs: Pairs, donors: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, float]:
        """Model rows (B, T) from the laid-out pairs: tokens, document ids, positions, segment ids, sequence
        labels, and the number of raw positions shown.

        Each pair is five stretches ([CLS], first, [SEP], second, [SEP]), each a run of consecutive source
        positions in `rows | donor text | [CLS] [SEP]`: a scatter of the stretch numbers at their first
        position and a cumulative max tell every model position its stretch, and a handful of gathers
        from (B, 5P) tables give the rest, so the cost is a few passes over the row, not one per field."""
        B, L = rows.shape
        P = pairs.at.size(1)
        device = rows.device
        W = 0 if donors is None else donors[0].size(1)
        sp = self.specials
        l0, l1, at = pairs.first_len, pairs.second_len, pairs.at
        second = torch.where(pairs.from_donor, L + pairs.second_start, pairs.second_start)
        cls_at, sep_at = L + W, L + W + 1
        # (B, P, 5) first model position and first source position of each stretch.
        begin = torch.stack([at, at + 1, at + 1 + l0, at + 2 + l0, at + 2 + l0 + l1], dim=2)
        source = torch.stack(
            [
                torch.full_like(at, cls_at),
                pairs.first_start,
                torch.full_like(at, sep_at),
                second,
                torch.full_like(at, sep_at),
            ],
            dim=2,
        )
        placed = pairs.placed[:, :, None].expand(B, P, 5)
        number = torch.arange(5 * P, device=device).view(1, P, 5).expand(B, P, 5)
        stretch = torch.full((B, L + 1), -1, dtype=torch.long, device=device)
        stretch.scatter_(1, torch.where(placed, begin, L).reshape(B, -1), number.reshape(B, -1))
        stretch = stretch[:, :L].cummax(1).values.clamp(min=0)  # every pair is placed before padding
        j = torch.arange(L, device=device).expand(B, L)
        total = torch.where(pairs.placed, l0 + l1 + 3, 0).sum(1, keepdim=True)
        real = j < total
        code = (source - begin).reshape(B, -1).gather(1, stretch) + j
        parts = [rows] if donors is None else [rows, donors[0].long()]
        specials = torch.tensor([[sp.cls, sp.sep, sp.pad]], dtype=torch.long, device=device).expand(B, 3)
        code = torch.where(real, code, sep_at + 1)
        tokens = torch.cat([*parts, specials], dim=1).gather(1, code)
        rank = pairs.placed.long().cumsum(1) - 1  # pair number among the placed ones
        docs = torch.where(real, rank[:, :, None].expand(B, P, 5).reshape(B, -1).gather(1, stretch), -1)
        pair_at = at[:, :, None].expand(B, P, 5).reshape(B, -1).gather(1, stretch)
        positions = j - torch.where(real, pair_at, total)  # padding is one more run, from 0
        half = torch.tensor([0, 0, 0, 1, 1], device=device).expand(B, P, 5)
        segments = half.reshape(B, -1).gather(1, stretch) * real
        label = torch.where(pairs.label, 1, 0)
        label = torch.stack([label, *[torch.full_like(label, IGNORE)] * 4], dim=2).reshape(B, -1)
        seq_labels = torch.where(real, label.gather(1, stretch), IGNORE)
        shown = torch.zeros(B, L + 1, dtype=torch.bool, device=device)
        shown.scatter_(1, torch.where(code < L, code, L), True)  # own raw positions shown (not donor text)
        return tokens, docs, positions, segments, seq_labels, float(shown[:, :L].sum())

    def loss(self, output: ModelOutput, batch: Batch) -> LossOutput:
        """MLM summed CE over the masked tokens plus the pair CE summed over the labelled [CLS] positions,
        each to be normalised by its own count (BERT: mean MLM + mean NSP; `LossOutput.pair_sum`)."""
        mlm = token_loss(output.logits, batch.labels)
        assert output.seq_logits is not None and batch.seq_labels is not None
        seq_logits = output.seq_logits.reshape(-1, output.seq_logits.size(-1))
        seq_labels = batch.seq_labels.reshape(-1)
        seq_sum = F.cross_entropy(seq_logits.float(), seq_labels, ignore_index=IGNORE, reduction="sum")
        labelled = seq_labels != IGNORE
        n_seq = labelled.sum()
        n_mlm = mlm.n_targets
        correct = (seq_logits.argmax(dim=-1) == seq_labels) & labelled
        metrics = {
            "mlm_loss": mlm.loss_sum.detach() / n_mlm.clamp(min=1),
            "seq_loss": seq_sum.detach() / n_seq.clamp(min=1),
            "seq_accuracy": correct.sum() / n_seq.clamp(min=1),
        }
        return LossOutput(mlm.loss_sum, n_mlm, metrics, pair_sum=seq_sum, n_pairs=n_seq)


def chunk_length(pair_length: int, width: int) -> int:
    """Text tokens of a pair's chunk in rows of `width` (module docstring, step 2): `pair_length`, at most
    (width - 6) / 2 so a row holds two pairs; evaluation builds its pairs to the same length."""
    return max(2, min(pair_length, (width - 6) // 2))


def _gather(values: Tensor, at: Tensor) -> Tensor:
    """values (B, L) read at (B, P) positions `at` (clamped into the row)."""
    return values.gather(1, at.clamp(0, values.size(1) - 1))


class NextSentencePrediction(_SentencePairs):
    """BERT NSP + MLM: is B the text that follows A (0) or text from elsewhere (1)?"""

    name = "nsp"

    @dataclass
    class Config:
        random_next_rate: float = 0.5  # share of pairs whose B is not the actual next (BERT: 0.5)
        same_document_negatives: bool = True  # B from the same row (before A, or after a skipped sentence)
        short_seq_prob: float = 0.1  # share of pairs with a shorter random length (BERT: 0.1)
        pair_length: int = 128  # text tokens of a pair (A + B); a row holds about T / (pair_length + 3)
        mlm: MaskedLMConfig = field(default_factory=MaskedLMConfig)  # masking of the pairs (section 2)

    def donor_length(self, width: int) -> int:
        return 0 if self.config.same_document_negatives else width

    def raw_lengths(self, model_length: int, row_index: Tensor, seed: int) -> Tensor:
        """Fewer raw tokens than positions: every pair spends 3 positions on [CLS] [SEP] [SEP], and a
        negative whose B cannot come from the row's unread tail (mostly the row's last pair) shows text
        again. Fed a full row, the text those positions displace could not be shown: 12% of the raw tokens
        of wikitext-2 paragraphs at 256 went unused. The need is the width less 3 positions per expected
        pair and an eighth of a chunk for the repeated B's; what is left over is padding (about 1-4% of
        the positions, module doc)."""
        K = self.chunk_length(model_length)
        p = self.config.short_seq_prob
        mean_chunk = (1 - p) * K + p * (K + 2) / 2
        pairs = model_length / (mean_chunk + 3)
        repeated = K / 8 if self.config.same_document_negatives else 0.0  # donor B's repeat nothing
        need = model_length - round(3 * pairs + repeated)
        return torch.full_like(row_index, max(need, min(model_length, 5)), dtype=torch.int64)

    def make_pairs(
        self, rows: Tensor, document_ids: Tensor, rr: RowRandom, donors: tuple[Tensor, Tensor] | None = None
    ) -> Pairs:
        if donors is not None or not self.config.same_document_negatives:
            return super().make_pairs(rows, document_ids, rr, donors)
        own = text_structure(rows, document_ids, self.specials, self.end_table)
        return put_back_pairs(own, self.chunk_length(rows.size(1)), self.config, rr)

    def choose(self, chunks: Chunks, own: Text, rr: RowRandom, donor: Text | None) -> Second:
        L = own.doc.size(1)
        want = chunks.end - chunks.split  # the actual next's length: a negative B as long keeps the layout
        u = rr.uniform64(want.size(1), "nsp/random_start")
        if donor is None:
            # Sentence starts before A, or at or after the sentence start following the split (at least
            # one sentence skipped); those with room for the whole B first.
            start = chunks.start
            skip = own.next_start((chunks.split + 1).clamp(max=L))
            bounds = torch.cat([start - want + 1, L - want + 1, start, skip], dim=1).clamp(0, L)
            roomy_before, roomy_end, before_a, after_skip = own.before.gather(1, bounds).chunk(4, dim=1)
            roomy_after = (roomy_end - after_skip).clamp(min=0)
            use_roomy = (roomy_before + roomy_after) > 0
            before = torch.where(use_roomy, roomy_before, before_a)
            n = before + torch.where(use_roomy, roomy_after, own.before[:, L:] - after_skip)
            k = (u * n).long()
            q = own.nth_start(torch.where(k < before, k, after_skip + k - before)).clamp(max=L - 1)
            limit = own.run_end(q)
            # Its document ends too soon: the next document's first sentence, if a candidate with more room.
            q2 = own.next_start(limit)
            limit2 = own.run_end(q2.clamp(max=L - 1))
            limit2 = torch.where(q2 < start, torch.minimum(limit2, start), limit2)
            limit = torch.where(q < start, torch.minimum(limit, start), limit)
            better = (q2 < L) & ((q2 >= skip) | (q2 < start)) & (limit - q < want) & (limit2 - q2 > limit - q)
            q, limit = torch.where(better, q2, q), torch.where(better, limit2, limit)
            end = own.end_near(q, want, limit)
            has = n > 0
            from_donor = torch.zeros_like(has)
        else:
            # BERT's negatives: B from another place of the corpus, read where the pair's split is in the row
            # (so a row's negatives read different donor text), from the first sentence start there.
            W = donor.doc.size(1)
            anchor = torch.minimum(chunks.split, W - want).clamp(0, W)
            q = donor.next_start(anchor)
            inside = (anchor < W) & (_gather(donor.doc, anchor) >= 0)  # else: the anchor's own token
            q = torch.where(q < W, q, torch.where(inside, anchor, W))
            has = q < W
            limit = donor.run_end(q.clamp(max=W - 1))
            # Its document ends too soon: the next document's first sentence, if it has more room.
            q2 = donor.next_start(limit)
            limit2 = donor.run_end(q2.clamp(max=W - 1))
            better = (q2 < W) & (limit - q < want) & (limit2 - q2 > limit - q)
            q, limit = torch.where(better, q2, q), torch.where(better, limit2, limit)
            end = donor.end_near(q, want, limit)
            from_donor = has
        negative = stratified(self.config.random_next_rate, chunks.valid, rr, "nsp/random") & has
        length = torch.where(negative, end - q, want)
        same_document = _gather(own.doc, q) == _gather(own.doc, chunks.start)
        flags = {
            "same_document_negatives": negative & ~from_donor & same_document,
            "donor_negatives": negative & from_donor,
        }
        return Second(
            start=torch.where(negative, q, chunks.split),
            length=length,
            label=negative,
            swap=torch.zeros_like(negative),
            from_donor=negative & from_donor,
            flags=flags,
        )


class SentenceOrderPrediction(_SentencePairs):
    """ALBERT SOP + MLM: are two consecutive segments of one document in order (0) or swapped (1)?"""

    name = "sop"

    @dataclass
    class Config:
        swap_rate: float = 0.5  # share of pairs shown in swapped order (ALBERT: 0.5)
        short_seq_prob: float = 0.1  # share of pairs with a shorter random length (ALBERT: 0.1)
        pair_length: int = 128  # text tokens of a pair (A + B); a row holds about T / (pair_length + 3)
        mlm: MaskedLMConfig = field(default_factory=MaskedLMConfig)  # masking of the pairs (section 2)

    def choose(self, chunks: Chunks, own: Text, rr: RowRandom, donor: Text | None) -> Second:
        swap = stratified(self.config.swap_rate, chunks.valid, rr, "sop/swap")
        return Second(chunks.split, chunks.end - chunks.split, swap, swap, torch.zeros_like(swap), {})


class _RowText:
    """`Text` of raw rows as flat numpy lookup tables, for the put-back walk: every query it makes on a (B,)
    state is one `take` from a precomputed table instead of a `searchsorted` (a walk step makes about
    twenty such lookups, and torch dispatch on (B, 1) tensors cost more than the work). Each table is
    (B, L + 2) flattened, read at `row_offset + position`."""

    def __init__(self, own: Text) -> None:
        # built with torch's scans (numpy's accumulate along rows is ~10x slower), read with numpy; the
        # walk is a few hundred tiny steps, so rows on an accelerator are walked on the CPU
        own = Text(*(t.cpu() for t in (own.doc, own.run_start, own.count, own.before, own.run_count)))
        doc = own.doc
        B, L = doc.shape
        W = L + 2
        self.B, self.L = B, L
        self.offset = np.arange(B, dtype=np.int64) * W
        count = own.count
        idx = torch.arange(L).expand(B, L)
        # nth[r, j] = searchsorted(count[r], j): 0 for j = 0, else the j-th sentence start (L where none);
        # positions that start no sentence write to a spare column
        is_start = torch.zeros_like(doc, dtype=torch.bool)
        is_start[:, 1:] = count[:, 1:] > count[:, :-1]
        nth = torch.full((B, W + 1), L, dtype=torch.int64)
        nth.scatter_(1, torch.where(is_start, count, W), idx)
        nth = nth[:, :W]
        nth[:, 0] = 0
        real = doc >= 0
        # the end of the run holding each position: the next run start after it (L where none)
        after = torch.where(own.run_start[:, 1:] == idx[:, 1:], idx[:, 1:], L)
        run_end = after.flip(1).cummin(1).values.flip(1)
        # first real position at or after each position (L where none); last real one before it (-1)
        next_real = torch.where(real, idx, L).flip(1).cummin(1).values.flip(1)
        last_real = torch.where(real, idx, -1).cummax(1).values

        def table(*parts: Tensor | int) -> np.ndarray:
            """Columns side by side (an int: one column of it), filled up to W with L, flattened."""
            cols = [torch.full((B, 1), p) if isinstance(p, int) else p for p in parts]
            n = sum(c.size(1) for c in cols)
            return torch.cat([*cols, torch.full((B, W - n), L)], 1).reshape(-1).numpy()

        self.nth = nth.reshape(-1).numpy()
        self.before = table(own.before)
        # the first sentence start at or after each position 0..L
        self.next_start = table(nth.gather(1, own.before + 1))
        self.run_start = table(own.run_start)
        self.run_end = table(run_end, L)
        self.next_real = table(next_real, L, L)
        self.last_real = table(-1, last_real)
        self.doc = table(doc)

    def at(self, table: np.ndarray, where: np.ndarray) -> np.ndarray:
        """table[r, where[r]] per row r (`where` within 0..L + 1)."""
        return table.take(where + self.offset)

    def nth_start(self, rank: np.ndarray) -> np.ndarray:
        """Position of the sentence start with 0-based `rank` (L where none), as `Text.nth_start` (every
        rank the walk asks for is in -1..L - 1: a count of starts, less one at most)."""
        return self.nth.take(rank + 1 + self.offset)

    def end_near(self, start: np.ndarray, want: np.ndarray, limit: np.ndarray) -> np.ndarray:
        """`Text.end_near` of (B,) arrays."""
        target = start + want
        at = np.minimum(np.maximum(target, 0), self.L - 1)
        n_incl, n_excl = self.at(self.before, at + 1), self.at(self.before, at)
        before, after = self.nth_start(n_incl - 1), self.nth_start(n_excl)
        after = np.minimum(after, limit)
        use_before = (n_incl > 0) & (before > start) & (target - before <= after - target)
        end = np.where(use_before, before, after)
        return np.where(target >= limit, limit, end)


class _Columns:
    """Column k of `rr.uniform64(n, stream)` (any n > k), as (B,) numpy: hashed in blocks of columns, not
    one call per column (the walk asks for four per step)."""

    def __init__(self, rr: RowRandom) -> None:
        self.rr = rr
        self.grids: dict[str, np.ndarray] = {}

    def __call__(self, k: int, stream: str) -> np.ndarray:
        grid = self.grids.get(stream)
        if grid is None or grid.shape[1] <= k:
            grid = self.rr.uniform64(max(16, 2 * (k + 1)), stream).cpu().numpy()
            self.grids[stream] = grid
        return grid[:, k]


def put_back_pairs(
    own: Text, pair_length: int, config: NextSentencePrediction.Config, rr: RowRandom
) -> Pairs:
    """NSP pairs of raw rows with same-row negatives, the unused segments put back (module doc, "NSP
    put-back"): a walk over the pairs of a row, vectorised over the batch, one step per pair. Each step
    depends on the one before, so the walk runs on (B,) numpy arrays and table lookups (`_RowText`)."""
    t = _RowText(own)
    B, L = t.B, t.L
    K = pair_length
    p_short = config.short_seq_prob
    short_scale = (K - 1) / max(p_short, 1e-300)
    cur = np.zeros(B, dtype=np.int64)
    at = np.zeros_like(cur)
    # Negatives read their B from the end of the row backwards: `tail` bounds the text still free there. It
    # starts at the row's last sentence start (the row's end when the row ends on an EOS or padding), so a
    # B ends at a sentence boundary as an actual next does; the text after it, the row's cut last sentence,
    # is read by the front last (`rest`), once it reaches the tail.
    n_starts = t.at(t.before, np.full(B, L))
    last_start = t.nth_start(np.maximum(n_starts - 1, 0))
    ends_clean = t.at(t.doc, np.full(B, L - 1)) < 0
    tail = np.where(ends_clean | (n_starts == 0), L, last_start)
    rest = tail.copy()
    closed = np.zeros(B, dtype=bool)  # the front reads the rest: no more B from the tail
    column = _Columns(rr)
    fields: dict[str, list[np.ndarray]] = {n: [] for n in Pairs.__dataclass_fields__ if n != "flags"}
    same_document: list[np.ndarray] = []
    for step in range(L + 1):
        cur = t.at(t.next_real, np.minimum(cur, L))
        jump = (cur >= tail) & (rest < L)
        if jump.any():
            cur = np.where(jump, t.at(t.next_real, rest), cur)
            tail = np.where(jump, L, tail)
            rest = np.where(jump, L, rest)
            closed = closed | jump
        room = L - at - 3  # text tokens the next pair may hold
        active = (cur < tail) & (room >= 2)
        if not active.any():
            break
        # the chunk: `length` tokens (short with short_seq_prob), moved forward to a sentence start within
        # half a chunk, inside its document run, before the tail, and no longer than the room left
        u = column(step, "pairs/length")
        short = u < p_short
        # (scaled only where short: with short_seq_prob 0 the scale is huge and the cast would overflow)
        drawn = np.minimum(
            np.where(short, 2 + (np.where(short, u, 0.0) * short_scale).astype(np.int64), K), K
        )
        limit = np.minimum(t.at(t.run_end, np.minimum(cur, L - 1)), tail)
        nominal = cur + np.minimum(drawn, room)
        nxt = t.at(t.next_start, np.minimum(nominal, L))
        snap = (nxt < limit) & (nxt <= nominal + max(K // 2, 1)) & (nxt - cur <= room)
        end = np.minimum(np.where(snap, nxt, nominal), limit)
        size = end - cur
        valid = active & (size >= 2)
        # the split: a random sentence start strictly inside, else a random token (as `chunk_rows`)
        u = column(step, "pairs/split")
        first = t.at(t.before, np.minimum(cur + 1, L))
        inner = t.at(t.before, np.minimum(end, L)) - first
        at_sentence = valid & (inner > 0)
        by_sentence = t.nth_start(first + (u * np.maximum(inner, 0)).astype(np.int64))
        by_token = cur + 1 + (u * np.maximum(size - 1, 0)).astype(np.int64)
        split = np.where(at_sentence, by_sentence, np.where(valid, by_token, cur))
        want = end - split
        # i.i.d. per pair, as BERT's coin: which pairs a row makes depends on the labels before them (a
        # put-back shifts the rest), so labels balanced along the row would bias the share; fresh draws do not
        negative = valid & (column(step, "nsp/random") < config.random_next_rate)
        # B from the tail: the sentence start nearest to `tail - want`, at or after the sentence start
        # following the split (one sentence skipped: never the actual next), to the tail or its run's end
        # inside the document run of the last text before the tail (a B from an earlier run would leave the
        # rest of that run unread); a run shorter than `want` gives all of itself
        skip = t.at(t.next_start, np.minimum(split + 1, L))
        t1 = t.at(t.last_real, tail)  # last real position before the tail (-1 where none)
        run_from = t.at(t.run_start, np.maximum(t1, 0))
        floor_ = np.maximum(run_from, skip)
        b_end = t1 + 1
        aim = np.minimum(np.maximum(np.maximum(b_end - want, floor_), 0), L)
        n_before = t.at(t.before, aim)
        q_after = t.nth_start(n_before)
        q_before = t.nth_start(np.maximum(n_before - 1, 0))
        before_ok = (n_before > 0) & (q_before >= floor_)
        use_before = before_ok & ((aim - q_before < q_after - aim) | (q_after >= b_end))
        q = np.where(use_before, q_before, q_after)
        # A pair split at a token (a one-sentence chunk) takes a B that starts at a token too, after the
        # actual next and as long as it: else "B starts mid-sentence" would tell every such pair positive.
        token_b = valid & ~at_sentence
        q = np.where(token_b, b_end - want, q)
        floor_ = np.where(token_b, np.maximum(run_from, end), floor_)
        from_tail = (t1 >= 0) & (q >= floor_) & (q < b_end) & ~closed
        # else before A (text already shown: nothing is lost), a random sentence start with room first
        roomy = t.at(t.before, np.minimum(np.maximum(cur - want + 1, 0), L))
        before_a = t.at(t.before, cur)
        # a tail run shorter than half the actual next gives way to a roomy passage before A: B's length
        # would otherwise tell negatives apart where documents are short
        from_tail = from_tail & ((b_end - run_from >= want // 2) | (roomy == 0))
        b_start, b_len = q, b_end - q
        if (negative & ~from_tail).any():  # only then: the draws are per (row, step) all the same
            u = column(step, "nsp/random_start")
            n = np.where(roomy > 0, roomy, before_a)
            q_early = np.minimum(t.nth_start((u * n).astype(np.int64)), L - 1)
            # token-type: a random text position before A with room for the whole B where there is one
            span = np.maximum(np.where(cur - want + 1 > 0, cur - want + 1, cur), 0)
            q_tok_early = np.minimum(t.at(t.next_real, np.minimum((u * span).astype(np.int64), L)), L - 1)
            q_early = np.where(token_b, q_tok_early, q_early)
            n = np.where(token_b, span, n)
            early_limit = np.minimum(t.at(t.run_end, q_early), cur)
            early_end = np.where(
                token_b, np.minimum(q_early + want, early_limit), t.end_near(q_early, want, early_limit)
            )
            negative = negative & (from_tail | (n > 0))
            b_start = np.where(from_tail, q, q_early)
            b_len = np.where(from_tail, b_len, early_end - q_early)
        a = split - cur
        b = np.where(negative, b_len, want)
        target = np.maximum(np.minimum(room, a + b), 0)
        # BERT truncate_seq_pair's final lengths, as `truncated_lengths`
        a = np.minimum(a, np.maximum((target + 1) // 2, target - b))
        b = np.minimum(b, target - a)
        fields["first_start"].append(split - a)
        fields["first_len"].append(a)
        fields["second_start"].append(np.where(negative, b_start, split))
        fields["second_len"].append(b)
        fields["at"].append(at)
        fields["placed"].append(valid)
        fields["label"].append(negative)
        fields["sentence_split"].append(at_sentence)
        same = t.at(t.doc, np.minimum(np.maximum(b_start, 0), L - 1)) == t.at(t.doc, np.minimum(cur, L - 1))
        same_document.append(negative & same)
        at = at + np.where(valid, a + b + 3, 0)
        tail = np.where(negative & from_tail, q, tail)
        # a negative's actual next is put back: the next chunk starts at the split (BERT's `i -= unused`)
        moved = np.where(active, np.maximum(end, cur + 1), cur)
        cur = np.where(valid, np.where(negative, split, end), moved)
    if not fields["at"]:  # no text at all: one empty column
        for name in fields:
            fields[name].append(
                np.zeros(B, dtype=bool if name in ("placed", "label", "sentence_split") else np.int64)
            )
        same_document.append(np.zeros(B, dtype=bool))
    device = own.doc.device

    def stacked(columns: list[np.ndarray]) -> Tensor:
        return torch.from_numpy(np.stack(columns, 1)).to(device)

    out = {name: stacked(v) for name, v in fields.items() if name != "from_donor"}
    none = torch.zeros(B, out["at"].size(1), dtype=torch.bool, device=device)
    flags = {"same_document_negatives": stacked(same_document), "donor_negatives": none}
    return Pairs(**out, from_donor=none.clone(), flags=flags)
