"""The `Objective` interface: a configured transform from raw token rows to a `Batch`, plus its loss.

An objective is built once from its `Config` (a dataclass whose defaults are mirrored in
`configs/objectives/<name>.yaml`) and applied per batch, like a Hugging Face collator, but as a pure
function of (rows, seed): all randomness comes from `RowRandom(seed, row_index)`, so a row is corrupted
the same way whatever batch or process reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from objtrain import IGNORE
from objtrain.batch import AttentionKind, Batch, ModelKind, ModelOutput, labelled_logits
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.specials import Specials


@dataclass
class LossOutput:
    """Summed loss and target count, so the training loop can normalise by the *global* target count
    (per-micro-batch means are wrong when target counts vary, as for MLM and span corruption)."""

    loss_sum: Tensor  # scalar, summed over targets
    n_targets: Tensor  # scalar int64
    metrics: dict[str, Tensor]  # extra scalars to log (e.g. head-1 loss for MTP, NSP accuracy)
    # A sequence-level term (NSP/SOP's pair loss) summed over the labelled rows, normalised by its own
    # global count: the step's loss is loss_sum / N + pair_sum / P over all micro-batches and ranks.
    pair_sum: Tensor | None = None
    n_pairs: Tensor | None = None

    def detach(self) -> LossOutput:
        return LossOutput(
            self.loss_sum.detach(),
            self.n_targets.detach(),
            {k: v.detach() for k, v in self.metrics.items()},
            None if self.pair_sum is None else self.pair_sum.detach(),
            None if self.n_pairs is None else self.n_pairs.detach(),
        )


class Objective:
    """Base class. Subclasses set the class attributes and implement `__call__`.

    `rows` are raw token rows (B, L) from a token or packed store, with `document_ids` (B, L) giving the
    document of every position (-1 = padding) and `row_index` (B,) the global index of each row.
    """

    name: ClassVar[str]
    model_kinds: ClassVar[tuple[ModelKind, ...]]  # first = default
    attention: ClassVar[AttentionKind]
    Config: ClassVar[type]
    # A decoder objective whose model scores text left to right (validation bits per byte reads it)
    left_to_right: ClassVar[bool] = False

    def __init__(
        self,
        config: Any,
        specials: Specials,
        tokenizer: Tokenizer | None = None,
        model_kind: ModelKind | None = None,
    ) -> None:
        self.config = config
        self.specials = specials
        self.tokenizer = tokenizer
        self.model_kind: ModelKind = model_kind or self.model_kinds[0]
        if self.model_kind not in self.model_kinds:
            raise UserError(
                f"objective {self.name!r} cannot train {'an' if self.model_kind[0] in 'aeiou' else 'a'} "
                f"{self.model_kind} model "
                f"(it trains: {', '.join(self.model_kinds)})"
            )
        self.setup()

    def setup(self) -> None:
        """Check the config and precompute what `__call__` needs; raise `UserError` on bad settings.

        Called once at the end of `__init__`, after `config`, `specials`, `tokenizer` and `model_kind` are
        set, so subclasses need not repeat the constructor's signature.
        """

    def raw_length(self, model_length: int) -> int:
        """Raw tokens a row must hold so the corrupted row fills `model_length` model positions."""
        return model_length

    def raw_lengths(self, model_length: int, row_index: Tensor, seed: int) -> Tensor:
        """(B,) int64 raw tokens each row `row_index` needs, a pure function of (row, seed).

        The training loader streams exactly this many tokens per row (the tail of a row beyond its need is
        padding, document id -1), so an objective whose rows need different lengths (UL2 picks its
        denoiser per row) wastes nothing. The default is the same `raw_length` for every row.
        """
        return torch.full_like(row_index, self.raw_length(model_length), dtype=torch.int64)

    def donor_length(self, width: int) -> int:
        """Raw tokens of *donor* text each row of `width` raw tokens needs from elsewhere in the corpus (0 =
        none), as BERT's NSP reads a random next sentence from a random document.

        When positive, callers pass `donors=(tokens, document_ids)` (B, n) to `__call__`: text the loader
        reads at a place drawn from (seed, row) (`training.data.donor_offsets`), so a row's corruption still
        depends on its own index only, never on which rows share its batch.
        """
        return 0

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        raise NotImplementedError

    def loss(self, output: ModelOutput, batch: Batch) -> LossOutput:
        """Summed token cross-entropy over `labels`; objectives with extra heads extend this."""
        return token_loss(output.logits, batch.labels)

    def describe(self) -> dict[str, Any]:
        """Key parameters for `objtrain corrupt --list`."""
        return dict(vars(self.config))


def raw_usage(document_ids: Tensor, used: int | float) -> dict[str, float]:
    """`raw_tokens_fed` (real positions of the raw rows, document id >= 0) and `raw_tokens_unused` (fed
    but in no input or target of the batch): the waste an objective reports in `Batch.stats`."""
    fed = int((document_ids >= 0).sum())
    return {"raw_tokens_fed": float(fed), "raw_tokens_unused": float(fed - used)}


def token_loss(logits: Tensor, labels: Tensor) -> LossOutput:
    """Summed cross-entropy over the labelled positions of dense (..., V) or sparse (N, V) logits."""
    n_targets = (labels != IGNORE).sum()
    if logits.dim() == 2 and labels.dim() > 1:  # sparse prediction: logits at the labelled positions only
        logits, labels = labelled_logits(logits, labels)
    loss_sum = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1), ignore_index=IGNORE, reduction="sum"
    )
    return LossOutput(loss_sum, n_targets, {})
