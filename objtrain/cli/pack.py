"""`objtrain pack`: a token store -> fixed-length rows with per-position document ids."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from objtrain.cli.common import make_console
from objtrain.data.pack import PackConfig, PackSummary, pack_store
from objtrain.data.store import SPLITS
from objtrain.io import check_no_link_loop

HELP = """Pack a token store into rows of --seq-len tokens, each document followed by eos.

concat: documents joined into one stream and cut into rows; every token kept once, in order; only the
last row is padded. bestfit: best-fit-decreasing bin packing; a document that fits a row is never split,
longer ones are cut into row-sized pieces; rows shuffled by --seed. Every position keeps its row-local
document index (0, 1, 2... and -1 for padding). Both splits are packed by default, into PACKED/train.* and
PACKED/valid.*.

Example: objtrain pack runs/demo/store --seq-len 256 --mode bestfit -o runs/demo/packed
"""


def print_summary(console: Console, summary: PackSummary) -> None:
    table = Table(
        title=f"packed store {summary.path} ({summary.mode}, seq_len {summary.seq_len})", title_justify="left"
    )
    for column in ("split", "rows", "documents", "tokens", "padding", "fill", "documents split"):
        table.add_column(column, justify="left" if column == "split" else "right")
    for name, c in summary.splits.items():
        table.add_row(
            name, f"{c.rows:,}", f"{c.documents:,}", f"{c.tokens:,}", f"{c.padding:,}", f"{c.fill:.2%}",
            f"{c.documents_split:,}",
        )  # fmt: skip
    total = summary.total()
    console.print(table)
    console.print(
        f"{total.rows:,} rows, fill {total.fill:.2%}, {total.documents_split:,} documents split, "
        f"{total.padding:,} padding tokens, {summary.seconds:.2f} s"
    )


def run(
    store: Annotated[Path, typer.Argument(help="Token store made by `objtrain tokenize`.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Packed store directory to create.")] = Path(
        "packed"
    ),
    seq_len: Annotated[int, typer.Option(help="Tokens per row.")] = 1024,
    mode: Annotated[str, typer.Option(help="concat or bestfit.")] = "bestfit",
    seed: Annotated[int, typer.Option(help="Seed of the row order (bestfit).")] = 0,
    split: Annotated[str, typer.Option(help="Split to pack: train, valid or all.")] = "all",
    force: Annotated[bool, typer.Option("--force", help="Replace OUTPUT if it exists.")] = False,
) -> None:
    splits = SPLITS if split == "all" else (split,)
    config = PackConfig(seq_len=seq_len, mode=mode, seed=seed, splits=splits)  # type: ignore[arg-type]
    check_no_link_loop(output)  # before pack_store resolves it to compare it with the input
    summary = pack_store(store, output, config, force=force)
    print_summary(make_console(), summary)


# Paragraphs rewrapped to the terminal by rich: join their lines.
run.__doc__ = "\n\n".join(" ".join(p.split()) for p in HELP.split("\n\n"))
