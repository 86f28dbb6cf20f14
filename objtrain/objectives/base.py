"""The `Objective` interface: a configured transform from raw token rows to a `Batch`, plus its loss.

An objective is built once from its `Config` (a dataclass whose defaults are mirrored in
`configs/objectives/<name>.yaml`) and applied per batch, like a Hugging Face collator, but as a pure
function of (rows, seed): all randomness comes from `RowRandom(seed, row_index)`, so a row is corrupted
the same way whatever batch or process reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

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


# Minimal-pair scoring forms (objtrain/evaluation/blimp.py) a model of each kind is scored in when its
# objective names none of its own, headline first.
DEFAULT_PAIR_FORMS: dict[str, tuple[str, ...]] = {
    "decoder": ("causal",),
    "encoder": ("pll_word", "pll"),
    "encdec": ("encdec_lm",),
}

# an objective class and its recorded settings (`registry.recorded_parts`)
Recorded = tuple[type["Objective"], Mapping[str, Any]]


class Objective:
    """Base class. Subclasses set the class attributes and implement `__call__`.

    `rows` are raw token rows (B, L) from a token or packed store, with `document_ids` (B, L) giving the
    document of every position (-1 = padding) and `row_index` (B,) the global index of each row.

    Capabilities: what the training loop, the run's plan, evaluation, export and the CLI ask of an
    objective are the class attributes and hooks below, with defaults that fit an objective with nothing
    special; a subclass overrides only what differs (docs/adding-an-objective.md lists them). No code
    outside `objtrain/objectives/` compares an objective's name.
    """

    name: ClassVar[str]
    model_kinds: ClassVar[tuple[ModelKind, ...]]  # first = default
    attention: ClassVar[AttentionKind]
    Config: ClassVar[type]
    # The minimal-pair forms (see objtrain/evaluation/blimp.py) a model this objective trained is scored
    # in, per model kind, headline first; a kind left out gets DEFAULT_PAIR_FORMS'.
    minimal_pair_forms: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    # A decoder trained on it reads text left to right, so validation also reports val_bpb (bits per byte of
    # plain next-token rows): CLM, MTP (head 1), FIM, prefix LM.
    scores_left_to_right: ClassVar[bool] = False
    # Its batches carry segment ids (sentence A/B), so they train the model's segment embedding; every
    # other objective leaves it at its initialisation, and evaluation feeds no segment ids (NSP, SOP).
    feeds_segments: ClassVar[bool] = False
    # Its rows hold FIM's sentinels <PRE>/<SUF>/<MID>, so the model can infill with `generate --prefix`.
    fim_sentinels: ClassVar[bool] = False
    # It trains to fill spans marked by sentinels (`<extra_id_0>`): infilling asks it in that layout.
    infills_with_sentinels: ClassVar[bool] = False
    # An encoder-decoder trained on it rebuilds its whole input in the decoder (BART), so conditional
    # scoring gives the encoder `first <mask>` and scores the second half of `first second`.
    rebuilds_input: ClassVar[bool] = False

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
        reads at a place drawn from (seed, row) (`objtrain.data.batches.donor_offsets`), so a row's
        corruption still depends on its own index only, never on which rows share its batch.
        """
        return 0

    def __call__(self, rows: Tensor, document_ids: Tensor, row_index: Tensor, seed: int) -> Batch:
        raise NotImplementedError

    def loss(self, output: ModelOutput, batch: Batch) -> LossOutput:
        """Summed token cross-entropy over `labels`; objectives with extra heads extend this."""
        return token_loss(output.logits, batch.labels)

    def pair_forms(self) -> tuple[str, ...]:
        """The minimal-pair forms of this objective's model kind, headline first."""
        return tuple(self.minimal_pair_forms.get(self.model_kind, DEFAULT_PAIR_FORMS[self.model_kind]))

    def describe(self) -> dict[str, Any]:
        """Key parameters for `objtrain corrupt --list`."""
        return dict(vars(self.config))

    # -- capabilities: hooks (see the class docstring) --------------------------------------------------

    @classmethod
    def model_kinds_of(cls, config: Any) -> tuple[ModelKind, ...]:
        """The model kinds this objective trains under `config`, the first the default (a mixture: the
        kinds its components share)."""
        return cls.model_kinds

    def model_overrides(self, overrides: dict[str, Any]) -> dict[str, Any]:
        """The model overrides a run trains with, given the user's: an objective that needs a setting of
        the model fills it in or refuses a contradicting one (`UserError`), e.g. MTP's `mtp_heads`."""
        return overrides

    @classmethod
    def extra_head_layers(cls, config: Any) -> int:
        """Transformer layers the objective's own extra heads add to the model under its settings (`config`,
        its YAML defaults with an arm's overrides: MTP's n - 1 heads), which an experiment matching
        parameters takes from the trunk."""
        return 0

    def record(self) -> dict[str, Any]:
        """Keys a checkpoint's training record holds besides the objective's name and config, for
        `eval` and `generate` (FIM: `fim_mode`)."""
        return {}

    def run_notes(self, model_config: Any) -> list[str]:
        """Lines the run prints as it starts, about how this objective's numbers read."""
        return []

    def splits_backward(self, model_config: Any) -> bool:
        """Whether `split_forward_backward` replaces one forward and one backward for a model of this
        config (then the blocks run outside the root forward and are compiled one by one)."""
        return False

    def split_forward_backward(
        self,
        model: Any,
        batch: Batch,
        scale: float,
        autocast: Callable[[], AbstractContextManager[Any]],
        backward: Callable[[Tensor], None],
    ) -> LossOutput:
        """The objective's own forward and backward of one micro-batch (`splits_backward`): `backward(loss)`
        for each part of `loss_sum * scale`, each under `autocast()`; returns the detached `LossOutput`."""
        raise NotImplementedError

    def validation_loss(self, output: ModelOutput, batch: Batch) -> LossOutput:
        """The loss validation and evaluation report, comparable across objectives (MTP: head 1's)."""
        return self.loss(output, batch)

    # What a checkpoint's training record (`objective`, `objective_config`, ...) says about the model, asked
    # of the recorded objective's class by evaluation and generation (`registry.recorded_parts`).

    @classmethod
    def recorded_components(cls, settings: Mapping[str, Any]) -> list[Recorded]:
        """The objectives a recorded run of this one also trained on, each with its settings (a mixture's
        components); none for a single objective."""
        return []

    @classmethod
    def conditions_on_prefix(cls, settings: Mapping[str, Any]) -> bool:
        """Whether a model trained on it with these settings reads a bidirectional prefix (or an encoder
        input) and continues from it (prefix LM; UL2 with an S denoiser): conditional scoring's layout."""
        return False

    @classmethod
    def mode_token(cls, settings: Mapping[str, Any], layout: Literal["prefix", "span"]) -> str | None:
        """The name of the `Specials` mode token a model trained on it reads first in a prefix or a span
        layout (UL2's `s2s` or `nlu`), or None."""
        return None

    @classmethod
    def infill_form(cls, kind: str, training: Mapping[str, Any]) -> str:
        """How a `kind` model trained on it fills a gap between a prefix and a suffix: `fim-psm`, `fim-spm`,
        `sentinel`, `left-to-right` (the prefix alone) or `none`. `training` is the checkpoint's record."""
        if kind == "decoder" and training.get("fim_mode"):
            return f"fim-{training['fim_mode']}"
        if cls.infills_with_sentinels and kind in ("decoder", "encdec"):
            return "sentinel"
        return "left-to-right" if kind == "decoder" else "none"

    @classmethod
    def trained_both_orders(cls, training: Mapping[str, Any]) -> bool:
        """Whether the model was trained to infill in both FIM orders (PSM and SPM), so both are its own."""
        return False


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
