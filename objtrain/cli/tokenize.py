"""`objtrain tokenize`: text files, directories or the standard library -> a token store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from objtrain.cli.common import make_console
from objtrain.data.progress import RichProgress
from objtrain.data.tokenize import (
    TokenizeConfig,
    TokenizeSummary,
    is_hf_tokenizer,
    tokenize_corpus,
)
from objtrain.errors import UserError

HELP = """Tokenize a corpus into a token store (train and valid splits, memory-mapped).

Inputs are files and directories (walked recursively, hidden entries skipped): `*.jsonl` files hold one JSON
object per line (text in --text-field), `*.parquet` files and `datasets` save_to_disk folders (`*.arrow`)
hold the text in column --text-field, anything else is UTF-8 text; JSONL and text may be compressed
(`.gz`, `.zst`). A text file is one document unless --doc-split cuts it at blank lines or lines.
A `datasets` DatasetDict folder keeps its own splits: train -> train, validation (else test) -> valid.
`--corpus stdlib` adds the Python standard library's own `.py` files (without site-packages and without
its test suites).

A binary or non-UTF-8 file found inside a directory is skipped and counted (listed in meta.json); the same
file named explicitly is refused. A malformed record (a JSONL line that is not JSON or lacks the text
field, a null text cell) is skipped and counted (the first ones listed in meta.json); --strict refuses it.
Exact round trip: every stored document decodes to its text byte for byte (with --no-byte-fallback,
characters the vocabulary lacks become <unk> instead, and are counted).

Example: objtrain tokenize --corpus stdlib --vocab-size 4096 -o runs/demo/store
"""


def print_summary(console: Console, summary: TokenizeSummary, doc_split: str = "file") -> None:
    table = Table(title=f"token store {escape(str(summary.path))}", title_justify="left")
    for column in ("split", "documents", "tokens", "bytes", "bytes/token"):
        table.add_column(column, justify="left" if column == "split" else "right")
    for name, counts in summary.splits.items():
        bpt = counts.bytes / counts.tokens if counts.tokens else 0.0
        table.add_row(name, f"{counts.documents:,}", f"{counts.tokens:,}", f"{counts.bytes:,}", f"{bpt:.2f}")
    table.add_row(
        "all",
        f"{summary.documents:,}",
        f"{summary.tokens:,}",
        f"{summary.bytes:,}",
        f"{summary.bytes_per_token:.2f}",
        style="bold",
    )
    console.print(table)
    if summary.tokenizer_note:
        console.print(summary.tokenizer_note, highlight=False, markup=False)
    for dataset_dict in summary.dataset_dicts:
        console.print(dataset_dict.describe(), highlight=False, markup=False)
    trained = f"trained in {summary.train_seconds:.1f} s" if summary.tokenizer_trained else "reused"
    rest = max(summary.seconds - summary.train_seconds, 1e-9)
    console.print(
        f"{summary.n_sources:,} file{'s' if summary.n_sources != 1 else ''}, "
        f"vocabulary {summary.vocab_size:,} ({trained}), "
        f"{summary.seconds:.1f} s in all, {summary.bytes / 1e6 / rest:.2f} MB/s without training"
    )
    if summary.skipped:
        console.print(
            f"[yellow]skipped {len(summary.skipped)} unreadable files[/] (binary, not UTF-8, or without the "
            "text column; listed in meta.json)"
        )
        for skipped in summary.skipped[:5]:
            console.print(f"  {skipped.path}: {skipped.reason}", highlight=False, markup=False)
    if summary.bad_records.count:
        first = summary.bad_records.examples[0]
        console.print(
            f"[yellow]skipped {summary.bad_records.count:,} malformed records[/] (first: "
            f"{escape(first['where'])}: {escape(first['reason'])}; listed in meta.json; "
            "--strict refuses them)"
        )
    if summary.empty_documents:
        console.print(f"dropped {summary.empty_documents:,} empty documents")
    if summary.unknown:
        console.print(
            f"[yellow]{summary.unknown:,} tokens are <unk>[/]: characters outside the vocabulary, which "
            "has no byte fallback; those documents do not decode back exactly"
        )
    if summary.splits["valid"].documents == 0:
        # documents are what the split draws: few whole files may all land in train
        hint = "raise --valid-fraction" + (" or use --doc-split" if doc_split == "file" else "")
        console.print(f"[yellow]the valid split is empty[/]: {hint}")


def _refuse_training_options(ctx: typer.Context, hf: bool) -> None:
    """Options that shape a new tokenizer mean nothing when --tokenizer reuses one: say so rather than
    silently ignore them (a user asking for --vocab-size 1000 would get the reused tokenizer's size).
    A Hugging Face tokenizer gets objtrain's special tokens added, so --sentinels still counts for it."""
    shaping = ("model_type", "vocab_size", "byte_fallback", "train_bytes") + (() if hf else ("sentinels",))
    # by name: typer carries its own copy of click, whose ParameterSource is not click's
    given = [n for n in shaping if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"]
    if given:
        flags = ", ".join(
            ("--" if ctx.params.get(n) is not False else "--no-") + n.replace("_", "-") for n in given
        )
        raise UserError(
            f"{flags} shape a new tokenizer; --tokenizer reuses one as it is: drop one or the other"
        )


def run(
    ctx: typer.Context,
    inputs: Annotated[
        list[Path] | None, typer.Argument(help="Files and directories to read.", show_default=False)
    ] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Token store directory to create.")] = Path(
        "store"
    ),
    corpus: Annotated[
        str | None,
        typer.Option(help="Built-in corpus to add: 'stdlib' (the standard library's .py files)."),
    ] = None,
    include: Annotated[
        list[str] | None,
        typer.Option(help="Glob a file in a directory must match (name or relative path)."),
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option(help="Glob of files in directories to leave out.")
    ] = None,
    text_field: Annotated[
        str, typer.Option(help="JSONL field or Parquet/Arrow column holding the text.")
    ] = "text",
    strict: Annotated[
        bool, typer.Option("--strict", help="Refuse a malformed record instead of skipping and counting it.")
    ] = False,
    doc_split: Annotated[
        str, typer.Option(help="How a text file becomes documents: file, blank-line or line.")
    ] = "file",
    model_type: Annotated[str, typer.Option(help="Sentencepiece model: unigram, bpe or char.")] = "unigram",
    vocab_size: Annotated[int, typer.Option(help="Vocabulary size, special tokens included.")] = 8192,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="Reuse a tokenizer: a token store, a checkpoint, a sentencepiece .model file, or a Hugging "
            "Face tokenizer.json (or a directory holding one; objtrain's special tokens are added to it)."
        ),
    ] = None,
    sentinels: Annotated[
        int, typer.Option(help="Sentinel tokens <extra_id_k> to reserve (or add to a Hugging Face one).")
    ] = 256,
    byte_fallback: Annotated[
        bool,
        typer.Option(
            help="Spell characters outside the vocabulary as UTF-8 byte pieces (256 ids). Without it, "
            "every character of the training sample gets a piece and unseen ones become <unk>: for a "
            "closed alphabet, e.g. a --model-type char vocabulary of just the corpus's characters."
        ),
    ] = True,
    train_bytes: Annotated[
        int,
        typer.Option(help="Cap on the tokenizer's training sample, in bytes (a fixed hash-chosen sample)."),
    ] = 3_000_000,
    valid_fraction: Annotated[float, typer.Option(help="Fraction of documents in the valid split.")] = 0.05,
    seed: Annotated[int, typer.Option(help="Seed of the train/valid split and the training sample.")] = 0,
    threads: Annotated[int, typer.Option(help="Encoding threads; 0 = every core.")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists.")] = False,
) -> None:
    if tokenizer is not None:
        _refuse_training_options(ctx, is_hf_tokenizer(tokenizer))
    config = TokenizeConfig(
        corpus=corpus,
        include=tuple(include or ()),
        exclude=tuple(exclude or ()),
        text_field=text_field,
        strict=strict,
        doc_split=doc_split,  # type: ignore[arg-type]  # checked by tokenize_corpus
        model_type=model_type,  # type: ignore[arg-type]
        vocab_size=vocab_size,
        tokenizer=tokenizer,
        n_sentinels=sentinels,
        byte_fallback=byte_fallback,
        train_bytes=train_bytes,
        valid_fraction=valid_fraction,
        seed=seed,
        num_threads=threads,
    )
    console = make_console()
    progress = RichProgress(make_console(stderr=True))
    with progress.bar:
        summary = tokenize_corpus(inputs or [], output, config, force=force, progress=progress)
    print_summary(console, summary, doc_split)


# Paragraphs rewrapped to the terminal by rich: join their lines.
run.__doc__ = "\n\n".join(" ".join(p.split()) for p in HELP.split("\n\n"))
