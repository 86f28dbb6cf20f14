"""The loop: every objective trains every model kind it supports; loss normalisation; exact resume;
non-finite losses stop the run and keep the last good checkpoint."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from rich.console import Console
from safetensors.torch import load_file

from objtrain.data.loader import CorruptedRows, RowSampler
from objtrain.data.stream import Position
from objtrain.errors import UserError
from objtrain.objectives.registry import OBJECTIVES, objective_class
from objtrain.training import checkpoint as ckpt
from objtrain.training.config import TrainConfig
from objtrain.training.loop import NonFiniteLoss, forward_backward, prepare, train
from objtrain.training.optim import lr_factor

# Every (objective, kind) the registry declares; the default mixture (span + prefix LM) has no encoder form.
PAIRS = [
    (name, kind)
    for name in OBJECTIVES
    for kind in objective_class(name).model_kinds
    if (name, kind) != ("mixture", "encoder")
]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


# Settings a pair needs besides the shared ones. Contrastive (SimCSE dropout views): every model size ships
# with dropout 0, which makes the two views identical and the task trivial (loss ~0.01 at init on the debug
# model, positive cosine exactly 1), and lr 1e-2 (about the init std of 0.02 per Adam step) collapses the
# pooled embeddings once warmup ends (all cosines -> 1, loss rising to ~1-3). With dropout 0.1, a softer
# temperature and 32 rows (31 negatives each) the task is not trivial at init and the loss falls.
_SETTINGS: dict[tuple[str, str], dict] = {
    ("contrastive", "encoder"): {
        "objective": {"overrides": {"temperature": 0.2}},
        "model": {"overrides": {"dropout": 0.1}},
        "batch": {"batch_size": 32},
        "optim": {"lr": 1e-3},
    },
}


@pytest.mark.parametrize(
    ("name", "kind"),
    PAIRS,
    ids=[f"{n}-{k}" for n, k in PAIRS],
)
def test_every_objective_trains_every_kind_it_supports(
    name: str, kind: str, train_store: Path, tmp_path: Path, small_config
) -> None:
    sections = {
        "objective": {"name": name},
        "model": {"kind": kind},
        "budget": {"steps": 12},
        "optim": {"lr": 1e-2},
        "validation": {"every": 6},
    }
    for section, values in _SETTINGS.get((name, kind), {}).items():
        sections[section] = {**sections.get(section, {}), **values}
    cfg = small_config(train_store, **sections)
    result = train(cfg, tmp_path / "run", show_progress=False)
    rows = [r for r in records(tmp_path / "run") if "loss" in r]
    first, last = sum(r["loss"] for r in rows[:3]) / 3, sum(r["loss"] for r in rows[-3:]) / 3
    assert last < first, f"{name} on {kind}: loss {first:.3f} -> {last:.3f}"
    if name == "contrastive":  # dropout is on in training: the two views of a row really differ
        assert all(r["positive_cosine"] < 0.999 for r in rows)
    assert result.step == 12 and result.checkpoint is not None
    assert ckpt.is_complete(result.checkpoint)
    val = [r for r in records(tmp_path / "run") if r.get("split") == "val"]
    assert [r["step"] for r in val] == [6, 12] and all(r["val_loss"] > 0 for r in val)
    info = json.loads((result.checkpoint / "config.json").read_text())["training"]
    assert info["objective"] == name and info["model_kind"] == kind and info["step"] == 12
    if kind == "decoder" and name in ("clm", "mtp", "fim", "prefix_lm"):
        assert "val_bpb" in val[-1]


def test_mfu_counts_a_contrastive_steps_two_views(train_store: Path, tmp_path: Path, small_config) -> None:
    """The logged MFU counts the FLOPs the model ran: a contrastive step encodes two views of every row and
    runs the unembedding forward only, so it is not the one-view count of a plain encoder step."""
    from objtrain.training import accounting

    sections = {"objective": {"name": "contrastive"}, "model": {"kind": "encoder"}, "budget": {"steps": 2}}
    for section, values in _SETTINGS[("contrastive", "encoder")].items():
        sections[section] = {**sections.get(section, {}), **values}
    cfg = small_config(train_store, **sections)
    train(cfg, tmp_path / "run", show_progress=False)
    steps = [r for r in records(tmp_path / "run") if "mfu" in r]
    peak = accounting.peak_flops(torch.device("cpu"), "fp32")[0]
    tokens = steps[1]["tokens"] - steps[0]["tokens"]
    logged = steps[1]["mfu"] * peak * tokens / steps[1]["tokens_per_s"]
    model_cfg = prepare(cfg, tmp_path / "unused").model_cfg
    rows, seq_len = cfg.batch.batch_size, cfg.batch.seq_len
    two_views = accounting.flops_per_step(model_cfg, 2 * rows, seq_len, logits_backward=False)
    assert logged == pytest.approx(two_views, rel=1e-6)
    assert logged != pytest.approx(accounting.flops_per_step(model_cfg, rows, seq_len), rel=0.1)  # one view


def _grads(cfg: TrainConfig, store: Path, micro: int) -> tuple[dict[str, torch.Tensor], float]:
    """Gradients of one global batch of 16 rows, taken as 16 / micro micro-batches."""
    plan = prepare(cfg, store.parent / "unused-run")
    torch.manual_seed(0)
    from objtrain.models.zoo import build_model

    model = build_model(plan.model_cfg)
    stream = plan.source.stream("train", cfg.seed)
    dataset = CorruptedRows(stream, plan.objective, plan.seq_len, cfg.seed)
    sampler = RowSampler(plan.objective, plan.seq_len, cfg.seed, 16, micro, 0, 1, Position(), 0, 1)
    batches = [dataset[item][1] for item in sampler]
    n = sum(b.n_targets for b in batches)
    n_pairs = max(sum(b.n_pairs for b in batches), 1)
    total, pairs = 0.0, 0.0
    for b in batches:
        lo = forward_backward(
            model, plan.objective, b, 1.0 / n, plan.device, "fp32", None, pair_scale=1.0 / n_pairs
        )
        total += float(lo.loss_sum)
        pairs += float(lo.pair_sum) if lo.pair_sum is not None else 0.0
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return grads, total / n + pairs / n_pairs


@pytest.mark.parametrize("name", ["mlm", "nsp", "sop"])
def test_accumulation_equals_the_full_batch_for_ragged_mlm_targets(
    name: str, train_store: Path, small_config
) -> None:
    """MLM's token term and NSP/SOP's pair term are each normalised by their own count over the step."""
    cfg = small_config(train_store, objective={"name": name}, model={"kind": "encoder"})
    full, loss_full = _grads(cfg, train_store, micro=16)
    accum, loss_accum = _grads(cfg, train_store, micro=4)
    assert loss_accum == pytest.approx(loss_full, rel=1e-6)
    for key in full:
        torch.testing.assert_close(accum[key], full[key], rtol=1e-5, atol=1e-7)


def test_the_loop_logs_the_same_loss_with_and_without_accumulation(
    train_store: Path, tmp_path: Path, small_config
) -> None:
    runs = {}
    for micro in (16, 4):
        cfg = small_config(
            train_store,
            objective={"name": "mlm"},
            model={"kind": "encoder"},
            batch={"batch_size": 16, "micro_batch_size": micro},
            budget={"steps": 2},
        )
        train(cfg, tmp_path / f"m{micro}", show_progress=False)
        runs[micro] = [r["loss"] for r in records(tmp_path / f"m{micro}") if "loss" in r]
    assert runs[4] == pytest.approx(runs[16], rel=1e-5)
    # The check could fail: per-micro-batch means averaged give a different number for MLM's ragged counts.
    cfg = small_config(train_store, objective={"name": "mlm"}, model={"kind": "encoder"})
    plan = prepare(cfg, tmp_path / "x")
    stream = plan.source.stream("train", cfg.seed)
    dataset = CorruptedRows(stream, plan.objective, plan.seq_len, cfg.seed)
    counts = [
        dataset[i][1].n_targets for i in RowSampler(plan.objective, 64, 0, 16, 4, 0, 1, Position(), 0, 1)
    ]
    assert len(set(counts)) > 1


@pytest.mark.parametrize(
    ("name", "kind", "model"),
    [("clm", "decoder", {"dropout": 0.1}), ("mtp", "decoder", {}), ("span", "encdec", {"dropout": 0.1})],
)
def test_resume_is_bit_identical(
    name: str, kind: str, model: dict, train_store: Path, tmp_path: Path, small_config
) -> None:
    def cfg(steps_every: int) -> TrainConfig:
        return small_config(
            train_store,
            objective={"name": name},
            model={"kind": kind, "overrides": model},
            budget={"steps": 8},
            checkpoint={"every": steps_every, "keep": 10},
            batch={"batch_size": 8, "micro_batch_size": 4},
        )

    full = train(cfg(4), tmp_path / "full", show_progress=False)
    # The same run, stopped at its step-4 checkpoint (drop step 8 and `latest`), then resumed.
    import shutil

    shutil.copytree(tmp_path / "full", tmp_path / "half")
    shutil.rmtree(tmp_path / "half" / "checkpoints" / "step-00000008")
    (tmp_path / "half" / "checkpoints" / "latest").unlink()
    resumed = train(cfg(4), tmp_path / "half", resume=True, show_progress=False)
    assert resumed.step == 8
    a = load_file(full.checkpoint / "model.safetensors")  # type: ignore[operator]
    b = load_file(resumed.checkpoint / "model.safetensors")  # type: ignore[operator]
    assert all(torch.equal(a[k], b[k]) for k in a)
    la = [r["loss"] for r in records(tmp_path / "full") if "loss" in r]
    lb = [r["loss"] for r in records(tmp_path / "half") if "loss" in r]
    assert lb[-4:] == la[-4:]  # the resumed steps log the same losses


def test_resuming_a_finished_run_changes_nothing(train_store: Path, tmp_path: Path, small_config) -> None:
    cfg = small_config(train_store, objective={"name": "clm"}, budget={"steps": 3})
    done = train(cfg, tmp_path / "run", show_progress=False)
    ckpt_dir = done.checkpoint
    assert ckpt_dir is not None
    before = {p.name: p.stat().st_mtime_ns for p in ckpt_dir.iterdir()}
    n_records = len(records(tmp_path / "run"))
    again = train(cfg, tmp_path / "run", resume=True, show_progress=False)
    assert again.step == 3 and again.checkpoint == ckpt_dir
    assert {p.name: p.stat().st_mtime_ns for p in ckpt_dir.iterdir()} == before  # nothing re-saved
    assert len(records(tmp_path / "run")) == n_records  # nothing re-validated or logged


def test_resume_refuses_changed_settings(train_store: Path, tmp_path: Path, small_config) -> None:
    from objtrain.errors import UserError

    train(small_config(train_store, budget={"steps": 2}), tmp_path / "run", show_progress=False)
    with pytest.raises(UserError, match="optim"):
        train(
            small_config(train_store, budget={"steps": 2}, optim={"lr": 1e-4}), tmp_path / "run", resume=True
        )
    shorter = {"seq_len": 32, "batch_size": 8}
    with pytest.raises(UserError, match="--seq-len 32 differs from the checkpoint's 64"):
        train(small_config(train_store, budget={"steps": 2}, batch=shorter), tmp_path / "run", resume=True)
    # both asked of the library, as of the CLI: the run is neither continued nor replaced
    before = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    with pytest.raises(UserError, match="give one of them"):
        prepare(small_config(train_store, budget={"steps": 2}), tmp_path / "run", resume=True, force=True)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == before


def test_nonfinite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(
    train_store: Path, tmp_path: Path, small_config, poison_clm_loss
) -> None:
    poison_clm_loss(5)
    cfg = small_config(train_store, budget={"steps": 8}, checkpoint={"every": 2})
    with pytest.raises(NonFiniteLoss, match="step 5"):
        train(cfg, tmp_path / "run", show_progress=False)
    latest = ckpt.latest_checkpoint(tmp_path / "run")
    assert latest is not None and latest.name == "step-00000004"
    weights = load_file(latest / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert not (tmp_path / "run" / "checkpoints" / "step-00000005").exists()


def test_keep_prunes_to_the_newest_complete_checkpoints(
    train_store: Path, tmp_path: Path, small_config
) -> None:
    cfg = small_config(train_store, budget={"steps": 6}, checkpoint={"every": 1, "keep": 2})
    train(cfg, tmp_path / "run", show_progress=False)
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert names == ["latest", "step-00000005", "step-00000006"]
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step-00000006"


def test_resume_ignores_a_torn_checkpoint_and_a_missing_latest(
    train_store: Path, tmp_path: Path, small_config
) -> None:
    cfg = small_config(train_store, budget={"steps": 4}, checkpoint={"every": 2, "keep": 5})
    train(cfg, tmp_path / "run", show_progress=False)
    root = tmp_path / "run" / "checkpoints"
    (root / "latest").write_text("step-00000099\n")  # names a deleted checkpoint
    torn = root / "step-00000004" / "optimizer.safetensors"
    torn.write_bytes(torn.read_bytes()[:100])  # size no longer matches state.json
    (root / ".step-00000006.abcd.tmp").mkdir()  # what a kill mid-save leaves
    assert ckpt.latest_checkpoint(tmp_path / "run") == root / "step-00000002"
    console = Console(record=True, width=300)
    result = train(cfg, tmp_path / "run", resume=True, show_progress=False, console=console)
    assert result.step == 4 and not (root / ".step-00000006.abcd.tmp").exists()
    assert "note: step-00000004 incomplete or damaged" in console.export_text()  # said, not silent


def test_resume_on_other_numerics_says_so(train_store: Path, tmp_path: Path, small_config) -> None:
    # Another thread count or CPU picks other kernels: the promise of bit-identical weights no longer holds,
    # and the user is told so (and metrics.jsonl keeps it) rather than finding out from the weights.
    cfg = small_config(train_store, budget={"steps": 4}, checkpoint={"every": 2, "keep": 5})
    train(cfg, tmp_path / "run", show_progress=False)
    root = tmp_path / "run" / "checkpoints"
    state_file = root / "step-00000002" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["threads"] == torch.get_num_threads() and state["cpu_capability"] and "processor" in state
    state_file.write_text(json.dumps(state | {"threads": 99}))
    (root / "latest").unlink()
    shutil.rmtree(root / "step-00000004")
    console = Console(record=True, width=300)
    train(cfg, tmp_path / "run", resume=True, show_progress=False, console=console)
    said = console.export_text()
    assert f"threads 99 -> {torch.get_num_threads()}" in said and "float tolerance" in said
    event = [r for r in records(tmp_path / "run") if r.get("event") == "resume"][-1]
    assert event["numerics_changed"] == {"threads": [99, torch.get_num_threads()]}


def test_resume_refuses_a_damaged_state_and_reads_past_a_damaged_pointer(
    train_store: Path, tmp_path: Path, small_config
) -> None:
    cfg = small_config(train_store, budget={"steps": 4}, checkpoint={"every": 2, "keep": 5})
    train(cfg, tmp_path / "run", show_progress=False)
    root = tmp_path / "run" / "checkpoints"
    (root / "latest").write_bytes(b"\xff\xfe")  # not UTF-8: as if there were no pointer
    assert ckpt.latest_checkpoint(tmp_path / "run") == root / "step-00000004"
    state_file = root / "step-00000004" / "state.json"
    original = json.loads(state_file.read_text())
    edits = {
        "'step'": lambda s: s.pop("step"),  # resumed, the run would count again from step 0
        "'position'": lambda s: s.update(position="x"),
        "'tokens'": lambda s: s.update(tokens="many"),
        "'config'": lambda s: s.pop("config"),
    }
    for field, edit in edits.items():
        state = json.loads(json.dumps(original))
        edit(state)
        state_file.write_text(json.dumps(state))  # the files it lists are whole: it looks complete
        with pytest.raises(UserError, match=rf"state\.json has no (usable )?{field}.*resume refused"):
            train(cfg, tmp_path / "run", resume=True, show_progress=False)
    shutil.rmtree(root)
    root.write_text("not a directory")
    with pytest.raises(UserError, match="checkpoints is not a directory"):
        prepare(cfg, tmp_path / "run", resume=True)


def test_no_data_trains_on_the_embedded_store(
    train_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_config
) -> None:
    import objtrain.data.default as default

    monkeypatch.setattr(default, "default_store_path", lambda: train_store)
    cfg = small_config(train_store, data={"store": None}, budget={"steps": 2})
    result = train(cfg, tmp_path / "run", show_progress=False)
    assert result.step == 2 and result.mfu > 0  # the summary line reports it
    resolved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert resolved["data"]["store"] is None and resolved["resolved"]["data"] == str(train_store)


def test_bf16_autocast_and_a_seconds_budget(train_store: Path, tmp_path: Path, small_config) -> None:
    cfg = small_config(train_store, precision={"dtype": "bf16"}, budget={"steps": None, "seconds": 3.0})
    result = train(cfg, tmp_path / "run", show_progress=False)
    assert result.total_steps >= 1 and result.step == result.total_steps
    state = json.loads((result.checkpoint / "state.json").read_text())  # type: ignore[operator]
    assert state["dtype"] == "bf16" and state["total_steps"] == result.total_steps
    assert all(isinstance(r["loss"], float) for r in records(tmp_path / "run") if "loss" in r)


def test_compiled_forward_and_loss_train_as_eager(train_store: Path, tmp_path: Path, small_config) -> None:
    """`--compile` runs the forward and the objective's loss as one compiled function: same losses as eager
    (NSP: a pair term and per-position pooled logits go through it too)."""
    losses = {}
    for compiled in (False, True):
        cfg = small_config(
            train_store,
            objective={"name": "nsp"},
            model={"kind": "encoder"},
            budget={"steps": 3},
            precision={"compile": compiled},
        )
        train(cfg, tmp_path / f"c{compiled}", show_progress=False)
        losses[compiled] = [r["loss"] for r in records(tmp_path / f"c{compiled}") if "loss" in r]
    assert len(losses[True]) == 3
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)


def test_a_step_the_fp16_scaler_skips_does_not_advance_the_lr(
    train_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_config
) -> None:
    """Inf gradients at step 3: the scaler skips it (its scale halves), the lr schedule stays where
    it was (reference training.md section 2), and a run resumed after the skip continues the same schedule.
    fp16 is refused on CPU as slow; its loop path runs here with that refusal lifted."""
    import objtrain.training.loop as loop
    import objtrain.training.plan as plan

    monkeypatch.setattr(plan, "check_precision", lambda dtype, device: None)
    original = loop.forward_backward
    calls = {"n": 0, "poison": True}

    def poisoned(model, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = original(model, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 3 and calls["poison"]:
            next(model.parameters()).grad.view(-1)[0] = float("inf")
        return out

    monkeypatch.setattr(loop, "forward_backward", poisoned)
    cfg = small_config(
        train_store, precision={"dtype": "fp16"}, budget={"steps": 6}, checkpoint={"every": 3, "keep": 5}
    )
    train(cfg, tmp_path / "run", show_progress=False)
    steps = [r for r in records(tmp_path / "run") if "loss" in r]
    assert [r["skipped_steps"] for r in steps] == [0, 0, 1, 1, 1, 1]
    assert steps[2]["loss_scale"] == steps[1]["loss_scale"] / 2
    lrs = [r["lr"] for r in steps]
    # the schedule at the optimizer steps taken before each step: step 4 repeats step 3's point
    assert lrs == [cfg.optim.lr * lr_factor(a, 6, cfg.schedule) for a in (0, 1, 2, 2, 3, 4)]
    assert lrs[3] > lrs[4] > lrs[5]
    saved = json.loads((tmp_path / "run" / "checkpoints" / "step-00000003" / "state.json").read_text())
    assert saved["step"] == 3 and saved["optimizer_steps"] == 2

    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step-00000006")  # resume from step 3, after the skip
    calls["poison"] = False
    train(cfg, tmp_path / "run", resume=True, show_progress=False)
    resumed = [r for r in records(tmp_path / "run") if "loss" in r][-3:]
    assert [r["lr"] for r in resumed] == lrs[3:]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in steps[3:]]


def test_checkpoint_files_get_the_users_usual_permissions(
    train_store: Path, tmp_path: Path, small_config
) -> None:
    # safetensors writes 0600 files: shared with a group, a checkpoint would be readable but for its tensors
    old = os.umask(0o022)
    try:
        result = train(small_config(train_store, budget={"steps": 1}), tmp_path / "run", show_progress=False)
    finally:
        os.umask(old)
    assert result.checkpoint is not None
    modes = {p.name: p.stat().st_mode & 0o777 for p in result.checkpoint.iterdir()}
    assert {"model.safetensors", "optimizer.safetensors", "state.json"} <= set(modes)
    assert set(modes.values()) == {0o644}, modes
