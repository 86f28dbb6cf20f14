"""Ctrl-C and closed pipes, through the real entry point in a subprocess (`python -m objtrain`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

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
def test_ctrl_c_while_writing_removes_the_temporary(tmp_path: Path) -> None:
    out = tmp_path / "store"
    proc = subprocess.Popen(objtrain_cmd(*STDLIB_RUN, "-o", out), env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_able)  # fmt: skip
    _wait_for(lambda: any(p.name.endswith(".tmp") for p in tmp_path.iterdir()), proc, "the encoding phase")
    _assert_one_interrupted_line(*_interrupt(proc))
    assert list(tmp_path.iterdir()) == []  # neither the store nor its temporary


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
