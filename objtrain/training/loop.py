"""The one training loop for every objective and model kind.

    plan = prepare(cfg, run_dir)        # every check, nothing written: a refusal leaves nothing behind
    result = train(cfg, run_dir)        # prepare + the loop; `objtrain train` and `compare` both call it

Per optimizer step (reference training.md sections 1, 2, 8, 9):
1. Take this rank's A micro-batches from the loader (timed: the data-wait share).
2. Count their targets and all-reduce: N, the step's global target count.
3. Each micro-batch backpropagates `loss_sum / N` (MTP: the trunk once, then each head's forward and
   backward in turn, so one logits tensor is alive at a time). The step's loss is therefore the sum over
   all targets of all micro-batches and ranks over their total count, never a mean of means; if an
   objective's own count differs from the labels' (pair-level losses), gradients are rescaled to it.
4. SUM the gradients over ranks, unscale (fp16), clip the global norm, check everything is finite (else
   stop naming the step: the last good checkpoint stays), set the step's lr, step AdamW.
Then log, validate and checkpoint on their intervals. The lr is a pure function of (optimizer steps
taken, total steps): a step fp16's GradScaler skips does not advance it (reference training.md section 2).
Data is a pure function of (seed, rows consumed), RNG states are saved: a resumed run is bit-identical.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from rich.console import Console
from rich.markup import escape
from torch import Tensor, nn

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.config import to_dict
from objtrain.data.default import default_store
from objtrain.devices import auto_dtype, resolve_device
from objtrain.errors import UserError
from objtrain.interop import require
from objtrain.io import (
    OutputLock,
    Unwritable,
    atomic_file,
    check_output_free,
    check_writable,
    is_unwritable,
    unwritable,
)
from objtrain.models.base import TrunkOutput
from objtrain.models.checkpoint import unwrap
from objtrain.models.zoo import ModelConfig, build_model, count_parameters, model_config
from objtrain.objectives.base import LossOutput, Objective
from objtrain.objectives.mtp import mtp_head_loss
from objtrain.objectives.registry import build_objective
from objtrain.training import accounting
from objtrain.training import checkpoint as ckpt
from objtrain.training import distributed as dist
from objtrain.training.config import DEFAULT_STEPS, TrainConfig, check_divisible, config_dict
from objtrain.training.cores import packed_cores
from objtrain.training.data import (
    CorruptedRows,
    MixedStream,
    Position,
    RowSampler,
    Sources,
    leading_batches,
    make_loader,
    open_sources,
    received,
    validation_batches,
    workers_stopped,
)
from objtrain.training.host_memory import keep_freed_memory
from objtrain.training.logger import MetricsLog, Progress, TensorBoard, Wandb
from objtrain.training.optim import (
    build_optimizer,
    describe_extension,
    extended_lr_factor,
    scaled_step,
    set_lr,
)

DEFAULT_SEQ_LEN = 256
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "checkpoints")  # what makes a directory a training run
LEFT_TO_RIGHT = ("clm", "mtp", "fim", "prefix_lm")  # decoder objectives whose model scores text left to right


class NonFiniteLoss(UserError):
    """The loss or the gradient norm is NaN or infinite: the run stops, the last good checkpoint stays."""


@dataclass
class Plan:
    """Everything checked and resolved before a file is written."""

    cfg: TrainConfig
    run_dir: Path
    world: dist.World
    device: torch.device
    dtype: str
    source: Sources  # one store, or a mixture (data.sources)
    objective: Objective
    model_cfg: ModelConfig
    seq_len: int
    micro_batch: int
    accumulation: int
    resume_from: Path | None
    has_valid: bool
    init: Any = None  # objtrain.interop.init_from.InitSource: the weights --init-from starts from
    init_origin: str | None = None  # what the run started from, kept in every checkpoint across resumes
    dtype_note: str = ""  # how --dtype auto was resolved ("" when given explicitly)
    lock: OutputLock | None = None  # RUN held by this process (main rank) while it trains

    def release(self) -> None:
        """Let RUN go (another process may then write it)."""
        if self.lock is not None:
            self.lock.release()


@dataclass
class TrainResult:
    run_dir: Path
    checkpoint: Path | None
    step: int
    total_steps: int
    tokens: int
    seconds: float
    loss: float
    parameters: int
    flops_per_token: float
    tokens_per_s: float
    peak_memory_bytes: int
    validation: dict[str, float] = field(default_factory=dict)
    stopped: str = ""  # "" = finished; "SIGINT" or "SIGTERM": stopped early after saving a checkpoint
    mfu: float = float("nan")  # median over the steps after the first (which holds compilation and warm-up)


def prepare(
    cfg: TrainConfig,
    run_dir: Path,
    resume: bool = False,
    force: bool = False,
    world: dist.World | None = None,
    console: Console | None = None,
) -> Plan:
    """Check everything a run needs and resolve defaults; raise `UserError` before writing anything.

    An existing RUN (--resume, --force) is locked here, before anything in it is read or cleaned, and
    stays locked by the returned plan (`Plan.release`); a new RUN is locked when the run creates it."""
    if resume and force:  # --resume would win and silently keep the run --force meant to replace
        raise UserError("--resume continues RUN and --force replaces it: give one of them")
    world = world or dist.World()
    run_dir = Path(run_dir)
    device = resolve_device(cfg.device)
    if world.distributed and device.type == "cuda":
        device = torch.device("cuda", world.local_rank)
    if run_dir.exists() and not (resume or force):
        raise UserError(f"{run_dir} already exists (pass --resume to continue it or --force to replace it)")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir} exists and is not a run directory")
    if world.is_main:  # a read-only mount, no permission, a full disk: now, not after the model is built
        check_writable(run_dir)
    if cfg.logging.wandb is not None and world.is_main:  # asked for by name: missing is an error, not a note
        require("wandb", "logging.wandb")
    # Only a run is locked here: a folder of the user's that has the name is refused below, untouched.
    markers = (*RUN_MARKERS, OutputLock.NAME)
    ours = run_dir.is_dir() and (not any(run_dir.iterdir()) or any((run_dir / m).exists() for m in markers))
    lock = OutputLock(run_dir, "-o").acquire() if world.is_main and ours else None
    try:
        plan = _resolve(cfg, run_dir, resume, force, world, device, console)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    plan.lock = lock
    return plan


def _resolve(
    cfg: TrainConfig,
    run_dir: Path,
    resume: bool,
    force: bool,
    world: dist.World,
    device: torch.device,
    console: Console | None,
) -> Plan:
    """`prepare` past the checks of RUN itself (and its lock)."""
    checkpoints = ckpt.checkpoints_dir(run_dir)
    if resume and checkpoints.exists() and not checkpoints.is_dir():
        raise UserError(f"{checkpoints} is not a directory: {run_dir} is not a run to resume")

    store = cfg.data.store
    if store is None and not cfg.data.sources:
        store = str(_embedded_store(world, console))
    source = open_sources(store, cfg.data.sources)
    if cfg.data.store is not None:  # recorded absolute: `objtrain eval RUN` finds it from any directory
        absolute = str(Path(cfg.data.store).absolute())
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, store=absolute))
    if force and run_dir.exists():
        paths = [m.path for m in source.members]
        markers = (*RUN_MARKERS, OutputLock.NAME)  # a run killed as it began holds only its lock
        check_output_free(run_dir, True, paths, replaces=("a training run", markers))
    objective = build_objective(
        cfg.objective.name,
        source.specials,
        tokenizer=source.tokenizer,
        model_kind=cfg.model.kind,  # type: ignore[arg-type]
        overrides=cfg.objective.overrides,
    )
    overrides = dict(cfg.model.overrides)
    if objective.name == "mtp":
        n = int(objective.config.n)
        if overrides.setdefault("mtp_heads", n) != n:
            raise UserError(
                f"mtp with n={n} needs mtp_heads={n}, the model override says {overrides['mtp_heads']}"
            )
    # SimCSE's two views differ only by dropout, and every model size ships with none: default to SimCSE's
    # 0.1 and refuse an explicit 0, which would train the trivial task of matching a row to itself.
    dropout_views = objective.name == "contrastive" and objective.config.views == "dropout"
    if dropout_views and float(overrides.setdefault("dropout", 0.1)) <= 0:
        raise UserError("contrastive with views=dropout needs model dropout > 0 (SimCSE: model.dropout=0.1)")
    model_cfg = model_config(
        objective.model_kind, cfg.model.size, overrides, vocab_size=source.tokenizer.vocab_size
    )
    seq_len = cfg.batch.seq_len or source.packed_length or DEFAULT_SEQ_LEN
    micro, accumulation = check_divisible(cfg, world.world_size)
    has_valid = source.has_split(cfg.data.valid_split)
    if cfg.validation.every >= 0 and not has_valid:
        raise UserError(no_valid_split(source, cfg.data.valid_split))
    # Both splits are read and checked now, before anything is written: a damaged store leaves no run behind.
    if cfg.validation.every >= 0:
        source.documents(cfg.data.valid_split)
    _probe_objective(objective, source, seq_len, cfg.seed)
    resume_from = None
    if resume and run_dir.exists():
        if world.is_main:
            ckpt.clean_leftovers(run_dir)
        resume_from = ckpt.latest_checkpoint(run_dir)
        skipped = ckpt.skipped_newer(run_dir, resume_from) if resume_from is not None else []
        if resume_from is not None and skipped and console is not None and world.is_main:
            names = ", ".join(p.name for p in skipped)
            console.print(
                f"note: {names} incomplete or damaged (a kill while saving?): resuming from "
                f"{resume_from.name}, the steps after it are trained again",
                markup=False,
            )
        if (
            resume_from is None
            and ckpt.checkpoints_dir(run_dir).is_dir()
            and any(p.name.startswith("step-") for p in ckpt.checkpoints_dir(run_dir).iterdir())
        ):
            raise UserError(
                f"{run_dir} has checkpoints but none is complete; refusing to restart from scratch"
            )
    init, init_origin = None, cfg.init_from
    if cfg.init_from is not None and resume_from is None:
        from objtrain.interop import init_from

        init = init_from.load_source(Path(cfg.init_from))
        init_from.check_tokenizer(init, source.tokenizer, source.path)
        model_cfg = init_from.model_config(init, model_cfg, overrides)
    elif resume_from is not None:
        from objtrain.interop import init_from

        # a run started --init-from has the source's shape: its checkpoints say so, whatever the flags now
        model_cfg, init_origin = init_from.resumed_model_config(resume_from, model_cfg)
    dtype, dtype_note = _choose_dtype(cfg.precision.dtype, device, resume_from)
    check_precision(dtype, device)
    return Plan(
        cfg,
        run_dir,
        world,
        device,
        dtype,
        source,
        objective,
        model_cfg,
        seq_len,
        micro,
        accumulation,
        resume_from,
        has_valid,
        init,
        init_origin,
        dtype_note,
    )


def no_valid_split(sources: Any, split: str) -> str:
    """The refusal for a store without validation data, with the ways out: a corpus of a few whole files
    has too few documents to split, so cutting them into paragraphs or lines is usually the fix. For a
    mixture, the first store that lacks the split."""
    lacking = sources.lacking(split) if hasattr(sources, "lacking") else sources.path
    source = next((m for m in getattr(sources, "members", [sources]) if m.path == lacking), sources)
    splits = source.store.meta.get("splits", {})
    unit = "rows" if source.packed_length else "documents"
    total = sum(int(info.get(unit, 0)) for info in splits.values() if isinstance(info, dict))
    few = f" (its {total:,} {unit} are too few to split)" if total < 100 else ""
    return (
        f"{source.path} has no {split!r} split to validate on{few}: re-run `objtrain tokenize` with "
        "--doc-split blank-line (paragraphs) or --doc-split line to cut files into more documents, or a "
        "larger --valid-fraction; or train without validation: validation.every=-1"
    )


def _choose_dtype(requested: str, device: torch.device, resume_from: Path | None) -> tuple[str, str]:
    """(dtype, why): a resumed run keeps the precision it was started in (`auto` takes the checkpoint's;
    another explicit one is refused); a new run's `auto` is decided by the device's units (`auto_dtype`)."""
    saved = ckpt.read_state(resume_from).get("dtype") if resume_from is not None else None
    if resume_from is None or saved not in accounting.DTYPES:  # new, or saved before dtypes were recorded
        if requested != "auto":
            return requested, ""
        dtype, why = auto_dtype(device)
        return dtype, f"auto: {why}"
    if requested == "auto":
        return saved, f"auto: the precision of {resume_from.name}"
    if requested != saved:
        raise UserError(
            f"--resume: the run trains in {saved} ({resume_from.name}); --dtype {requested} would change its "
            f"precision mid-run: resume with --dtype {saved} or auto, or start a new run (-o)"
        )
    return saved, ""


def _embedded_store(world: dist.World, console: Console | None) -> Path:
    """Rank 0 builds the standard-library store once (with a progress bar); the others wait for it."""
    from objtrain.data.default import default_store_path

    path = default_store_path()
    if world.is_main and not (path / "meta.json").is_file():
        if console is not None:
            console.print(
                f"building the embedded standard-library store once, in {path}", highlight=False, markup=False
            )
        progress = None
        if console is not None and console.is_terminal:
            from objtrain.cli.tokenize import RichProgress

            progress = RichProgress(console)
            with progress.bar:
                default_store(progress)
        else:
            default_store()
    dist.barrier(world)
    return path


def _probe_objective(objective: Objective, source: Sources, seq_len: int, seed: int) -> None:
    """Corrupt two real rows now, so a seq-len too short for the objective is refused before any work."""
    stream = source.stream("train", seed)  # a damaged split says so itself, not as a --seq-len problem
    try:
        (batch,) = leading_batches(stream, objective, seq_len, 2, 2, seed, within_epoch=False)
    except UserError as exc:
        raise UserError(f"--seq-len {seq_len} does not work for {objective.name}: {exc}") from None
    except (ValueError, RuntimeError, IndexError) as exc:
        raise UserError(f"--seq-len {seq_len} is too short for {objective.name} ({exc})") from None
    if batch.n_targets == 0 and batch.seq_labels is None:
        raise UserError(f"--seq-len {seq_len} is too short for {objective.name}: its rows have no targets")


def total_steps(cfg: TrainConfig, plan: Plan, step_seconds: Callable[[], float] | None = None) -> int:
    b = cfg.budget
    if b.steps is not None:
        return b.steps
    if b.tokens is not None:
        return max(math.ceil(b.tokens / (cfg.batch.batch_size * plan.seq_len)), 1)
    if b.seconds is not None:
        assert step_seconds is not None
        return max(int(b.seconds / max(step_seconds(), 1e-6)), 1)
    return DEFAULT_STEPS


def autocast(device: torch.device, dtype: str) -> Any:
    if dtype == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=accounting.DTYPES[dtype])


class StopFlag:
    """Ctrl-C / SIGTERM set a flag; the loop saves at the next step boundary. A second Ctrl-C stops now."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = signum

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def forward_backward(
    model: nn.Module,
    objective: Objective,
    batch: Batch,
    scale: float,
    device: torch.device,
    dtype: str,
    scaler: Any,
    sequential: bool = True,
    pair_scale: float = 0.0,
    loss_of: Callable[[Batch], LossOutput] | None = None,
) -> LossOutput:
    """One micro-batch: forward, `loss_sum * scale + pair_sum * pair_scale` backward. Returns the detached
    `LossOutput` (sums and counts, for the step's global normalisation).

    MTP uses the sequential per-head backward unless `sequential` is off (a sharded model must go through
    its root forward, which the trunk/heads split bypasses). `loss_of`, when given, is the forward and the
    loss as one (compiled) function."""
    plain = unwrap(model)
    if sequential and objective.name == "mtp" and getattr(plain.config, "mtp_heads", 1) > 1:
        return _mtp_forward_backward(plain, batch, scale, device, dtype, scaler)
    with autocast(device, dtype):
        lo = loss_of(batch) if loss_of is not None else objective.loss(model(batch), batch)
    loss = lo.loss_sum * scale
    if lo.pair_sum is not None:
        loss = loss + lo.pair_sum * pair_scale
    (scaler.scale(loss) if scaler is not None else loss).backward()
    return lo.detach()


def _mtp_forward_backward(
    model: Any, batch: Batch, scale: float, device: torch.device, dtype: str, scaler: Any
) -> LossOutput:
    """Gloeckle et al. 2024, section 2: trunk once; each head's forward and backward in turn into the
    detached trunk output; then one backward through the trunk. Gradients equal the joint backward."""
    assert batch.mtp_labels is not None
    with autocast(device, dtype):
        trunk = model.trunk(batch)
    detached = trunk.hidden.detach().requires_grad_()
    shared = TrunkOutput(detached, trunk.ctx, trunk.memory)
    total = torch.zeros((), device=device)
    n_head1 = torch.zeros((), dtype=torch.int64, device=device)
    metrics: dict[str, Tensor] = {}
    for k in range(1, model.config.mtp_heads + 1):
        with autocast(device, dtype):
            # the logits stay a temporary: cross-entropy keeps its own output for the backward, so a name
            # held here would keep a second (B, T, V) tensor alive through it
            loss_sum, count = mtp_head_loss(model.head(k - 1, shared)[1], batch.mtp_labels, k)
        loss = loss_sum * scale
        (scaler.scale(loss) if scaler is not None else loss).backward()
        total = total + loss_sum.detach()
        metrics[f"head{k}_loss"] = loss_sum.detach() / count.clamp(min=1)
        if k == 1:
            n_head1 = count.detach()
    trunk.hidden.backward(detached.grad)
    return LossOutput(total, n_head1, metrics)


@torch.no_grad()
def validate(model: nn.Module, plan: Plan, valid: ValidationSets, sharded: bool = False) -> dict[str, float]:
    """Objective loss on the fixed valid rows (MTP: head 1), and bits per byte for left-to-right models.

    Ranks split the rows; a sharded model runs every row on every rank (its forward is a collective)."""
    model.eval()
    world, device = plan.world, plan.device

    def mine(items: list[Batch]) -> list[Batch]:
        return items if sharded else items[world.rank :: world.world_size]

    # loss, count, lm nats, lm bytes, pair-loss sum, pair count
    sums = torch.zeros(6, dtype=torch.float64, device=device)
    for batch in mine(valid.batches):
        batch = batch.to(device)
        with autocast(device, plan.dtype):
            out = model(batch)
            if plan.objective.name == "mtp":
                lo_sum, lo_n = mtp_head_loss(out.logits, batch.mtp_labels, 1)  # type: ignore[arg-type]
            else:
                lo = plan.objective.loss(out, batch)
                lo_sum, lo_n = lo.loss_sum, lo.n_targets
                if lo.pair_sum is not None and lo.n_pairs is not None:
                    sums[4] += lo.pair_sum.double()
                    sums[5] += lo.n_pairs.double()
        sums[0] += lo_sum.double()
        sums[1] += lo_n.double()
    if valid.byte_table is not None:
        table = valid.byte_table.to(device)
        for batch in mine(valid.lm_batches):
            batch = batch.to(device)
            with autocast(device, plan.dtype):
                logits = model(batch).logits.float()
            labels = batch.labels
            nll = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=IGNORE, reduction="none"
            )
            keep = labels.reshape(-1) != IGNORE
            sums[2] += nll[keep].double().sum()
            sums[3] += table[labels.reshape(-1)[keep]].double().sum()
    if not sharded:
        dist.all_reduce_sum(sums, world)
    model.train()
    out = {"val_loss": float(sums[0] / sums[1].clamp(min=1) + sums[4] / sums[5].clamp(min=1))}
    if valid.byte_table is not None and sums[3] > 0:
        out["val_bpb"] = float(sums[2] / math.log(2) / sums[3])
    return out


def _training_info(plan: Plan, step: int, tokens: int) -> dict[str, Any]:
    """What `eval` and `generate` read back from the checkpoint."""
    cfg = plan.cfg
    objective_config = (
        to_dict(plan.objective.config) if hasattr(plan.objective.config, "__dataclass_fields__") else {}
    )
    info: dict[str, Any] = {
        "objective": plan.objective.name,
        "objective_config": objective_config,
        "model_kind": plan.model_cfg.kind,
        "model_size": cfg.model.size,
        "seq_len": plan.seq_len,
        "step": step,
        "tokens": tokens,
        "seed": cfg.seed,
    }
    if plan.init_origin is not None:
        info["init_from"] = plan.init_origin
    if plan.objective.name == "fim":
        info["fim_mode"] = "spm" if float(objective_config.get("spm_rate", 0.0)) > 0.5 else "psm"
    return info


def train(
    cfg: TrainConfig,
    run_dir: Path,
    resume: bool = False,
    force: bool = False,
    console: Console | None = None,
    show_progress: bool = True,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    save_at: Collection[int] = (),
) -> TrainResult:
    """Train `cfg` into `run_dir` (see the module docstring); returns what the run did.

    `on_record` sees every metrics record (training steps, and validations with `"split": "val"`) on the
    main process: `objtrain compare` draws its progress across arms from it. `save_at`: steps to save a
    checkpoint at besides `checkpoint.every` (a compare sweep branches shorter runs from them).
    """
    started = time.perf_counter()
    console = console or Console(stderr=True, highlight=False)
    world = dist.setup(resolve_device(cfg.device).type)
    plan: Plan | None = None
    try:
        plan = prepare(cfg, run_dir, resume=resume, force=force, world=world, console=console)
        hook = on_record if world.is_main else None
        return _run(plan, console, show_progress and world.is_main, force, hook, started, frozenset(save_at))
    except (OSError, Unwritable) as exc:
        # A write that cannot happen (the disk filled, the mount went read-only): one line naming the
        # checkpoint that is kept, which a save cut short never replaces.
        if plan is None:  # refused before anything was written: the line says so already
            raise
        if isinstance(exc, Unwritable):
            where, reason = exc.output, exc.reason
        elif is_unwritable(exc):
            where, reason = str(exc.filename or run_dir), unwritable(exc, run_dir).reason
        else:
            raise
        last = ckpt.latest_checkpoint(Path(run_dir))
        kept = f"the last good checkpoint is {last}" if last is not None else "no checkpoint was saved"
        raise Unwritable(where, reason, kept) from None
    finally:
        if plan is not None:
            plan.release()
        dist.teardown()


@dataclass
class RunState:
    """Where a run stands: saved in every checkpoint's `state.json`, restored by `--resume`."""

    step: int = 0
    optimizer_steps: int = 0  # steps that updated the weights (fp16's scaler skips some): the lr's clock
    position: Position = field(default_factory=Position)  # the data: rows consumed, stream offset
    tokens: int = 0  # model positions trained on
    target_tokens: int = 0  # of which targets of the loss
    seconds: float = 0.0  # training time (the steps' own), summed over the resumed parts
    elapsed: float = 0.0  # wall-clock time up to the checkpoint (start-up, validation, saves), summed too

    @classmethod
    def restore(cls, saved: dict[str, Any]) -> RunState:
        step = int(saved.get("step", 0))
        return cls(
            step=step,
            optimizer_steps=int(saved.get("optimizer_steps", step)),
            position=Position.from_dict(saved["position"]) if "position" in saved else Position(),
            tokens=int(saved.get("tokens", 0)),
            target_tokens=int(saved.get("target_tokens", 0)),
            seconds=float(saved.get("seconds", 0.0)),
            elapsed=float(saved.get("elapsed", saved.get("seconds", 0.0))),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "optimizer_steps": self.optimizer_steps,
            "position": self.position.to_dict(),
            "tokens": self.tokens,
            "target_tokens": self.target_tokens,
            "seconds": self.seconds,
            "elapsed": self.elapsed,
        }


@dataclass
class StepOutcome:
    """One optimizer step, over all micro-batches and ranks."""

    loss: float  # summed over all targets / their count (+ the pair-level loss's mean)
    grad_norm: float  # before clipping
    lr: float
    n_targets: float
    metrics: dict[str, float]  # the objective's own figures, averaged over this rank's micro-batches


class Trainer:
    """One run's model, optimizer and state. `step` is one optimizer step, `save` one checkpoint;
    `_run` around it streams the data, validates, logs and decides when to save."""

    def __init__(self, plan: Plan) -> None:
        cfg, device = plan.cfg, plan.device
        self.plan = plan
        torch.manual_seed(cfg.seed)
        self.model = build_model(plan.model_cfg)
        self.init_notes: list[str] = []
        if plan.init is not None and plan.resume_from is None:
            from objtrain.interop import init_from

            self.init_notes = init_from.apply(self.model, plan.init)
        self.model = self.model.to(device)
        self.sharded = cfg.parallel == "fsdp" and plan.world.distributed
        if self.sharded:
            dist.shard(self.model, plan.world, device)
        self.optimizer = build_optimizer(self.model, cfg.optim, device)
        self.scaler = torch.amp.GradScaler(device.type) if plan.dtype == "fp16" else None
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.param_names = [n for g in self.optimizer.param_groups for n in g["names"]]
        saved: dict[str, Any] = {}
        self.saved_rng: dict[str, torch.Tensor] = {}
        if plan.resume_from is not None:
            restored = ckpt.restore(plan.resume_from, self.model, self.optimizer, device, self.sharded)
            saved, self.saved_rng = restored.state, restored.rng
            _check_resume(plan, saved)
        # Shown on resume and kept in metrics.jsonl: why a resumed run may match only to float tolerance.
        self.numerics_changed = _numerics_changed(saved, accounting.numerics(device)) if saved else {}
        self.state = RunState.restore(saved)
        if self.scaler is not None and saved.get("scaler"):
            self.scaler.load_state_dict(saved["scaler"])
        self.loss_of = self._compile() if cfg.precision.compile else None
        self.extension = ""  # what the schedule does from a resume that raised the run's total
        if "total_steps" in saved:  # the schedule is that of the whole run, fixed when it started...
            self.total = int(saved["total_steps"])
            self.totals = [(int(a), int(b)) for a, b in saved.get("schedule_totals") or [(0, self.total)]]
            if saved["config"].get("budget") != config_dict(cfg)["budget"]:  # ...or raised since
                self._extend(saved)
        else:
            self.total = total_steps(cfg, plan, lambda: _time_one_step(plan, self.model, self.scaler))
            self.totals = [(0, self.total)]
        self.checkpoint = plan.resume_from  # the last complete checkpoint

    def _extend(self, saved: dict[str, Any]) -> None:
        """`--resume` with a bigger budget: the run goes on to the new total (`extended_lr_factor`);
        a smaller one, or a --time budget (fixed by timing a step when the run began), is refused."""
        cfg = self.plan.cfg
        if cfg.budget.seconds is not None or saved["config"].get("budget", {}).get("seconds") is not None:
            raise UserError(
                "--resume: a --time budget is fixed as the run starts; extend a run by --steps or --tokens"
            )
        new = total_steps(cfg, self.plan)
        if new < self.total:
            raise UserError(
                f"--resume: the budget gives {new} steps, fewer than the run's {self.total}: a run can be "
                "extended, not shortened (its schedule is fixed up to its end); start a new run (-o)"
            )
        if new == self.total:
            return
        at = self.state.optimizer_steps
        before = extended_lr_factor(at, self.totals, cfg.schedule)
        self.extension = describe_extension(at, self.total, new, cfg.schedule, before)
        self.totals.append((at, new))
        self.total = new

    def restore_rng(self) -> None:
        """Put a resumed run's RNG back as it was after its last saved step. Called right before the first
        step, after every set-up that may draw from the global RNG (a matmul timed for MFU, a step timed for
        a --time budget): the dropout masks of the resumed steps are then those of the run never stopped."""
        ckpt.restore_rng(self.saved_rng)

    def _compile(self) -> Callable[[Batch], LossOutput] | None:
        plan = self.plan
        mtp_split = plan.objective.name == "mtp" and plan.model_cfg.mtp_heads > 1
        if self.sharded or mtp_split:  # these run the blocks outside the root forward: compile each block
            unwrap(self.model).compile_blocks()  # type: ignore[operator]
            return None
        # the forward and the loss as one graph: inductor also fuses the head with the cross-entropy
        return torch.compile(lambda batch: plan.objective.loss(self.model(batch), batch))

    @property
    def finished(self) -> bool:
        return self.state.step >= self.total

    def due(self, every: int) -> bool:
        """Whether an every-N-steps event falls now; the run's end validates and saves on its own."""
        return every > 0 and self.state.step % every == 0 and not self.finished

    def step(self, batches: list[Batch]) -> StepOutcome:
        """One optimizer step over this rank's micro-batches (steps 2 to 4 of the module docstring)."""
        plan, world, device = self.plan, self.plan.world, self.plan.device
        optim_cfg = plan.cfg.optim
        counts = torch.tensor([[b.n_targets, b.n_pairs] for b in batches], dtype=torch.float64).sum(0)
        n_expected, p_expected = dist.all_reduce_sum(counts.to(device), world).tolist()
        # FSDP averages gradients over the ranks where the replicated path sums them: undo the mean.
        ranks = world.world_size if self.sharded else 1.0
        scale, pair_scale = ranks / max(n_expected, 1.0), ranks / max(p_expected, 1.0)
        totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, count, pair sum, pair count
        metric_sums: dict[str, float] = {}
        for batch in batches:
            lo = forward_backward(
                self.model,
                plan.objective,
                batch,
                scale,
                device,
                plan.dtype,
                self.scaler,
                not self.sharded,
                pair_scale,
                self.loss_of,
            )
            totals[0] += lo.loss_sum.double()
            totals[1] += lo.n_targets.double()
            if lo.pair_sum is not None and lo.n_pairs is not None:
                totals[2] += lo.pair_sum.double()
                totals[3] += lo.n_pairs.double()
            for key, value in lo.metrics.items():
                metric_sums[key] = metric_sums.get(key, 0.0) + float(value) / len(batches)
        dist.all_reduce_sum(totals, world)
        n_actual = max(float(totals[1]), 1.0)
        if not self.sharded:
            dist.all_reduce_gradients(self.params, world)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if abs(n_actual - max(n_expected, 1.0)) > 0.5:  # pair-level losses count pairs, not labels
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(max(n_expected, 1.0) / n_actual)
        max_norm = optim_cfg.grad_clip if optim_cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        loss = float(totals[0]) / n_actual + float(totals[2]) / max(float(totals[3]), 1.0)
        if not math.isfinite(loss) or (self.scaler is None and not math.isfinite(grad_norm)):
            what = "loss" if not math.isfinite(loss) else "gradient norm"
            where = f"; the last good checkpoint is {self.checkpoint}" if self.checkpoint else ""
            raise NonFiniteLoss(
                f"the {what} is {loss if what == 'loss' else grad_norm} at step {self.state.step + 1}{where}"
            )
        lr = optim_cfg.lr * extended_lr_factor(self.state.optimizer_steps, self.totals, plan.cfg.schedule)
        set_lr(self.optimizer, lr)
        if self.scaler is not None:
            self.state.optimizer_steps += scaled_step(self.optimizer, self.scaler)
        else:
            self.optimizer.step()
            self.state.optimizer_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        return StepOutcome(loss, grad_norm, lr, n_actual, metric_sums)

    def save(self, log: MetricsLog | None) -> Path:
        """A complete checkpoint of the current step (every rank calls it: gathering may be collective)."""
        plan, world, state = self.plan, self.plan.world, self.state
        weights = dist.full_model_state(self.model, self.sharded)
        moments = dist.full_optimizer_state(self.model, self.optimizer, self.sharded)
        if world.is_main:
            self.checkpoint = ckpt.save_training_checkpoint(
                plan.run_dir,
                state.step,
                self.model,
                weights,
                moments,
                plan.source.specials,
                plan.source.tokenizer,
                _training_info(plan, state.step, state.tokens),
                {
                    **state.to_dict(),
                    "total_steps": self.total,
                    "schedule_totals": [list(t) for t in self.totals],
                    "world_size": world.world_size,
                    "micro_batch": plan.micro_batch,
                    "seq_len": plan.seq_len,
                    **accounting.numerics(plan.device),
                    "dtype": plan.dtype,
                    "param_names": self.param_names,
                    "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                    "config": config_dict(plan.cfg),
                },
                plan.cfg.checkpoint.keep,
            )
            if log is not None:
                log.sync()
        dist.barrier(world)
        return self.checkpoint  # type: ignore[return-value]


@dataclass
class ValidationSets:
    """The fixed valid rows (the same corruption every time), and for left-to-right models the plain
    next-token rows and each token's byte count for bits per byte."""

    batches: list[Batch] = field(default_factory=list)
    lm_batches: list[Batch] = field(default_factory=list)
    byte_table: Tensor | None = None

    @classmethod
    def build(cls, plan: Plan) -> ValidationSets:
        cfg, source = plan.cfg, plan.source
        split = cfg.data.valid_split
        docs = source if source.mixture else source.documents(split)  # a mixture: its stores' splits mixed
        rows, micro = cfg.validation.rows, plan.micro_batch
        sets = cls(
            validation_batches(docs, source.specials, plan.objective, plan.seq_len, rows, micro, split)
        )
        if plan.model_cfg.kind == "decoder" and plan.objective.name in LEFT_TO_RIGHT:
            clm = build_objective("clm", source.specials, source.tokenizer, "decoder")
            sets.lm_batches = validation_batches(docs, source.specials, clm, plan.seq_len, rows, micro, split)
            sets.byte_table = accounting.token_bytes(source.tokenizer)
        return sets


def _run(
    plan: Plan,
    console: Console,
    show: bool,
    force: bool,
    on_record: Callable[[dict[str, Any]], None] | None,
    started: float,
    save_at: frozenset[int] = frozenset(),
) -> TrainResult:
    cfg, world, device, run_dir = plan.cfg, plan.world, plan.device, plan.run_dir
    if device.type == "cpu":
        keep_freed_memory()  # no page faults re-mapping the activations every step
    trainer = Trainer(plan)
    state, total = trainer.state, trainer.total
    n_params = count_parameters(trainer.model)
    flops_token = accounting.flops_per_step(plan.model_cfg, 1, plan.seq_len) / plan.seq_len
    if plan.resume_from is not None and trainer.finished:  # nothing to train, nothing to write
        if show:
            console.print(f"{run_dir} finished at step {state.step}/{total}: nothing to resume", markup=False)
        return TrainResult(
            run_dir=run_dir,
            checkpoint=plan.resume_from,
            step=state.step,
            total_steps=total,
            tokens=state.tokens,
            seconds=state.seconds,
            loss=float("nan"),
            parameters=n_params,
            flops_per_token=flops_token,
            tokens_per_s=state.tokens / max(state.seconds, 1e-9),
            peak_memory_bytes=0,
        )

    # Files: only now, after every check; rank 0 writes, the others read nothing from RUN.
    if world.is_main:
        _claim(plan, force)
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        _write_record(plan, total, state.step)
    dist.barrier(world)
    elapsed_before = state.elapsed

    def elapsed() -> float:
        """Wall-clock seconds of the run so far: start-up, validation and saves too, over resumed parts."""
        return elapsed_before + time.perf_counter() - started

    mirror = None
    if cfg.logging.wandb is not None and world.is_main:
        w = cfg.logging.wandb
        resolved = config_dict(cfg) | {"resolved": _resolved(plan, total)}
        mirror = Wandb(run_dir, w.project, w.mode, resolved, entity=w.entity, name=w.name, tags=w.tags)
    log = MetricsLog(run_dir / "metrics.jsonl", mirror) if world.is_main else None
    tb = TensorBoard(run_dir / "tensorboard", cfg.logging.tensorboard if world.is_main else False)
    if log is not None and plan.resume_from is not None:
        event = {"event": "resume", "step": state.step, "from": plan.resume_from.name, "total_steps": total}
        if trainer.extension:
            event["schedule"] = trainer.extension
        log.write(event | accounting.numerics(device) | {"numerics_changed": trainer.numerics_changed})
    if plan.init is not None and trainer.checkpoint is None and world.is_main:
        notes = "".join(f"; {note}" for note in trainer.init_notes)
        console.print(f"initialised from {plan.init.description}{notes}", markup=False)
        if log is not None:
            log.write({"event": "init_from", "from": str(plan.init.path), "notes": trainer.init_notes})
    if trainer.extension and world.is_main:
        console.print(f"schedule: {trainer.extension}", markup=False)
    if trainer.numerics_changed and world.is_main:
        changes = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in trainer.numerics_changed.items())
        console.print(
            f"note: resumed with other numerics than the checkpoint was saved with ({changes}): the rest "
            "of the run matches an uninterrupted one to float tolerance, not bit for bit",
            markup=False,
        )

    stream = plan.source.stream("train", cfg.seed)
    sampler = RowSampler(
        plan.objective,
        plan.seq_len,
        cfg.seed,
        cfg.batch.batch_size,
        plan.micro_batch,
        world.rank,
        world.world_size,
        state.position,
        state.step,
        total,
        stream=stream,
    )
    loader = make_loader(CorruptedRows(stream, plan.objective, plan.seq_len, cfg.seed), sampler, cfg.workers)
    validating = cfg.validation.every >= 0 and plan.has_valid
    valid = ValidationSets.build(plan) if validating else ValidationSets()

    tokens_per_step = cfg.batch.batch_size * plan.seq_len
    peak, peak_source = accounting.peak_flops(device, plan.dtype)
    memory = accounting.PeakMemory(device)
    memory.reset()
    progress = Progress(console, total, state.step, cfg.logging.every, enabled=show)
    if show:
        _announce(progress, plan, n_params, total, state.step)
    if show and tb.missing:
        progress.note(tb.missing)

    last_loss = float("nan")
    mfus: list[float] = []
    validation: dict[str, float] = {}
    stopped = ""
    wire = iter(loader)
    iterator = received(wire)

    def run_validation() -> dict[str, float]:
        result = validate(trainer.model, plan, valid, trainer.sharded)
        where = {
            "step": state.step,
            "tokens": state.tokens,
            "wall_time": state.seconds,
            "elapsed": elapsed(),
            "time": time.time(),
        }
        _log_validation(log, tb, progress, where, result, on_record)
        return result

    trainer.restore_rng()
    threads = torch.get_num_threads()
    with StopFlag() as flag, workers_stopped(wire), packed_cores(threads, device.type, world.world_size):
        while not trainer.finished:
            t_step = time.perf_counter()
            items, wait = [], 0.0
            for _ in range(plan.accumulation):
                t0 = time.perf_counter()
                items.append(next(iterator))
                wait += time.perf_counter() - t0
            batches = [b.to(device, non_blocking=True) for _, b in items]
            out = trainer.step(batches)

            state.step += 1
            before, state.position = state.position, items[-1][0].after
            state.tokens += tokens_per_step
            state.target_tokens += int(out.n_targets)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            step_time = time.perf_counter() - t_step
            state.seconds += step_time
            last_loss = out.loss
            flops = accounting.flops_per_step(
                plan.model_cfg, cfg.batch.batch_size, plan.seq_len, _target_len(batches)
            )
            record: dict[str, Any] = {
                "step": state.step,
                "rows": state.position.rows,
                "tokens": state.tokens,
                "target_tokens": state.target_tokens,
                "loss": out.loss,
                "lr": out.lr,
                "grad_norm": out.grad_norm,
                "tokens_per_s": tokens_per_step / step_time,
                "mfu": flops / step_time / world.world_size / peak,
                "data_wait_frac": wait / step_time,
                "peak_mem_bytes": memory.peak_bytes(),
                "wall_time": state.seconds,
                "elapsed": elapsed(),
                "time": time.time(),
                **out.metrics,
                **_realised(batches),
            }
            if isinstance(stream, MixedStream):  # per source: rows, tokens, epochs; a new epoch is an event
                record |= stream.figures(state.position, plan.seq_len)
                for name, epoch in stream.epochs_started(before, state.position):
                    if log is not None:
                        log.write({"event": "epoch", "step": state.step, "source": name, "epoch": epoch})
                    progress.note(f"step {state.step}: source {name} starts epoch {epoch + 1}")
            mfus.append(record["mfu"])
            if trainer.scaler is not None:
                record["loss_scale"] = trainer.scaler.get_scale()
                record["skipped_steps"] = state.step - state.optimizer_steps
            if log is not None:
                log.write(record)
            tb.write(state.step, record)
            progress.update(record)
            if on_record is not None:
                on_record(record)

            if validating and trainer.due(cfg.validation.every):
                validation = run_validation()
            if trainer.due(cfg.checkpoint.every) or (state.step in save_at and not trainer.finished):
                state.elapsed = elapsed()
                trainer.save(log)
            stop = torch.tensor([float(flag.signal is not None)], device=device)
            if float(dist.all_reduce_max(stop, world)) > 0:
                state.elapsed = elapsed()
                trainer.save(log)
                stopped = "SIGTERM" if flag.signal == signal.SIGTERM else "SIGINT"
                break

    if not stopped:
        if validating:
            validation = run_validation()
        state.elapsed = elapsed()
        trainer.save(log)
    progress.close()
    tb.close()
    if log is not None:
        log.close()
    del iterator
    result = TrainResult(
        run_dir=run_dir,
        checkpoint=trainer.checkpoint,
        step=state.step,
        total_steps=total,
        tokens=state.tokens,
        seconds=state.seconds,
        loss=last_loss,
        parameters=n_params,
        flops_per_token=flops_token,
        tokens_per_s=state.tokens / max(state.seconds, 1e-9),
        peak_memory_bytes=memory.peak_bytes(),
        validation=validation,
        stopped=stopped,
        mfu=statistics.median(mfus[1:] or mfus) if mfus else float("nan"),
    )
    if show:
        _summary(console, result, peak_source)
        if isinstance(stream, MixedStream):
            console.print(
                _mixture_summary(stream, state.position, plan.seq_len), highlight=False, markup=False
            )
        if not stopped and cfg.logging.sample and not trainer.sharded:  # sharded: generating is collective
            _sample(console, plan, trainer.model)
    return result


def _announce(progress: Progress, plan: Plan, n_params: int, total: int, step: int) -> None:
    cfg = plan.cfg
    size = "--init-from" if plan.init_origin else cfg.model.size  # the source's shape, not a zoo size
    progress.note(
        f"{plan.objective.name} on a {size} {plan.model_cfg.kind} "
        f"({n_params / 1e6:.2f}M params), "
        f"{total} steps of {cfg.batch.batch_size} x {plan.seq_len}, {plan.dtype} "
        + (f"({plan.dtype_note}) " if plan.dtype_note else "")
        + f"on {plan.device}, "
        f"{plan.world.world_size} process{'es' if plan.world.world_size > 1 else ''}"
        + (f", resumed at step {step}" if step else "")
    )
    if plan.objective.name == "mtp" and plan.model_cfg.mtp_heads > 1:
        progress.note(
            f"loss is the sum of the {plan.model_cfg.mtp_heads} heads' losses (each in metrics.jsonl); "
            "val_loss is head 1's, comparable with a next-token model"
        )


def _target_len(batches: list[Batch]) -> int | None:
    b = batches[0]
    return int(b.labels.size(1)) if b.is_encdec else None


def _realised(batches: list[Batch]) -> dict[str, float]:
    """Waste figures the objectives report (raw tokens fed / unused, target tokens dropped), summed."""
    out: dict[str, float] = {}
    for b in batches:
        for key in ("raw_tokens_fed", "raw_tokens_unused", "target_tokens_dropped"):
            if key in b.stats:
                out[key] = out.get(key, 0.0) + float(b.stats[key])
    return out


def _log_validation(
    log: MetricsLog | None,
    tb: TensorBoard,
    progress: Progress,
    where: dict[str, Any],
    validation: dict[str, float],
    on_record: Callable[[dict[str, Any]], None] | None,
) -> None:
    step = where["step"]
    record = {"split": "val", **where, **validation}
    if log is not None:
        log.write(record)
    if on_record is not None:
        on_record(record)
    tb.write(step, validation, prefix="val")
    progress.note(f"step {step}  " + "  ".join(f"{k} {v:.4f}" for k, v in validation.items()))


def _resolved(plan: Plan, total: int) -> dict[str, Any]:
    return {
        "model_kind": plan.model_cfg.kind,
        "model": to_dict(plan.model_cfg),
        "seq_len": plan.seq_len,
        "total_steps": total,
        "micro_batch_size": plan.micro_batch,
        "accumulation": plan.accumulation,
        "processes": plan.world.world_size,
        "dtype": plan.dtype,
        "device": str(plan.device),
        "data": plan.source.identity if plan.source.mixture else str(plan.source.path),
    }


def _claim(plan: Plan, force: bool) -> None:
    """Create (or, with --force, empty) RUN and hold its lock. A new RUN is locked as it is made: were
    another run to have made it since the checks, this one is refused rather than write into it."""
    run_dir = plan.run_dir
    if force and run_dir.exists() and plan.resume_from is None:
        for entry in run_dir.iterdir():  # --force replaces the run, all checks passed; the lock stays held
            if entry.name != OutputLock.NAME:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    if plan.lock is None:
        plan.lock = OutputLock(run_dir, "-o").acquire()
        if any((run_dir / marker).exists() for marker in RUN_MARKERS):
            plan.release()
            raise UserError(f"{run_dir} was made by another run meanwhile (pass --resume to continue it)")


def provenance() -> dict[str, Any]:
    """What made a run: objtrain's version and, installed from a git checkout, its commit (with `+dirty`
    when the tree had changes), torch and Python, the host, the command line, the time."""
    import objtrain

    out: dict[str, Any] = {
        "objtrain": objtrain.__version__,
        "git_commit": _git_commit(Path(objtrain.__file__).resolve().parent.parent),
        "torch": str(torch.__version__),  # a str subclass YAML cannot represent
        "python": platform.python_version(),
        "host": platform.node(),
        "command": _command_line(),
        "cwd": os.getcwd(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return out


def _command_line() -> str:
    """This process's command line as a shell would take it (`python -m objtrain` shown as `objtrain`)."""
    if not sys.argv:
        return ""
    head = Path(sys.argv[0]).name
    return shlex.join(["objtrain" if head == "__main__.py" else head, *sys.argv[1:]])


def _git_commit(root: Path) -> str | None:
    if not (root / ".git").exists():
        return None  # installed from a wheel or an sdist
    try:

        def git(*args: str) -> str:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
            )
            return done.stdout.strip()

        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


RESUMES = "resumes"  # RUN/resumes/NNN-from-step-SSSSSSSS.yaml: one record per resume


def _write_record(plan: Plan, total: int, step: int) -> None:
    """RUN/config.yaml once, when the run starts; each later start (a resume, or a restart of a run with
    no complete checkpoint) adds its own record under RUN/resumes/ instead: the history stays."""
    record = config_dict(plan.cfg) | {"resolved": _resolved(plan, total), "provenance": provenance()}
    target = plan.run_dir / "config.yaml"
    if target.exists():
        folder = plan.run_dir / RESUMES
        n = 1 + sum(1 for p in folder.glob("*.yaml")) if folder.is_dir() else 1
        target = folder / f"{n:03d}-from-step-{step:08d}.yaml"
        record["resumed_from"] = plan.resume_from.name if plan.resume_from is not None else None
    with atomic_file(target, "w") as handle:
        yaml.safe_dump(record, handle, sort_keys=False)


def check_precision(dtype: str, device: torch.device) -> None:
    """Refuse a dtype the device has no business training in."""
    if dtype == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("--dtype bf16: this GPU does not support bf16 (use fp16 or auto)")
    if dtype == "fp16" and device.type == "cpu":  # it runs, but slowly and for no gain over bf16 or fp32
        raise UserError("--dtype fp16 needs a GPU (fp16 with loss scaling); on CPU use fp32 or bf16")


def _check_resume(plan: Plan, state: dict[str, Any]) -> None:
    """The schedule is that of the whole run: refuse a resume that changes what the run is."""
    saved = state.get("config", {})
    now = config_dict(plan.cfg)
    for section in ("model", "objective", "optim", "schedule", "data"):  # a budget may grow: `_extend`
        if section == "data" and _same_data(saved.get(section), now.get(section)):
            continue
        if saved.get(section) != now.get(section):
            raise UserError(
                f"--resume: the {section} settings differ from the checkpoint's ({plan.resume_from}); "
                "start a new run (-o) or use the same settings"
            )
    if (
        saved.get("batch", {}).get("batch_size") != now["batch"]["batch_size"]
        or saved.get("seed") != now["seed"]
    ):
        raise UserError("--resume: batch_size and seed must match the checkpoint's")
    # Every row's length and corruption depend on the sequence length (it may come from a packed store
    # rather than the config): a change would train the rest of the run on other rows.
    seq_len = state.get("seq_len", saved.get("batch", {}).get("seq_len"))
    if seq_len is not None and seq_len != plan.seq_len:
        raise UserError(f"--resume: --seq-len {plan.seq_len} differs from the checkpoint's {seq_len}")


def _same_data(saved: Any, now: Any) -> bool:
    """The same data settings, the store compared as a path: a run started as `train packed` (recorded so
    by older versions) resumes as the absolute path it now records."""
    if not (isinstance(saved, dict) and isinstance(now, dict)):
        return False

    def where(section: dict[str, Any]) -> dict[str, Any]:
        store = section.get("store")
        return section | {"store": None if store is None else str(Path(store).absolute())}

    return where(saved) == where(now)


def _numerics_changed(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{field: (saved, now)} for each numerics field the checkpoint recorded that differs now (older
    checkpoints record only some)."""
    return {k: (saved[k], v) for k, v in now.items() if k in saved and saved[k] != v}


def _time_one_step(plan: Plan, model: nn.Module, scaler: Any) -> float:
    """Seconds of one step's forwards and backwards, measured on a throwaway copy (budget: seconds)."""
    import copy

    probe = copy.deepcopy(model)
    rng = torch.get_rng_state()
    stream = plan.source.stream("train", plan.cfg.seed)
    mb = plan.micro_batch
    (batch,) = leading_batches(
        stream, plan.objective, plan.seq_len, mb, mb, plan.cfg.seed, within_epoch=False
    )
    batch = batch.to(plan.device)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        forward_backward(probe, plan.objective, batch, 1e-3, plan.device, plan.dtype, None)
        times.append(time.perf_counter() - t0)
    torch.set_rng_state(rng)
    return min(times[1:]) * plan.accumulation * 1.1  # + optimizer and data overhead


def _summary(console: Console, r: TrainResult, peak_source: str) -> None:
    val = "  ".join(f"{k} {v:.4f}" for k, v in r.validation.items())
    console.print(
        f"[bold]done[/]: {r.step}/{r.total_steps} steps, {r.tokens:,} tokens in {r.seconds:.1f}s "
        f"({r.tokens_per_s:,.0f} tok/s), loss {r.loss:.4f}{'  ' + val if val else ''}, "
        f"MFU {r.mfu:.1%} (against {peak_source}), peak memory {r.peak_memory_bytes / 2**20:.0f} MiB; "
        f"checkpoint {escape(str(r.checkpoint))}",
        highlight=False,
    )


def _mixture_summary(stream: MixedStream, position: Position, seq_len: int) -> str:
    """One line: each source's share of rows against its weight, its tokens and its epochs."""
    figures = stream.figures(position, seq_len)
    parts = [
        f"{name} {figures[f'source/{name}/share']:.1%} of rows (weight {w:.1%}), "
        f"{int(figures[f'source/{name}/tokens']):,} tokens, {figures[f'source/{name}/epochs']:.2f} epochs"
        for name, w in zip(stream.names, stream.weights, strict=True)
    ]
    return "sources: " + "; ".join(parts)


def _sample(console: Console, plan: Plan, model: nn.Module) -> None:
    """A short greedy continuation (decoders) and, for FIM models, an infill: a look at what was learnt."""
    from objtrain.evaluation import generate as gen

    plain: Any = unwrap(model)
    plain.eval()
    tok = plan.source.tokenizer
    s = plan.source.specials
    if plan.model_cfg.kind != "decoder":
        return
    docs = plan.source.documents(plan.cfg.data.valid_split if plan.has_valid else "train")
    first = tok.decode(docs.tokens[docs.offsets[0] : docs.offsets[0] + 24].tolist())
    prompt = first[: max(len(first) // 2, 1)]
    ids = tok.encode(prompt)
    out = list(gen.generate_decoder(plain, ids, 48, stop_ids=(s.eos,)))
    console.print("[bold]sample[/] (greedy):", highlight=False)
    console.print(f"[dim]{escape(prompt)}[/]{escape(tok.decode(out))}", highlight=False, markup=True)
    if plan.objective.name == "fim":
        prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
        mode = _training_info(plan, 0, 0)["fim_mode"]
        fill = list(
            gen.generate_decoder(
                plain, gen.fim_prompt(tok, prefix, suffix, mode), 24, stop_ids=(s.eos, s.fim_pad)
            )
        )
        console.print(
            f"[bold]infill[/] ({mode}): {escape(repr(prefix))} [bold]{escape(repr(tok.decode(fill)))}[/] "
            f"{escape(repr(suffix))}",
            highlight=False,
        )
