"""What keeps a run safe to stop, resume, extend and share a disk with: the dtype a resume trains in, the
lock on a run directory, a write that fails mid-run, the run's records, and a budget raised on resume."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from rich.console import Console
from safetensors.torch import load_file

from objtrain import devices
from objtrain.errors import UserError
from objtrain.training import checkpoint as ckpt
from objtrain.training.loop import prepare, train


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def steps(run: Path) -> dict[int, dict]:
    """The last training record per step (a resumed run appends records for the steps it redoes)."""
    return {r["step"]: r for r in records(run) if "loss" in r}


def keep_only(run: Path, step: int) -> None:
    """The run as if stopped at its step-`step` checkpoint: later checkpoints and `latest` removed."""
    for path in (run / "checkpoints").iterdir():
        if path.name.startswith("step-") and int(path.name[5:]) > step:
            shutil.rmtree(path)
    (run / "checkpoints" / "latest").unlink()


# --- precision ------------------------------------------------------------------------------------------


def test_auto_dtype_on_a_gpu_or_mps_is_decided_by_its_units(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert devices.auto_dtype(torch.device("cuda"))[0] == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert devices.auto_dtype(torch.device("cuda"))[0] == "fp16"
    assert devices.auto_dtype(torch.device("mps"))[0] == "fp32"


def test_a_resume_keeps_the_precision_the_run_started_in(
    train_store: Path, tmp_path: Path, small_config
) -> None:
    run = tmp_path / "run"
    train(
        small_config(train_store, precision={"dtype": "bf16"}, budget={"steps": 4}, checkpoint={"every": 2}),
        run,
        show_progress=False,
    )
    keep_only(run, 2)
    # auto takes the checkpoint's bf16, though this CPU's own choice may be fp32
    plan = prepare(
        small_config(train_store, precision={"dtype": "auto"}, budget={"steps": 4}), run, resume=True
    )
    plan.release()
    assert plan.dtype == "bf16"
    with pytest.raises(UserError, match=r"trains in bf16.*--dtype fp32") as refused:
        prepare(small_config(train_store, precision={"dtype": "fp32"}, budget={"steps": 4}), run, resume=True)
    assert "\n" not in str(refused.value)
    resumed = train(
        small_config(train_store, precision={"dtype": "auto"}, budget={"steps": 4}), run, resume=True
    )
    assert resumed.step == 4
    assert json.loads((resumed.checkpoint / "state.json").read_text())["dtype"] == "bf16"  # type: ignore[operator]


# --- one process per run directory ----------------------------------------------------------------------


def test_a_run_directory_in_use_is_refused_and_a_dead_holders_lock_taken_over(
    train_store: Path, tmp_path: Path, small_config
) -> None:
    from objtrain.io import OutputLock

    run = tmp_path / "run"
    cfg = small_config(train_store, budget={"steps": 2})
    train(cfg, run, show_progress=False)
    more = small_config(train_store, budget={"steps": 4})
    held = prepare(more, run, resume=True)  # holds RUN as a training run does
    before = sorted(p.name for p in run.rglob("*"))
    with pytest.raises(UserError, match="in use by another objtrain process") as refused:
        train(more, run, resume=True, show_progress=False)
    assert "\n" not in str(refused.value)
    with pytest.raises(UserError, match="in use"):
        train(more, run, force=True, show_progress=False)  # --force does not pull it from under its user
    assert sorted(p.name for p in run.rglob("*")) == before
    held.release()

    # A holder killed with SIGKILL leaves its lock file; the kernel dropped the lock itself.
    code = "import sys, time; from objtrain.io import OutputLock; OutputLock(sys.argv[1]).acquire(); "
    code += "print('held', flush=True); time.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"pid {holder.pid}"):
            prepare(more, run, resume=True)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert (run / OutputLock.NAME).read_text().strip() == str(holder.pid)  # stale: its holder is dead
    assert train(more, run, resume=True, show_progress=False).step == 4


def test_two_cli_runs_into_one_directory_the_second_is_refused(train_store: Path, tmp_path: Path) -> None:
    run = tmp_path / "busy"
    args = [sys.executable, "-m", "objtrain", "train", str(train_store), "--objective", "clm",
            "--model", "debug", "--seq-len", "64", "--batch-size", "8", "--dtype", "fp32", "--device", "cpu",
            "logging.sample=false", "logging.tensorboard=false", "validation.every=-1",
            "-o", str(run)]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    first = subprocess.Popen(
        [*args, "--steps", "100000", "workers=1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and '"loss"' not in _text(run / "metrics.jsonl"):
            assert first.poll() is None, first.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
            time.sleep(0.2)
        lines_before = _text(run / "metrics.jsonl").count("\n")
        second = subprocess.run(
            [*args, "--steps", "100000", "--resume"], env=env, capture_output=True, timeout=300
        )
        err = second.stderr.decode()
        assert second.returncode == 2, err[-2000:]
        assert "in use by another objtrain process" in err and len(err.strip().splitlines()) == 1
        assert first.poll() is None  # the first run goes on, its records its own
        assert _text(run / "metrics.jsonl").count("\n") >= lines_before
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=600)


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


# --- a write that fails mid-run -------------------------------------------------------------------------


def test_a_full_disk_mid_run_is_one_line_and_keeps_the_last_good_checkpoint(
    train_store: Path, tmp_path: Path, small_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    import objtrain.io as oio

    real = oio.save_tensors
    calls = {"n": 0}

    def fills_the_disk(tensors, path, metadata=None):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] > 2:  # the model and the optimizer file of the first checkpoint fit; no more
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(tensors, path, metadata)

    monkeypatch.setattr(oio, "save_tensors", fills_the_disk)
    monkeypatch.setattr("objtrain.models.checkpoint.save_tensors", fills_the_disk)
    monkeypatch.setattr(ckpt, "save_tensors", fills_the_disk)
    run = tmp_path / "run"
    with pytest.raises(UserError) as failed:
        train(
            small_config(train_store, budget={"steps": 4}, checkpoint={"every": 2}), run, show_progress=False
        )
    message = str(failed.value)
    assert "\n" not in message and "No space left on device" in message
    assert "the last good checkpoint is" in message and "step-00000002" in message
    kept = ckpt.latest_checkpoint(run)
    assert kept is not None and kept.name == "step-00000002" and ckpt.is_complete(kept)
    leftovers = [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers == [] and not (run / "checkpoints" / "step-00000004").exists()  # nothing half-written


# --- the run's records ----------------------------------------------------------------------------------


def test_records_keep_the_runs_history_and_where_its_data_is(
    train_store: Path, tmp_path: Path, small_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    import objtrain
    from objtrain.evaluation.suite import run_dir_of

    monkeypatch.chdir(train_store.parent)  # the data typed relative to here, as `objtrain train store`
    run = tmp_path / "run"
    t0 = time.time()
    cfg = small_config(Path(train_store.name), budget={"steps": 4}, checkpoint={"every": 2})
    train(cfg, run, show_progress=False)
    first = (run / "config.yaml").read_bytes()
    record = yaml.safe_load(first)
    assert Path(record["data"]["store"]).is_absolute() and Path(record["data"]["store"]) == train_store
    made = record["provenance"]
    assert made["objtrain"] == objtrain.__version__ and made["torch"] == str(torch.__version__)
    assert "git_commit" in made and made["command"] and made["started"]
    rows = steps(run)
    assert all(
        r["elapsed"] >= r["wall_time"] and t0 - 1 <= r["time"] <= time.time() + 1 for r in rows.values()
    )
    assert rows[4]["elapsed"] >= rows[2]["elapsed"]

    keep_only(run, 2)
    monkeypatch.chdir(tmp_path)  # resumed from elsewhere, the store named another way
    train(small_config(train_store, budget={"steps": 4}, checkpoint={"every": 2}), run, resume=True)
    assert (run / "config.yaml").read_bytes() == first  # not rewritten: the run's start stays on record
    (resumed,) = sorted((run / "resumes").iterdir())
    assert resumed.name == "001-from-step-00000002.yaml"
    again = yaml.safe_load(resumed.read_text())
    assert (
        again["resumed_from"] == "step-00000002"
        and Path(again["provenance"]["cwd"]).resolve() == tmp_path.resolve()
    )
    # a resumed run appends records for the steps after its checkpoint; the last per step is the one kept
    assert [r["step"] for r in records(run) if "loss" in r] == [1, 2, 3, 4, 3, 4]
    assert steps(run)[4]["elapsed"] > rows[2]["elapsed"]  # summed over the parts: it does not restart at 0
    # `objtrain eval RUN` from any directory finds the run's data through config.yaml
    monkeypatch.chdir("/")
    assert run_dir_of(run / "checkpoints" / "step-00000004") == run
    assert Path(yaml.safe_load((run / "config.yaml").read_text())["data"]["store"]).is_dir()


# --- a budget raised on resume --------------------------------------------------------------------------


def _lrs(run: Path) -> dict[int, float]:
    return {s: r["lr"] for s, r in steps(run).items()}


def test_resume_with_a_bigger_budget_extends_the_run_and_says_what_the_lr_does(
    train_store: Path, tmp_path: Path, small_config
) -> None:
    def cfg(n: int, **more: object):  # type: ignore[no-untyped-def]
        base = {"budget": {"steps": n}, "checkpoint": {"every": 2, "keep": 10}, "schedule": {"warmup": 2}}
        return small_config(train_store, **(base | more))

    run = tmp_path / "run"
    train(cfg(6), run, show_progress=False)
    said = io.StringIO()
    done = train(cfg(10), run, resume=True, show_progress=False, console=Console(file=said, width=400))
    assert done.step == 10 and done.total_steps == 10
    (line,) = [x for x in said.getvalue().splitlines() if x.startswith("schedule:")]
    assert (
        "from 6 to 10 steps" in line and "goes on at it" in line
    )  # a finished cosine run stays at its floor
    lr = _lrs(run)
    floor = 1e-3 * 0.1 * 3  # min_lr_ratio 0.1 of small_config's lr 3e-3
    assert all(lr[s] == pytest.approx(floor) for s in (6, 7, 8, 9, 10))  # no jump back up

    # Extended from the middle of its decay: the rest of it stretched, from where it was, to the new end.
    run2 = tmp_path / "mid"
    train(cfg(8), run2, show_progress=False)
    original = _lrs(run2)
    keep_only(run2, 4)
    said = io.StringIO()
    train(cfg(16), run2, resume=True, show_progress=False, console=Console(file=said, width=400))
    assert "is stretched" in said.getvalue()
    lr2 = _lrs(run2)
    assert lr2[5] == pytest.approx(original[5])  # the first step after the raise: where the run was
    assert lr2[6] > original[6]  # then a slower decay, never rising, down to the floor at the new end
    assert all(lr2[s + 1] <= lr2[s] for s in range(4, 16)) and lr2[16] == pytest.approx(floor)

    # A raised run is as exact as any: stopped at step 12 of the raise and resumed, it ends the same.
    run3 = tmp_path / "again"
    shutil.copytree(run2, run3)
    keep_only(run3, 12)
    train(cfg(16), run3, resume=True, show_progress=False)
    a = load_file(ckpt.latest_checkpoint(run2) / "model.safetensors")  # type: ignore[operator]
    b = load_file(ckpt.latest_checkpoint(run3) / "model.safetensors")  # type: ignore[operator]
    assert all(torch.equal(a[k], b[k]) for k in a)

    with pytest.raises(UserError, match="extended, not shortened"):
        train(cfg(12), run2, resume=True, show_progress=False)


def test_a_wsd_run_extended_in_its_stable_phase_stays_stable(
    train_store: Path, tmp_path: Path, small_config
) -> None:
    def cfg(n: int):  # type: ignore[no-untyped-def]
        return small_config(
            train_store,
            budget={"steps": n},
            checkpoint={"every": 2, "keep": 10},
            schedule={"kind": "wsd", "warmup": 2, "decay_ratio": 0.25},
        )

    run = tmp_path / "run"
    train(cfg(8), run, show_progress=False)  # stable until step 6, then a decay over the last 2
    keep_only(run, 4)
    said = io.StringIO()
    train(cfg(16), run, resume=True, show_progress=False, console=Console(file=said, width=400))
    assert "stable phase goes on" in said.getvalue() and "steps 12-16" in said.getvalue()
    lr = _lrs(run)
    assert all(lr[s] == pytest.approx(3e-3) for s in range(3, 13)) and lr[16] == pytest.approx(3e-4)


def test_the_extended_schedule_equals_the_original_before_the_raise() -> None:
    from objtrain.training.config import ScheduleConfig
    from objtrain.training.optim import extended_lr_factor, lr_factor

    for kind in ("cosine", "linear", "constant", "wsd"):
        cfg = ScheduleConfig(kind=kind, warmup=10, min_lr_ratio=0.1, decay_ratio=0.2)  # type: ignore[arg-type]
        plain = [lr_factor(s, 100, cfg) for s in range(100)]
        assert [extended_lr_factor(s, [(0, 100)], cfg) for s in range(100)] == plain
        for at in (5, 40, 90, 100):
            raised = [extended_lr_factor(s, [(0, 100), (at, 300)], cfg) for s in range(300)]
            assert raised[:at] == plain[:at]
            if at >= 10:  # past warmup the lr never rises and ends at the floor (constant: stays at 1)
                assert all(b <= a + 1e-12 for a, b in zip(raised[at - 1 :], raised[at:], strict=False))
                assert raised[-1] == pytest.approx(1.0 if kind == "constant" else 0.1)
