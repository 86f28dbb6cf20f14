"""`objtrain eval`: thin glue over `objtrain.evaluation.suite.evaluate` (flags -> EvalOptions -> table)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from objtrain.cli.common import DEVICE_HELP, check_format, make_console
from objtrain.errors import UserError
from objtrain.evaluation.suite import METRICS, EvalOptions, evaluate

HELP = """Evaluate a checkpoint (or the newest checkpoint of a run directory) with everything it can do.

Left to right (decoders; encoder-decoders through their decoder): loss, perplexity and bits per byte over
whole documents with a sliding window (--window, --stride), every byte counted once. Conditional bits per
byte (decoders, prefix LMs, encoder-decoders): the second half of held-out documents given the first, each
model in its own form (a decoder reads on, a prefix LM takes the first half as its prefix, an encoder-decoder
as its encoder input, a FIM model as the prefix with an empty suffix), the metric to compare kinds on.
Masked-token accuracy
(encoders) and span-target loss (encoder-decoders) on fixed-seed corruptions, and the training objective's
own loss. Infilling of held-out Python functions (one line or one span cut out) with the model's own infill
mode, or tasks from a HumanEval-Infilling JSONL (--infill): exact match and the share that still parses,
and the middle's bits per byte given prefix and suffix (and from the prefix alone), which resolves models
too small for exact match.
A linear probe on frozen features: by default, which standard-library package a function comes from; or a
labelled TSV/JSONL (--probe train.tsv --probe-valid dev.tsv), or named tasks (--probe-task sst2,trec,cola
--probe-data DIR); the layer and penalty are chosen on a dev split, never on the reported one. Beside each
probe: its majority class, the same probe on bag-of-words token counts and on the same architecture at random
init, and its sd over probe seeds (refits on redrawn examples); a probe near its random-init baseline says
little about the features. Encoders: sentence order (consecutive segments of held-out text, in order or
swapped), zero-shot by an NSP/SOP head and as a probe. With
--finetune, the whole model is also fine-tuned on the same tasks (a linear head, AdamW, weights chosen on
dev) and scored on test, as the literature compares objectives, beside the same fine-tune of the architecture
at random init (--finetune-task sst2: only the tasks named). With --blimp PATH, minimal pairs (BLiMP): the
share whose grammatical sentence the model scores higher (a tie is wrong, the tie rate beside it), overall,
per linguistics term and per paradigm with Wilson intervals, in each form the model trained (a decoder's
summed log-probability, an encoder's pseudo-log-likelihood and its within-word variant, an encoder-decoder's
span form), beside the same architecture at random init, an n-gram model of the training tokens (--blimp-
ngram) and the paper's rows (--blimp-paper). A few greedy samples for the eye.

DATA is a token or packed store (its valid split by default) or a UTF-8 text file, encoded with the
checkpoint's own tokenizer. Without --data: the run's own store, else the embedded standard-library store.

Example: objtrain eval runs/fim --data runs/demo/store --stride 128 --format json
"""


def run(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint directory or a run directory.")],
    data: Annotated[
        str | None, typer.Option("--data", "-d", help="Token/packed store or a UTF-8 text file.")
    ] = None,
    split: Annotated[str, typer.Option(help="Store split to evaluate on.")] = "valid",
    window: Annotated[
        int | None,
        typer.Option(help="Left-to-right window in tokens (default: the training seq_len, else 256)."),
    ] = None,
    stride: Annotated[int | None, typer.Option(help="Window stride (default: the window, disjoint).")] = None,
    word_ppl: Annotated[bool, typer.Option("--word-ppl", help="Also word-level perplexity.")] = False,
    max_docs: Annotated[int | None, typer.Option("--max-docs", help="Score at most N documents.")] = None,
    conditional_docs: Annotated[
        int,
        typer.Option(
            "--conditional-docs",
            min=1,
            help="Windows scored for conditional_bpb (long documents give several).",
        ),
    ] = 256,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Rows per forward.")] = 16,
    seed: Annotated[int, typer.Option(help="Eval seed: corruptions, infill cuts, probe sampling.")] = 1234,
    corrupt_rows: Annotated[int, typer.Option("--corrupt-rows", min=1, help="Rows for masked scores.")] = 64,
    infill_file: Annotated[
        Path | None,
        typer.Option("--infill", help="HumanEval-Infilling JSONL (prompt, suffix, canonical_solution)."),
    ] = None,
    infill_tasks: Annotated[int, typer.Option("--infill-tasks", min=1, help="Most infilling tasks.")] = 32,
    infill_kinds: Annotated[
        str, typer.Option("--infill-kinds", help="line, lines (2-6 lines), span, both (line,span) or all.")
    ] = "both",
    infill_max_tokens: Annotated[
        int, typer.Option("--infill-max-tokens", min=1, help="Most tokens of a line fill (spans: twice).")
    ] = 64,
    probe_train: Annotated[
        Path | None, typer.Option("--probe", help="Labelled TSV/JSONL to train a probe on.")
    ] = None,
    probe_valid: Annotated[
        Path | None, typer.Option("--probe-valid", help="Labelled file to score it on.")
    ] = None,
    pooling: Annotated[
        str, typer.Option("--probe-pooling", help="mean, last, first or pooled (encoder head).")
    ] = "mean",
    probe_layers: Annotated[
        str,
        typer.Option(
            "--probe-layers", help="best (every layer and l2 tried, chosen on a dev split) or last."
        ),
    ] = "best",
    probe_tasks: Annotated[
        str, typer.Option("--probe-task", help="Named probe tasks, comma-separated: sst2, trec, cola.")
    ] = "",
    probe_data: Annotated[
        Path | None, typer.Option("--probe-data", help="Directory holding sst2/, trec/, cola/.")
    ] = None,
    no_baselines: Annotated[
        bool,
        typer.Option("--no-baselines", help="Leave out the probes' bag-of-words and random-init baselines."),
    ] = False,
    probe_seeds: Annotated[
        int, typer.Option("--probe-seeds", min=1, help="Probe refits on redrawn examples for its sd.")
    ] = 5,
    sentence_order_pairs: Annotated[
        int,
        typer.Option("--sentence-order-pairs", min=1, help="Encoders: segment pairs, in order or swapped."),
    ] = 600,
    middle_tasks: Annotated[
        int, typer.Option("--middle-tasks", min=0, help="Infilling tasks whose middle is scored in bits.")
    ] = 240,
    finetune: Annotated[
        bool,
        typer.Option(
            "--finetune", help="Also fine-tune the whole model on the probe's tasks (minutes on a CPU)."
        ),
    ] = False,
    finetune_tasks: Annotated[
        str,
        typer.Option("--finetune-task", help="Of the named probe tasks, those fine-tuned on (default: all)."),
    ] = "",
    finetune_steps: Annotated[
        int, typer.Option("--finetune-steps", help="Fine-tuning steps per task.")
    ] = 300,
    finetune_lr: Annotated[
        str,
        typer.Option(
            "--finetune-lr",
            help="Fine-tuning peak learning rates, comma-separated: each tried, best on dev kept.",
        ),
    ] = "3e-4,1e-3,3e-3,1e-2",
    finetune_seeds: Annotated[
        int,
        typer.Option(
            "--finetune-seeds",
            help="Fine-tunes at the chosen rate, each with its own seed: the fine-tune's own sd (1: none).",
        ),
    ] = 1,
    blimp_path: Annotated[
        Path | None,
        typer.Option(
            "--blimp",
            help="Minimal pairs: a folder of BLiMP *.jsonl or one .jsonl(.gz) (sentence_good, sentence_bad, "
            "UID, linguistics_term).",
        ),
    ] = None,
    blimp_paper: Annotated[
        Path | None,
        typer.Option("--blimp-paper", help="The BLiMP paper's accuracy per paradigm (models_summary.jsonl)."),
    ] = None,
    blimp_per_paradigm: Annotated[
        int,
        typer.Option(
            "--blimp-per-paradigm", min=0, help="Score the first K pairs of each paradigm (0: every pair)."
        ),
    ] = 0,
    blimp_ngram: Annotated[
        int,
        typer.Option(
            "--blimp-ngram", min=0, help="Order of the n-gram baseline on the training tokens (0: none)."
        ),
    ] = 3,
    samples: Annotated[int, typer.Option(min=0, help="Greedy samples to show.")] = 3,
    skip: Annotated[
        str,
        typer.Option(
            help="Parts to leave out: lm,conditional,corrupted,infill,probe,sentence_order,finetune,samples."
        ),
    ] = "",
    output_format: Annotated[
        str, typer.Option("--format", help="text (a table) or json (one object).")
    ] = "text",
    device: Annotated[str, typer.Option(help=DEVICE_HELP)] = "auto",
) -> None:
    output_format = check_format(output_format, ("text", "json"))
    options = EvalOptions(
        split=split,
        window=window,
        stride=stride,
        word_ppl=word_ppl,
        max_docs=max_docs,
        conditional_docs=conditional_docs,
        batch_size=batch_size,
        seed=seed,
        corrupt_rows=corrupt_rows,
        infill_tasks=infill_tasks,
        infill_file=infill_file,
        infill_kinds=tuple(k.strip() for k in infill_kinds.split(",") if k.strip()),
        infill_max_tokens=infill_max_tokens,
        probe_train=probe_train,
        probe_valid=probe_valid,
        probe_pooling=pooling,
        probe_layers=probe_layers,
        probe_tasks=tuple(k.strip() for k in probe_tasks.split(",") if k.strip()),
        probe_data=probe_data,
        probe_baselines=not no_baselines,
        probe_seeds=probe_seeds,
        sentence_order_pairs=sentence_order_pairs,
        middle_tasks=middle_tasks,
        finetune=finetune,
        finetune_tasks=tuple(k.strip() for k in finetune_tasks.split(",") if k.strip()),
        finetune_steps=finetune_steps,
        finetune_lrs=_rates(finetune_lr),
        finetune_seeds=finetune_seeds,
        blimp=blimp_path,
        blimp_paper=blimp_paper,
        blimp_per_paradigm=blimp_per_paradigm,
        blimp_ngram=blimp_ngram,
        samples=samples,
        skip=tuple(k.strip() for k in skip.split(",") if k.strip()),
        device=device,
    )
    err = make_console(stderr=True, highlight=False)
    result = evaluate(
        checkpoint, data=data, options=options, progress=lambda line: err.print(line, markup=False)
    )
    if output_format == "json":
        print(json.dumps(_finite(result), ensure_ascii=False, allow_nan=False))
        return
    print_result(make_console(), result)


NOTES = (
    "data", "window", "stride", "scored_tokens", "scored_bytes", "lm_mode", "conditional_mode",
    "conditional_docs", "infill_mode", "infill_tasks", "infill_skipped", "middle_mode", "middle_tasks",
    "probe", "probe_method", "sentence_order_pairs", "probe_classes", "probe_feature_dim", "probe_layer",
    "eval_seed", "finetune_best_step", "finetune_steps", "blimp_form", "blimp_forms",
)  # fmt: skip


def _finite(value: Any) -> Any:
    """Strict JSON: a NaN or infinite number (a diverged model) becomes null, paths become strings."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value.is_integer() and abs(value) >= 1:
            return f"{int(value):,}"
        return f"{value:.4f}"
    return str(value)


def print_result(console: Console, result: dict[str, Any]) -> None:
    title = (
        f"{result['checkpoint']}: {result['model_kind']}"
        + (f", {result['objective']}" if result.get("objective") else "")
        + (f", step {result['train_step']}" if result.get("train_step") is not None else "")
    )
    # A heading of its own: as a table title it would wrap to the narrow table's width, mid-phrase.
    console.print(Text(title, style="table.title"), soft_wrap=True)
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("", justify="left")
    for name, (better, _) in METRICS.items():
        if name in result:
            arrow = {"lower": "lower is better", "higher": "higher is better"}.get(better, "")
            table.add_row(name, _fmt(result[name]), f"[dim]{arrow}[/]")
    console.print(table)
    notes = []
    for key in NOTES:
        if key in result:
            notes.append(f"{key} {_fmt(result[key])}")
    console.print("[dim]" + escape("; ".join(notes)) + f"; {result['seconds']:.1f} s[/]", highlight=False)
    if "blimp_by_term" in result:
        console.print(blimp_table(result))
    for sample in result.get("samples", []):
        head = sample.get("prompt", sample.get("prefix", ""))
        console.print(f"\n[bold]{sample['mode']}[/] [dim]{escape(repr(head[-120:]))}[/]", highlight=False)
        console.print(f"  model:    {sample['output']!r}", highlight=False, markup=False)
        console.print(f"  expected: {sample['expected']!r}", highlight=False, markup=False)


def blimp_table(result: dict[str, Any]) -> Table:
    """Minimal-pair accuracy per linguistics term, with its interval and the baselines beside it."""
    cells = result["blimp_by_term"]
    bases = [b for b in ("random_init", "ngram") if any(b in c for c in cells.values())]
    table = Table(title=f"BLiMP by linguistics term ({result.get('blimp_form')} form)")
    for name in ("term", "pairs", "accuracy", "95% interval", "ties", *bases, *(["paper gpt2"] if any(
            "paper" in c for c in cells.values()) else [])):  # fmt: skip
        table.add_column(name, justify="left" if name == "term" else "right")
    rows = [("all", {"accuracy": result["blimp_accuracy"], "lo": result["blimp_accuracy_lo"],
             "hi": result["blimp_accuracy_hi"], "tie_rate": result["blimp_tie_rate"],
             "pairs": result["blimp_pairs"],
             **{b: result.get(f"blimp_{b}_accuracy") for b in bases},
             **({"paper": result["blimp_paper"]} if "blimp_paper" in result else {})})]  # fmt: skip
    for term, cell in [*rows, *cells.items()]:
        extra = [f"{cell[b]:.3f}" if cell.get(b) is not None else "" for b in bases]
        if table.columns[-1].header == "paper gpt2":
            extra.append(f"{cell['paper']['gpt2']:.3f}" if "gpt2" in cell.get("paper", {}) else "")
        table.add_row(term, f"{int(cell['pairs']):,}", f"{cell['accuracy']:.3f}",
                      f"{cell['lo']:.3f}-{cell['hi']:.3f}", f"{cell['tie_rate']:.3f}", *extra)  # fmt: skip
    return table


run.__doc__ = "\n\n".join(" ".join(p.split()) for p in HELP.split("\n\n"))


def _rates(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(f"--finetune-lr takes comma-separated numbers, got {text!r}") from None
