"""`precision.compile: auto` and `workers: auto`: what they pick, from the device, the run's shape and the
host's cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from objtrain.data import loader as D
from objtrain.data.loader import auto_workers
from objtrain.errors import UserError
from objtrain.objectives.registry import find_class
from objtrain.training import distributed as dist
from objtrain.training.config import build_config
from objtrain.training.loop import GRAPHS, compile_mode, prepare


def plan(device: str = "cuda", accumulation: int = 1, kind: str = "decoder", objective: str = "clm", **kw):  # type: ignore[no-untyped-def]
    splits = find_class(objective).splits_backward  # type: ignore[union-attr]
    return SimpleNamespace(
        device=torch.device(device),
        accumulation=accumulation,
        model_cfg=SimpleNamespace(kind=kind, mtp_heads=kw.get("heads", 1)),
        # the objective's own answer (MTP: its per-head backward on more than one head), without building it
        objective=SimpleNamespace(name=objective, splits_backward=lambda cfg: splits(None, cfg)),
        cfg=SimpleNamespace(parallel=kw.get("parallel", "ddp")),
        world=SimpleNamespace(distributed=kw.get("distributed", False)),
    )


def test_compile_auto_compiles_on_cuda_and_stays_eager_on_cpu() -> None:
    assert compile_mode("auto", plan("cpu")) is None
    assert compile_mode(False, plan("cuda")) is None
    assert compile_mode(True, plan("cpu")) == "default"  # asked for: compiled anywhere
    assert compile_mode("auto", plan("cuda")) == GRAPHS


@pytest.mark.parametrize(
    ("why", "settings", "want"),
    [
        ("gradient accumulation", {"accumulation": 2}, "default"),
        ("encoder-decoder rows vary in length", {"kind": "encdec", "objective": "span"}, "default"),
        ("MTP's per-head backward", {"objective": "mtp", "heads": 4}, "default, block by block"),
        ("FSDP", {"parallel": "fsdp", "distributed": True}, "default, block by block"),
        ("an encoder's rows are static", {"kind": "encoder", "objective": "mlm"}, GRAPHS),
    ],
)
def test_cuda_graphs_only_where_they_are_safe(why: str, settings: dict, want: str) -> None:
    assert compile_mode("auto", plan("cuda", **settings)) == want, why


def test_compile_takes_auto_true_and_false_only() -> None:
    assert build_config({}).precision.compile == "auto"
    for value in (True, False, "auto"):
        assert build_config({"precision": {"compile": value}}).precision.compile == value
    with pytest.raises(UserError, match="compile"):
        build_config({"precision": {"compile": "sometimes"}})


def test_train_with_compile_auto_on_cpu_trains_eagerly(train_store: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [
        sys.executable,
        "-m",
        "objtrain",
        "train",
        str(train_store),
        "--objective",
        "clm",
        "--model",
        "debug",
    ]
    cmd += [
        "--seq-len",
        "64",
        "--batch-size",
        "4",
        "--steps",
        "2",
        "precision.compile=auto",
        "logging.sample=false",
        "-o",
        str(run),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "compiled" not in done.stderr
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    assert not any(r.get("event") == "compile" for r in rows)


@pytest.mark.parametrize(
    ("device", "cores", "processes", "want"),
    [
        ("cuda", 16, 1, 4),  # a GPU alone on a 16-core host: 4 workers
        ("cuda", 112, 8, 4),  # 8 GPUs, 14 cores each
        ("cuda", 16, 4, 2),  # 4 cores a GPU: 2 for workers
        ("cuda", 16, 8, 1),  # 2 cores a GPU: still one worker
        ("cpu", 2, 1, 1),
        ("cpu", 2, 2, 0),  # one core a process: the training needs it
        ("cpu", 64, 1, 1),
    ],
)
def test_auto_workers_from_the_cores(
    device: str, cores: int, processes: int, want: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert auto_workers(device, processes) == want


def test_prepare_resolves_auto_workers(
    train_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_config
) -> None:
    cfg = small_config(train_store, workers="auto")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert prepare(cfg, tmp_path / "a").workers == 1
    world = dist.World(0, 1, 0, local_world_size=8)  # eight processes on this host: one core each
    assert prepare(cfg, tmp_path / "b", world=world).workers == 0
    assert prepare(small_config(train_store, workers=3), tmp_path / "c").workers == 3
    with pytest.raises(UserError, match="workers"):
        small_config(train_store, workers=-1)


def test_pinned_batches_arrive_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the loader's thread pins each batch (`Wire.pin_memory`); `received` takes the pinned
    tensors as they are. (A CPU build cannot pin: pinning is stood in for by a copy here.)"""
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a: self.clone())
    ids = np.arange(12, dtype=np.int64).reshape(2, 6)
    fields = {
        "input_ids": ids,
        "labels": ids,
        "positions": ids,
        "document_ids": np.zeros_like(ids),
        "attention": "causal",
        "stats": {},
    }
    wire = D.Wire(fields).pin_memory()
    assert all(
        isinstance(v, torch.Tensor) for k, v in wire.fields.items() if isinstance(fields[k], np.ndarray)
    )
    ((_, batch),) = D.received(iter([("item", wire)]))
    assert torch.equal(batch.input_ids, torch.from_numpy(ids)) and batch.attention == "causal"
