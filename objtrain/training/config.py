"""`TrainConfig`: everything a run is, in one YAML (saved resolved as RUN/config.yaml).

    data:       store: PATH (token or packed store; null = the embedded standard-library store), or
                sources: [{store: PATH, weight: W, name: N}, ...] (a mixture: rows drawn by weight)
    model:      kind, size, overrides
    objective:  name, overrides
    batch:      seq_len, batch_size (global rows), micro_batch_size
    optim:      lr, betas, eps, weight_decay, grad_clip
    schedule:   kind (cosine | linear | constant | wsd), warmup, min_lr_ratio, decay_ratio (wsd)
    budget:     steps | tokens | seconds (one of them; none = the default run)
    precision:  dtype (auto | fp32 | bf16 | fp16), compile (auto | true | false)
    validation: every, rows
    checkpoint: every, keep
    logging:    every, tensorboard, sample, wandb {project, mode, entity, name, tags}
    seed, device, workers (auto | N), parallel (ddp | fsdp)

Every section is a dataclass, read strictly by `objtrain.config.from_dict`: an unknown key is refused
before any work. Command-line flags are overrides of the same keys (`--lr 1e-3` is `optim.lr=1e-3`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from objtrain.config import from_dict, merge, to_dict
from objtrain.errors import UserError, check_seed


@dataclass
class SourceConfig:
    """One store of a mixture: each global row reads it with probability weight / sum of weights."""

    store: str
    weight: float = 1.0
    name: str | None = None  # in metrics (source/NAME/...); default: the store's directory name

    def __post_init__(self) -> None:
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise ValueError(f"a source's weight must be a positive number, got {self.weight}")
        if self.name is not None and (not self.name or "/" in self.name):
            raise ValueError(f"a source's name must be non-empty and hold no '/', got {self.name!r}")


@dataclass
class DataConfig:
    store: str | None = None  # token store or packed store; None = the embedded standard-library store
    sources: list[SourceConfig] | None = None  # a weighted mixture of stores instead of `store`
    valid_split: str = "valid"

    def __post_init__(self) -> None:
        if self.sources is not None and self.store is not None:
            raise ValueError(
                f"give data.store or data.sources, not both (store {self.store!r} and "
                f"{len(self.sources)} sources)"
            )
        if self.sources is not None and not self.sources:
            raise ValueError("data.sources is empty: give at least one {store: PATH, weight: W}")
        names = [s.name for s in self.sources or [] if s.name is not None]
        if len(set(names)) < len(names):
            raise ValueError(f"data.sources: two sources share a name ({', '.join(names)})")


@dataclass
class ModelSection:
    kind: str | None = None  # decoder | encoder | encdec; None = the objective's first
    size: str = "tiny"  # a file in configs/models/
    overrides: dict[str, Any] = field(default_factory=dict)  # e.g. {n_layer: 8, dropout: 0.1}


@dataclass
class ObjectiveSection:
    name: str = "clm"
    overrides: dict[str, Any] = field(default_factory=dict)  # e.g. {fim_rate: 0.9}


@dataclass
class BatchConfig:
    seq_len: int | None = None  # model positions per row; None = the packed store's rows, else 256
    batch_size: int = 16  # global rows per optimizer step, over all processes and micro-batches
    micro_batch_size: int | None = None  # rows per forward on one process; None = batch_size / processes

    def __post_init__(self) -> None:
        if self.batch_size < 1 or (self.micro_batch_size is not None and self.micro_batch_size < 1):
            raise ValueError("batch_size and micro_batch_size must be positive")
        if self.seq_len is not None and self.seq_len < 2:
            raise ValueError(f"seq_len must be at least 2, got {self.seq_len}")


@dataclass
class OptimConfig:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1  # Linear weights only: not norms, biases or embeddings
    grad_clip: float = 1.0  # max global grad norm; 0 = off

    def __post_init__(self) -> None:
        # 0 is refused too: the weights would never move, and the run would spend its budget writing
        # checkpoints of its initialisation that every later report would read as a trained model.
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a finite number > 0 (at 0 the weights never move), got {self.lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {list(self.betas)}")
        if self.eps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("eps, weight_decay and grad_clip must be >= 0")


@dataclass
class ScheduleConfig:
    kind: Literal["cosine", "linear", "constant", "wsd"] = "cosine"
    warmup: int | float = 0.05  # steps, or a fraction (< 1) of the run
    min_lr_ratio: float = 0.1  # final lr / lr (nanoGPT: lr/10)
    decay_ratio: float = 0.2  # wsd: share of the run spent decaying

    def __post_init__(self) -> None:
        if self.warmup < 0 or not 0 <= self.min_lr_ratio <= 1 or not 0 < self.decay_ratio <= 1:
            raise ValueError("warmup must be >= 0, min_lr_ratio in [0, 1], decay_ratio in (0, 1]")


@dataclass
class BudgetConfig:
    steps: int | None = None
    tokens: int | None = None  # model input positions over all processes
    seconds: float | None = None  # wall time of training steps (the step count is fixed after warmup)

    def __post_init__(self) -> None:
        given = [v for v in (self.steps, self.tokens, self.seconds) if v is not None]
        if len(given) > 1:
            raise ValueError("give one budget: steps, tokens or seconds")
        if any(not (math.isfinite(v) and v > 0) for v in given):  # NaN compares false to everything
            raise ValueError(f"the budget must be positive and finite, got {given[0]}")


@dataclass
class PrecisionConfig:
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    # torch.compile the step: auto = on CUDA (CUDA graphs where shapes are static; `loop.compile_mode`), eager
    # on CPU; true = anywhere; false = never. Slow first steps; sharded and MTP runs compile each block.
    compile: bool | Literal["auto"] = "auto"


@dataclass
class ValidationConfig:
    every: int = 100  # steps between validations; 0 = at the end only; -1 = never
    rows: int = 64  # fixed rows of the valid split, corrupted with a fixed seed

    def __post_init__(self) -> None:
        if self.every < -1 or self.rows < 1:
            raise ValueError("validation.every must be >= -1 (-1 = never) and validation.rows >= 1")


@dataclass
class CheckpointConfig:
    every: int = 0  # steps between checkpoints; 0 = at the end only
    keep: int = 3  # newest complete checkpoints kept

    def __post_init__(self) -> None:
        if self.every < 0 or self.keep < 1:
            raise ValueError(
                "checkpoint.every (--save-every) must be >= 0 (0 = at the end only) "
                "and checkpoint.keep (--keep) >= 1"
            )


@dataclass
class WandbConfig:
    """Weights & Biases logging (`pip install 'objtrain[wandb]'`): every metrics.jsonl record, mirrored."""

    project: str = "objtrain"
    mode: Literal["offline", "online", "disabled"] = "offline"  # offline: files under RUN/wandb, no network
    entity: str | None = None  # team or user (online); None = the account's default
    name: str | None = None  # the run's name; None = the run directory's name
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.project.strip():
            raise ValueError("logging.wandb.project must not be empty")


@dataclass
class LoggingConfig:
    every: int = 10  # steps between log lines (metrics.jsonl gets every step)
    # Event files: None (the default) writes them when the `tensorboard` package is installed and says
    # nothing when it is not; true asks for them, and a missing package is then said once.
    tensorboard: bool | None = None
    sample: bool = True  # end with a short greedy sample from the model
    wandb: WandbConfig | None = None  # Weights & Biases too, e.g. {project: my-project, mode: offline}

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"logging.every must be >= 1, got {self.every}")


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelSection = field(default_factory=ModelSection)
    objective: ObjectiveSection = field(default_factory=ObjectiveSection)
    batch: BatchConfig = field(default_factory=BatchConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    seed: int = 0
    device: str = "auto"
    # DataLoader worker processes preparing batches per training process; 0 = in the training process;
    # auto = from the cores each process may use (up to 4 on a GPU, 1 on a CPU; `data.loader.auto_workers`).
    workers: int | Literal["auto"] = "auto"
    # Over several processes: "ddp" replicates the model and sums gradients; "fsdp" shards parameters,
    # gradients and optimizer state (FSDP2 fully_shard per block), for models that do not fit one device.
    parallel: Literal["ddp", "fsdp"] = "ddp"
    # Start from these weights (an objtrain run/checkpoint or a Hugging Face Llama directory) instead of
    # a fresh init; the model's shape comes from them. Ignored when --resume finds a checkpoint.
    init_from: str | None = None

    def __post_init__(self) -> None:
        check_seed(self.seed, "seed")  # a YAML's or KEY=VALUE's seed; --seed is checked as it is parsed
        if isinstance(self.workers, int) and self.workers < 0:
            raise ValueError(f"workers must be >= 0 (0 = load in the training process), got {self.workers}")


# The run `objtrain train` does with no budget: about 5 minutes on 2 CPU cores with a visibly falling loss.
DEFAULT_STEPS = 300


def build_config(data: dict[str, Any]) -> TrainConfig:
    """A strictly checked `TrainConfig` from a nested dict (YAML plus overrides)."""
    return from_dict(TrainConfig, data, where="train")


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The resolved config as plain YAML-able data (tuples become lists)."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    out = plain(to_dict(cfg))
    # One form of each: a single store's config reads as it always has (a resume compares sections).
    if out["data"].get("sources") is None:
        out["data"].pop("sources", None)
    else:
        out["data"].pop("store", None)
    return out


def merged(base: dict[str, Any], *updates: dict[str, Any]) -> dict[str, Any]:
    out = base
    for update in updates:
        out = merge(out, update)
    return out


def check_divisible(cfg: TrainConfig, world_size: int) -> tuple[int, int]:
    """(micro-batch rows, accumulation steps) for `world_size` processes, or one clear error."""
    b = cfg.batch
    if b.batch_size % world_size:
        raise UserError(f"batch_size {b.batch_size} does not divide over {world_size} processes")
    per_rank = b.batch_size // world_size
    micro = b.micro_batch_size or per_rank
    if per_rank % micro:
        raise UserError(
            f"batch_size {b.batch_size} does not divide into {world_size} processes x micro-batches "
            f"of {micro}"
        )
    return micro, per_rank // micro
