"""GPT-BERT (Charpentier & Samuel 2024, "GPT or BERT: why not both?", BabyLM 2024, arXiv 2410.24159):
masked next-token prediction (MNTP) and causal LM in one decoder, mixed per row.

Both forms share one LM head because both predict *the next position's token*: the output at position t
is trained on token t+1 (the paper's Figure 1, "shifting both outputs by one token to the right").
- A causal row (probability `causal_fraction`, the paper's 1:15 causal:masked data ratio = 1/16) is a
  CLM row: causal attention, `labels[t] = x[t+1]` inside its document (`clm.next_token_labels`).
- A masked row is a BERT row read bidirectionally inside each document (`attention = "prefix"` with
  `prefix_mask` True over every real token), corrupted as MLM corrupts (`mlm.mask_tokens`: a
  `selection_rate` share selected, 80% `<mask>`, 10% random, 10% kept, Devlin et al. 2019), and the
  original of a selected token at position i is the label of position i - 1, IGNORE elsewhere. A
  document's first token is never selected (nothing before it in its document carries its label), nor
  is a special token.

Worked example, document `a b c d e` (raw row `a b c d e f`, T = 5), `c` selected and shown as <mask>:
    causal row:  input `a b c d e`, labels `b c d e f`, prefix_mask `0 0 0 0 0`
    masked row:  input `a b <mask> d e`, labels `- c - - -`, prefix_mask `1 1 1 1 1`
A row needs T + 1 raw tokens (the causal form's last target); a masked row leaves its last raw token
unused (1 in T + 1, in `raw_tokens_unused`).

The masked form's `selection_rate` (0.15) and 80/10/10 split are BERT's (Devlin et al. 2019, section
3.1), not a schedule of the GPT-BERT paper: see configs/objectives/gpt_bert.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import Batch, positions_of
from objtrain.objectives.clm import causal_raw_used, next_token_labels
from objtrain.objectives.mlm import MaskedLM, MaskedLMConfig, mask_tokens
from objtrain.rng import RowRandom


@dataclass
class GptBertConfig(MaskedLMConfig):
    causal_fraction: float = 1 / 16  # share of rows trained causally (GPT-BERT's 1:15 causal:masked)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.causal_fraction <= 1.0:
            raise ValueError(f"causal_fraction must be in [0, 1], got {self.causal_fraction}")


def mntp_labels(tokens: Tensor, selected_labels: Tensor) -> Tensor:
    """(B, T) next-token-aligned MNTP labels: the label of selected position i (its original token in
    `selected_labels`, IGNORE where not selected) moved to position i - 1; the last position gets none."""
    labels = torch.full_like(tokens, IGNORE)
    labels[:, :-1] = selected_labels[:, 1:]
    return labels


class GptBert(MaskedLM):
    """Per row: causal LM (causal attention) or masked next-token prediction (bidirectional)."""

    name = "gpt_bert"
    model_kinds = ("decoder",)
    attention = "prefix"
    Config = GptBertConfig
    scores_left_to_right = True  # the causal form scores text left to right (validation bits per byte)
    # minimal pairs in both forms it trained (objtrain/evaluation/blimp.py): summed next-token
    # log-probability, and masked next-token pseudo-log-likelihood (bidirectional, token i read at i-1)
    minimal_pair_forms: ClassVar[dict[str, tuple[str, ...]]] = {"decoder": ("causal", "masked_next")}

    def raw_length(self, model_length: int) -> int:
        return model_length + 1

    def causal_rows(self, row_index: Tensor, seed: int) -> Tensor:
        """(B,) bool: which rows are causal, a pure function of (row, seed)."""
        draw = RowRandom(seed, row_index).scalar("gpt_bert/causal")
        return draw < self.config.causal_fraction

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        rows, document_ids = rows.long(), document_ids.long()
        T = max(rows.size(1) - 1, 0)
        tokens, docs = rows[:, :T], document_ids[:, :T]
        causal = self.causal_rows(row_index, seed).to(rows.device)
        masked = ~causal

        input_ids = tokens.clone()
        labels = next_token_labels(rows, document_ids, 1, False, T)
        # masked rows: selectable positions follow a token of the same document (never a first token)
        follows = torch.zeros_like(docs, dtype=torch.bool)
        follows[:, 1:] = docs[:, 1:] == docs[:, :-1]
        m_tokens, m_docs = tokens[masked], docs[masked]
        m_inputs, m_selected, stats = mask_tokens(
            m_tokens,
            m_docs,
            self.config,
            self.specials,
            self.vocab_size,
            RowRandom(seed, row_index[masked]),
            self.starts(m_tokens, m_docs),
            stream="gpt_bert",
            eligible=follows[masked],
        )
        input_ids[masked] = m_inputs
        labels[masked] = mntp_labels(m_tokens, m_selected)

        batch = Batch(
            input_ids=input_ids,
            labels=labels,
            positions=positions_of(docs),
            document_ids=docs,
            attention="prefix",
            prefix_mask=masked[:, None] & (docs >= 0),
            sparse_logits=True,  # logits at the labelled positions: every causal one, ~15% of a masked row
        )
        n_causal = int(causal.sum())
        # causal rows use what CLM uses; masked rows every real input (masked, replaced or kept)
        used = causal_raw_used(document_ids[causal], labels[causal]) + int((m_docs >= 0).sum())
        fed = int((document_ids >= 0).sum())
        batch.stats = {
            **stats,
            "causal_rows": float(n_causal),
            "masked_rows": float(rows.size(0) - n_causal),
            "tokens": float((docs >= 0).sum()),
            "targets": float(batch.n_targets),
            "raw_tokens_fed": float(fed),
            "raw_tokens_unused": float(fed - used),
        }
        return batch
