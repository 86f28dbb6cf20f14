"""Conventions every `objtrain` command shares: consoles, output formats, progress, interrupts.

- `--format text|json|jsonl` where a command prints results: text for people, json one document, jsonl
  one object per line (`check_format` with the subset a command offers).
- `--device` says the same everywhere (`DEVICE_HELP`).
- Output to a terminal is laid out for its width; piped or redirected output is never wrapped, and
  progress displays stay off (nothing but results on stdout, nothing stray on stderr).
- Ctrl-C ends a command with one line and exit 130: `interrupted; nothing was written` unless the
  command says what it kept (`interrupt_note`) or its output was already in place, complete (the line
  then says so). Once the command has finished, a Ctrl-C is ignored: it can neither undo nor misreport it.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich import progress as rp
from rich.console import Console

from objtrain.errors import UserError, did_you_mean
from objtrain.io import completed_outputs

FORMATS = ("text", "json", "jsonl")
DEVICE_HELP = "auto | cpu | cuda | cuda:N | mps (auto: cuda, then mps, then cpu)."
# Piped output is not wrapped: rich lays it out for a console this wide, and tables take what they need.
UNWRAPPED_WIDTH = 1_000_000

NOTHING_WRITTEN = "interrupted; nothing was written"
_note = {"interrupt": NOTHING_WRITTEN}


def interrupt_note(message: str) -> None:
    """What the one line after Ctrl-C says for the running command (e.g. what it kept)."""
    _note["interrupt"] = message


def interrupted_message() -> str:
    """The command's own note; by default, the output this command had already put in place whole, if
    any (a Ctrl-C while it printed its summary), else that nothing was written."""
    done = completed_outputs()
    if _note["interrupt"] == NOTHING_WRITTEN and done:
        return f"interrupted after {done[-1]} was written: it is complete"
    return _note["interrupt"]


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class PipeConsole(Console):
    """A rich console that leaves a closed pipe to `main()` (exit 0) instead of exiting 1 itself."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more can reach the reader
        raise BrokenPipeError


def make_console(stderr: bool = False, **kwargs: object) -> Console:
    """A rich console on stdout (or stderr): the terminal's width on a TTY, no wrapping when piped
    (unless COLUMNS is set, as a user asking for a width). A closed pipe ends the command quietly."""
    stream = sys.stderr if stderr else sys.stdout
    if not is_terminal(stream) and "COLUMNS" not in os.environ and "width" not in kwargs:
        kwargs["width"] = UNWRAPPED_WIDTH
    return PipeConsole(stderr=stderr, **kwargs)  # type: ignore[arg-type]


def check_format(value: str, allowed: tuple[str, ...] = FORMATS) -> str:
    """`--format` checked against the shared vocabulary (case-insensitively)."""
    folded = value.lower()
    if folded in allowed:
        return folded
    raise UserError(
        f"--format must be one of {', '.join(allowed)}, got {value!r}{did_you_mean(value, allowed)}"
    )


def progress_bar(*columns: rp.ProgressColumn | str, transient: bool = True) -> rp.Progress:
    """A progress display on stderr, shown only when stderr is a terminal."""
    console = make_console(stderr=True)
    return rp.Progress(
        *(columns or rp.Progress.get_default_columns()),
        console=console,
        transient=transient,
        disable=not console.is_terminal,
    )
