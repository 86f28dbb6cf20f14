"""The `objtrain` command line: thin glue over library functions, one module per subcommand.

`main()` owns how every command ends: bad input is one line and exit 2 (UserError, usage errors, typer's
own option errors too), Ctrl-C is one line and exit 130, SIGTERM and SIGHUP (`timeout`, Slurm preemption,
`docker stop`, a closed terminal) the same as Ctrl-C with exit 143 and 129 (the output's temporaries go on
the way out), a closed pipe (`objtrain corrupt ... | head`) ends quietly with exit 0.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import signal
import sys
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, TypeVar

import typer
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup
from typer.main import get_command, get_command_from_info
from typer.models import CommandInfo

import objtrain
from objtrain.cli import common
from objtrain.errors import UserError, check_seed
from objtrain.io import forget_completed, is_unwritable, unwritable

F = TypeVar("F", bound=Callable[..., Any])
# click as typer carries it (its own copy): the base of its usage errors, and the end of a prompt
_ClickException: type[Exception] = typer.BadParameter.__mro__[2]
_Abort: type[BaseException] = typer.Abort


class _Interrupted(BaseException):
    """Ctrl-C inside a command, carried past click (which would turn it into a silent exit 130)."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signum)
        self.signum = signum


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP: unwinds the command as Ctrl-C does (every `finally` and cleanup runs)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# Signals that end a command as Ctrl-C does; train's loop takes SIGTERM over to save a checkpoint first.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


# The ending signals received while this command runs: an exception a C extension raises in place of the
# signal's `Terminated` (numpy's `tofile` interrupted reports a TypeError) is still that signal's end.
_TERMINATED: list[int] = []


def _terminate(signum: int, frame: Any) -> None:
    _TERMINATED.append(signum)
    raise Terminated(signum)


@contextlib.contextmanager
def _ending_signals_interrupt() -> Any:
    """SIGTERM and SIGHUP raise `Terminated` while a command runs (main thread only: elsewhere Python
    cannot install handlers), restored after."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for sig in ENDING_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup`'s ignored SIGHUP stays ignored
            previous[sig] = signal.signal(sig, _terminate)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _PipeClosed(BaseException):
    """The reader of stdout went away (`| head`): not an error."""


def _guarded(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt as exc:
            raise _Interrupted(getattr(exc, "signum", signal.SIGINT)) from None
        except BrokenPipeError:
            raise _PipeClosed from None
        except Exception:
            if _TERMINATED:  # the signal's unwinding, re-raised as another error on the way
                raise _Interrupted(_TERMINATED[-1]) from None
            raise

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        import platform
        from importlib import metadata

        try:  # torch's own record of its version: importing torch would take seconds
            torch_version = metadata.version("torch")
        except metadata.PackageNotFoundError:  # a torch built in place, without package metadata
            import torch

            torch_version = torch.__version__
        print(f"objtrain {objtrain.__version__} (torch {torch_version}, Python {platform.python_version()})")
        raise typer.Exit()


# Every command: its module in objtrain/cli/ (each has a `run`), and the first paragraph of its help, which
# `objtrain --help` lists without importing the module (and torch, which most of them load).
COMMANDS = {
    "tokenize": ("tokenize", "Tokenize a corpus into a token store (train and valid splits, memory-mapped)."),
    "pack": ("pack", "Pack a token store into rows of --seq-len tokens, each document followed by eos."),
    "corrupt": (
        "corrupt",
        "Show the original, the model input and the target of a few rows, aligned and coloured.",
    ),
    "train": ("train", "Pre-train a model with one objective (or a mixture), on a token or packed store."),
    "eval": (
        "evaluate",
        "Evaluate a checkpoint (or the newest checkpoint of a run directory) with everything it can do.",
    ),
    "compare": (
        "compare",
        "Train several arms under one equal budget, evaluate them with the same suite, report side by side.",
    ),
    "generate": (
        "generate",
        "Generate text from a checkpoint: continue a prompt, infill (FIM), fill masks or spans.",
    ),
    "export": (
        "export",
        "Export a checkpoint (or a run's newest one) as a Hugging Face transformers directory.",
    ),
}


class _Loaded(MutableMapping[str, Any]):
    """A group's commands by name, each built (its module imported) when first looked up."""

    def __init__(self, load: Callable[[str], Any]) -> None:
        self._load = load
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            if name not in COMMANDS:
                raise KeyError(name)
            self._built[name] = self._load(name)
        return self._built[name]

    def __setitem__(self, name: str, cmd: Any) -> None:
        self._built[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self._built[name]

    def __iter__(self) -> Iterator[str]:
        yield from COMMANDS
        yield from (name for name in self._built if name not in COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS) + sum(name not in COMMANDS for name in self._built)


class _Commands(TyperGroup):
    """The root group: a command's module is imported only when that command runs or shows its own help;
    the root's help lists every command from `COMMANDS` alone, so `objtrain --help` and `--version` answer
    without torch. `prepare`, where set, adjusts each command as it is built (`command()`)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.commands = _Loaded(self._build)
        self.prepare: Callable[[Any], None] | None = None
        self._listing = False

    def _build(self, name: str) -> Any:
        try:
            module = importlib.import_module(f"objtrain.cli.{COMMANDS[name][0]}")
        except KeyboardInterrupt as exc:  # Ctrl-C while torch loads: one line, as at any later moment
            raise _Interrupted(getattr(exc, "signum", signal.SIGINT)) from None
        info = CommandInfo(name=name, callback=_guarded(module.run))
        cmd = get_command_from_info(
            info, pretty_exceptions_short=True, rich_markup_mode=self.rich_markup_mode
        )
        if self.prepare is not None:
            self.prepare(cmd)
        return cmd

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # the names alone (typer's own reads every command)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if self._listing and cmd_name in COMMANDS:  # the root's help: a name and its first paragraph
            return TyperCommand(name=cmd_name, help=COMMANDS[cmd_name][1])
        return super().get_command(ctx, cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="objtrain",
    cls=_Commands,
    help="Pre-train language models with every major pre-training objective, and compare them honestly.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", help="Print the version and exit.", is_eager=True, callback=_version
    ),
) -> None:
    """Pre-train language models with every major pre-training objective, and compare them honestly."""


def _seed_checked(callback: Callable[..., Any] | None) -> Callable[..., Any]:
    """A `--seed` callback that validates the value (`check_seed`) before the command sees it."""

    def check(ctx: Any, param: Any, value: Any) -> Any:
        if value is not None:
            check_seed(value, "--seed")
        return callback(ctx, param, value) if callback is not None else value

    return check


def _plain_flags(cmd: Any) -> None:
    """On/off options shown as plain flags in --help, and a `--seed` validated (`check_seed`)."""
    helper = cmd.get_help_option(typer.Context(cmd))  # made on first use, then cached
    for param in [*cmd.params, *([helper] if helper is not None else [])]:
        if getattr(param, "is_flag", False):
            param.metavar = ""  # typer would show `--force <bool>` for a flag that takes no value
        if param.name == "seed":
            param.callback = _seed_checked(param.callback)


def command() -> Any:
    """The click command behind `app`, with on/off options shown as plain flags in --help, and every
    command's `--seed` validated the same way (each command as it is built)."""
    root = get_command(app)
    _plain_flags(root)
    root.prepare = _plain_flags
    return root


def _usage_line(exc: Any) -> str:
    """Click's usage error (an option's bad value, a missing argument) as one line, with where to look."""
    ctx = getattr(exc, "ctx", None)
    where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    return f"{exc.format_message()}{where}"


def _quiet_stdout() -> None:
    """After a closed pipe, point stdout at /dev/null so the interpreter's final flush stays silent."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(OSError, ValueError):
        os.dup2(devnull, sys.stdout.fileno())


def _finished() -> None:
    """The command is done: a Ctrl-C from now on (the interpreter's shutdown) is ignored. Python would
    raise it in a shutdown hook (a stray 'KeyboardInterrupt' under exit 0) or, once its handler is gone,
    die of the signal without a word, although everything was written."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main(argv: list[str] | None = None, program: bool = False) -> None:
    """Entry point: bad input is one line on stderr and exit 2, Ctrl-C one line and exit 130.

    Usage errors are typer's own (exit 2); everything a command raises arrives here past typer, which
    only ever ends by SystemExit. `program`: this is the process's own run (the `objtrain` executable),
    which ignores Ctrl-C once the command has succeeded; not when a caller (a test) runs commands in-process.
    """
    err = common.make_console(stderr=True)
    common.interrupt_note(common.NOTHING_WRITTEN)  # each run starts from the default (tests call main twice)
    forget_completed()
    _TERMINATED.clear()
    try:
        try:
            with _ending_signals_interrupt():
                code = command().main(args=argv, prog_name="objtrain", standalone_mode=False)
            if program:
                _finished()
            sys.exit(code if isinstance(code, int) else 0)
        except SystemExit as exc:
            if program and exc.code in (0, None):
                _finished()
            raise
        finally:
            sys.stdout.flush()  # a closed pipe shows here, inside the handlers below
    except UserError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True, markup=True)
        sys.exit(2)
    except _ClickException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `objtrain`: its help, as click shows it
            exc.show()
            sys.exit(exc.exit_code)
        line = escape(_usage_line(exc))
        err.print(f"[bold red]error:[/] {line}", highlight=False, soft_wrap=True, markup=True)
        sys.exit(exc.exit_code)
    except _Abort:  # click's own end of a prompt (EOF on stdin)
        err.print("[bold red]aborted[/]", highlight=False)
        sys.exit(1)
    except (_Interrupted, KeyboardInterrupt) as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        message = common.interrupted_message()
        if signum != signal.SIGINT:  # "terminated (SIGTERM); nothing was written"
            message = message.replace("interrupted", f"terminated ({signal.Signals(signum).name})", 1)
        err.print(f"[bold red]{escape(message)}[/]", highlight=False, soft_wrap=True)
        sys.exit(128 + signum)
    except (_PipeClosed, BrokenPipeError):
        _quiet_stdout()
        sys.exit(0)
    except OSError as exc:  # stdout on a full disk (`> /dev/full`); files say so in objtrain.io
        if not is_unwritable(exc):
            raise
        _quiet_stdout()
        line = escape(str(unwritable(exc, exc.filename or "the output")))
        err.print(f"[bold red]error:[/] {line}", highlight=False, soft_wrap=True)
        sys.exit(2)
