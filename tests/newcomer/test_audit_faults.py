"""Faults an outside audit found (issue 53): each one line and exit 2, or a clean end, never a traceback,
an unbounded allocation, or an output replaced by a run that was not asked to replace it."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from newcomer_helpers import Result, objtrain_cmd, subprocess_env
from safetensors.torch import load_file, save_file
from test_bad_input import refused

from objtrain.data.tokenizer import Tokenizer
from objtrain.models.checkpoint import save_checkpoint
from objtrain.models.zoo import build_model, model_config


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory, tokenizer: Tokenizer) -> Path:
    torch.manual_seed(0)
    model = build_model(model_config("decoder", "debug", vocab_size=tokenizer.vocab_size))
    root = tmp_path_factory.mktemp("audit")
    info = {"objective": "clm", "seq_len": 16}
    return save_checkpoint(root / "clm", model, tokenizer.specials, tokenizer, info)


@pytest.fixture(scope="module")
def nan_decoder(decoder: Path) -> Path:
    bad = decoder.parent / "nan"
    bad.mkdir()
    for file in decoder.iterdir():
        (bad / file.name).write_bytes(file.read_bytes())
    weights = load_file(str(bad / "model.safetensors"))
    key = sorted(weights)[0]
    weights[key] = weights[key].clone()
    weights[key].view(-1)[0] = float("nan")
    save_file(weights, str(bad / "model.safetensors"))
    return bad


def test_seeds_are_checked_once_for_every_command(
    cli: Callable[..., Result], small_store: Path, decoder: Path, tmp_path: Path
) -> None:
    for seed in ("-1", str(10**23), str(2**63)):
        err = refused(cli("train", small_store, "--objective", "clm", "--model", "debug", "--seq-len", "64",
                          "--steps", "1", "--seed", seed, "-o", tmp_path / "run"), "--seed")  # fmt: skip
        assert "seq-len" not in err
        refused(cli("generate", decoder, "--prompt", "x", "-n", "2", "--seed", seed), "--seed")
        refused(cli("pack", small_store, "--seed", seed, "-o", tmp_path / "p"), "--seed")
    assert not (tmp_path / "run").exists() and not (tmp_path / "p").exists()
    code, _, err = cli("generate", decoder, "--prompt", "x", "-n", "2", "--seed", str(2**63 - 1))
    assert code == 0, err


def test_a_seed_in_a_run_yaml_is_checked_too(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path
) -> None:
    refused(cli("train", small_store, "--objective", "clm", "--model", "debug", "seed=-1", "--steps", "1",
                "-o", tmp_path / "run"), "seed")  # fmt: skip


def test_typers_own_option_errors_are_one_line(cli: Callable[..., Result], decoder: Path) -> None:
    err = refused(cli("generate", decoder, "-n", "0"), "--max-new-tokens")
    assert "╭" not in err and "generate --help" in err
    refused(cli("pack"), "store")
    refused(cli("tokenize", "--vocab-size", "many"), "--vocab-size")


def test_generate_bounds_its_cache_by_the_models_context(
    cli: Callable[..., Result], decoder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from objtrain.models import generate as gen

    monkeypatch.setattr(gen, "CONTEXT_FLOOR", 24)  # the checkpoint trained on rows of 16
    code, out, err = cli("generate", decoder, "--prompt", "def f(", "-n", str(10**8), "--format", "json")
    assert code == 0 and "Traceback" not in err, err
    result = json.loads(out)
    assert 0 < result["n_tokens"] <= 24 and "usable context" in err and "24 positions" in err, err
    refused(cli("generate", decoder, "--prompt", "word " * 40, "-n", "4"), "usable context of 24")


def test_rows_that_cannot_fit_in_memory_are_refused_before_anything(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path
) -> None:
    huge = str(10**9)
    refused(cli("train", small_store, "--objective", "clm", "--model", "debug", "--seq-len", huge,
                "--steps", "1", "-o", tmp_path / "run"), f"--seq-len {huge}", "GiB", "estimate")  # fmt: skip
    refused(cli("pack", small_store, "--seq-len", huge, "-o", tmp_path / "p"), f"--seq-len {huge}", "GiB")
    assert sorted(tmp_path.iterdir()) == []


def test_non_finite_weights_are_refused_everywhere_weights_load(
    cli: Callable[..., Result], small_store: Path, nan_decoder: Path, tmp_path: Path
) -> None:
    refused(cli("generate", nan_decoder, "--prompt", "x", "-n", "4"), "NaN or infinite")
    refused(cli("eval", nan_decoder, "--data", small_store, "--format", "json"), "NaN or infinite")
    run = tmp_path / "runs" / "init"
    refused(cli("train", small_store, "--objective", "clm", "--init-from", nan_decoder, "--steps", "1",
                "--seq-len", "32", "validation.every=-1", "-o", run), "NaN or infinite")  # fmt: skip
    assert not run.exists() and not (tmp_path / "runs").exists()


def test_an_output_another_writer_claims_is_refused(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path
) -> None:
    from objtrain.io import OutputLock

    out = tmp_path / "packed"
    claim = OutputLock(out, "output", file=tmp_path / ".packed.lock")
    with claim:  # as a `pack` or `tokenize` still writing there holds it
        refused(cli("pack", small_store, "--seq-len", "32", "-o", out), "in use by another objtrain process")
        refused(cli("pack", small_store, "--seq-len", "32", "-o", out, "--force"), "in use")
    assert not out.exists()
    code, _, err = cli("pack", small_store, "--seq-len", "32", "-o", out)
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packed"]  # the claim file goes with the claim


def test_an_output_that_appears_during_the_work_is_not_replaced(tmp_path: Path) -> None:
    """The check before the work is not enough: one made meanwhile (by a writer that took no claim) stays."""
    from objtrain.errors import UserError
    from objtrain.io import atomic_dir

    out = tmp_path / "out"
    with pytest.raises(UserError, match="already exists"), atomic_dir(out) as tmp:
        (tmp / "ours").write_text("new")
        out.mkdir()
        (out / "theirs").write_text("kept")
    assert [p.name for p in out.iterdir()] == ["theirs"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary, no claim file


def test_two_writers_into_one_output_one_is_refused(tmp_path: Path, small_store: Path) -> None:
    """Two `pack` runs started together: while one holds the output, the other is refused."""
    out = tmp_path / "packed"
    command = objtrain_cmd("pack", small_store, "--seq-len", "32", "-o", out)
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    procs = [subprocess.Popen(command, env=subprocess_env(), **pipes) for _ in range(2)]  # type: ignore[call-overload]
    results = [(p.wait(timeout=120), p.communicate()[1]) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    err = next(e for c, e in results if c == 2)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packed"]


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to see the process stopped")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_while_writing_removes_the_temporary(tmp_path: Path, sig: signal.Signals) -> None:
    from test_signals import STDLIB_RUN, _stopped, _temporaries, _wait_for

    out = tmp_path / "store"
    proc = subprocess.Popen(objtrain_cmd(*STDLIB_RUN, "-o", out), env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    _wait_for(lambda: _temporaries(tmp_path), proc, "the encoding phase")
    proc.send_signal(signal.SIGSTOP)
    _wait_for(lambda: _stopped(proc.pid), proc, "the stop")
    proc.send_signal(sig)  # pending until it runs again
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"terminated ({sig.name})" in err, err
    if not out.exists():  # else stopped inside the rename: the store is whole, and the line says so
        assert list(tmp_path.iterdir()) == []


def test_resume_says_when_there_is_nothing_to_resume_and_names_a_different_kind(
    cli: Callable[..., Result], small_store: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    base = ("--model", "debug", "--steps", "1", "--seq-len", "32", "--batch-size", "2", "validation.every=-1")
    code, _, err = cli("train", small_store, "--objective", "mlm", *base, "--resume", "-o", run)
    assert code == 0, err
    assert "has no checkpoint to resume: --resume starts at step 0" in err, err
    err = refused(cli("train", small_store, "--objective", "clm", *base, "--resume", "-o", run))
    assert "holds an encoder model (trained with mlm)" in err and "asks for a decoder" in err, err


def test_an_error_raised_while_a_signal_unwinds_the_command_ends_as_that_signal() -> None:
    """A C extension interrupted by SIGHUP/SIGTERM may raise its own error in place of the signal's
    (numpy's `tofile` gave a TypeError): the command still ends as terminated, not with a traceback."""
    from objtrain import cli as cli_module

    @cli_module._guarded
    def command() -> None:
        try:
            cli_module._terminate(signal.SIGHUP, None)
        except cli_module.Terminated:
            raise TypeError("expected str, bytes or os.PathLike object, not BufferedWriter") from None

    cli_module._TERMINATED.clear()
    with pytest.raises(cli_module._Interrupted) as caught:
        command()
    assert caught.value.signum == signal.SIGHUP
    cli_module._TERMINATED.clear()

    @cli_module._guarded
    def plain() -> None:
        raise TypeError("a real bug")

    with pytest.raises(TypeError):  # without a signal, an error stays the error it is
        plain()
