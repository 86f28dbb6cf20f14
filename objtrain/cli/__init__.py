"""The `objtrain` command line: thin glue over library functions, one module per subcommand."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from objtrain.cli import compare, corrupt, evaluate, generate, pack, tokenize, train
from objtrain.errors import UserError

app = typer.Typer(
    name="objtrain",
    help="Pre-train language models with every major pre-training objective, and compare them honestly.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("tokenize")(tokenize.run)
app.command("pack")(pack.run)
app.command("corrupt")(corrupt.run)
app.command("train")(train.run)
app.command("eval")(evaluate.run)
app.command("compare")(compare.run)
app.command("generate")(generate.run)

err_console = Console(stderr=True)


def main() -> None:
    """Entry point: bad input becomes one line on stderr and exit code 2, never a traceback."""
    try:
        app()
    except UserError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]")
        sys.exit(130)
