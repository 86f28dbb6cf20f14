"""`objtrain train` as a user meets it: refusals (one line, exit 2, nothing left behind), SIGKILL at any
moment (including mid-save), Ctrl-C, two processes under torchrun, --dry-run."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from objtrain.cli import main
from objtrain.training import checkpoint as ckpt

QUICK = ["--model", "debug", "--seq-len", "64", "--dtype", "fp32", "--device", "cpu", "workers=0",
         "logging.tensorboard=false", "logging.sample=false", "validation.every=-1"]  # fmt: skip


def run_main(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["objtrain", "train", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err
    code = exc.value.code
    return (code if isinstance(code, int) else 0), err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--objective", "mlm", "--model-kind", "decoder"], "cannot train a decoder"),
        (["--objective", "ul2", "--seq-len", "4"], "seq-len 4"),
        (["--objective", "clm", "--batch-size", "6", "--micro-batch-size", "4"], "does not divide"),
        (["--objective", "clm", "optim.lrr=1"], "lrr"),
        (["--objective", "clm", "--dtype", "fp16"], "fp16"),
        (["--objective", "nope"], "unknown objective"),
        (["--objective", "contrastive", "model.dropout=0"], "needs model dropout > 0"),
        (["--objective", "clm", "--lr", "-1"], "lr must be a finite number > 0"),
        (["--objective", "clm", "--lr", "0"], "lr must be a finite number > 0 (at 0 the weights never move)"),
        (["--objective", "clm", "optim.lr=0"], "got 0"),
        (["--objective", "clm", "--keep", "0"], "checkpoint.keep (--keep) >= 1"),
        (["--objective", "clm", "workers=-1"], "workers must be >= 0"),
        (["--objective", "clm", "model.attention_kernel=flex"], "flex cannot train on CPU"),
        (["--objective", "clm", "--steps", "1", "--resume", "--force"], "--resume continues RUN and --force"),
        (["--objective", "clm", "--time", "nan"], "the budget must be positive and finite, got nan"),
        (["--objective", "clm", "--nproc", "0"], "--nproc must be at least 1, got 0"),
        (["objective=3"], "train.objective must be a mapping"),
        # a run key given bare or under a mistyped section: name the dotted key and the flag
        (["--objective", "clm", "lr=1e-3"], "did you mean optim.lr or --lr?"),
        (["--objective", "clm", "optimizer.lr=1e-3"], "did you mean optim.lr or --lr?"),
        (["--objective", "fim", "sched.kind=wsd"], "did you mean schedule.kind?"),
        (["--objective", "clm", "n_layr=8"], "did you mean model.n_layer?"),
        (["--objective", "fim", "fim_rat=0.9"], "did you mean 'fim_rate'?"),  # still the objective's own
    ],
)
def test_refusals_are_one_line_and_leave_nothing(
    args: list[str], message: str, train_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    run = tmp_path / "run"
    code, err = run_main([str(train_store), *QUICK, *args, "-o", str(run)], monkeypatch, capsys)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not run.exists()


@pytest.mark.parametrize("objective", ["clm", "fim"])
def test_a_finished_run_prints_a_greedy_sample_and_a_fim_model_an_infill(
    objective: str, train_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    quick = [a for a in QUICK if a != "logging.sample=false"]
    args = [str(train_store), *quick, "--objective", objective, "--steps", "2", "-o", str(tmp_path / "run")]
    code, err = run_main(args, monkeypatch, capsys)
    assert code == 0, err
    assert "sample (greedy):" in err
    assert ("infill (" in err) == (objective == "fim")


def test_refuses_an_existing_run_and_a_store_without_a_valid_split(
    train_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "mine.txt").write_text("keep me")
    code, err = run_main(
        [str(train_store), *QUICK, "--objective", "clm", "-o", str(run)], monkeypatch, capsys
    )
    assert code == 2 and "already exists" in err and (run / "mine.txt").read_text() == "keep me"
    # --force replaces an earlier run, never a folder of the user's that happens to have the name
    code, err = run_main(
        [str(train_store), *QUICK, "--objective", "clm", "-o", str(run), "--force"], monkeypatch, capsys
    )
    assert code == 2 and "is not a training run" in err and (run / "mine.txt").read_text() == "keep me"
    assert [p.name for p in run.iterdir()] == ["mine.txt"]  # not even a lock file left in it

    from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus

    text = tmp_path / "t.txt"
    text.write_text("def f(x):\n    return x + 1\n\n" * 40)
    no_valid = tmp_path / "novalid"
    tokenize_corpus([text], no_valid, TokenizeConfig(tokenizer=train_store, valid_fraction=0.0))
    args = [str(no_valid), *QUICK[:-1], "--objective", "clm", "-o", str(tmp_path / "r2")]
    code, err = run_main(args, monkeypatch, capsys)
    assert code == 2 and "valid" in err and not (tmp_path / "r2").exists()


def test_a_text_file_as_data_suggests_tokenizing_it_into_a_new_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    text = tmp_path / "plain.txt"
    text.write_text("def f(x):\n    return x\n")
    code, err = run_main(
        [str(text), *QUICK, "--objective", "clm", "-o", str(tmp_path / "r")], monkeypatch, capsys
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    # the store goes to a new path, never over the text file
    assert f"objtrain tokenize {text} -o STORE" in err and f"-o {text}" not in err
    assert text.read_text() == "def f(x):\n    return x\n" and not (tmp_path / "r").exists()


@pytest.mark.parametrize("damage", ["valid.bin cut short", "train token past the vocabulary"])
def test_a_damaged_store_is_refused_before_the_run_directory_is_made(
    damage: str, train_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    store = tmp_path / "store"
    shutil.copytree(train_store, store)
    if damage == "valid.bin cut short":
        (store / "valid.bin").write_bytes((store / "valid.bin").read_bytes()[:-2])
        message = "valid.bin is"
    else:
        dtype = np.dtype(json.loads((store / "meta.json").read_text())["dtype"])
        tokens = np.memmap(store / "train.bin", dtype=dtype, mode="r+")
        tokens[len(tokens) // 2] = np.iinfo(dtype).max
        tokens.flush()
        del tokens
        message = f"'train' split holds token id {np.iinfo(dtype).max}, outside the tokenizer's"
    run = tmp_path / "run"
    args = [str(store), *QUICK[:-1], "--objective", "clm", "--steps", "2", "-o", str(run)]
    code, err = run_main(args, monkeypatch, capsys)
    assert code == 2 and message in err and "--seq-len" not in err, err
    assert len(err.strip().splitlines()) == 1 and not run.exists()


def test_dry_run_prints_sizes_and_writes_nothing(
    train_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr(sys, "argv", ["objtrain", "train", str(train_store), *QUICK, "--objective", "mtp",
                                      "--dry-run", "-o", str(tmp_path / "run")])  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code in (0, None)
    out = capsys.readouterr().out
    for word in ("parameters", "FLOPs per token", "tokens per step", "optimizer state", "activations"):
        assert word in out
    assert not (tmp_path / "run").exists()


def _cli(store: Path, run: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "objtrain", "train", str(store), *QUICK, "--objective", "clm",
            "--batch-size", "8", "--steps", "12", "-o", str(run), *extra]  # fmt: skip


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    # faulthandler: a rank that aborts (SIGABRT) or segfaults prints every thread's Python stack first
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **extra})
    return env


def _failure(done: subprocess.CompletedProcess) -> str:
    """All of a failed launch's output: under torchrun the cause (a rank's own traceback or abort message)
    comes long before the launcher's summary at the end."""
    out = (done.stdout or b"").decode(errors="replace") + (done.stderr or b"").decode(errors="replace")
    return f"exit {done.returncode}:\n{out[-20000:]}"


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    latest = ckpt.latest_checkpoint(run)
    assert latest is not None
    assert json.loads((latest / "state.json").read_text())["step"] == 12
    return load_file(latest / "model.safetensors")


def _group(pgid: int) -> list[int]:
    """Live processes of process group `pgid` (zombies, already dead, are left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, _, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            found.append(int(entry.name))
    return found


def _gone(pgid: int, timeout: float = 60.0) -> list[int]:
    """Wait until no process of group `pgid` is left; returns those still there at the deadline."""
    deadline = time.time() + timeout
    while (left := _group(pgid)) and time.time() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process groups from /proc")
def test_sigkill_at_any_moment_resumes_to_the_same_weights(train_store: Path, tmp_path: Path) -> None:
    # Dropout on: each resumed process must draw the dropout masks the run never stopped drew, so nothing
    # may touch the global RNG between restoring it and the first resumed step. The killed runs load with
    # two worker processes (the straight run with none: data are a pure function of the row), and nothing
    # of a killed run may outlive it: a worker left behind holds its memory for ever.
    dropout = "model.dropout=0.1"
    straight = tmp_path / "straight"
    subprocess.run(
        _cli(train_store, straight, dropout, "--save-every", "1"), env=_env(), check=True, capture_output=True
    )
    expected = _final_weights(straight)

    run = tmp_path / "killed"
    root = run / "checkpoints"
    rng = random.Random(7)
    env = _env(OBJTRAIN_SAVE_DELAY="0.05")  # widen the window in which a kill lands mid-save

    def steps_logged() -> int:
        path = run / "metrics.jsonl"
        return sum('"loss"' in line for line in path.read_text().splitlines()) if path.exists() else 0

    def wait_for(predicate, timeout: float = 600.0) -> None:  # type: ignore[no-untyped-def]
        deadline = time.time() + timeout
        while not predicate() and time.time() < deadline:
            time.sleep(0.005)

    mid_save = 0
    helpers_seen = 0
    for attempt in range(3):
        resume = ["--resume"] if attempt else []
        args = _cli(train_store, run, dropout, "--save-every", "1", "workers=2", *resume)
        proc = subprocess.Popen(
            args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        before = steps_logged()
        wait_for(lambda b=before, p=proc: steps_logged() >= b + 2 or p.poll() is not None)
        if attempt == 0:  # kill inside a save: the moment its temporary directory exists
            wait_for(lambda: root.is_dir() and any(p.name.endswith(".tmp") for p in root.iterdir()))
        else:  # anywhere
            time.sleep(rng.uniform(0.0, 0.3))
        assert proc.poll() is None, "the run ended before it could be killed"
        helpers_seen += len(_group(proc.pid)) - 1
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        proc.stderr.close()  # type: ignore[union-attr]
        left = _gone(proc.pid)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"processes {left} of a SIGKILLed run survived it"
        mid_save += any(p.name.endswith(".tmp") for p in root.iterdir())
    assert mid_save >= 1  # at least one kill landed in the middle of a save
    assert helpers_seen > 0  # the runs had loader workers to leave behind
    final = subprocess.run(
        _cli(train_store, run, dropout, "--save-every", "1", "--resume"), env=env, capture_output=True
    )
    assert final.returncode == 0, final.stderr.decode()[-400:]
    got = _final_weights(run)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(
    "sig, group, workers, code",
    [(signal.SIGINT, False, 0, 130), (signal.SIGTERM, True, 1, 143)],
    ids=["ctrl-c", "sigterm-to-the-group-with-a-loader-worker"],
)
def test_a_signal_saves_a_checkpoint_and_exits(
    train_store: Path, tmp_path: Path, sig: int, group: bool, workers: int, code: int
) -> None:
    # `timeout`, `kill -- -PGID`, Slurm and systemd signal the whole group, loader workers included
    run = tmp_path / "run"
    args = [*_cli(train_store, run), f"workers={workers}"]
    args[args.index("12")] = "100000"
    proc = subprocess.Popen(
        args, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=group
    )
    metrics = run / "metrics.jsonl"
    # On a busy machine starting the process alone can take a minute or more: wait for its third step (a
    # signal before training starts writes nothing, rightly), however long that takes within reason.
    deadline = time.time() + 600
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.1)
    if not metrics.exists() or len(metrics.read_text().splitlines()) < 3:
        os.killpg(proc.pid, signal.SIGKILL) if group else proc.kill()
        proc.communicate()
        pytest.fail("the run logged no third step within 600 s")
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == code, err.decode()[-400:]
    assert b"interrupted at step" in err and b"Traceback" not in err
    latest = ckpt.latest_checkpoint(run)
    assert latest is not None and ckpt.is_complete(latest)
    step = json.loads((latest / "state.json").read_text())["step"]
    assert step >= 3


# A failure the loop does not expect, in the middle of a run with a loader worker: `objtrain train` as the
# user starts it, with validation made to raise.
_BREAK_VALIDATION = """
import sys
from objtrain.cli import main
from objtrain.training import loop

def broken(*args, **kwargs):
    raise RuntimeError("validation broke")

loop.validate = broken
sys.argv = ["objtrain", *sys.argv[1:]]
main()
"""


def test_an_error_mid_run_exits_instead_of_waiting_on_its_loader_workers(
    train_store: Path, tmp_path: Path
) -> None:
    # The workers ignore SIGTERM (so a signal to the group reaches the trainer alone): left running after an
    # error, the interpreter's exit, which terminates and then joins them, would wait forever.
    args = _cli(train_store, tmp_path / "run", "workers=1", "validation.every=2")
    args[1:3] = ["-c", _BREAK_VALIDATION]
    proc = subprocess.Popen(
        args, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("objtrain train did not exit after an error with a loader worker running")
    assert proc.returncode == 1 and b"validation broke" in err, err.decode()[-400:]


def test_two_processes_match_one_and_resume(train_store: Path, tmp_path: Path) -> None:
    def losses(run: Path) -> list[float]:
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in rows if "loss" in r]

    one = tmp_path / "one"
    subprocess.run(_cli(train_store, one, "--save-every", "6", "--keep", "5"), env=_env(), check=True,
                   capture_output=True)  # fmt: skip
    two = tmp_path / "two"
    cmd = _cli(train_store, two, "--save-every", "6", "--keep", "5", "--nproc", "2")  # launches torchrun
    done = subprocess.run(cmd, env=_env(OBJTRAIN_DIST_TIMEOUT="300"), capture_output=True, timeout=900)
    assert done.returncode == 0, _failure(done)
    assert losses(two) == pytest.approx(losses(one), rel=1e-5)
    w1, w2 = _final_weights(one), _final_weights(two)
    for k in w1:
        # Sums in another order differ by ~1e-8; Adam's m/sqrt(v) can turn that into a step-sized difference
        # for a weight whose gradient is ~0, so compare at a tenth of one lr-sized step.
        torch.testing.assert_close(w2[k], w1[k], rtol=0, atol=3e-4)
    # Resume the two-process run from its step-6 checkpoint: the same weights as its straight run.
    import shutil

    shutil.rmtree(two / "checkpoints" / "step-00000012")
    (two / "checkpoints" / "latest").unlink()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd = [*torchrun, *_cli(train_store, two, "--save-every", "6", "--keep", "5", "--resume")[1:]]
    done = subprocess.run(cmd, env=_env(OBJTRAIN_DIST_TIMEOUT="300"), capture_output=True, timeout=900)
    assert done.returncode == 0, _failure(done)
    w3 = _final_weights(two)
    assert all(torch.equal(w3[k], w2[k]) for k in w2)


def test_fsdp_matches_one_process_and_resumes(train_store: Path, tmp_path: Path) -> None:
    def losses(run: Path) -> list[float]:
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in rows if "loss" in r]

    one, sharded = tmp_path / "one", tmp_path / "fsdp"
    subprocess.run(_cli(train_store, one), env=_env(), check=True, capture_output=True)
    cmd = _cli(train_store, sharded, "--save-every", "6", "--keep", "5", "parallel=fsdp", "--nproc", "2")
    done = subprocess.run(cmd, env=_env(OBJTRAIN_DIST_TIMEOUT="300"), capture_output=True, timeout=900)
    assert done.returncode == 0, _failure(done)
    assert losses(sharded) == pytest.approx(losses(one), rel=1e-5)
    full = _final_weights(sharded)  # gathered in full: a plain checkpoint that `generate` and `eval` load
    from objtrain.models.checkpoint import load_checkpoint

    assert load_checkpoint(ckpt.latest_checkpoint(sharded)).config.kind == "decoder"  # type: ignore[arg-type]
    import shutil

    shutil.rmtree(sharded / "checkpoints" / "step-00000012")
    (sharded / "checkpoints" / "latest").unlink()
    done = subprocess.run(
        [*cmd, "--resume"], env=_env(OBJTRAIN_DIST_TIMEOUT="300"), capture_output=True, timeout=900
    )
    assert done.returncode == 0, _failure(done)
    resumed = _final_weights(sharded)
    assert all(torch.equal(resumed[k], full[k]) for k in full)
