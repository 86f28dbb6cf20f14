"""Ctrl-C and closed pipes, through the real entry point in a subprocess (`python -m objtrain`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from newcomer_helpers import Result, objtrain_cmd, subprocess_env

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to time the signal")

STDLIB_RUN = (
    "tokenize",
    "--corpus",
    "stdlib",
    "--vocab-size",
    "1000",
    "--train-bytes",
    "200000",
    "--threads",
    "1",
)


def _loading_torch(pid: int) -> bool:
    """The process is importing torch (its shared library is mapped): past the interpreter's own start-up,
    inside objtrain's, where a Ctrl-C used to print a KeyboardInterrupt traceback."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def _temporaries(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.endswith(".tmp")]


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP has taken effect: state T in /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] in "Tt"  # the state follows the command name in parentheses


def _wait_for(condition, proc: subprocess.Popen, what: str, limit: float = 120) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while not condition():
        assert proc.poll() is None, f"ended before {what}"
        assert time.monotonic() < deadline, f"never reached {what}"
        time.sleep(0.01)


def _ctrl_c_able() -> None:
    """In the child before exec: SIGINT handled as in a terminal's foreground job. A test run in the
    background (`&`, nohup, some CI runners) ignores SIGINT, and a child inherits that, so the Ctrl-C
    these tests send would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def _assert_one_interrupted_line(code: int, err: str) -> None:
    assert code == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines() == ["interrupted; nothing was written"], repr(err)


@pytest.mark.slow
def test_ctrl_c_during_start_up(tmp_path: Path) -> None:
    out = tmp_path / "store"
    proc = subprocess.Popen(objtrain_cmd(*STDLIB_RUN, "-o", out), env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_able)  # fmt: skip
    _wait_for(lambda: _loading_torch(proc.pid), proc, "objtrain's imports")
    _assert_one_interrupted_line(*_interrupt(proc))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_sigterm_during_start_up_is_one_line(tmp_path: Path) -> None:
    """`timeout` and `docker stop` send SIGTERM: while torch loads it ends the start-up in one line, 143."""
    out = tmp_path / "store"
    proc = subprocess.Popen(objtrain_cmd(*STDLIB_RUN, "-o", out), env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    _wait_for(lambda: _loading_torch(proc.pid), proc, "objtrain's imports")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["terminated (SIGTERM); nothing was written"], repr(err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_ctrl_c_while_writing_removes_the_temporary(tmp_path: Path) -> None:
    out = tmp_path / "store"
    proc = subprocess.Popen(objtrain_cmd(*STDLIB_RUN, "-o", out), env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_able)  # fmt: skip
    _wait_for(lambda: _temporaries(tmp_path), proc, "the encoding phase")
    # Hold the run still, check that it is writing, and let the Ctrl-C land exactly there: on a busy
    # machine the test may be off the CPU between its look and the signal while the run goes on.
    proc.send_signal(signal.SIGSTOP)
    _wait_for(lambda: _stopped(proc.pid), proc, "the stop")
    assert _temporaries(tmp_path) and not out.exists(), "the run was not writing when it stopped"
    proc.send_signal(signal.SIGINT)  # pending until it runs again
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=60)
    if out.exists():
        # Stopped inside the rename's own system call (microseconds of a phase of seconds): the store is
        # whole, and the line must say so rather than "nothing was written".
        assert proc.returncode == 130 and err.strip().splitlines() == [
            f"interrupted after {out} was written: it is complete"
        ], err
        assert [p.name for p in tmp_path.iterdir()] == ["store"] and (out / "meta.json").is_file()
        return
    _assert_one_interrupted_line(proc.returncode, err)
    assert list(tmp_path.iterdir()) == []  # neither the store nor its temporary


def _ctrl_c_right_after(monkeypatch: pytest.MonkeyPatch, name: str, first_arg: Callable[[str], bool]) -> None:
    """`os.<name>` does its work, then a Ctrl-C lands before the line that called it gets the result (once,
    for the call whose first argument matches): the narrowest window a writer has to survive."""
    real = getattr(os, name)

    def cut(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if first_arg(os.fspath(args[0])):
            monkeypatch.setattr(os, name, real)
            if name == "open":
                os.close(result)
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(os, name, cut)


@pytest.mark.parametrize(
    "writer, call",
    [("atomic_dir", "mkdir"), ("atomic_file", "open"), ("check_writable", "open")],
)
def test_ctrl_c_right_after_a_temporary_is_made_removes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer: str, call: str
) -> None:
    """The temporary (or the writability probe) exists from the moment the system call returns: a Ctrl-C
    that lands before its name reached the writer used to leave it behind (`tempfile.mkdtemp` and
    `mkstemp` return the name only after making it)."""
    import objtrain.io as objtrain_io

    _ctrl_c_right_after(monkeypatch, call, lambda name: Path(name).parent == tmp_path)
    with pytest.raises(KeyboardInterrupt):
        if writer == "check_writable":
            objtrain_io.check_writable(tmp_path / "out")
        else:
            with getattr(objtrain_io, writer)(tmp_path / "out"):
                pass
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_between_the_renames_of_a_replace_puts_the_previous_output_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objtrain.io import atomic_dir, completed_outputs, forget_completed

    out = tmp_path / "out"
    out.mkdir()
    (out / "data").write_text("the previous store")
    forget_completed()
    _ctrl_c_right_after(monkeypatch, "replace", lambda name: name == str(out))  # out -> .out.old, then ^C
    with pytest.raises(KeyboardInterrupt), atomic_dir(out, force=True) as tmp:
        (tmp / "data").write_text("the new store")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert (out / "data").read_text() == "the previous store"
    assert completed_outputs() == []  # "nothing was written" is what the line says


def test_ctrl_c_before_the_temporary_is_made_is_not_a_complete_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary's name is held before it exists: a missing temporary only means it was renamed into
    place once the writing is over, not when the Ctrl-C came before the mkdir (over an existing output)."""
    from objtrain.io import atomic_dir, completed_outputs, forget_completed

    out = tmp_path / "out"
    out.mkdir()
    (out / "data").write_text("the previous store")
    forget_completed()

    real = os.mkdir

    def ctrl_c_before_the_temporary(name: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(name).endswith(".tmp"):
            raise KeyboardInterrupt
        real(name, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", ctrl_c_before_the_temporary)
    with pytest.raises(KeyboardInterrupt), atomic_dir(out, force=True):
        pass
    assert completed_outputs() == [] and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_closed_pipe_ends_quietly(small_store: Path) -> None:
    proc = subprocess.Popen(
        objtrain_cmd("corrupt", small_store, "--objective", "span", "--format", "jsonl", "--n", "300"),
        env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    assert first.startswith(b"{")
    proc.stdout.close()  # `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert err == ""


def test_ctrl_c_after_the_output_is_in_place_says_it_is_complete(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import objtrain.cli.tokenize as tokenize_cli
    from objtrain.data.store import TokenStore

    def ctrl_c(*args: object, **kwargs: object) -> None:  # while the summary prints, after the rename
        raise KeyboardInterrupt

    text = tmp_path / "corpus.txt"
    text.write_text("def f(x):\n    return x\n\n\ndef g(y):\n    return y\n", encoding="utf-8")
    monkeypatch.setattr(tokenize_cli, "print_summary", ctrl_c)
    out = tmp_path / "store"
    code, _, err = cli("tokenize", text, "--tokenizer", small_store, "-o", out)
    assert code == 130 and err.strip().splitlines() == [
        f"interrupted after {out} was written: it is complete"
    ]
    assert TokenStore.open(out).tokenizer is not None  # whole, as the line says
    # the next command's Ctrl-C, before it wrote anything, is "nothing was written" again
    monkeypatch.setattr(tokenize_cli, "tokenize_corpus", ctrl_c)
    code, _, err = cli("tokenize", text, "--tokenizer", small_store, "-o", tmp_path / "other")
    assert code == 130 and err.strip().splitlines() == ["interrupted; nothing was written"]


def test_ctrl_c_once_the_command_has_finished_is_ignored(tmp_path: Path, small_store: Path) -> None:
    """A Ctrl-C that lands in the interpreter's shutdown (here: sent by an exit hook) neither prints a
    stray KeyboardInterrupt under exit 0 nor kills the process without a word."""
    script = (
        "import atexit, os, signal, sys\n"
        "atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from objtrain.__main__ import main\n"
        "sys.argv = ['objtrain', *sys.argv[1:]]\n"
        "main()\n"
    )
    out = tmp_path / "packed"
    done = subprocess.run([sys.executable, "-c", script, "pack", small_store, "--seq-len", "64", "-o", out],
                          env=subprocess_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert (out / "meta.json").is_file()
    # a command that failed keeps Ctrl-C as it was (it ends now anyway), and in-process callers keep theirs
    from objtrain.cli import main

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit):
        main(["pack", str(small_store), "--seq-len", "64", "-o", str(out)])  # exists: refused, exit 2
    with pytest.raises(SystemExit):
        main(["corrupt", "--list"])
    assert signal.getsignal(signal.SIGINT) is before
