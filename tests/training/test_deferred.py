"""A step's numbers are read from the device only when they are logged (`objtrain.training.steps`):
between reads a step makes no host read at all; the reads give the records per-step reads gave; a
non-finite loss still stops the run within its logging interval, naming the step and the last good
checkpoint."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from objtrain.training import checkpoint as ckpt
from objtrain.training import loop
from objtrain.training.loop import NonFiniteLoss, train
from objtrain.training.steps import StepFigures, host_counts, read_window

# Every way a tensor's value reaches Python: on a GPU each one waits for the kernels queued before it.
# (`.numpy()` is not one: on a GPU tensor it raises; the loop uses it on the loader's host batches.)
READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "cpu")


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


class Reads:
    """Counts tensor reads per step while `on`, with where each came from."""

    def __init__(self) -> None:
        self.on = False
        self.step = 0
        self.seen: dict[int, list[str]] = {}

    def hit(self, name: str) -> None:
        if self.on:
            where = traceback.extract_stack(limit=4)[0]
            self.seen.setdefault(self.step, []).append(f"{name} at {where.filename}:{where.lineno}")


@pytest.mark.parametrize(
    "sections",
    [
        {},
        {"objective": {"name": "nsp"}, "model": {"kind": "encoder"}},  # a pair term and metrics
        {"objective": {"name": "mtp"}, "batch": {"micro_batch_size": 4}},  # per-head backward, accumulation
    ],
    ids=["clm", "nsp", "mtp-accumulation"],
)
def test_no_read_from_the_device_between_log_points(
    sections, train_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_config
) -> None:
    reads = Reads()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):  # type: ignore[no-untyped-def]
            reads.hit(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)

    # Counted: the step and the loop around it. Not counted: the loader making batches (host tensors,
    # workers=0 runs it in this process), the reads themselves, and the checkpoint at the end.
    step, window, received, save = loop.Trainer.step, loop.read_window, loop.received, loop.Trainer.save

    def counted_step(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        reads.step = self.state.step + 1
        reads.on = True
        return step(self, *args, **kwargs)

    def uncounted(function):  # type: ignore[no-untyped-def]
        def run(*args, **kwargs):  # type: ignore[no-untyped-def]
            was, reads.on = reads.on, False
            try:
                return function(*args, **kwargs)
            finally:
                reads.on = was

        return run

    def quiet_loader(wire):  # type: ignore[no-untyped-def]
        batches = received(wire)
        while True:
            was, reads.on = reads.on, False
            try:
                item = next(batches)
            except StopIteration:
                return
            finally:
                reads.on = was
            yield item

    monkeypatch.setattr(loop.Trainer, "step", counted_step)
    monkeypatch.setattr(loop.Trainer, "save", uncounted(save))
    monkeypatch.setattr(loop, "read_window", uncounted(window))
    monkeypatch.setattr(loop, "received", quiet_loader)
    cfg = small_config(train_store, budget={"steps": 9}, logging={"every": 4}, **sections)
    train(cfg, tmp_path / "run", show_progress=False)
    reads.on = False
    assert reads.seen == {}, reads.seen
    assert [r["step"] for r in records(tmp_path / "run") if "loss" in r] == list(range(1, 10))


def test_a_window_read_at_once_equals_its_steps_read_one_by_one() -> None:
    """`read_window` reads many steps with one transfer; each step's figures come out as reading it alone
    (the loss over the global count, the pair term, metrics averaged over micro-batches)."""
    figures = [
        StepFigures(
            torch.tensor([6.0, 3.0, 1.0, 2.0, 0.5, 0.1, 0.3], dtype=torch.float64), ("acc",), 2, 1e-3
        ),
        StepFigures(torch.tensor([8.0, 0.0, 0.0, 0.0, float("nan")], dtype=torch.float64), (), 1, 2e-3),
    ]
    pending = [type("P", (), {"figures": f})() for f in figures]
    one, two = read_window(pending)  # type: ignore[arg-type]
    assert (one.loss, one.grad_norm, one.lr, one.n_targets) == (6.0 / 3.0 + 1.0 / 2.0, 0.5, 1e-3, 3.0)
    assert one.metrics == {"acc": 0.0 + 0.1 / 2 + 0.3 / 2}
    assert two.loss == 8.0 and two.n_targets == 1.0 and two.grad_norm != two.grad_norm


def test_targets_are_counted_on_the_host(train_store: Path, small_config) -> None:
    from objtrain.data.batches import leading_batches
    from objtrain.data.mixture import open_stores
    from objtrain.objectives.registry import build_objective

    source = open_stores(str(train_store), None)
    for name, kind in (("mlm", "encoder"), ("nsp", "encoder"), ("contrastive", "encoder")):
        objective = build_objective(name, source.specials, source.tokenizer, kind)
        (batch,) = leading_batches(source.stream("train", 0), objective, 64, 4, 4, 0, within_epoch=False)
        assert host_counts([batch, batch]) == (2.0 * batch.n_targets, 2.0 * batch.n_pairs)


def test_a_nonfinite_loss_stops_within_the_logging_interval_naming_the_last_good_checkpoint(
    train_store: Path, tmp_path: Path, small_config, poison_clm_loss
) -> None:
    calls = poison_clm_loss(7)
    cfg = small_config(
        train_store, budget={"steps": 20}, logging={"every": 5}, checkpoint={"every": 2, "keep": 9}
    )
    with pytest.raises(
        NonFiniteLoss, match=r"loss is nan at step 7; the last good checkpoint is .*step-00000006"
    ):
        train(cfg, tmp_path / "run", show_progress=False)
    # read at step 8 (its checkpoint): step 8 ran on the poisoned weights, nothing of it was kept
    assert calls["n"] == 8
    assert [r["step"] for r in records(tmp_path / "run") if "loss" in r] == [1, 2, 3, 4, 5, 6]
    latest = ckpt.latest_checkpoint(tmp_path / "run")
    assert latest is not None and latest.name == "step-00000006"
    assert all(torch.isfinite(t).all() for t in load_file(latest / "model.safetensors").values())
    assert not (tmp_path / "run" / "checkpoints" / "step-00000008").exists()


TIMING = {"tokens_per_s", "mfu", "data_wait_frac", "peak_mem_bytes", "wall_time", "elapsed", "time"}


def test_the_records_do_not_depend_on_when_they_are_read(
    train_store: Path, tmp_path: Path, small_config
) -> None:
    """Read every step or every 4 steps: the same records (their timings aside), the same weights."""
    runs = {}
    for every in (1, 4):
        cfg = small_config(
            train_store,
            objective={"name": "nsp"},
            model={"kind": "encoder"},
            batch={"micro_batch_size": 4},
            budget={"steps": 7},
            logging={"every": every},
        )
        train(cfg, tmp_path / f"every{every}", show_progress=False)
        runs[every] = [
            {k: v for k, v in r.items() if k not in TIMING} for r in records(tmp_path / f"every{every}")
        ]
    assert runs[1] == runs[4] and len([r for r in runs[1] if "loss" in r]) == 7
    weights = [
        load_file(ckpt.latest_checkpoint(tmp_path / f"every{e}") / "model.safetensors") for e in (1, 4)
    ]  # type: ignore[operator]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU's host syncs: needs CUDA")
def test_a_cuda_step_never_waits_for_the_gpu(
    train_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_config
) -> None:
    """torch's sync debug mode raises on any synchronising call inside a step (reference gpu.md 2)."""
    step = loop.Trainer.step

    def strict(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.state.step < 2:  # the first steps allocate and warm up
            return step(self, *args, **kwargs)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return step(self, *args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(loop.Trainer, "step", strict)
    cfg = small_config(
        train_store, device="cuda", precision={"dtype": "bf16", "compile": False}, budget={"steps": 6}
    )
    train(cfg, tmp_path / "run", show_progress=False)
