"""Sentence-pair objectives: BERT next-sentence prediction (reference section 3) and ALBERT sentence-order
prediction (section 4), each with MLM on the pair (section 2), as BERT and ALBERT train them.

Layout (T model positions, raw length T): `[CLS] A [SEP] B [SEP]` then padding; `segment_ids` are 0 for
[CLS], A and the first [SEP], 1 for B and the last [SEP] (and 0 on padding); the pair is one document.
`seq_labels`: 1 = random next (NSP) / swapped (SOP), 0 = actual next in order (BERT's convention; the
flipped-label pitfall of section 3). A row with no two adjacent tokens of one document cannot make a
pair: it gets `[CLS] [SEP] [SEP]` and `seq_labels = IGNORE`.

How a row becomes a pair, vectorised over the batch (all draws from the row's own random streams):
1. Sentences come from `sentences.sentence_ids`; special tokens (EOS) are not content.
2. The split point s is a random sentence start inside the row's longest document run (a token of the
   same document before it): a pair is one document's text, and the longest run fills it best. A row
   with no such boundary (a 1-sentence chunk) is split at a random token position inside that run
   instead: the reference's recommendation, used by both NSP and SOP, where BERT and ALBERT would draw a
   random document (albert#234).
   A = the document's tokens before s, next = its tokens from s on.
3. NSP negatives: with probability `random_next_rate`, B starts at a random sentence start away from A.
   With `same_document_negatives` (default), B comes from a *different* document of the same raw row,
   or, in a row holding a single document (long documents, or a one-document corpus such as
   tinyshakespeare), from a sentence start strictly after the next one, so at least one sentence is
   skipped and label 1 stays true ("B does not follow A"); BERT would draw from the same document and
   could return the actual next sentence (NVIDIA/DeepLearningExamples#421). Without it, B is drawn as
   BERT does, from another place of the corpus: the loader hands each row *donor* text (`donor_length`)
   read at a place drawn from (seed, row) that never overlaps the row, and B starts at its first sentence
   start (its first token when it holds none): a random sentence of the corpus. So the share of label 1
   is `random_next_rate` whatever the packing, and a row's pair depends on its own index only, never on
   the rows that share its batch. `stats["label_1_fraction"]`, `stats["same_document_negatives"]` and
   `stats["donor_negatives"]` report what was realised.
   SOP: with probability `swap_rate`, A and next are swapped (label 1); SOP needs one document only.
   Padding: a pair is the text of one document, so a row whose longest run is short, a B whose document
   ends early, the sentences a same-document negative skips and `short_seq_prob` (about 5% alone) leave
   padding, as BERT's instances do at document ends; the other documents of a multi-document row are
   not used.
4. Length: the pair gets T - 3 tokens, or with probability `short_seq_prob` a uniform target in
   [2, T - 3] (BERT's short_seq_prob). The longer of A and B is shortened first, as BERT's
   truncate_seq_pair, and each part's removed tokens are split at random between its front and back
   (BERT flips a coin per token; a uniform split here), so truncation leaves no ordering cue.
5. MLM (the `mlm` keys, MaskedLM's) masks the pair; [CLS]/[SEP] are special and never selected.

Loss: MLM mean + sentence-pair mean, an unweighted sum as BERT's run_pretraining.py; each mean is over
the whole optimizer step (all micro-batches and ranks), through `LossOutput.pair_sum`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import Batch, ModelOutput, positions_of, runs_of
from objtrain.errors import UserError
from objtrain.objectives.base import LossOutput, Objective, raw_usage, token_loss
from objtrain.objectives.mlm import MaskedLMConfig, below, mask_tokens, resolve_vocab_size, word_starts
from objtrain.objectives.rng import RowRandom
from objtrain.objectives.sentences import sentence_end_table, sentence_ids
from objtrain.specials import Specials

_MIN_KEY = torch.iinfo(torch.int64).min


def pick(candidates: Tensor, rr: RowRandom, stream: str) -> Tensor:
    """(B,) a uniformly random position among the True ones of (B, L) `candidates` (0 where none)."""
    keys = rr.bits(candidates.size(1), stream).masked_fill(~candidates, _MIN_KEY)
    return keys.argmax(dim=1)


def pick_where(candidates: Tensor, need: Tensor, rr: RowRandom, stream: str) -> Tensor:
    """`pick` for the rows where `need` (B,) holds, 0 elsewhere: a row's pick depends only on its own
    global index, so hashing only the needed rows gives the same numbers."""
    if bool(need.all()):
        return pick(candidates, rr, stream)
    out = torch.zeros(candidates.size(0), dtype=torch.int64, device=candidates.device)
    sel = need.nonzero().squeeze(1)
    if sel.numel():
        sub = RowRandom(rr.seed, rr.rows[sel])
        out[sel] = pick(candidates.index_select(0, sel), sub, stream)
    return out


@dataclass
class Text:
    """Sentence structure of raw rows (B, L): document of each position (-1 on specials and padding),
    sentence starts (never position 0), and the end of each position's document run."""

    doc: Tensor
    starts: Tensor
    run_start: Tensor
    run_end: Tensor


def text_structure(rows: Tensor, document_ids: Tensor, specials: Specials, end_table: Tensor) -> Text:
    doc = torch.where(specials.is_special(rows) | (document_ids < 0), -1, document_ids)
    sid = sentence_ids(rows, doc, end_table.to(rows.device))
    starts = torch.zeros_like(rows, dtype=torch.bool)
    starts[:, 1:] = (sid[:, 1:] != sid[:, :-1]) & (doc[:, 1:] >= 0)
    _, _, run_start, run_length = runs_of(doc)
    return Text(doc, starts, run_start, run_start + run_length)


def truncated_lengths(a: Tensor, b: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """BERT truncate_seq_pair's final lengths: shorten the longer part (B on ties) until a + b <= target."""
    half = (target + 1) // 2
    a_new = torch.minimum(a, torch.maximum(half, target - b))
    return a_new, torch.minimum(b, target - a_new)


@dataclass
class Pair:
    """Source ranges of the two segments in the raw rows, per row (B,)."""

    first_start: Tensor
    first_len: Tensor
    second_start: Tensor
    second_len: Tensor
    label: Tensor  # int64, IGNORE where no pair could be made
    from_donor: Tensor  # bool: the second segment is read from the row's donor text (NSP negatives)
    sentence_split: Tensor  # bool: split at a sentence boundary (else at a token)
    flags: dict[str, Tensor]  # (B,) bool per objective-specific statistic


class _SentencePairs(Objective):
    """Shared chunking, layout, MLM and loss of NSP and SOP; subclasses choose the label."""

    model_kinds = ("encoder",)
    attention = "bidirectional"

    def setup(self) -> None:
        specials, tokenizer = self.specials, self.tokenizer
        if tokenizer is None:
            raise UserError(f"{self.name}: needs the tokenizer (to find sentence ends)")
        self.mlm_config: MaskedLMConfig = self.config.mlm
        self.vocab_size = resolve_vocab_size(self.mlm_config, specials, tokenizer, self.name)
        self.end_table = sentence_end_table(tokenizer)
        self.word_tables = tokenizer.word_boundary_tables if self.mlm_config.whole_word else None

    def choose(
        self, split: Tensor, own: Text, rr: RowRandom, donor: Text | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Tensor], Tensor]:
        """Given the split (B,): B's start and end, the label, whether to swap, (B,) bool flags to count in
        the stats, and whether B is read from the donor text."""
        raise NotImplementedError

    def make_pairs(
        self, rows: Tensor, document_ids: Tensor, rr: RowRandom, donors: tuple[Tensor, Tensor] | None = None
    ) -> Pair:
        L = rows.size(1)
        own = text_structure(rows, document_ids, self.specials, self.end_table)
        doc, starts = own.doc, own.starts
        inside = torch.zeros_like(rows, dtype=torch.bool)  # a token of the same document precedes
        inside[:, 1:] = (doc[:, 1:] == doc[:, :-1]) & (doc[:, 1:] >= 0)
        # The pair comes from the row's longest document run: a pair is one document's text, so the most
        # text to fill it (least padding) is there.
        run_length = torch.where(doc >= 0, own.run_end - own.run_start, 0)
        inside &= run_length == run_length.max(dim=1, keepdim=True).values
        at_sentence = (inside & starts).any(dim=1)
        valid = inside.any(dim=1)
        split = torch.where(
            at_sentence,
            pick_where(inside & starts, at_sentence, rr, "pairs/split"),
            pick_where(inside, ~at_sentence, rr, "pairs/token_split"),
        )
        donor = None
        if donors is not None:
            donor = text_structure(donors[0].long(), donors[1].long(), self.specials, self.end_table)
        a0 = own.run_start.gather(1, split[:, None])[:, 0]
        b0, b1, label, swap, flags, from_donor = self.choose(split, own, rr, donor)
        a, b = split - a0, b1 - b0

        budget = L - 3
        short = below(rr.bits(1, "pairs/short")[:, 0], self.config.short_seq_prob)
        short_target = rr.integers(1, budget + 1, "pairs/short_target", low=2)[:, 0]
        target = torch.where(short, short_target, budget)
        a_len, b_len = truncated_lengths(a, b, target)
        cut = rr.uniform64(2, "pairs/cut")
        a_from = a0 + torch.floor(cut[:, 0] * (a - a_len + 1).double()).long()
        b_from = b0 + torch.floor(cut[:, 1] * (b - b_len + 1).double()).long()

        zero = torch.zeros_like(a_len)
        a_len, b_len = torch.where(valid, a_len, zero), torch.where(valid, b_len, zero)
        return Pair(
            first_start=torch.where(swap, b_from, a_from),
            first_len=torch.where(swap, b_len, a_len),
            second_start=torch.where(swap, a_from, b_from),
            second_len=torch.where(swap, a_len, b_len),
            label=torch.where(valid, label, IGNORE),
            from_donor=from_donor & valid,
            sentence_split=at_sentence,
            flags=flags,
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
        B, L = rows.shape
        if L < 5:
            raise UserError(f"{self.name}: rows of {L} tokens cannot hold [CLS] A [SEP] B [SEP]")
        if self.donor_length(L) and donors is None:
            raise UserError(
                f"{self.name}: same_document_negatives=false draws each negative from another place of the "
                "corpus: read rows through the data loader, which hands each row its donor text"
            )
        rr = RowRandom(seed, row_index)
        pair = self.make_pairs(rows, document_ids, rr, donors)
        sp = self.specials
        j = torch.arange(L, device=rows.device)[None, :]
        l0, l1 = pair.first_len[:, None], pair.second_len[:, None]
        sep0, sep1 = 1 + l0, 2 + l0 + l1
        in_first = (j >= 1) & (j < sep0)
        in_second = (j > sep0) & (j < sep1)
        src = torch.where(
            in_first, pair.first_start[:, None] + j - 1, pair.second_start[:, None] + j - sep0 - 1
        )
        src = torch.where(in_first | in_second, src, 0).clamp(0, L - 1)
        text = rows.gather(1, src)
        if donors is not None and bool(pair.from_donor.any()):  # NSP negatives read B from the donor text
            from_donor = donors[0].long().gather(1, src.clamp(max=donors[0].size(1) - 1))
            text = torch.where(in_second & pair.from_donor[:, None], from_donor, text)
        tokens = torch.where(in_first | in_second, text, sp.pad)
        tokens = torch.where((j == sep0) | (j == sep1), sp.sep, tokens)
        tokens[:, 0] = sp.cls
        real = j <= sep1
        docs = torch.where(real, 0, -1).expand(B, L)
        segments = ((j > sep0) & real).long()

        starts = None
        if self.word_tables is not None:
            begins, ends = (t.to(rows.device) for t in self.word_tables)
            starts = word_starts(tokens, docs, begins, ends)
        inputs, labels, stats = mask_tokens(tokens, docs, self.mlm_config, sp, self.vocab_size, rr, starts)
        valid = pair.label != IGNORE
        n_valid = int(valid.sum())
        stats.update(
            pairs=float(n_valid),
            label_1=float((pair.label == 1).sum()),
            label_1_fraction=float((pair.label == 1).sum()) / max(n_valid, 1),
            sentence_splits=float((pair.sentence_split & valid).sum()),
            token_splits=float((~pair.sentence_split & valid).sum()),
        )
        stats.update({name: float((flag & valid).sum()) for name, flag in pair.flags.items()})
        own_text = pair.first_len + torch.where(pair.from_donor, 0, pair.second_len)  # donor B: not own text
        stats.update(raw_usage(document_ids, float(own_text.sum())))
        return Batch(
            input_ids=inputs,
            labels=labels,
            positions=positions_of(docs),
            document_ids=docs.contiguous(),
            attention="bidirectional",
            segment_ids=segments,
            seq_labels=pair.label,
            stats=stats,
        )

    def loss(self, output: ModelOutput, batch: Batch) -> LossOutput:
        """MLM summed CE over the masked tokens plus the pair CE summed over the labelled rows, each to be
        normalised by its own count (BERT: mean MLM + mean NSP; `LossOutput.pair_sum`)."""
        mlm = token_loss(output.logits, batch.labels)
        assert output.seq_logits is not None and batch.seq_labels is not None
        seq_sum = F.cross_entropy(
            output.seq_logits.float(), batch.seq_labels, ignore_index=IGNORE, reduction="sum"
        )
        n_seq = (batch.seq_labels != IGNORE).sum()
        n_mlm = mlm.n_targets
        correct = (output.seq_logits.argmax(dim=-1) == batch.seq_labels) & (batch.seq_labels != IGNORE)
        metrics = {
            "mlm_loss": mlm.loss_sum.detach() / n_mlm.clamp(min=1),
            "seq_loss": seq_sum.detach() / n_seq.clamp(min=1),
            "seq_accuracy": correct.sum() / n_seq.clamp(min=1),
        }
        return LossOutput(mlm.loss_sum, n_mlm, metrics, pair_sum=seq_sum, n_pairs=n_seq)


class NextSentencePrediction(_SentencePairs):
    """BERT NSP + MLM: is B the text that follows A (0) or from another document (1)?"""

    name = "nsp"

    @dataclass
    class Config:
        random_next_rate: float = 0.5  # share of pairs whose B is not the actual next (BERT: 0.5)
        same_document_negatives: bool = True  # rows of one document: B = a later, non-adjacent passage
        short_seq_prob: float = 0.1  # share of pairs with a shorter random length (BERT: 0.1)
        mlm: MaskedLMConfig = field(default_factory=MaskedLMConfig)  # masking of the pair (section 2)

    def donor_length(self, width: int) -> int:
        return 0 if self.config.same_document_negatives else width

    def choose(
        self, split: Tensor, own: Text, rr: RowRandom, donor: Text | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Tensor], Tensor]:
        doc, starts = own.doc, own.starts
        idx = torch.arange(doc.size(1), device=doc.device)[None, :]
        d = doc.gather(1, split[:, None])
        if donor is None:
            candidates = starts & (doc != d)  # sentence starts of other documents of the row
            has_other = candidates.any(dim=1)
            # Else later sentence starts of A's document: the split is itself a sentence start, so the
            # skipped text [split, q) holds at least one whole sentence.
            later = starts & (doc == d) & (idx > split[:, None])
            candidates = torch.where(has_other[:, None], candidates, later)
        else:
            # BERT's negatives: B from another place of the corpus. The donor text already starts at a random
            # place, so B starts at its first sentence start (its first real token when it holds none): a
            # random sentence of the corpus, with the most donor text after it to fill the pair.
            first = lambda m: m & (m.cumsum(dim=1) == 1)  # noqa: E731 - the first True of each row
            has_start = donor.starts.any(dim=1, keepdim=True)
            candidates = torch.where(has_start, first(donor.starts), first(donor.doc >= 0))
        random = below(rr.bits(1, "nsp/random")[:, 0], self.config.random_next_rate) & candidates.any(dim=1)
        q = pick_where(candidates, random, rr, "nsp/random_start")  # only used where `random`
        b0 = torch.where(random, q, split)
        from_donor = random & (donor is not None)
        own_end = own.run_end.gather(1, b0[:, None])[:, 0]
        b1 = (
            own_end
            if donor is None
            else torch.where(from_donor, donor.run_end.gather(1, b0[:, None])[:, 0], own_end)
        )
        flags = {
            "same_document_negatives": random & ~from_donor & (doc.gather(1, b0[:, None])[:, 0] == d[:, 0])
        }
        flags["donor_negatives"] = from_donor
        return b0, b1, random.long(), torch.zeros_like(random), flags, from_donor


class SentenceOrderPrediction(_SentencePairs):
    """ALBERT SOP + MLM: are two consecutive segments of one document in order (0) or swapped (1)?"""

    name = "sop"

    @dataclass
    class Config:
        swap_rate: float = 0.5  # share of pairs shown in swapped order (ALBERT: 0.5)
        short_seq_prob: float = 0.1  # share of pairs with a shorter random length (ALBERT: 0.1)
        mlm: MaskedLMConfig = field(default_factory=MaskedLMConfig)  # masking of the pair (section 2)

    def choose(
        self, split: Tensor, own: Text, rr: RowRandom, donor: Text | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, dict[str, Tensor], Tensor]:
        swap = below(rr.bits(1, "sop/swap")[:, 0], self.config.swap_rate)
        b1 = own.run_end.gather(1, split[:, None])[:, 0]
        return split, b1, swap.long(), swap, {}, torch.zeros_like(swap)
