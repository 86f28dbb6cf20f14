"""Masked LM (Devlin et al. 2019; BERT create_pretraining_data.py, HF DataCollatorForLanguageModeling).

1. Eligible positions: ordinary tokens of real documents. Special tokens (`specials.is_special`) and
   padding (`document_ids == -1`) are never selected, whatever their id (transformers#11155).
2. Selection, a `selection_rate` share of the eligible tokens of each row:
   - `exact_count: true` (default, BERT/RoBERTa): exactly `max(1, round(rate * n_eligible))` tokens per
     row, the lowest random keys. Every row with an eligible token has a target, and the target count
     per batch barely varies (transformers PR #1814), which steadies the loss normalisation;
   - `exact_count: false` (HF): each token independently with probability `selection_rate`.
   With `whole_word`, a word (sentencepiece: starts at a ▁ piece or after whitespace/special, see
   `Tokenizer.word_boundary_tables`) is selected or not as a unit. Exact counts then add words in key
   order while they fit the budget, plus the word that crosses it when that lands closer to the budget
   (BERT skips an overflowing word and tries the next; one sort cannot, so this is the vectorised
   stand-in: the realised count is within half a word of the budget).
3. Each selected token independently becomes:
   - `<mask>` with probability `mask_prob` (0.8);
   - a random ordinary token with probability `random_prob` (0.1);
   - itself otherwise (0.1, still predicted).
   As conditional probabilities (the form HF uses, transformers#35251): P(random | selected, not
   masked) = random_prob / (1 - mask_prob) = 0.5. Among eligible tokens that is 12% `<mask>`, 1.5% random,
   1.5% unchanged-but-predicted. Random replacements are drawn uniformly from the ordinary ids
   [first_ordinary, vocab_size): BERT draws from the whole vocabulary (pad, [CLS], unused slots
   included, transformers#15342); objtrain never shows the model a special token it did not put there.
4. Labels: the original token at selected positions, IGNORE elsewhere; nothing is shifted. Masked
   positions stay in attention (the HF DataCollatorForSOP `attention_mask = ~masked` pitfall).
5. Sparse prediction (`Batch.sparse_logits`): the model gathers the hidden states at the labelled
   positions before the unembedding, so the (V, D) output layer runs for the 15% that carry a loss, not
   for every position (as ModernBERT, Warner et al. 2024, and the efficient BERT recipes of Izsak et al.
   2021 do); the loss and its gradients are those of the dense path (tests/objectives/test_mlm.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import Batch, positions_of
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.objectives.base import Objective, raw_usage
from objtrain.objectives.sentences import lookup
from objtrain.rng import RowRandom
from objtrain.specials import Specials

_LAST = torch.iinfo(torch.int64).max  # sort key that puts ineligible positions after every eligible one


@dataclass
class MaskedLMConfig:
    selection_rate: float = 0.15  # share of eligible tokens that are predicted (BERT masked_lm_prob)
    mask_prob: float = 0.8  # of the selected: shown as <mask>
    random_prob: float = 0.1  # of the selected: replaced by a random ordinary token (the rest unchanged)
    exact_count: bool = True  # fixed count per row (BERT/RoBERTa); false = per-token Bernoulli (HF)
    whole_word: bool = False  # select whole words (needs the tokenizer)
    vocab_size: int = 0  # range of random replacements; 0 = the tokenizer's vocabulary size

    def __post_init__(self) -> None:
        for name in ("selection_rate", "mask_prob", "random_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.mask_prob + self.random_prob > 1.0:
            raise ValueError("mask_prob + random_prob must be at most 1")
        if self.vocab_size < 0:
            raise ValueError("vocab_size must be 0 (from the tokenizer) or positive")


def below(bits: Tensor, p: float) -> Tensor:
    """Bernoulli(p) from uniform int64 bits with one comparison: P(bits < -2^63 + p * 2^64) = p."""
    if p >= 1.0:
        return torch.ones_like(bits, dtype=torch.bool)
    return bits < min(-(2**63) + round(p * 2**64), 2**63 - 1)


def word_starts(tokens: Tensor, document_ids: Tensor, begins: Tensor, ends: Tensor) -> Tensor:
    """(B, L) bool: token t starts a word iff begins[x[t]] | ends[x[t-1]], or a row/document starts at t."""
    start = lookup(begins, tokens)
    start[:, 1:] |= lookup(ends, tokens[:, :-1]) | (document_ids[:, 1:] != document_ids[:, :-1])
    start[:, 0] = True
    return start


def select(
    eligible: Tensor, rate: float, exact: bool, rr: RowRandom, stream: str, starts: Tensor | None = None
) -> Tensor:
    """(B, L) bool selection among `eligible` (B, L); `starts` (B, L) makes words the unit of selection."""
    B, L = eligible.shape
    idx = torch.arange(L, device=eligible.device).expand(B, L)
    start_pos = None
    if starts is not None:
        start_pos = torch.where(starts, idx, 0).cummax(dim=1).values  # first position of each token's word
    if not exact:
        bits = rr.bits(L, stream)
        if start_pos is not None:
            bits = bits.gather(1, start_pos)
        return eligible & below(bits, rate)

    n_eligible = eligible.sum(dim=1)
    # BERT: max(1, round(n * rate)), torch.round being half-to-even as Python's round; none at rate 0.
    budget = torch.round(n_eligible.double() * rate).long()
    if rate > 0:
        budget = torch.where(n_eligible > 0, budget.clamp(min=1), 0)
    keys = rr.bits(L, stream)
    if start_pos is not None:
        keys = keys.gather(1, start_pos)
    keys = keys.masked_fill(~eligible, _LAST)
    if start_pos is None:
        # The `budget` lowest keys per row: a top-k and a per-row threshold, cheaper than a full sort.
        k = int(budget.max()) if B else 0
        if k == 0:
            return torch.zeros_like(eligible)
        lowest = keys.topk(k, dim=1, largest=False).values  # (B, k) ascending
        threshold = lowest.gather(1, (budget - 1).clamp(min=0)[:, None])
        return eligible & (keys <= threshold) & (budget[:, None] > 0)
    order = keys.sort(dim=1, stable=True).indices  # a word's tokens stay together, in position order
    rank = torch.empty_like(order).scatter_(1, order, idx.contiguous())
    budget = budget[:, None]
    word = starts.long().cumsum(dim=1) - 1
    length = torch.zeros_like(word).scatter_add_(1, word, torch.ones_like(word)).gather(1, word)
    before = rank - (idx - start_pos)  # selected tokens ahead of this word in key order
    after = before + length
    fits = after <= budget
    crosses_closer = (before < budget) & (after - budget <= budget - before)
    return eligible & (fits | crosses_closer)


def mask_tokens(
    tokens: Tensor,
    document_ids: Tensor,
    config: MaskedLMConfig,
    specials: Specials,
    vocab_size: int,
    rr: RowRandom,
    starts: Tensor | None = None,
    stream: str = "mlm",
    eligible: Tensor | None = None,
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """BERT 80/10/10 corruption of (B, L) `tokens`: returns (input_ids, labels, stats).

    `eligible` (B, L) bool, if given, further restricts the selectable positions (gpt_bert: not a
    document's first token)."""
    L = tokens.size(1)
    ordinary = ~specials.is_special(tokens) & (document_ids >= 0)  # ordinary tokens of documents
    eligible = ordinary if eligible is None else ordinary & eligible
    selected = select(eligible, config.selection_rate, config.exact_count, rr, f"{stream}/select", starts)
    # One 64-bit draw per position decides the action (its order among all int64) and the random id (its
    # low 32 bits, multiply-shifted onto the ordinary range).
    bits = rr.bits(L, f"{stream}/action")
    masked = selected & below(bits, config.mask_prob)
    randomised = selected & ~masked & below(bits, config.mask_prob + config.random_prob)
    inputs = tokens.masked_fill(masked, specials.mask)
    ids = specials.ordinary_ids(vocab_size)  # arange(first_ordinary, V) in objtrain's own layout
    inputs[randomised] = ids[((bits[randomised] & 0xFFFFFFFF) * ids.numel()) >> 32]
    labels = tokens.masked_fill(~selected, IGNORE)
    counts = torch.stack([eligible.sum(), selected.sum(), masked.sum(), randomised.sum()]).tolist()
    n_eligible, n_selected, n_masked, n_random = (float(c) for c in counts)
    stats = {
        "eligible": n_eligible,
        "selected": n_selected,
        "masked": n_masked,
        "random": n_random,
        "kept": n_selected - n_masked - n_random,
    }
    return inputs, labels, stats


class MaskedLM(Objective):
    """BERT-style masked LM on packed rows (raw length = model length), bidirectional within documents."""

    name = "mlm"
    model_kinds = ("encoder",)
    attention = "bidirectional"
    Config = MaskedLMConfig

    def setup(self) -> None:
        config, specials, tokenizer = self.config, self.specials, self.tokenizer
        self.vocab_size = resolve_vocab_size(config, specials, tokenizer, self.name)
        self.word_tables: tuple[Tensor, Tensor] | None = None
        if config.whole_word:
            if tokenizer is None:
                raise UserError(f"{self.name}: whole_word masking needs the tokenizer (to find word starts)")
            self.word_tables = tokenizer.word_boundary_tables

    def starts(self, tokens: Tensor, document_ids: Tensor) -> Tensor | None:
        if self.word_tables is None:
            return None
        begins, ends = (t.to(tokens.device) for t in self.word_tables)
        return word_starts(tokens, document_ids, begins, ends)

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        rows, document_ids = rows.long(), document_ids.long()
        rr = RowRandom(seed, row_index)
        inputs, labels, stats = mask_tokens(
            rows,
            document_ids,
            self.config,
            self.specials,
            self.vocab_size,
            rr,
            self.starts(rows, document_ids),
        )
        return Batch(
            input_ids=inputs,
            labels=labels,
            positions=positions_of(document_ids),
            document_ids=document_ids,
            attention="bidirectional",
            sparse_logits=True,  # logits only at the ~15% labelled positions
            # every real token is an input (masked, replaced or kept): none is left unused
            stats={**stats, **raw_usage(document_ids, int((document_ids >= 0).sum()))},
        )


def resolve_vocab_size(
    config: MaskedLMConfig, specials: Specials, tokenizer: Tokenizer | None, name: str
) -> int:
    """The id range of random replacements: the config's `vocab_size`, else the tokenizer's."""
    if tokenizer is not None and config.vocab_size and config.vocab_size != tokenizer.vocab_size:
        raise UserError(
            f"{name}: vocab_size {config.vocab_size} differs from the tokenizer's {tokenizer.vocab_size}; "
            "set vocab_size: 0 to take it from the tokenizer"
        )
    vocab_size = config.vocab_size or (tokenizer.vocab_size if tokenizer is not None else 0)
    if vocab_size == 0:
        raise UserError(f"{name}: no vocabulary size: pass the tokenizer or set vocab_size")
    if specials.ordinary_ids(vocab_size).numel() == 0:
        reserved = f"ids below {specials.first_ordinary}" if specials.own_layout else "all of them"
        raise UserError(f"{name}: vocab_size {vocab_size} leaves no ordinary tokens ({reserved} reserved)")
    return vocab_size
