"""The evaluation suite: everything a checkpoint can be measured on, as one flat JSON-ready dict.

    from objtrain.evaluation.suite import EvalOptions, evaluate
    result = evaluate("runs/fim", data="runs/demo/store", options=EvalOptions(stride=128))
    result["bits_per_byte"], result["infill_exact_match"], result["probe_accuracy"]

What runs follows from the model and what it was trained with (config.json's `training` section; a
checkpoint without one gets what its model kind allows):

- left to right (`lm.py`): decoders (MTP: head 1; FIM: plain text; prefix LM: empty prefix) and
  encoder-decoders through their decoder (the encoder reads one EOS): loss, perplexity, bits_per_byte,
  byte_perplexity, word_perplexity;
- conditional (`conditional.py`): every decoder, prefix LM and encoder-decoder, in its own form:
  conditional_bpb, the second half of held-out documents given the first (the metric every generating
  kind can be compared on);
- corruptions (`corrupted.py`): the trained objective's own loss (objective_loss); masked_accuracy and
  masked_loss for encoders; span_target_loss for encoder-decoders;
- infilling (`infill.py`): FIM decoders, span models, other decoders left to right (line tasks only):
  infill_exact_match(_norm), infill_parse_rate, infill_stop_rate;
- probe (`probe.py`), every model: probe_accuracy, probe_mcc (two classes), and beside each probe its
  baselines (majority class, bag of words, the architecture at random init) and probe-seed sd;
- sentence order (`sentence_order.py`), encoders: sentence_order_accuracy by an NSP/SOP head, and
  probe_sentence_order_accuracy;
- minimal pairs (`blimp.py`), every model, with --blimp PATH: blimp_accuracy (ties wrong), blimp_tie_rate,
  per linguistics term and paradigm with Wilson intervals, each form the objective supports, beside the
  same architecture at random init, an n-gram model of the training tokens and the paper's rows;
- samples, every model: a few greedy continuations or fills, under `samples`.

Every number is a float under a fixed name (`METRICS` says which direction is better), so `compare`
can tabulate arms; descriptive keys (`model_kind`, `objective`, `lm_mode`, ...) are strings. Eval
randomness (corruptions, infill cuts, probe sampling) comes from `EvalOptions.seed`, independent of the
training seed, and is stored in the result.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from objtrain.data.default import default_store_path
from objtrain.data.store_reader import DataSource
from objtrain.data.stream import Documents
from objtrain.data.tokenizer import Tokenizer
from objtrain.devices import resolve_device
from objtrain.errors import UserError, did_you_mean
from objtrain.evaluation import (
    blimp,
    conditional,
    corrupted,
    finetune,
    infill,
    lm,
    middle,
    probe,
    sentence_order,
)
from objtrain.io import write_json
from objtrain.models import generate as gen
from objtrain.models.checkpoint import Checkpoint, load_checkpoint
from objtrain.models.zoo import count_parameters
from objtrain.objectives.base import DEFAULT_PAIR_FORMS
from objtrain.objectives.registry import build_objective
from objtrain.training.accounting import token_bytes

PARTS = (
    "lm",
    "conditional",
    "corrupted",
    "infill",
    "probe",
    "sentence_order",
    "finetune",
    "blimp",
    "samples",
)
INFILL_KINDS = {
    "line": ("line",),
    "lines": ("lines",),
    "span": ("span",),
    "both": ("line", "span"),
    "all": ("line", "lines", "span"),
}
MIDDLE_KINDS = ("line", "lines", "span")  # single-line, multi-line and character-span middles
DEFAULT_WINDOW = 256

# name -> (better: "lower" | "higher", what it is). Counts and baselines are "info".
METRICS: dict[str, tuple[str, str]] = {
    "bits_per_byte": ("lower", "left-to-right NLL in bits per UTF-8 byte (comparable across tokenizers)"),
    "loss": ("lower", "left-to-right NLL per scored token (nats)"),
    "conditional_bpb": (
        "lower",
        "bits per byte of held-out documents' second half given the first, each model in its own form "
        "(decoder reads on, prefix LM as its prefix, encoder-decoder as encoder input, FIM empty suffix)",
    ),
    "conditional_bpb_se": ("info", "standard error of conditional_bpb over the scored documents"),
    "bits_per_byte_se": ("info", "standard error of bits_per_byte over the scored documents"),
    "middle_bpb_se": ("info", "standard error of middle_bpb over the infilling tasks"),
    "probe_sst2_accuracy_se": ("info", "binomial standard error of the SST-2 probe's test accuracy"),
    "probe_trec_accuracy_se": ("info", "binomial standard error of the TREC probe's test accuracy"),
    "perplexity": ("lower", "token perplexity exp(loss) (depends on the tokenizer)"),
    "byte_perplexity": ("lower", "2 ** bits_per_byte"),
    "word_perplexity": ("lower", "exp(NLL / whitespace-separated words), with --word-ppl"),
    "objective_loss": ("lower", "the training objective's loss on eval-seed corruptions of held-out rows"),
    "masked_accuracy": ("higher", "top-1 accuracy at 15% masked positions (all <mask>)"),
    "masked_loss": ("lower", "NLL per masked position, same masks"),
    "masked_majority_accuracy": ("info", "accuracy of always predicting the most frequent masked token"),
    "span_target_loss": ("lower", "teacher-forced NLL per target token of T5 span corruption (0.15, 3)"),
    "span_target_accuracy": ("higher", "top-1 accuracy over the same span targets"),
    "middle_bpb": ("lower", "bits per byte of a cut-out middle in the model's own infilling mode"),
    "middle_bpb_line": ("lower", "middle_bpb on single-line middles"),
    "middle_bpb_lines": ("lower", "middle_bpb on multi-line middles (2-6 lines)"),
    "middle_bpb_span": ("lower", "middle_bpb on random character spans (1-64 characters)"),
    "middle_bpb_prefix_only": ("lower", "bits per byte of the middle read from the prefix alone"),
    "suffix_gain": ("higher", "middle_bpb_prefix_only - middle_bpb: bits per byte the suffix saves"),
    "middle_bpb_psm": ("lower", "middle_bpb in PSM order (a FIM model trained in both orders)"),
    "middle_bpb_spm": ("lower", "middle_bpb in SPM order (a FIM model trained in both orders)"),
    "suffix_gain_psm": ("higher", "middle_bpb_prefix_only - middle_bpb_psm"),
    "suffix_gain_spm": ("higher", "middle_bpb_prefix_only - middle_bpb_spm"),
    "suffix_worth": ("higher", "middle bits per byte in the own mode with an empty suffix, less with it"),
    "suffix_worth_psm": ("higher", "suffix_worth in PSM order (a FIM model trained in both orders)"),
    "suffix_worth_spm": ("higher", "suffix_worth in SPM order (a FIM model trained in both orders)"),
    "far_prefix_worth": ("higher", "middle bits per byte given the last two prefix lines, less given all"),
    "infill_exact_match": ("higher", "infilled middle == the cut-out middle"),
    "infill_exact_match_norm": ("higher", "exact match after stripping trailing whitespace per line"),
    "infill_parse_rate": ("higher", "share of infilled functions that parse with ast"),
    "infill_stop_rate": ("info", "share of fills that ended on the model's stop token"),
    "probe_accuracy": ("higher", "linear probe accuracy on the probe's validation split"),
    "probe_sst2_accuracy": ("higher", "SST-2 test accuracy of a linear probe (layer and l2 chosen on dev)"),
    "probe_sst2_mcc": ("higher", "Matthews correlation of the SST-2 probe"),
    "probe_trec_accuracy": ("higher", "TREC-6 test accuracy of a linear probe (layer and l2 chosen on dev)"),
    "probe_cola_mcc": ("higher", "CoLA in-domain dev Matthews correlation of a linear probe"),
    "probe_cola_accuracy": ("higher", "CoLA in-domain dev accuracy of the same probe"),
    "probe_mcc": ("higher", "Matthews correlation of the probe (two classes)"),
    "probe_train_accuracy": ("info", "linear probe accuracy on its own training split"),
    "probe_majority_accuracy": ("info", "accuracy of always predicting the majority training label"),
    "sentence_order_accuracy": (
        "higher",
        "zero-shot: the NSP/SOP head tells in-order from swapped consecutive segments of held-out text",
    ),
    "probe_sentence_order_accuracy": (
        "higher",
        "linear probe: in order or swapped (pairs split by document)",
    ),
    "probe_sentence_order_mcc": ("higher", "Matthews correlation of the sentence-order probe"),
    "finetune_accuracy": ("higher", "test accuracy after fine-tuning the whole model (--finetune)"),
    "finetune_mcc": ("higher", "Matthews correlation after fine-tuning (two classes)"),
    "finetune_sst2_accuracy": ("higher", "SST-2 test accuracy after fine-tuning the whole model"),
    "finetune_sst2_mcc": ("higher", "Matthews correlation of the fine-tuned SST-2 classifier"),
    "finetune_trec_accuracy": ("higher", "TREC-6 test accuracy after fine-tuning the whole model"),
    "finetune_cola_mcc": ("higher", "CoLA in-domain dev Matthews correlation after fine-tuning"),
    "finetune_cola_accuracy": ("higher", "CoLA in-domain dev accuracy after fine-tuning"),
    "blimp_accuracy": (
        "higher",
        "minimal pairs (BLiMP) whose grammatical sentence the model scores higher, in its headline form "
        "(ties wrong)",
    ),
    "blimp_accuracy_lo": ("info", "Wilson 95% interval of blimp_accuracy, low end"),
    "blimp_accuracy_hi": ("info", "Wilson 95% interval of blimp_accuracy, high end"),
    "blimp_tie_rate": ("info", "share of minimal pairs scored equal (counted wrong)"),
    "blimp_pairs": ("info", "minimal pairs scored"),
}
for _form in blimp.FORMS:
    METRICS[f"blimp_{_form}_accuracy"] = ("higher", f"minimal-pair accuracy in the {_form} form (ties wrong)")
    METRICS[f"blimp_{_form}_tie_rate"] = ("info", f"share of minimal pairs the {_form} form scores equal")
for _base, _what in (("random_init", "the same architecture at random init"),
                     ("ngram", "an n-gram model of the run's training tokens")):  # fmt: skip
    METRICS[f"blimp_{_base}_accuracy"] = ("info", f"minimal-pair accuracy of {_what} (headline form)")
    METRICS[f"blimp_{_base}_accuracy_lo"] = ("info", f"Wilson 95% interval, low end, of {_what}")
    METRICS[f"blimp_{_base}_accuracy_hi"] = ("info", f"Wilson 95% interval, high end, of {_what}")
    METRICS[f"blimp_{_base}_tie_rate"] = ("info", f"share of minimal pairs {_what} scores equal")

PROBE_TASK_NAMES = ("", "sst2", "trec", "cola", "sentence_order")


def _probe_baseline_metrics() -> dict[str, tuple[str, str]]:
    """Beside every probe (the default one: "probe_"; named tasks: "probe_sst2_", ...): its baselines and
    its own noise, never ranked (a report draws them next to the arms)."""
    out: dict[str, tuple[str, str]] = {}
    for task in PROBE_TASK_NAMES:
        p, what = (f"probe_{task}_", f"the {task} probe") if task else ("probe_", "the probe")
        out[f"{p}majority_accuracy"] = ("info", f"{what}: always the majority training label")
        out[f"{p}bow_accuracy"] = ("info", f"{what} on bag-of-words token counts (same protocol)")
        out[f"{p}bow_mcc"] = ("info", f"Matthews correlation of {what} on bag-of-words counts")
        out[f"{p}random_init_accuracy"] = ("info", f"{what} on the same architecture at random init")
        out[f"{p}random_init_mcc"] = ("info", f"Matthews correlation of {what} at random init")
        out[f"{p}accuracy_probe_sd"] = (
            "info",
            f"sd of {what}'s accuracy over probe seeds (redrawn examples)",
        )
    for task in PROBE_TASK_NAMES[:4]:  # fine-tuning: its majority class and the random-init model alike
        p, what = (f"finetune_{task}_", f"{task} fine-tuning") if task else ("finetune_", "fine-tuning")
        out[f"{p}majority_accuracy"] = ("info", f"{what}: always the majority training label")
        out[f"{p}random_init_accuracy"] = ("info", f"{what} of the same architecture at random init")
        out[f"{p}random_init_mcc"] = ("info", f"Matthews correlation of {what} at random init")
        out[f"{p}accuracy_tune_sd"] = (
            "info",
            f"sd of {what}'s accuracy over fine-tune seeds (one checkpoint)",
        )
    return out


METRICS.update({k: v for k, v in _probe_baseline_metrics().items() if k not in METRICS})


FINETUNE_LRS = finetune.FinetuneConfig.lrs  # (a field below is named `finetune`)


@dataclass
class EvalOptions:
    split: str = "valid"  # store split scored
    window: int | None = None  # left-to-right window; None = the training seq_len, else 256
    stride: int | None = None  # None = window (disjoint windows, as the LM evaluation harness)
    word_ppl: bool = False  # also word-level perplexity (whitespace words of the scored text)
    max_docs: int | None = None  # score at most this many documents (None = all)
    conditional_docs: int = 256  # documents whose second half is scored given the first (conditional.py)
    sentence_order_pairs: int = 600  # encoders: in-order / swapped segment pairs (sentence_order.py)
    batch_size: int = 16
    seed: int = 1234  # eval seed: corruptions, infill cuts, probe sampling
    corrupt_rows: int = 64  # rows for corruption-based scores
    infill_tasks: int = 32
    infill_file: Path | None = None  # HumanEval-Infilling JSONL
    infill_kinds: tuple[str, ...] = ("line", "span")  # "both" = line and span, "all" adds multi-line
    middle_tasks: int = 240  # tasks whose middle is scored in bits per byte (cheap: one forward each)
    infill_max_tokens: int = 64  # most tokens a line fill may take (span fills: twice as many)
    probe_train: Path | None = None  # labelled TSV/JSONL; None = the standard-library package probe
    probe_valid: Path | None = None  # None = a quarter of probe_train held out under the seed
    probe_pooling: str = "mean"  # mean | last | first | pooled (an encoder's pooled head)
    probe_l2: float = 1e-3  # with probe_layers "last"; "best" chooses it with the layer
    probe_layers: str = "best"  # best: every layer and l2 tried, chosen on a held-out dev split; last
    probe_tasks: tuple[str, ...] = ()  # named tasks (sst2, trec, cola) read from probe_data
    probe_data: Path | None = None  # a folder of probe task data: sst2/, trec/, cola/ (`probe.task_files`)
    probe_baselines: bool = True  # also a bag of words and the architecture at random init, same protocol
    probe_seeds: int = probe.PROBE_SEEDS  # refits on redrawn examples for the probe's own sd (1: none)
    units: bool = False  # per-document and per-task scores in result["units"] (compare's paired SEs)
    finetune: bool = False  # also fine-tune the whole model on the probe's tasks (finetune.py); slow
    finetune_tasks: tuple[str, ...] = ()  # of the named probe tasks, those fine-tuned on (empty: every one)
    finetune_steps: int = 300
    finetune_lrs: tuple[float, ...] = FINETUNE_LRS  # peak rates tried, the best on dev kept
    finetune_seeds: int = 1  # fine-tunes at the chosen rate for the fine-tune's own sd (1: none)
    # Per task ("" for the default probe's), one peak rate to fine-tune at instead of choosing among
    # finetune_lrs: a comparison's later seeds at the rate their arm's first seed chose on dev.
    finetune_lr_chosen: dict[str, float] = field(default_factory=dict)
    # The random-init twin fine-tunes at the rate chosen by the twin drawn with this training seed (the
    # comparison's first), computed once and shared, instead of choosing among finetune_lrs itself.
    finetune_twin_seed: int | None = None
    blimp: Path | None = None  # minimal pairs: a folder of BLiMP *.jsonl, or one .jsonl(.gz)
    blimp_paper: Path | None = None  # the BLiMP paper's rows per paradigm (models_summary.jsonl)
    blimp_per_paradigm: int = 0  # the first K pairs of each paradigm (0: every pair)
    blimp_ngram: int = 3  # order of the n-gram baseline counted on the run's training tokens (0: none)
    blimp_batch_tokens: int = 0  # tokens a forward of minimal-pair copies holds (0: by device, blimp.py)
    samples: int = 3
    sample_tokens: int = 32
    skip: tuple[str, ...] = ()  # parts to leave out: lm, corrupted, infill, probe, samples
    device: str = "auto"  # as `train`: a GPU when there is one

    def __post_init__(self) -> None:
        sizes = {
            "--window": self.window,
            "--stride": self.stride,
            "--max-docs": self.max_docs,
            "--conditional-docs": self.conditional_docs,
            "--probe-seeds": self.probe_seeds,
            "--sentence-order-pairs": self.sentence_order_pairs,
        }
        if self.middle_tasks < 0:
            raise UserError(f"--middle-tasks must be at least 0, got {self.middle_tasks}")
        for flag, value in sizes.items():
            if value is not None and value < 1:
                raise UserError(f"{flag} must be at least 1, got {value}")
        unknown = sorted(set(self.skip) - set(PARTS))
        if unknown:
            hint = did_you_mean(unknown[0], PARTS)
            raise UserError(f"--skip {unknown[0]!r} is not a part{hint} (parts: {', '.join(PARTS)})")
        if self.probe_pooling not in ("mean", "last", "first", "pooled"):
            raise UserError(
                f"--probe-pooling must be mean, last, first or pooled, got {self.probe_pooling!r}"
            )
        if self.probe_layers not in ("best", "last"):
            raise UserError(f"--probe-layers must be best or last, got {self.probe_layers!r}")
        if self.finetune:
            # refuses bad values
            finetune.FinetuneConfig(
                steps=self.finetune_steps,
                lrs=self.finetune_lrs + tuple(self.finetune_lr_chosen.values()),
                seeds=self.finetune_seeds,
            )
        stray = [t for t in self.finetune_tasks if t not in self.probe_tasks]
        if stray and self.probe_tasks:  # without named tasks the default probe's task is the one tuned on
            tasks = ", ".join(self.probe_tasks)
            raise UserError(f"--finetune-task {stray[0]!r} is not one of the probe's tasks ({tasks})")
        if self.probe_valid is not None and self.probe_train is None:
            raise UserError("--probe-valid needs --probe (the training file)")
        bad = [k for k in self.infill_kinds if k not in INFILL_KINDS]
        if bad or not self.infill_kinds:
            raise UserError(
                "--infill-kinds must be line, lines, span, both or all, "
                f"got {','.join(self.infill_kinds) or 'nothing'!r}"
            )
        # "both" is line,span; a kind named twice is cut once
        self.infill_kinds = tuple(dict.fromkeys(k for x in self.infill_kinds for k in INFILL_KINDS[x]))


@dataclass
class EvalData:
    """Held-out documents in the checkpoint's tokens, and their text when it is at hand."""

    name: str
    docs: Documents  # documents; `closed` = packed pieces, a document's last one ending in EOS
    eos: int = 3
    texts: list[str] | None = None  # raw text files: the text itself
    text_bytes: int | None = None
    roundtrip: bool = True
    _decoded: list[str] | None = field(default=None, repr=False)

    def documents(self, limit: int | None = None) -> list[np.ndarray]:
        """Token arrays without any trailing EOS (that EOS is never scored)."""
        offsets, tokens = self.docs.offsets, self.docs.tokens
        n = len(self.docs) if limit is None else min(limit, len(self.docs))
        out = []
        for i in range(n):
            d = np.asarray(tokens[offsets[i] : offsets[i + 1]], dtype=np.int64)
            if self.docs.closed and len(d) and d[-1] == self.eos:  # only a document's last piece has it
                d = d[:-1]
            out.append(d)
        return out

    def text_of(self, tokenizer: Tokenizer, limit: int | None = None) -> list[str]:
        if self.texts is not None:
            return self.texts[:limit] if limit is not None else self.texts
        return [tokenizer.decode(d.tolist()) for d in self.documents(limit)]


def run_dir_of(path: Path) -> Path | None:
    """The run directory holding a checkpoint (RUN/checkpoints/NAME or RUN/checkpoint), if any."""
    for candidate in (path, path.parent, path.parent.parent):
        if (candidate / "config.yaml").is_file():
            return candidate
    return None


def resolve_data(ckpt: Checkpoint, data: str | Path | None, split: str) -> EvalData:
    """A store (token or packed), a raw UTF-8 text file, or with no DATA the run's own store (else the
    embedded default store when its tokenizer is the checkpoint's)."""
    tokenizer = ckpt.tokenizer
    if tokenizer is None:
        raise UserError(f"{ckpt.path} has no tokenizer.model: it cannot encode evaluation data")
    if data is None:
        run = run_dir_of(Path(ckpt.path)) if ckpt.path else None
        store = None
        if run is not None:
            # a damaged config.yaml is said as such: falling back to the embedded store would score other
            # data, or fail on its tokenizer with no word of why
            try:
                cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8")) or {}
                store = (cfg.get("data") or {}).get("store")
                # a mixture is scored on its largest source (named in the result) unless --data says
                sources = (cfg.get("data") or {}).get("sources") or []
                if sources:
                    store = max(sources, key=lambda s: float(s.get("weight", 1.0)))["store"]
            except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
                raise UserError(
                    f"{run / 'config.yaml'} cannot be read for the run's store: pass --data STORE_OR_TEXT"
                ) from None
        if store is None and (default_store_path() / "meta.json").is_file():
            store = default_store_path()
        if store is None:
            raise UserError("no evaluation data: pass --data STORE_OR_TEXT")
        data = Path(store)
    path = Path(data)
    if not path.exists():
        raise UserError(f"data not found: {path}")
    if path.is_dir():
        source = DataSource(path)
        if source.tokenizer.hash != tokenizer.hash:
            raise UserError(
                f"{path} was tokenized with another tokenizer ({source.tokenizer.hash}) than the "
                f"checkpoint's ({tokenizer.hash}): pass a store made with it, or a text file"
            )
        if not source.has_split(split):
            raise UserError(_missing_split(path, source, split))
        return EvalData(f"{path} [{split}]", source.documents(split), eos=ckpt.specials.eos)
    return text_data(path, tokenizer)


def _missing_split(path: Path, source: DataSource, split: str) -> str:
    """Why `split` cannot be scored, with the splits the store does have (and for the default valid
    split, the two ways around it)."""
    splits = list(source.store.meta["splits"])
    usable = [name for name in splits if source.has_split(name)]
    what = "is empty" if split in splits else "does not exist"
    message = f"{path} has no documents to evaluate: its {split!r} split {what}"
    message += f" (splits with documents: {', '.join(usable)})" if usable else " (no split has documents)"
    if split == "valid":
        hint = "--split train or " if "train" in usable else ""
        message += f"; pass {hint}--data with held-out text"
    return message


def text_data(path: Path, tokenizer: Tokenizer) -> EvalData:
    """A raw text file as one document, encoded with the checkpoint's tokenizer; bytes are its UTF-8 bytes."""
    raw = path.read_bytes()
    if not raw.strip():
        raise UserError(f"{path} is empty: nothing to evaluate")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text (invalid byte at offset {exc.start})") from None
    ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
    docs = Documents.of([ids])
    roundtrip = tokenizer.decode(ids.tolist()) == text
    return EvalData(
        str(path), docs, eos=tokenizer.specials.eos, texts=[text], text_bytes=len(raw), roundtrip=roundtrip
    )


def _seq_len(ckpt: Checkpoint) -> int:
    """The row length the model was trained at (corruptions, infill tasks and probe inputs use it)."""
    value = ckpt.training.get("seq_len")
    if value is None:
        return DEFAULT_WINDOW
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(
            f"{ckpt.path} records a training seq_len of {value!r} in config.json, not a positive length: "
            "the checkpoint is damaged"
        )
    return value


def evaluate(
    checkpoint: str | Path | Checkpoint,
    data: str | Path | None = None,
    options: EvalOptions | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every part of the suite the checkpoint supports (see the module docstring). `progress` hears
    one line as each part starts and ends (what it samples, how to ask for more, how long it took)."""
    say = progress or (lambda _line: None)
    options = options or EvalOptions()
    device = resolve_device(options.device)
    torch.manual_seed(options.seed)
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(Path(checkpoint), device)
    ckpt.model.eval()
    # Files named by the options are read before any part runs: a bad one is refused in one line, not
    # after minutes of scoring.
    if "probe" not in options.skip:
        if options.probe_pooling == "pooled" and getattr(ckpt.model, "pooler", None) is None:
            raise UserError("--probe-pooling pooled needs an encoder with a pooled head (n_classes > 0)")
        for path in (options.probe_train, options.probe_valid):
            if path is not None:
                probe.read_labelled(path)
        check_probe_tasks(options)
    if "infill" not in options.skip and options.infill_file is not None:
        infill.read_infill_file(options.infill_file)
    pairs, paper = None, None
    if options.blimp is not None and "blimp" not in options.skip:
        pairs = blimp.read_pairs(options.blimp, options.blimp_per_paradigm)
        paper = blimp.read_paper_rows(options.blimp_paper) if options.blimp_paper is not None else None
    tokenizer = ckpt.tokenizer
    evaldata = resolve_data(ckpt, data, options.split)
    assert tokenizer is not None
    kind, info = ckpt.config.kind, ckpt.training
    # --window is the left-to-right window alone: the other parts read rows of the training length, so a
    # long window never makes them build rows the model never saw (or memory it does not have).
    seq_len = _seq_len(ckpt)
    window = options.window or seq_len
    result: dict[str, Any] = {
        "checkpoint": str(ckpt.path),
        "model_kind": kind,
        "objective": info.get("objective"),
        "train_step": info.get("step"),
        "train_tokens": info.get("tokens"),
        "parameters": count_parameters(ckpt.model),
        "data": evaldata.name,
        "eval_seed": options.seed,
    }
    started = time.perf_counter()
    timings: dict[str, float] = {}
    units: dict[str, dict[str, list[float]]] = {}
    if options.stride is not None and not 1 <= options.stride <= window and "lm" not in options.skip:
        raise UserError(f"--stride must be in [1, window={window}], got {options.stride}")
    n_docs = len(evaldata.docs) if options.max_docs is None else min(options.max_docs, len(evaldata.docs))
    state = _State(ckpt, evaldata, options, seq_len, window, n_docs, device, say, result, pairs, paper)
    for each in EVAL_PARTS:
        if each.name in options.skip or not each.applies(state):
            continue
        say(each.start(state))
        t0 = time.perf_counter()
        part = each.run(state)
        units.update(part.pop("units", {}))
        result.update(part)
        if each.timed:
            timings[each.name] = time.perf_counter() - t0
            for line in each.done(state, part, timings[each.name]):
                say(line)
    if options.units and units:
        result["units"] = units
    result["seconds"] = time.perf_counter() - started
    result["part_seconds"] = {k: round(v, 3) for k, v in timings.items()}
    return result


@dataclass
class _State:
    """What the parts of one `evaluate` call read: the checkpoint, its data and options, the result so far,
    and what an earlier part leaves a later one (the infilling's fills, which the samples show)."""

    ckpt: Checkpoint
    data: EvalData
    options: EvalOptions
    seq_len: int  # the training length: every part but left to right reads rows of it
    window: int  # the left-to-right window
    n_docs: int  # documents scored left to right
    device: torch.device
    say: Callable[[str], None]
    result: dict[str, Any]
    pairs: blimp.Pairs | None = None  # --blimp's minimal pairs, read before any part runs
    paper: Any = None  # --blimp-paper's rows
    infilled: list[infill.InfillResult] = field(default_factory=list)


def _took(_s: _State, _part: dict[str, Any], seconds: float) -> list[str]:
    return [f"  ({seconds:.1f} s)"]


@dataclass(frozen=True)
class Part:
    """One part of the suite, in the order `evaluate` runs them: its `--skip` name, whether it applies to
    this checkpoint and these options, the line that announces it, how it runs (result keys, with
    `units` for compare's paired standard errors) and the lines after it (`timed` parts only)."""

    name: str
    applies: Callable[[_State], bool]
    start: Callable[[_State], str]
    run: Callable[[_State], dict[str, Any]]
    done: Callable[[_State, dict[str, Any], float], list[str]] = _took
    timed: bool = True


def _not_encoder(s: _State) -> bool:
    return s.ckpt.config.kind != "encoder"


def _corrupted_scores(s: _State) -> dict[str, Any]:
    assert s.ckpt.tokenizer is not None
    return corrupted.objective_scores(
        s.ckpt.model, s.ckpt.config.kind, s.ckpt.training, s.data.docs, s.ckpt.specials, s.ckpt.tokenizer,
        s.seq_len, s.options.corrupt_rows, s.options.batch_size, s.options.seed, s.device,
    )  # fmt: skip


def _infilled(s: _State) -> dict[str, Any]:
    part, s.infilled = _infill(s.ckpt, s.data, s.options, s.seq_len, s.device)
    return part


def _probe_done(s: _State, _part: dict[str, Any], seconds: float) -> list[str]:
    near = near_baseline(s.result)
    hint = [f"  {near}: --finetune fine-tunes the whole model, a measure that separates more"]
    return _took(s, _part, seconds) + (hint if near and not s.options.finetune else [])


def _finetune_start(s: _State) -> str:
    o = s.options
    tasks = ", ".join(o.finetune_tasks or o.probe_tasks) or "the default probe's task"
    baseline = ", and the same architecture at random init alike" if o.probe_baselines else ""
    rates = ", ".join(f"{lr:g}" for lr in o.finetune_lrs)
    again = (f", then {o.finetune_seeds - 1} more seed(s) at the rate chosen for its own sd "
             "(--finetune-seeds)") if o.finetune_seeds > 1 else ""  # fmt: skip
    return (f"fine-tune: {tasks}, {o.finetune_steps} steps at each rate of {rates}, the best on dev "
            f"kept (--finetune-steps, --finetune-lr){again}{baseline}")  # fmt: skip


def _finetuned(s: _State) -> dict[str, Any]:
    part = _finetune(s.ckpt, s.options, s.seq_len, s.device)
    part["probe_method"] = "linear+finetune" if "probe_method" in s.result else "finetune"
    return part


def _blimp_start(s: _State) -> str:
    assert s.pairs is not None
    return f"minimal pairs: {len(s.pairs):,} pairs of {s.pairs.source} (--blimp)"


def _blimp_scores(s: _State) -> dict[str, Any]:
    assert s.pairs is not None
    return _blimp(s.ckpt, s.data, s.options, s.pairs, s.paper, s.device, s.say)


# The suite's parts (`PARTS` names them for --skip), each run unless skipped and where it applies.
EVAL_PARTS = (
    Part("lm", _not_encoder,
         lambda s: f"left to right: {s.n_docs:,} held-out documents in windows of {s.window} "
         "(--max-docs to change)",
         lambda s: _left_to_right(s.ckpt, s.data, s.options, s.window, s.device),
         lambda s, part, t: [f"  bits per byte {part['bits_per_byte']:.4f} ({t:.1f} s)"]),
    Part("conditional", _not_encoder,
         lambda s: f"conditional: second halves of up to {s.options.conditional_docs} windows of held-out "
         "documents given the first (--conditional-docs)",
         lambda s: _conditional(s.ckpt, s.data, s.options, s.seq_len),
         lambda s, part, t: [f"  conditional bits per byte {part['conditional_bpb']:.4f} ({t:.1f} s)"]
         if "conditional_bpb" in part else []),
    Part("corrupted", lambda s: True,
         lambda s: f"corruptions: {s.options.corrupt_rows} rows under eval seed {s.options.seed} "
         "(--corrupt-rows)",
         _corrupted_scores),
    Part("infill", lambda s: True,
         lambda s: f"infilling: {s.options.middle_tasks} middles scored, {s.options.infill_tasks} filled "
         "greedily (--middle-tasks, --infill-tasks)",
         _infilled),
    Part("probe", lambda s: True,
         lambda s: f"probe: {', '.join(s.options.probe_tasks) or 'the default probe'}, "
         f"{s.options.probe_layers} layer (--probe-task, --probe-layers)",
         lambda s: _probe(s.ckpt, s.options, s.seq_len, s.device), _probe_done),
    Part("sentence_order", lambda s: s.ckpt.config.kind == "encoder",
         lambda s: f"sentence order: {s.options.sentence_order_pairs} segment pairs "
         "(--sentence-order-pairs)",
         lambda s: _sentence_order(s.ckpt, s.data, s.options, s.seq_len, s.device)),
    Part("finetune", lambda s: s.options.finetune, _finetune_start, _finetuned),
    Part("blimp", lambda s: s.pairs is not None,
         _blimp_start, _blimp_scores,
         lambda s, part, t: [f"  blimp accuracy {s.result['blimp_accuracy']:.4f} ({t:.1f} s)"]),
    Part("samples", lambda s: s.options.samples > 0,
         lambda s: f"samples: {s.options.samples} greedy (--samples)",
         lambda s: {"samples": _samples(s.ckpt, s.data, s.options, s.infilled)}, timed=False),
)  # fmt: skip


def near_baseline(result: dict[str, Any]) -> str:
    """Which probes do not beat their random-init baseline by two of their probe-seed sds, as one phrase
    ("" when all do, or when there is no baseline to judge by)."""
    near = []
    for task in PROBE_TASK_NAMES:
        p = f"probe_{task}_" if task else "probe_"
        acc, base = result.get(f"{p}accuracy"), result.get(f"{p}random_init_accuracy")
        sd = result.get(f"{p}accuracy_probe_sd")
        if isinstance(acc, float) and isinstance(base, float):
            margin = 2 * sd if isinstance(sd, float) and math.isfinite(sd) else 0.0
            if acc - base <= margin:
                near.append(f"{task or 'the'} probe {acc:.3f} vs random init {base:.3f}")
    return "; ".join(near)


def check_probe_tasks(options: EvalOptions) -> None:
    """Named probe tasks need their directory, and their files must read (one line otherwise)."""
    if options.probe_tasks and options.probe_data is None:
        raise UserError("--probe-task needs --probe-data (the directory holding sst2/, trec/, cola/)")
    for name in options.probe_tasks:
        assert options.probe_data is not None
        probe.task_files(name, options.probe_data)


def _left_to_right(
    ckpt: Checkpoint, data: EvalData, options: EvalOptions, window: int, device: torch.device
) -> dict[str, Any]:
    tokenizer = ckpt.tokenizer
    assert tokenizer is not None
    specials, kind = ckpt.specials, ckpt.config.kind
    documents = data.documents(options.max_docs)
    words = 0
    if options.word_ppl:
        words = sum(len(t.split()) for t in data.text_of(tokenizer, options.max_docs))
    text_bytes = data.text_bytes if data.texts is not None and options.max_docs in (None, 1) else None
    context = int(ckpt.training.get("decoder_start_id", specials.pad)) if kind == "encdec" else specials.eos
    t0 = time.perf_counter()
    score = lm.score_documents(
        ckpt.model,
        documents,
        token_bytes(tokenizer),
        context,
        window,
        options.stride,
        specials.eos,
        options.batch_size,
        device,
        text_bytes=text_bytes,
        words=words,
    )
    seconds = time.perf_counter() - t0
    out: dict[str, Any] = score.metrics(options.word_ppl)
    out["window"] = window
    out["stride"] = options.stride or window
    out["lm_tokens_per_s"] = score.targets / max(seconds, 1e-9)
    out["lm_mode"] = "decoder, encoder reads one EOS" if kind == "encdec" else "left to right, behind one EOS"
    if ckpt.config.mtp_heads > 1:
        out["lm_mode"] += ", head 1"
    if not data.roundtrip:
        out["roundtrip"] = False
    if options.units and score.doc_nats is not None and score.doc_bytes is not None:
        out["units"] = {"bits_per_byte": middle.units_of(score.doc_nats, score.doc_bytes)}
    return out


def _conditional(ckpt: Checkpoint, data: EvalData, options: EvalOptions, seq_len: int) -> dict[str, Any]:
    tokenizer = ckpt.tokenizer
    assert tokenizer is not None
    # documents shorter than conditional.MIN_TOKENS are skipped: read a few times as many as are scored
    limit = options.max_docs if options.max_docs is not None else 8 * options.conditional_docs
    return conditional.conditional_scores(
        ckpt.model,
        ckpt.config.kind,
        ckpt.training,
        tokenizer,
        data.documents(limit),
        token_bytes(tokenizer),
        options.seed,
        seq_len,
        options.conditional_docs,
        options.batch_size,
        options.units,
    )


def _infill(
    ckpt: Checkpoint, data: EvalData, options: EvalOptions, seq_len: int, device: torch.device
) -> tuple[dict[str, Any], list[infill.InfillResult]]:
    tokenizer = ckpt.tokenizer
    assert tokenizer is not None
    mode = infill.infill_mode(ckpt.config.kind, ckpt.training)
    if mode == "none":
        return {}, []
    if options.infill_file is not None:
        every = infill.read_infill_file(options.infill_file)
        tasks, middle_tasks = every[: options.infill_tasks], every[: options.middle_tasks]
    else:
        kinds = options.infill_kinds if mode != "left-to-right" else ("line",)
        budget = seq_len - 8

        def fits(source: str) -> bool:
            return len(tokenizer.encode(source)) <= budget

        texts = data.text_of(tokenizer, 200)
        tasks = infill.code_tasks(texts, options.infill_tasks, kinds, options.seed, fits)  # type: ignore[arg-type]
        middle_tasks = infill.code_tasks(texts, options.middle_tasks, MIDDLE_KINDS, options.seed + 1, fits)
    out: dict[str, Any] = {"infill_mode": mode}
    if middle_tasks:
        own = "prefix only (left to right)" if mode == "left-to-right" else f"{mode}, prefix + suffix"
        out["middle_mode"] = own
        out.update(
            middle.middle_scores(
                ckpt.model,
                mode,
                tokenizer,
                ckpt.specials,
                ckpt.training,
                middle_tasks,
                options.batch_size,
                units=options.units,
            )
        )
    if not tasks:
        if not middle_tasks:
            out["infill_skipped"] = "no Python functions in the held-out data"
        return out, []
    if mode == "left-to-right":
        tasks = [t for t in tasks if t.kind in ("line", "file")]
    results = infill.infill_tasks(
        ckpt.model,
        mode,
        tokenizer,
        ckpt.specials,
        ckpt.training,
        tasks,
        options.infill_max_tokens,
        2 * options.infill_max_tokens,
    )
    out.update(infill.infill_metrics(results))
    return out, results


def _probe(ckpt: Checkpoint, options: EvalOptions, seq_len: int, device: torch.device) -> dict[str, Any]:
    tokenizer = ckpt.tokenizer
    assert tokenizer is not None
    pooling, seed = options.probe_pooling, options.seed
    out: dict[str, Any] = {
        "probe_pooling": pooling,
        "probe_layers_mode": options.probe_layers,
        "probe_method": "linear",
    }
    task = _ProbeTask(ckpt, options, seq_len, device)
    if options.probe_tasks:
        assert options.probe_data is not None
        for name in options.probe_tasks:
            train, dev, test = probe.task_files(name, options.probe_data)
            if dev is None:
                train, dev = probe.split_off(train, 0.2, seed)
            out.update(task.scores(name, train, dev, test))
        return out
    if options.probe_train is None:
        train, valid = probe.stdlib_probe(seed)
        out["probe"] = "stdlib-package"
    else:
        train = probe.read_labelled(options.probe_train)
        out["probe"] = str(options.probe_train)
        if options.probe_valid is not None:
            valid = probe.read_labelled(options.probe_valid)
        else:  # hold a quarter out under the eval seed
            train, valid = probe.split_off(train, 0.25, seed)
    if options.probe_layers == "best":
        fit, dev = probe.split_off(train, 0.2, seed + 1)
        out.update(task.scores("", fit, dev, valid))
        out["probe_valid_examples"] = out.pop("probe_test_examples")
    else:
        out.update(task.scores("", train, None, valid))
    if train.replaced_lines or valid.replaced_lines:
        out["probe_non_utf8_lines"] = float(train.replaced_lines + valid.replaced_lines)
    return out


class _ProbeTask:
    """One probe protocol (features, layer and penalty selection) applied to the checkpoint, to its
    baselines (bag of words, the same architecture at random init) and to redrawn training examples."""

    def __init__(self, ckpt: Checkpoint, options: EvalOptions, seq_len: int, device: torch.device) -> None:
        self.ckpt, self.options, self.seq_len, self.device = ckpt, options, seq_len, device
        self.segments = probe.trained_with_segments(ckpt.training)
        self._random: torch.nn.Module | None = None

    def encoded(self, data: probe.Labelled) -> list[list[int]]:
        """The token ids the model reads: a text probe's texts encoded (truncated to the row length), a
        sentence pair's own ids."""
        if isinstance(data, probe.LabelledIds):
            return data.ids
        tokenizer = self.ckpt.tokenizer
        assert tokenizer is not None
        return probe.encode_texts(tokenizer, data.texts, self.seq_len)

    def feats(self, model: torch.nn.Module, data: probe.Labelled) -> list[torch.Tensor]:
        o = self.options
        layers = "all" if o.probe_layers == "best" else "last"
        second = data.second if isinstance(data, probe.LabelledIds) else None
        pad = self.ckpt.specials.pad
        return probe.encoded_features(
            model, self.encoded(data), pad, o.probe_pooling, o.batch_size * 2, self.device, layers,
            self.segments, second,
        )  # fmt: skip

    def protocol(
        self,
        fit: Sequence[torch.Tensor],
        fit_labels: Sequence[str],
        dev: Sequence[torch.Tensor],
        dev_labels: Sequence[str],
        test: Sequence[torch.Tensor],
        test_labels: Sequence[str],
    ) -> dict[str, float]:
        """`best`: layer and penalty chosen on dev, scored on test; `last`: the last layer at --probe-l2."""
        if self.options.probe_layers == "best":
            return probe.select_and_score(fit, fit_labels, dev, dev_labels, test, test_labels)
        return probe.run_probe(fit[-1], fit_labels, test[-1], test_labels, self.options.probe_l2)

    def scores(
        self, name: str, fit: probe.Labelled, dev: probe.Labelled | None, test: probe.Labelled
    ) -> dict[str, Any]:
        o, model = self.options, self.ckpt.model
        dev_labels = dev.labels if dev is not None else []

        def run(features: Any) -> dict[str, float]:
            xf, xd, xt = features
            return self.protocol(xf, fit.labels, xd, dev_labels, xt, test.labels)

        splits = [fit, *([dev] if dev is not None else []), test]

        def triple(per_split: list[list[torch.Tensor]]) -> tuple[Any, Any, Any]:
            return per_split[0], (per_split[1] if dev is not None else []), per_split[-1]

        main = triple([self.feats(model, d) for d in splits])
        out = run(main)
        if o.probe_seeds > 1:
            # The probe's own noise: refits on redrawn training examples at the layer and penalty chosen
            # (one fit each, not the whole selection again: that would multiply the probe's cost).
            layer = int(out.get("probe_layer", len(main[0]))) - 1
            l2 = float(out.get("probe_l2", o.probe_l2))
            out["probe_accuracy_probe_sd"] = probe.probe_seed_sd(
                lambda xs, ys: probe.run_probe(xs[0], ys, main[2][layer], test.labels, l2),
                [main[0][layer]],
                fit.labels,
                o.seed,
                o.probe_seeds,
            )
        if o.probe_baselines:
            tokenizer = self.ckpt.tokenizer
            assert tokenizer is not None
            encoded = [self.encoded(d) for d in splits]

            def bow() -> dict[str, float]:
                return run(triple([[x] for x in probe.bow_features(encoded, tokenizer.vocab_size)]))

            def random_init() -> dict[str, float]:
                return run(triple([self.feats(self.random_model(), d) for d in splits]))

            data_key = self.data_key(encoded, [fit.labels, dev_labels, test.labels], splits)
            for label, compute, key in (
                ("bow", bow, ("bow", tokenizer.vocab_size, probe.BOW_FEATURES)),
                ("random_init", random_init, ("random_init", repr(model.config), self.random_seed())),
            ):
                scores = _baseline_scores(hashlib.sha256(repr(key).encode() + data_key).hexdigest(), compute)
                out[f"probe_{label}_accuracy"] = scores["probe_accuracy"]
                if "probe_mcc" in scores:
                    out[f"probe_{label}_mcc"] = scores["probe_mcc"]
        return {k.replace("probe_", f"probe_{name}_", 1): v for k, v in out.items()} if name else out

    def random_seed(self) -> int:
        return random_init_seed(self.ckpt, self.options)

    def random_model(self) -> torch.nn.Module:
        """The random-init baseline (see `random_init_seed`), built once."""
        if self._random is None:
            self._random = probe.random_init_like(self.ckpt.model, self.random_seed())
        return self._random

    def data_key(
        self, encoded: Sequence[Sequence[list[int]]], labels: Sequence[Sequence[str]], splits: Sequence[Any]
    ) -> bytes:
        """Everything besides the model that a baseline's numbers follow from: the splits' token ids and
        labels (sentence pairs: where segment 1 starts), the protocol and how features are read."""
        o = self.options
        h = hashlib.sha256(
            repr((o.probe_layers, o.probe_l2, o.probe_pooling, o.batch_size, str(self.device),
                  self.segments, self.ckpt.specials.pad, [list(map(str, ls)) for ls in labels])).encode()
        )  # fmt: skip
        for split, ids in zip(splits, encoded, strict=True):
            h.update(np.asarray([len(e) for e in ids], dtype=np.int64).tobytes())
            h.update(np.asarray([t for e in ids for t in e], dtype=np.int64).tobytes())
            if isinstance(split, probe.LabelledIds):
                h.update(np.asarray(split.second, dtype=np.int64).tobytes())
        return h.digest()


def random_init_seed(ckpt: Checkpoint, options: EvalOptions) -> int:
    """The random-init baseline's seed: the run's own training seed where the checkpoint records one (the
    weights a run from scratch started from: the loop seeds, then builds the model), so it varies with the
    pretraining seed as the arms do and a comparison's interval for it is a seed spread, not one draw; the
    eval seed otherwise."""
    seed = ckpt.training.get("seed")
    return seed if isinstance(seed, int) else options.seed


# A baseline does not follow from the checkpoint's weights: the bag of words on a task is the same for
# every model with the tokenizer, and the random-init model the same for every arm of a comparison with the
# architecture and training seed. A comparison evaluates its runs in one process, where each baseline is
# fitted once and reused (the same inputs to the same deterministic fit: the same numbers). The bag of
# words' fits are most of a probe's time (2,048 features, near separable at the smallest penalty).
_BASELINES: dict[str, dict[str, float]] = {}
# Where processes evaluating runs side by side (`compare --jobs`) share their baselines: each is fitted by
# the first process to need it while the others wait for its numbers, instead of each fitting it again (a
# random-init fine-tune takes minutes). None: this process's memory only.
SHARED_BASELINES: Path | None = None


def _baseline_scores(key: str, compute: Callable[[], dict[str, float]]) -> dict[str, float]:
    if key not in _BASELINES:
        _BASELINES[key] = compute() if SHARED_BASELINES is None else _shared(SHARED_BASELINES, key, compute)
    return _BASELINES[key]


def _shared(folder: Path, key: str, compute: Callable[[], dict[str, float]]) -> dict[str, float]:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.json"
    with (folder / f"{key}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held while another process fits it: then read its numbers
        if path.is_file():
            return dict(json.loads(path.read_text(encoding="utf-8")))
        scores = compute()
        write_json(path, scores)
        return scores


def _sentence_order(
    ckpt: Checkpoint, data: EvalData, options: EvalOptions, seq_len: int, device: torch.device
) -> dict[str, Any]:
    """Zero-shot by the pair head where the model trained one, and as a probe (unless --skip probe)."""
    tokenizer = ckpt.tokenizer
    assert tokenizer is not None
    budget = sentence_order.pair_budget(ckpt.training, seq_len)
    limit = options.max_docs if options.max_docs is not None else 4 * options.sentence_order_pairs
    pairs, source = sentence_order.build_pairs(
        data.documents(limit), tokenizer, options.seed, budget, options.sentence_order_pairs
    )
    if len(pairs.ids) < 10:
        return {"sentence_order_skipped": f"{len(pairs.ids)} pairs of whole sentences in the held-out data"}
    out: dict[str, Any] = {"sentence_order_pairs": float(len(pairs.ids))}
    if getattr(ckpt.model, "pooler", None) is not None and probe.trained_with_segments(ckpt.training):
        out["sentence_order_accuracy"] = sentence_order.head_accuracy(
            ckpt.model, pairs, ckpt.specials.pad, options.batch_size * 2
        )
    if "probe" not in options.skip:
        train, dev, test = sentence_order.split_by_document(pairs, source, options.seed)
        if all(len(set(split.labels)) == 2 for split in (train, dev, test)):
            task = _ProbeTask(ckpt, options, seq_len, device)
            out.update(task.scores("sentence_order", train, dev, test))
        else:
            out["probe_sentence_order_skipped"] = "too few documents to split the pairs three ways"
    return out


def _probe_splits(options: EvalOptions) -> list[tuple[str, probe.Labelled, probe.Labelled, probe.Labelled]]:
    """(name, train, dev, test) of each task the probe reads: the named tasks (a fifth of train as dev where
    a task has no dev file), else the labelled files or the default probe, with a fifth of train as dev."""
    seed = options.seed
    if options.probe_tasks:
        assert options.probe_data is not None
        out = []
        for name in options.probe_tasks:
            train, dev, test = probe.task_files(name, options.probe_data)
            if dev is None:
                train, dev = probe.split_off(train, 0.2, seed)
            out.append((name, train, dev, test))
        return out
    if options.probe_train is None:
        train, test = probe.stdlib_probe(seed)
    else:
        train = probe.read_labelled(options.probe_train)
        if options.probe_valid is not None:
            test = probe.read_labelled(options.probe_valid)
        else:
            train, test = probe.split_off(train, 0.25, seed)
    fit, dev = probe.split_off(train, 0.2, seed + 1)
    return [("", fit, dev, test)]


def _finetune(ckpt: Checkpoint, options: EvalOptions, seq_len: int, device: torch.device) -> dict[str, Any]:
    tokenizer = ckpt.tokenizer
    assert tokenizer is not None
    config = finetune.FinetuneConfig(
        steps=options.finetune_steps, lrs=options.finetune_lrs, seeds=options.finetune_seeds
    )
    segments = probe.trained_with_segments(ckpt.training)
    seed = random_init_seed(ckpt, options)
    out: dict[str, Any] = {}

    def tune(
        model: torch.nn.Module, splits: tuple[probe.Labelled, ...], how: finetune.FinetuneConfig
    ) -> dict[str, float]:
        return finetune.finetune(model, tokenizer, *splits, seq_len, options.seed, how, device, segments)

    def twin(
        splits: tuple[probe.Labelled, ...], twin_seed: int, how: finetune.FinetuneConfig
    ) -> dict[str, float]:
        # The same fine-tune from the same architecture untrained: what the whole model learns from
        # the task's own examples alone, against which pretraining's worth is judged. One per
        # architecture, training seed and task, kept for the other arms of a comparison.
        key = (
            "finetune_random_init", repr(ckpt.model.config), twin_seed, repr(how), seq_len, options.seed,
            segments, str(device), tokenizer.vocab_size,
            hashlib.sha256(repr([(d.texts, d.labels) for d in splits]).encode()).hexdigest(),
        )  # fmt: skip
        return _baseline_scores(
            hashlib.sha256(repr(key).encode()).hexdigest(),
            lambda: tune(probe.random_init_like(ckpt.model, twin_seed), splits, how),
        )

    for name, train, dev, test in _probe_splits(options):
        if name and options.finetune_tasks and name not in options.finetune_tasks:
            continue
        splits = (train, dev, test)
        chosen = options.finetune_lr_chosen.get(name)
        scores = tune(ckpt.model, splits, config if chosen is None else replace(config, lrs=(chosen,)))
        if options.probe_baselines:
            how = replace(config, seeds=1)  # a twin's own noise is never reported: one fine-tune a rate
            if options.finetune_twin_seed is not None and options.finetune_twin_seed != seed:
                # its rate is the one the first seed's twin chose on dev (fitted once and shared)
                how = replace(how, lrs=(twin(splits, options.finetune_twin_seed, how)["finetune_lr"],))
            base = twin(splits, seed, how)
            scores["finetune_random_init_accuracy"] = base["finetune_accuracy"]
            scores["finetune_random_init_lr"] = base["finetune_lr"]
            if "finetune_mcc" in base:
                scores["finetune_random_init_mcc"] = base["finetune_mcc"]
        prefix = f"finetune_{name}_" if name else "finetune_"
        out.update({k.replace("finetune_", prefix, 1): v for k, v in scores.items()})
    return out


def pair_forms(ckpt: Checkpoint) -> tuple[str, ...]:
    """The minimal-pair forms the checkpoint's objective says its model kind is scored in (headline
    first); the model kind's default where the objective is not recorded or not known."""
    name, kind = ckpt.training.get("objective"), ckpt.config.kind
    if name:
        try:
            objective = build_objective(
                name, ckpt.specials, ckpt.tokenizer, model_kind=kind,
                overrides=ckpt.training.get("objective_config") or {},
            )  # fmt: skip
            return objective.pair_forms()
        except UserError:
            pass
    return DEFAULT_PAIR_FORMS[kind]


def _blimp(
    ckpt: Checkpoint,
    data: EvalData,
    options: EvalOptions,
    pairs: blimp.Pairs,
    paper: dict[str, dict[str, float]] | None,
    device: torch.device,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Every form the model supports, then its baselines beside the headline form (see blimp.py)."""
    tokenizer = ckpt.tokenizer
    assert tokenizer is not None
    forms = pair_forms(ckpt)
    good, bad = blimp.encode_texts(tokenizer, pairs.good), blimp.encode_texts(tokenizer, pairs.bad)
    segments = ckpt.config.kind == "encoder" and probe.trained_with_segments(ckpt.training)

    size = options.blimp_batch_tokens or blimp.batch_tokens_for(device)

    def scored(model: torch.nn.Module, wanted: Sequence[str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for form in wanted:
            if form in out:
                continue
            if form in ("pll", "pll_word"):  # one pass gives both
                both = [
                    blimp.pll_scores(model, e, ckpt.specials, device, size, segments) for e in (good, bad)
                ]
                for k, name in enumerate(("pll", "pll_word")):
                    out[name] = blimp.summarize(*blimp.compare_scores(both[0][k], both[1][k]), pairs)
            else:
                scorer = blimp.model_scorer(model, form, ckpt.specials, device, size, segments)
                out[form] = blimp.evaluate_pairs(scorer, good, bad, pairs)
        return out

    t0 = time.perf_counter()
    summaries = scored(ckpt.model, forms)
    head = summaries[forms[0]]
    result: dict[str, Any] = {"blimp_form": forms[0], "blimp_forms": ",".join(forms), "blimp": pairs.source}
    result.update(blimp.flat_metrics(head))
    result["blimp_pairs"] = head["all"]["pairs"]
    for form in forms:
        result.update(blimp.flat_metrics(summaries[form], f"blimp_{form}"))
    say(f"  {', '.join(forms)}: {time.perf_counter() - t0:.1f} s")
    by_term = {t: dict(c) for t, c in head["by_term"].items()}
    by_paradigm = {u: dict(c) for u, c in head["by_paradigm"].items()}
    baselines: dict[str, dict[str, Any]] = {}
    if options.probe_baselines:
        seed = random_init_seed(ckpt, options)
        key = ("blimp_random_init", repr(ckpt.model.config), seed, forms[0], str(device), pairs.source,
               hashlib.sha256(repr((pairs.good, pairs.bad, pairs.uid)).encode()).hexdigest())  # fmt: skip

        def twin() -> dict[str, Any]:
            return scored(probe.random_init_like(ckpt.model, seed), forms[:1])[forms[0]]

        baselines["random_init"] = _baseline_scores(hashlib.sha256(repr(key).encode()).hexdigest(), twin)
    if options.blimp_ngram > 0:
        train = _training_documents(ckpt, data)
        if train is None:
            result["blimp_ngram_skipped"] = (
                "no training store to count an n-gram model on (pass --data STORE)"
            )
        else:
            model = blimp.NGram(train, tokenizer.vocab_size, options.blimp_ngram, ckpt.specials.eos)
            baselines["ngram"] = blimp.evaluate_pairs(model.score, good, bad, pairs)
            result["blimp_ngram_order"] = float(options.blimp_ngram)
            result["blimp_ngram_tokens"] = float(sum(len(d) for d in train))
    for name, summary in baselines.items():
        result.update(blimp.flat_metrics(summary, f"blimp_{name}"))
        for group, cells in ((by_term, summary["by_term"]), (by_paradigm, summary["by_paradigm"])):
            for label, cell in cells.items():
                group[label][name] = cell["accuracy"]
    if paper is not None:
        ref = blimp.paper_reference(paper, pairs)
        result["blimp_paper"] = ref.get("all", {})
        for label, models in ref.items():
            if label in by_term:
                by_term[label]["paper"] = models
        for uid, models in paper.items():
            if uid in by_paradigm:
                by_paradigm[uid]["paper"] = models
    result["blimp_by_term"] = by_term
    result["blimp_by_paradigm"] = by_paradigm
    return result


def _training_documents(ckpt: Checkpoint, data: EvalData) -> list[np.ndarray] | None:
    """The training split of the store the run trained on (its config.yaml), else of the evaluation
    store, as token arrays without EOS; None when neither is at hand."""
    stores: list[Path] = []
    run = run_dir_of(Path(ckpt.path)) if ckpt.path else None
    if run is not None:
        try:
            cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8")) or {}
            store = (cfg.get("data") or {}).get("store")
            if store:
                stores.append(Path(store))
        except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
            pass
    if data.texts is None:
        stores.append(Path(data.name.rsplit(" [", 1)[0]))
    for path in stores:
        if not (path / "meta.json").is_file():
            continue
        source = DataSource(path)
        assert ckpt.tokenizer is not None
        if source.tokenizer.hash != ckpt.tokenizer.hash or not source.has_split("train"):
            continue
        train = EvalData(str(path), source.documents("train"), eos=ckpt.specials.eos)
        return train.documents()
    return None


def _samples(
    ckpt: Checkpoint, data: EvalData, options: EvalOptions, results: list[infill.InfillResult]
) -> list[dict[str, Any]]:
    """A few greedy outputs for the eye: continuations (decoders), fills (span models, encoders)."""
    tokenizer = ckpt.tokenizer
    assert tokenizer is not None
    specials, kind, model = ckpt.specials, ckpt.config.kind, ckpt.model
    out: list[dict[str, Any]] = []
    for r in results[: options.samples]:
        out.append(
            {
                "mode": "infill",
                "prefix": r.task.prefix[-200:],
                "suffix": r.task.suffix[:200],
                "output": r.output,
                "expected": r.task.middle,
            }
        )
    docs = [d for d in data.documents(50) if len(d) >= 24][: options.samples]
    prompt_len = 24
    for d in docs:
        prompt = d[:prompt_len].tolist()
        if kind == "decoder":
            ids = list(gen.generate_decoder(model, prompt, options.sample_tokens, stop_ids=(specials.eos,)))  # type: ignore[arg-type]
            out.append(
                {
                    "mode": "continue",
                    "prompt": tokenizer.decode(prompt),
                    "output": tokenizer.decode(ids),
                    "expected": tokenizer.decode(d[prompt_len : prompt_len + options.sample_tokens].tolist()),
                }
            )
        elif kind == "encoder":
            k = prompt_len // 2
            text = tokenizer.decode(prompt[:k]) + gen.MASK_MARKER + tokenizer.decode(prompt[k + 1 :])
            cands = gen.fill_mask(model, tokenizer, text, 3, probe.trained_with_segments(ckpt.training))  # type: ignore[arg-type]
            out.append(
                {
                    "mode": "fill-mask",
                    "prompt": text,
                    "output": cands[0][0].text if cands else "",
                    "candidates": [c.text for c in cands[0]] if cands else [],
                    "expected": tokenizer.decode(prompt[k : k + 1]),
                }
            )
        else:
            k = prompt_len // 2
            task = infill.InfillTask(
                "sample",
                tokenizer.decode(prompt[:k]),
                tokenizer.decode(prompt[k : k + 3]),
                tokenizer.decode(prompt[k + 3 :]),
            )
            r = infill.infill_one(model, "sentinel", tokenizer, specials, ckpt.training, task, 16)
            out.append(
                {
                    "mode": "span-fill",
                    "prefix": task.prefix,
                    "suffix": task.suffix,
                    "output": r.output,
                    "expected": task.middle,
                }
            )
    return out
