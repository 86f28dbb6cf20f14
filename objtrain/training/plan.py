"""A run's plan: every check and default resolved before a file is written (`prepare`).

A refusal here leaves nothing behind: RUN, its store and its precision are checked, the objective is tried
on two real rows, and a resume's checkpoint is found, all before the model is built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from objtrain.data.batches import leading_batches
from objtrain.data.default import default_store
from objtrain.data.loader import auto_workers
from objtrain.data.mixture import StoreMixture, open_stores
from objtrain.devices import auto_dtype, resolve_device
from objtrain.errors import UserError
from objtrain.interop import require
from objtrain.io import OutputLock, check_output_free, check_writable
from objtrain.memory import check_fits
from objtrain.models.attention import FLEX_ON_CPU
from objtrain.models.zoo import ModelConfig, build_model, config_to_dict, model_config
from objtrain.objectives.base import Objective
from objtrain.objectives.registry import build_objective
from objtrain.training import accounting
from objtrain.training import checkpoint as ckpt
from objtrain.training import distributed as dist
from objtrain.training.config import OptimConfig, TrainConfig, check_divisible
from objtrain.training.host_memory import keep_freed_memory
from objtrain.training.optim import build_optimizer
from objtrain.training.precision import choose_cpu_dtype, time_step

DEFAULT_SEQ_LEN = 256
RUN_MARKERS = ("config.yaml", "metrics.jsonl", "checkpoints")  # what makes a directory a training run


@dataclass
class Plan:
    """Everything checked and resolved before a file is written."""

    cfg: TrainConfig
    run_dir: Path
    world: dist.World
    device: torch.device
    dtype: str
    source: StoreMixture  # one store, or a mixture (data.sources)
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
    workers: int = 0  # loader worker processes, `workers: auto` resolved (`data.loader.auto_workers`)

    def release(self) -> None:
        """Let RUN go (another process may then write it)."""
        if self.lock is not None:
            self.lock.release()


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


def _resume_point(run_dir: Path, world: dist.World, console: Console | None) -> Path | None:
    """The checkpoint `--resume` continues from (None: RUN has none yet), its leftovers cleaned; RUN with
    checkpoints none of which is complete is refused rather than restarted from scratch."""
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
        raise UserError(f"{run_dir} has checkpoints but none is complete; refusing to restart from scratch")
    return resume_from


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
    source = open_stores(store, cfg.data.sources)
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
    overrides = objective.model_overrides(dict(cfg.model.overrides))  # e.g. MTP's heads, SimCSE's dropout
    model_cfg = model_config(
        objective.model_kind, cfg.model.size, overrides, vocab_size=source.tokenizer.vocab_size
    )
    seq_len = cfg.batch.seq_len or source.packed_length or DEFAULT_SEQ_LEN
    micro, accumulation = check_divisible(cfg, world.world_size)
    # rows no memory holds are refused now, before any is read or built (the lower, bf16 estimate)
    need = accounting.activation_bytes(model_cfg, micro, seq_len, "bf16")
    check_fits(need, f"--seq-len {seq_len} ({micro} rows per micro-batch)", device)
    has_valid = source.has_split(cfg.data.valid_split)
    if cfg.validation.every >= 0 and not has_valid:
        raise UserError(no_valid_split(source, cfg.data.valid_split))
    # Both splits are read and checked now, before anything is written: a damaged store leaves no run behind.
    if cfg.validation.every >= 0:
        source.documents(cfg.data.valid_split)
    _probe_objective(objective, source, seq_len, cfg.seed)
    resume_from = _resume_point(run_dir, world, console) if resume and run_dir.exists() else None
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
    step = _StepProbe(objective, source, model_cfg, seq_len, micro, cfg.seed, world.distributed, cfg.optim)
    dtype, dtype_note = _choose_dtype(cfg.precision.dtype, device, resume_from, step)
    check_precision(dtype, device)
    if model_cfg.attention_kernel == "flex" and device.type == "cpu":  # refused here, before a run dir exists
        raise UserError(FLEX_ON_CPU)
    workers = (
        cfg.workers if isinstance(cfg.workers, int) else auto_workers(device.type, world.local_world_size)
    )
    if resume and resume_from is None and console is not None and world.is_main:  # else silently a new run
        console.print(f"note: {run_dir} has no checkpoint to resume: --resume starts at step 0", markup=False)
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
        workers=workers,
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


def _choose_dtype(
    requested: str, device: torch.device, resume_from: Path | None, step: _StepProbe | None = None
) -> tuple[str, str]:
    """(dtype, why): a resumed run keeps the precision it was started in (`auto` takes the checkpoint's;
    another explicit one is refused); a new run's `auto` is decided by the device: on a CPU by timing the
    run's own step in both precisions once (`precision.choose_cpu_dtype`, cached), elsewhere by its units."""
    saved = ckpt.read_state(resume_from).get("dtype") if resume_from is not None else None
    if resume_from is None or saved not in accounting.DTYPES:  # new, or saved before dtypes were recorded
        if requested != "auto":
            return requested, ""
        if device.type == "cpu" and step is not None:
            choice = choose_cpu_dtype(step.shape(), step.measure, may_measure=not step.distributed)
            return choice.dtype, f"auto: {choice.why}"
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


@dataclass
class _StepProbe:
    """The run's training step as `--dtype auto` times it on a CPU: its model shape, objective and batch."""

    objective: Objective
    source: StoreMixture
    model_cfg: ModelConfig
    seq_len: int
    micro: int
    seed: int
    distributed: bool
    optim: OptimConfig

    def shape(self) -> dict[str, Any]:
        objective = {"name": self.objective.name, "kind": self.objective.model_kind}
        objective["config"] = {k: repr(v) for k, v in sorted(vars(self.objective.config).items())}
        return {
            "model": config_to_dict(self.model_cfg),
            "objective": objective,
            "rows": [self.micro, self.seq_len],
        }

    def measure(self) -> float:
        """fp32's step time over bf16's on real rows of the store, on a throwaway model of the run's shape."""
        stream = self.source.stream("train", self.seed)
        (batch,) = leading_batches(
            stream, self.objective, self.seq_len, self.micro, self.micro, self.seed, False
        )
        # The loop's own allocator settings (process-wide, applied by the loop anyway): without them each
        # step page-faults its activations back in, a cost that hides the precisions' difference.
        keep_freed_memory()
        with torch.random.fork_rng(devices=[]):
            model = build_model(self.model_cfg)
        optimizer = build_optimizer(model, self.optim, torch.device("cpu"))
        return time_step(model, self.objective, batch.mark_layout(), optimizer=optimizer)


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
            from objtrain.data.progress import RichProgress

            progress = RichProgress(console)
            with progress.bar:
                default_store(progress)
        else:
            default_store()
    dist.barrier(world)
    return path


def _probe_objective(objective: Objective, source: StoreMixture, seq_len: int, seed: int) -> None:
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


def check_precision(dtype: str, device: torch.device) -> None:
    """Refuse a dtype the device has no business training in."""
    if dtype == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("--dtype bf16: this GPU does not support bf16 (use fp16 or auto)")
    if dtype == "fp16" and device.type == "cpu":  # it runs, but slowly and for no gain over bf16 or fp32
        raise UserError("--dtype fp16 needs a GPU (fp16 with loss scaling); on CPU use fp32 or bf16")
