"""The one training loop for every objective and model kind.

    plan = prepare(cfg, run_dir)        # every check, nothing written: a refusal leaves nothing behind
    result = train(cfg, run_dir)        # prepare + the loop; `objtrain train` and `compare` both call it

Per optimizer step (MTP's heads: Gloeckle et al. 2024, section 2):
1. Take this rank's A micro-batches from the loader (timed: the data-wait share).
2. Count their targets on the host (the loader's arrays) and all-reduce: N, the step's global count.
3. Each micro-batch backpropagates `loss_sum / N` (MTP: the trunk once, then each head's forward and
   backward in turn, so one logits tensor is alive at a time). The step's loss is therefore the sum over
   all targets of all micro-batches and ranks over their total count, never a mean of means; if an
   objective's own count differs from the labels' (pair-level losses), gradients are rescaled to it.
4. SUM the gradients over ranks, unscale (fp16), clip the global norm, set the step's lr, step AdamW.
Nothing is read back from the device: the step's numbers wait on it until the loop reads a window of
steps at once (`steps`), at log points, validations, checkpoints and --time checks; a non-finite loss
or gradient norm found there stops the run naming its step (the last good checkpoint stays). Then
validate and checkpoint on their intervals. The lr is a pure function of (optimizer steps
taken, total steps): a step fp16's GradScaler skips does not advance it (`optim`).
Data is a pure function of (seed, rows consumed), RNG states are saved: a resumed run is bit-identical.

Around the loop: `plan` (the checks before anything is written), `budget` (the run's length), `records`
(what a run records about itself: state, config, provenance, resume checks) and `steps` (step accounting).
The loop's parts each decide when they act: `window.MetricsWindow` (the steps not read yet),
`run_log.RunLog` (the logging interval and where records go), `Validator` and `Checkpointer` (here).
"""

from __future__ import annotations

import math
import signal
import statistics
import sys
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape
from torch import Tensor, nn
from torch.utils.data import DataLoader

from objtrain import IGNORE
from objtrain.batch import Batch
from objtrain.data.batches import leading_batches, validation_batches
from objtrain.data.loader import CorruptedRows, RowSampler, WorkItem, make_loader, received, workers_stopped
from objtrain.data.stream import DocumentStream, MixedStream, Position
from objtrain.devices import resolve_device
from objtrain.errors import UserError
from objtrain.io import Unwritable, is_unwritable, unwritable
from objtrain.models.checkpoint import unwrap
from objtrain.models.zoo import build_model, count_parameters
from objtrain.objectives.base import LossOutput, Objective
from objtrain.objectives.registry import build_objective
from objtrain.training import accounting, budget
from objtrain.training import checkpoint as ckpt
from objtrain.training import distributed as dist
from objtrain.training.budget import TimeBudget, measure_step, total_steps
from objtrain.training.config import TrainConfig, config_dict
from objtrain.training.cores import packed_cores, unpin_this_process
from objtrain.training.host_memory import keep_freed_memory
from objtrain.training.logger import MetricsLog, Progress, TensorBoard, Wandb
from objtrain.training.optim import (
    build_optimizer,
    clip_scaled,
    describe_extension,
    extended_lr_factor,
    scaled_step,
    set_lr,
)
from objtrain.training.plan import Plan, prepare
from objtrain.training.records import (
    RunState,
    check_resume,
    claim,
    numerics_changed,
    resolved_settings,
    training_info,
    write_record,
)
from objtrain.training.run_log import RunLog
from objtrain.training.steps import NonFiniteLoss as NonFiniteLoss  # re-exported: what `train` raises
from objtrain.training.steps import (
    Pending,
    StepFigures,
    host_counts,
    read_window,
    realised,
    step_values,
)
from objtrain.training.window import MetricsWindow

# What a finished run shows after its summary, given the plan and the trained model.
AfterTraining = Callable[[Console, Plan, nn.Module], None]


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


def autocast(device: torch.device, dtype: str) -> Any:
    if dtype == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=accounting.DTYPES[dtype])


class StopFlag:
    """Ctrl-C / SIGTERM set a flag; the loop saves at the next step boundary (several processes: at the
    next step they all read, where they agree to stop). A second Ctrl-C stops now."""

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

    An objective with its own backward (`Objective.splits_backward`: MTP's per-head backward) uses it unless
    `sequential` is off (a sharded model must go through its root forward, which the trunk/heads split
    bypasses). `loss_of`, when given, is the forward and the loss as one (compiled) function."""
    plain = unwrap(model)
    if sequential and objective.splits_backward(getattr(plain, "config", None)):

        def backward(loss: Tensor) -> None:
            (scaler.scale(loss) if scaler is not None else loss).backward()

        return objective.split_forward_backward(
            plain, batch, scale, lambda: autocast(device, dtype), backward
        )
    with autocast(device, dtype):
        lo = loss_of(batch) if loss_of is not None else objective.loss(model(batch), batch)
    loss = lo.loss_sum * scale
    if lo.pair_sum is not None:
        loss = loss + lo.pair_sum * pair_scale
    (scaler.scale(loss) if scaler is not None else loss).backward()
    return lo.detach()


@torch.no_grad()
def validate(model: nn.Module, plan: Plan, valid: ValidationSets, sharded: bool = False) -> dict[str, float]:
    """Objective loss on the fixed valid rows (`Objective.validation_loss`: MTP's head 1), and bits per byte
    for left-to-right models.

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
            lo = plan.objective.validation_loss(out, batch)
            if lo.pair_sum is not None and lo.n_pairs is not None:
                sums[4] += lo.pair_sum.double()
                sums[5] += lo.n_pairs.double()
        sums[0] += lo.loss_sum.double()
        sums[1] += lo.n_targets.double()
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


def train(
    cfg: TrainConfig,
    run_dir: Path,
    resume: bool = False,
    force: bool = False,
    console: Console | None = None,
    show_progress: bool = True,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    save_at: Collection[int] = (),
    after: AfterTraining | None = None,
) -> TrainResult:
    """Train `cfg` into `run_dir` (see the module docstring); returns what the run did.

    `on_record` sees every metrics record (training steps, and validations with `"split": "val"`) on the
    main process: `objtrain compare` draws its progress across arms from it. `save_at`: steps to save a
    checkpoint at besides `checkpoint.every` (a compare sweep branches shorter runs from them). `after`:
    shown a run that trained to its end with its progress shown and `logging.sample` on, the model still in
    memory (`objtrain train` prints a greedy sample through it; decoding lives above the loop).
    """
    started = time.perf_counter()
    console = console or Console(stderr=True, highlight=False)
    world = dist.setup(resolve_device(cfg.device).type)
    plan: Plan | None = None
    try:
        plan = prepare(cfg, run_dir, resume=resume, force=force, world=world, console=console)
        hook = on_record if world.is_main else None
        show = show_progress and world.is_main
        return _run(plan, console, show, force, hook, started, frozenset(save_at), after)
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


GRAPHS = "reduce-overhead: CUDA graphs"


def compile_mode(setting: bool | str, plan: Plan) -> str | None:
    """How the step is compiled (None: eager). `auto` compiles on CUDA and stays eager elsewhere: on a
    CPU compiling costs tens of seconds for a few percent; `true` compiles anywhere.

    On CUDA the forward and loss replay CUDA graphs (`mode="reduce-overhead"`) where that is safe: small
    models are launch-bound (about 10% MFU eager on an H200), and a graph launches a step's hundreds of
    kernels at once. Not with gradient accumulation: a later micro-batch's backward accumulates into a
    `.grad` that can be a graph's output buffer, overwritten by the next replay (an error, or silently
    wrong gradients in older releases: PyTorch's CUDA graph trees notes); with one micro-batch the
    gradients are used and dropped (`zero_grad(set_to_none=True)`) before the next replay. Not for
    encoder-decoder rows, whose target length varies from batch to batch (each new shape records new
    graphs), nor where the blocks are
    compiled one by one (MTP's per-head backward, FSDP). There inductor's default mode compiles."""
    if setting is False or (setting == "auto" and plan.device.type != "cuda"):
        return None
    if plan.objective.splits_backward(plan.model_cfg) or (
        plan.cfg.parallel == "fsdp" and plan.world.distributed
    ):
        return "default, block by block"
    if plan.device.type == "cuda" and plan.accumulation == 1 and plan.model_cfg.kind != "encdec":
        return GRAPHS
    return "default"


def _ratio(ranks: float, count: float | Tensor) -> float | Tensor:
    """ranks / count, the count at least 1: a float from host counts, a device scalar from nccl's sum."""
    if isinstance(count, Tensor):
        return (ranks / count.clamp(min=1.0)).float()
    return ranks / max(count, 1.0)


class Trainer:
    """One run's model, optimizer and state. `step` is one optimizer step, `save` one checkpoint;
    `_run` around it streams the data, and its parts decide when to log, validate and save."""

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
            check_resume(plan, saved)
        # Shown on resume and kept in metrics.jsonl: why a resumed run may match only to float tolerance.
        self.numerics_changed = numerics_changed(saved, accounting.numerics(device)) if saved else {}
        self.state = RunState.restore(saved)
        if self.scaler is not None and saved.get("scaler"):
            self.scaler.load_state_dict(saved["scaler"])
        self.graphs = False  # the compiled step replays CUDA graphs (`compile_mode`)
        self.compile_mode = compile_mode(cfg.precision.compile, plan)  # None: eager
        self.loss_of = self._compile() if self.compile_mode is not None else None
        self.extension = ""  # what the schedule does from a resume that raised the run's total
        if "total_steps" in saved:  # the schedule is that of the whole run, fixed when it started...
            self.total = int(saved["total_steps"])
            self.totals = [(int(a), int(b)) for a, b in saved.get("schedule_totals") or [(0, self.total)]]
            if saved["config"].get("budget") != config_dict(cfg)["budget"]:  # ...or raised since
                self._extend(saved)
        else:
            self.total = total_steps(cfg, plan, lambda: _time_step(plan, self.model))
            if cfg.budget.seconds is not None:  # timed on each rank: the main process's estimate for all
                self.total = int(dist.broadcast_object(self.total, plan.world))  # type: ignore[call-overload]
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
        if self.sharded or plan.objective.splits_backward(plan.model_cfg):  # blocks outside the root forward
            unwrap(self.model).compile_blocks()  # type: ignore[operator]
            return None
        # the forward and the loss as one graph: inductor also fuses the head with the cross-entropy
        self.graphs = self.compile_mode == GRAPHS
        mode = "reduce-overhead" if self.graphs else None
        return torch.compile(lambda batch: plan.objective.loss(self.model(batch), batch), mode=mode)

    @property
    def finished(self) -> bool:
        return self.state.step >= self.total

    def step(self, batches: list[Batch], counts: tuple[float, float] | None = None) -> StepFigures:
        """One optimizer step over this rank's micro-batches (steps 2 to 4 of the module docstring), with no
        read from the device: its numbers come back as `StepFigures`, read when they are logged. `counts`:
        the micro-batches' (targets, pairs), counted on the host before they were moved (`host_counts`)."""
        plan, world, device = self.plan, self.plan.world, self.plan.device
        optim_cfg = plan.cfg.optim
        n_expected: float | Tensor
        p_expected: float | Tensor
        n_expected, p_expected = counts if counts is not None else host_counts(batches)
        if world.distributed:
            summed = torch.tensor([n_expected, p_expected], dtype=torch.float64, device=device)
            dist.all_reduce_sum(summed, world)
            # gloo reduces in host memory, which reads without waiting; nccl's sum stays on the GPU
            n_expected, p_expected = summed.tolist() if summed.device.type == "cpu" else summed.unbind()
        # FSDP averages gradients over the ranks where the replicated path sums them: undo the mean.
        ranks = world.world_size if self.sharded else 1.0
        scale, pair_scale = _ratio(ranks, n_expected), _ratio(ranks, p_expected)
        totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, count, pair sum, pair count
        metrics: list[dict[str, Tensor]] = []
        for batch in batches:
            if self.graphs:  # each micro-batch's forward replays its graphs afresh (CUDA graph trees)
                torch.compiler.cudagraph_mark_step_begin()
            lo = forward_backward(
                self.model,
                plan.objective,
                batch,
                scale,  # type: ignore[arg-type]
                device,
                plan.dtype,
                self.scaler,
                not self.sharded,
                pair_scale,  # type: ignore[arg-type]
                self.loss_of,
            )
            totals[0] += lo.loss_sum.double()
            totals[1] += lo.n_targets.double()
            if lo.pair_sum is not None and lo.n_pairs is not None:
                totals[2] += lo.pair_sum.double()
                totals[3] += lo.n_pairs.double()
            metrics.append(lo.metrics)
        dist.all_reduce_sum(totals, world)
        if not self.sharded:
            dist.all_reduce_gradients(self.params, world)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        # Pair-level losses may count pairs, not labels: the gradients are rescaled to the loss's own count.
        # The factor is exactly 1.0 when the counts agree (every shipped objective), folded into the clip.
        n_actual = totals[1].clamp(min=1.0)
        factor = (
            n_expected.clamp(min=1.0) if isinstance(n_expected, Tensor) else max(n_expected, 1.0)
        ) / n_actual
        max_norm = optim_cfg.grad_clip if optim_cfg.grad_clip > 0 else float("inf")
        if self.sharded:  # DTensor gradients: torch's clip, the factor (a device scalar) applied first
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(factor.to(p.grad.dtype))  # x * 1.0 is x: no change where the counts agree
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        else:
            norm = clip_scaled(self.params, max_norm, factor.float())
        lr = optim_cfg.lr * extended_lr_factor(self.state.optimizer_steps, self.totals, plan.cfg.schedule)
        set_lr(self.optimizer, lr)
        if self.scaler is not None:  # the scaler reads its inf check itself: fp16 waits for the GPU each step
            self.state.optimizer_steps += scaled_step(self.optimizer, self.scaler)
        else:
            self.optimizer.step()
            self.state.optimizer_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        names = tuple(metrics[0]) if metrics else ()
        values = step_values(totals, norm, [[mb[k] for k in names] for mb in metrics])
        return StepFigures(values, names, len(batches), lr, check_grad=self.scaler is None)

    def retarget(self, total: int) -> None:
        """A new total for the run (`--time`'s checks): the schedule goes on from where it stands."""
        if total != self.total:
            self.totals.append((self.state.optimizer_steps, total))
            self.total = total

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
                training_info(plan, state.step, state.tokens),
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
        if plan.model_cfg.kind == "decoder" and plan.objective.scores_left_to_right:
            clm = build_objective("clm", source.specials, source.tokenizer, "decoder")
            sets.lm_batches = validation_batches(docs, source.specials, clm, plan.seq_len, rows, micro, split)
            sets.byte_table = accounting.token_bytes(source.tokenizer)
        return sets


class Validator:
    """The fixed valid rows and when to score them: every `validation.every` steps and at the run's end
    (0: at the end only; below 0, or no valid split: never). `last`: the latest figures."""

    def __init__(self, plan: Plan, trainer: Trainer) -> None:
        self.plan, self.trainer = plan, trainer
        self.every = plan.cfg.validation.every
        self.enabled = self.every >= 0 and plan.has_valid
        self.sets = ValidationSets.build(plan) if self.enabled else ValidationSets()
        self.last: dict[str, float] = {}

    def due(self, step: int) -> bool:
        """Whether the interval falls at `step` (the run's end validates on its own)."""
        return self.enabled and self.every > 0 and step % self.every == 0

    def run(self, run_log: RunLog, elapsed: Callable[[], float]) -> None:
        trainer, state = self.trainer, self.trainer.state
        result = validate(trainer.model, self.plan, self.sets, trainer.sharded)
        where = {
            "step": state.step,
            "tokens": state.tokens,
            "wall_time": state.seconds,
            "elapsed": elapsed(),
            "time": time.time(),
        }
        run_log.validation(where, result)
        self.last = result


class Checkpointer:
    """When to save, and saving: every `checkpoint.every` steps and at the steps of `save_at` (a compare
    sweep branches shorter runs from them), at a stop and at the run's end. A checkpoint is saved only
    right after a read of the metrics window found every step finite (`steps` module docstring)."""

    def __init__(
        self, trainer: Trainer, save_at: frozenset[int], log: MetricsLog | None, elapsed: Callable[[], float]
    ) -> None:
        self.trainer = trainer
        self.every = trainer.plan.cfg.checkpoint.every
        self.save_at = save_at
        self.log = log
        self.elapsed = elapsed

    def due(self, step: int) -> bool:
        """Whether the interval or a `save_at` step falls at `step` (the run's end saves on its own)."""
        return (self.every > 0 and step % self.every == 0) or step in self.save_at

    def save(self) -> None:
        self.trainer.state.elapsed = self.elapsed()
        self.trainer.save(self.log)


@dataclass
class _Parts:
    """A run's parts around its `Trainer` (torchtitan's trainer components), each owning its own "is it
    time?": the log (`RunLog.due`), the validator, the checkpointer and the --time budget's checks; the
    metrics window holds the steps not read yet. `stream`: the training data; `memory`: the peak gauge."""

    trainer: Trainer
    run_log: RunLog
    window: MetricsWindow
    validator: Validator
    checkpointer: Checkpointer
    timer: TimeBudget | None
    stream: DocumentStream | MixedStream
    memory: accounting.PeakMemory
    elapsed: Callable[[], float]


def _run(
    plan: Plan,
    console: Console,
    show: bool,
    force: bool,
    on_record: Callable[[dict[str, Any]], None] | None,
    started: float,
    save_at: frozenset[int] = frozenset(),
    after: AfterTraining | None = None,
) -> TrainResult:
    cfg, device = plan.cfg, plan.device
    if device.type == "cpu":
        keep_freed_memory()  # no page faults re-mapping the activations every step
    trainer = Trainer(plan)
    state = trainer.state
    n_params = count_parameters(trainer.model)
    flops_token = accounting.flops_per_step(plan.model_cfg, 1, plan.seq_len) / plan.seq_len
    if plan.resume_from is not None and trainer.finished:  # nothing to train, nothing to write
        return _nothing_to_resume(plan, trainer, console, show, n_params, flops_token)
    _claim_run_dir(plan, force, trainer)
    elapsed_before = state.elapsed

    def elapsed() -> float:
        """Wall-clock seconds of the run so far: start-up, validation and saves too, over resumed parts."""
        return elapsed_before + time.perf_counter() - started

    log, tb = _open_log(plan, trainer)
    _say_start(plan, trainer, log, console)
    stream = plan.source.stream("train", cfg.seed)
    timer = TimeBudget(cfg.budget.seconds, state.step) if cfg.budget.seconds is not None else None
    loader = _loader(plan, state, stream, trainer.total if timer is None else sys.maxsize)
    validator = Validator(plan, trainer)
    peak, peak_source = accounting.peak_flops(device, plan.dtype)
    memory = accounting.PeakMemory(device)
    memory.reset()
    progress = Progress(console, trainer.total, state.step, cfg.logging.every, enabled=show)
    if show:
        _announce(progress, plan, n_params, trainer.total, state.step, trainer.compile_mode)
    if show and tb.missing:
        progress.note(tb.missing)
    run_log = RunLog(log, tb, progress, on_record, cfg.logging.every, state.step + 1)
    window = MetricsWindow(
        read_window,
        state,
        run_log,
        queued=device.type == "cuda",
        tokens_per_step=cfg.batch.batch_size * plan.seq_len,
        world_size=plan.world.world_size,
        peak_flops=peak,
        compile_mode=trainer.compile_mode,
    )
    checkpointer = Checkpointer(trainer, save_at, log, elapsed)
    parts = _Parts(trainer, run_log, window, validator, checkpointer, timer, stream, memory, elapsed)
    wire = iter(loader)
    iterator = received(wire)
    stopped = _train_steps(parts, wire, iterator)
    if not stopped:
        if validator.enabled:
            validator.run(run_log, elapsed)
        checkpointer.save()
    run_log.close()
    del iterator
    result = TrainResult(
        run_dir=plan.run_dir,
        checkpoint=trainer.checkpoint,
        step=state.step,
        total_steps=trainer.total,
        tokens=state.tokens,
        seconds=state.seconds,
        loss=window.last_loss,
        parameters=n_params,
        flops_per_token=flops_token,
        tokens_per_s=state.tokens / max(state.seconds, 1e-9),
        peak_memory_bytes=memory.peak_bytes(),
        validation=validator.last,
        stopped=stopped,
        mfu=statistics.median(window.mfus[1:] or window.mfus) if window.mfus else float("nan"),
    )
    if show:
        _show_end(console, result, peak_source, parts, after)
    return result


def _train_steps(p: _Parts, wire: Iterator[Any], iterator: Iterator[tuple[WorkItem, Batch]]) -> str:
    """Steps until the run's end or a signal (the module docstring's steps 1 to 4, then the parts' due
    events); returns "" at the end, else the signal ("SIGINT", "SIGTERM") after saving."""
    trainer, plan = p.trainer, p.trainer.plan
    world, device, state = plan.world, plan.device, trainer.state
    stopped = ""
    trainer.restore_rng()
    threads = torch.get_num_threads()
    with StopFlag() as flag, workers_stopped(wire), packed_cores(threads, device.type, world.world_size):
        while not trainer.finished:
            t_step = budget.clock()
            items, wait = _next_batches(iterator, plan.accumulation)
            host = [b for _, b in items]
            counts = host_counts(host)  # on the host, before the copy: no read back from the device
            batches = [b.to(device, non_blocking=True) for b in host]
            figures = trainer.step(batches, counts)

            state.step += 1
            before, state.position = state.position, items[-1][0].after
            state.tokens += p.window.tokens_per_step
            # on a GPU: until queued; the window's read puts the real time in
            step_time = budget.clock() - t_step
            state.seconds += step_time
            p.window.add(_pending(p, figures, host, batches, before, step_time, wait), t_step)

            # Every rank reads at the same steps (the collectives below need it); one process alone also
            # reads at a signal, to save at once.
            step = state.step
            logs = p.run_log.due(step, trainer.finished)
            validating, saving = p.validator.due(step), p.checkpointer.due(step)
            checking = p.timer is not None and p.timer.due(step)
            signalled = not world.distributed and flag.signal is not None
            if not (logs or validating or saving or checking or signalled):
                continue
            p.window.read(trainer.checkpoint)
            if p.timer is not None and (checking or logs):
                trainer.retarget(_shared(p.timer.check(step, state.seconds, trainer.total), p.timer, world))
                p.run_log.set_total(trainer.total)
            # The run's end validates and saves on its own; a --time check may have just moved the end
            # (to this step, or past it).
            if validating and not trainer.finished:
                p.validator.run(p.run_log, p.elapsed)
            if saving and not trainer.finished:
                p.checkpointer.save()
            if _stop_agreed(flag, world, device):
                p.checkpointer.save()
                stopped = "SIGTERM" if flag.signal == signal.SIGTERM else "SIGINT"
                break
        p.window.read(
            trainer.checkpoint
        )  # an error ends the run before here: its unread steps are not written
    return stopped


def _next_batches(
    iterator: Iterator[tuple[WorkItem, Batch]], n: int
) -> tuple[list[tuple[WorkItem, Batch]], float]:
    """This rank's `n` micro-batches from the loader, and the seconds spent waiting for them."""
    items, wait = [], 0.0
    for _ in range(n):
        t0 = budget.clock()
        items.append(next(iterator))
        wait += budget.clock() - t0
    return items, wait


def _pending(
    p: _Parts,
    figures: StepFigures,
    host: list[Batch],
    batches: list[Batch],
    before: Position,
    step_time: float,
    wait: float,
) -> Pending:
    """The step just run as the metrics window holds it: its device figures and its record's host side
    (`before`: the data position before the step)."""
    trainer, plan = p.trainer, p.trainer.plan
    state, world = trainer.state, plan.world
    # Counted from the host batches as the model sees them: a contrastive step runs two views of
    # each row and no logits backward, an encoder-decoder its own target length.
    flops = world.world_size * sum(accounting.batch_flops(plan.model_cfg, b) for b in host)
    pending = Pending(
        figures,
        {"step": state.step, "rows": state.position.rows, "tokens": state.tokens},
        {
            "peak_mem_bytes": p.memory.peak_bytes(),
            "wall_time": state.seconds,
            "elapsed": p.elapsed(),
            "time": time.time(),
        },
        step_time,
        wait,
        flops,
        realised(batches),
    )
    if isinstance(p.stream, MixedStream):  # per source: rows, tokens, epochs; a new epoch is an event
        pending.tail |= p.stream.figures(state.position, plan.seq_len)
        for name, epoch in p.stream.epochs_started(before, state.position):
            pending.events.append({"event": "epoch", "step": state.step, "source": name, "epoch": epoch})
            pending.notes.append(f"step {state.step}: source {name} starts epoch {epoch + 1}")
    if trainer.scaler is not None:
        pending.tail["loss_scale"] = trainer.scaler.get_scale()
        pending.tail["skipped_steps"] = state.step - state.optimizer_steps
    return pending


def _stop_agreed(flag: StopFlag, world: dist.World, device: torch.device) -> bool:
    """Whether to stop now: a signal arrived (several processes: at any rank, all stop at the same step)."""
    stop = flag.signal is not None
    if world.distributed:  # one rank's signal stops them all, at the same step
        stop = bool(dist.all_reduce_max(torch.tensor([float(stop)], device=device), world).item())
    return stop


def _nothing_to_resume(
    plan: Plan, trainer: Trainer, console: Console, show: bool, n_params: int, flops_token: float
) -> TrainResult:
    """`--resume` of a run that finished: nothing to train, nothing written."""
    state = trainer.state
    if show:
        console.print(
            f"{plan.run_dir} finished at step {state.step}/{trainer.total}: nothing to resume", markup=False
        )
    return TrainResult(
        run_dir=plan.run_dir,
        checkpoint=plan.resume_from,
        step=state.step,
        total_steps=trainer.total,
        tokens=state.tokens,
        seconds=state.seconds,
        loss=float("nan"),
        parameters=n_params,
        flops_per_token=flops_token,
        tokens_per_s=state.tokens / max(state.seconds, 1e-9),
        peak_memory_bytes=0,
    )


def _claim_run_dir(plan: Plan, force: bool, trainer: Trainer) -> None:
    """Files: only now, after every check; rank 0 writes, the others read nothing from RUN."""
    if plan.world.is_main:
        claim(plan, force)
        (plan.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        write_record(plan, trainer.total, trainer.state.step)
    dist.barrier(plan.world)


def _open_log(plan: Plan, trainer: Trainer) -> tuple[MetricsLog | None, TensorBoard]:
    """RUN/metrics.jsonl (mirrored to Weights & Biases when configured) on the main process, and
    TensorBoard; a resumed run's first record is its `resume` event."""
    cfg, world = plan.cfg, plan.world
    mirror = None
    if cfg.logging.wandb is not None and world.is_main:
        w = cfg.logging.wandb
        resolved = config_dict(cfg) | {"resolved": resolved_settings(plan, trainer.total)}
        mirror = Wandb(plan.run_dir, w.project, w.mode, resolved, entity=w.entity, name=w.name, tags=w.tags)
    log = MetricsLog(plan.run_dir / "metrics.jsonl", mirror) if world.is_main else None
    tb = TensorBoard(plan.run_dir / "tensorboard", cfg.logging.tensorboard if world.is_main else False)
    if log is not None and plan.resume_from is not None:
        event = {
            "event": "resume",
            "step": trainer.state.step,
            "from": plan.resume_from.name,
            "total_steps": trainer.total,
        }
        if trainer.extension:
            event["schedule"] = trainer.extension
        log.write(event | accounting.numerics(plan.device) | {"numerics_changed": trainer.numerics_changed})
    return log, tb


def _say_start(plan: Plan, trainer: Trainer, log: MetricsLog | None, console: Console) -> None:
    """What the run starts from, on the main process: --init-from's weights, a raised total's schedule,
    numerics that differ from the checkpoint's."""
    if not plan.world.is_main:
        return
    if plan.init is not None and trainer.checkpoint is None:
        notes = "".join(f"; {note}" for note in trainer.init_notes)
        console.print(f"initialised from {plan.init.description}{notes}", markup=False)
        if log is not None:
            log.write({"event": "init_from", "from": str(plan.init.path), "notes": trainer.init_notes})
    if trainer.extension:
        console.print(f"schedule: {trainer.extension}", markup=False)
    if trainer.numerics_changed:
        changes = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in trainer.numerics_changed.items())
        console.print(
            f"note: resumed with other numerics than the checkpoint was saved with ({changes}): the rest "
            "of the run matches an uninterrupted one to float tolerance, not bit for bit",
            markup=False,
        )


def _loader(plan: Plan, state: RunState, stream: DocumentStream | MixedStream, last_step: int) -> DataLoader:
    """The training rows from the run's position on, up to `last_step` (a --time run: its checks decide
    where it ends), corrupted by the objective (`data.CorruptedRows`)."""
    cfg, world = plan.cfg, plan.world
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
        last_step,
        stream=stream,
    )
    rows = CorruptedRows(stream, plan.objective, plan.seq_len, cfg.seed)
    return make_loader(
        rows, sampler, plan.workers, pin=plan.device.type == "cuda", on_worker_start=unpin_this_process
    )


def _show_end(
    console: Console, result: TrainResult, peak_source: str, p: _Parts, after: AfterTraining | None
) -> None:
    """The summary line, a mixture's sources, and `after` for a run that trained to its end."""
    plan, trainer = p.trainer.plan, p.trainer
    _summary(console, result, peak_source)
    if isinstance(p.stream, MixedStream):
        console.print(
            _mixture_summary(p.stream, trainer.state.position, plan.seq_len), highlight=False, markup=False
        )
    if after is not None and not result.stopped and plan.cfg.logging.sample and not trainer.sharded:
        after(console, plan, trainer.model)  # sharded: generating is collective, so not there


def _announce(
    progress: Progress, plan: Plan, n_params: int, total: int, step: int, mode: str | None = None
) -> None:
    cfg = plan.cfg
    size = "--init-from" if plan.init_origin else cfg.model.size  # the source's shape, not a zoo size
    timed = cfg.budget.seconds is not None
    progress.note(
        f"{plan.objective.name} on a {size} {plan.model_cfg.kind} "
        f"({n_params / 1e6:.2f}M params), "
        + ("~" if timed else "")
        + f"{total} steps of {cfg.batch.batch_size} x {plan.seq_len}, {plan.dtype} "
        + (f"({plan.dtype_note}) " if plan.dtype_note else "")
        + f"on {plan.device}, "
        f"{plan.world.world_size} process{'es' if plan.world.world_size > 1 else ''}"
        f", {plan.workers} loader worker{'' if plan.workers == 1 else 's'}"
        + (" each" if plan.world.world_size > 1 else "")
        + (f", resumed at step {step}" if step else "")
        + (f", compiled ({mode})" if mode else "")
        + (f"; --time {cfg.budget.seconds:g} s: the step count is re-estimated as it runs" if timed else "")
    )
    for note in plan.objective.run_notes(plan.model_cfg):
        progress.note(note)


def _time_step(plan: Plan, model: nn.Module) -> float:
    """Seconds of one full step (every micro-batch, clipping, the optimizer step; `budget.measure_step`)
    on a throwaway copy of the model and of its optimizer, with the run's RNG left as it was: the first
    estimate of a --time budget."""
    import copy

    device = plan.device
    probe = copy.deepcopy(model)
    optimizer = build_optimizer(probe, plan.cfg.optim, device)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
    mb = plan.micro_batch
    stream = plan.source.stream("train", plan.cfg.seed)
    (batch,) = leading_batches(
        stream, plan.objective, plan.seq_len, mb, mb, plan.cfg.seed, within_epoch=False
    )
    batch = batch.to(device)

    def run_step() -> None:
        for _ in range(plan.accumulation):
            forward_backward(probe, plan.objective, batch, 1e-3, device, plan.dtype, None)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    try:
        return measure_step(run_step, sync)
    finally:
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def _shared(total: int, timer: TimeBudget, world: dist.World) -> int:
    """A --time check's decision as the main process took it: every rank trains the same steps."""
    if world.distributed:
        total, timer.next_check, timer.warm = dist.broadcast_object(
            (total, timer.next_check, timer.warm), world
        )  # type: ignore[misc]
    return total


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
