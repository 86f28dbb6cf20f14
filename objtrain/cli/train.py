"""`objtrain train`: thin glue over `objtrain.training` (flags -> TrainConfig -> train)."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from objtrain.cli.common import DEVICE_HELP, make_console
from objtrain.config import dotted_keys, key_hint, load_yaml, packaged_config, parse_overrides
from objtrain.errors import UserError
from objtrain.evaluation.sample import print_sample
from objtrain.io import Unwritable
from objtrain.models.zoo import model_sizes
from objtrain.training import accounting
from objtrain.training import checkpoint as ckpt
from objtrain.training.config import DEFAULT_STEPS, TrainConfig, build_config, config_dict, merged
from objtrain.training.loop import Plan, prepare, total_steps, train

HELP = """Pre-train a model with one objective (or a mixture), on a token or packed store.

With no DATA it trains on the embedded default: the Python standard library's source, tokenized once and
cached. KEY=VALUE pairs set objective settings as in `objtrain corrupt` (fim_rate=0.9), or any key of the
run's YAML by its dotted name (optim.lr=3e-4, schedule.kind=wsd, model.n_layer=8). The resolved config
is saved as RUN/config.yaml; checkpoints go to RUN/checkpoints/ (safetensors + JSON, no pickle).

Example: objtrain train --objective fim --model tiny --steps 200 -o runs/fim
"""

SECTIONS = set(TrainConfig.__dataclass_fields__)
_DEFAULTS = TrainConfig()  # what --help shows for the flags left unset
MODEL_KEYS = {"kind", "size", "overrides"}


def split_args(args: list[str]) -> tuple[str | None, dict[str, Any]]:
    """DATA (the first argument without '='), then KEY=VALUE pairs sorted into the run's sections."""
    data: str | None = None
    pairs: list[str] = []
    for arg in args:
        if "=" in arg:
            pairs.append(arg)
        elif data is None:
            data = arg
        else:
            raise UserError(f"unexpected argument {arg!r}: give one DATA path, then KEY=VALUE settings")
    routed: list[str] = []
    for pair in pairs:
        key = pair.split("=", 1)[0]
        head, _, rest = key.partition(".")
        if head == "model" and rest and rest.split(".")[0] not in MODEL_KEYS:
            routed.append(f"model.overrides.{pair[len('model.') :]}")
        elif head in SECTIONS:
            routed.append(pair)
        else:  # an objective setting, as in `objtrain corrupt`
            routed.append(f"objective.overrides.{pair}")
    return data, parse_overrides(routed)


@dataclass(frozen=True)
class Flag:
    """One option of `objtrain train`: its parameter name and type, the run key it sets (None: it steers
    the command, not the config) and its Typer option (names, help, default shown)."""

    name: str
    kind: Any
    key: str | None
    option: Any
    hint: bool = True  # named in "did you mean" hints for a mistyped KEY=VALUE

    @property
    def flag(self) -> str:
        """The long flag as a hint names it: `--compile` for `--compile/--no-compile`."""
        return self.option.param_decls[0].split("/")[0]


def _option(*decls: str, default: Any = None, **kwargs: Any) -> Any:
    return typer.Option(default, *decls, **kwargs)


TRAIN_FLAGS = (
    Flag("config", Path, None, _option("--config", "-c",
         help="A run YAML, or the name of a shipped one in configs/train/ (fim-tiny).")),
    Flag("objective", str, "objective.name", _option("--objective", "-O",
         help="Objective name (objtrain corrupt --list).", show_default="required")),
    Flag("model_kind", str, "model.kind", _option("--model-kind", help="decoder | encoder | encdec.",
         show_default="the objective's first")),
    Flag("model", str, "model.size", _option("--model",
         help=f"Model size in configs/models/: {', '.join(model_sizes())}.",
         show_default=_DEFAULTS.model.size)),
    Flag("output", Path, None, _option("--output", "-o", help="Run directory.",
         show_default="runs/OBJECTIVE-KIND-SIZE")),
    Flag("seq_len", int, "batch.seq_len", _option("--seq-len", help="Model positions per row.",
         show_default="the packed rows, else 256")),
    Flag("batch_size", int, "batch.batch_size", _option("--batch-size",
         help="Global rows per optimizer step.", show_default=str(_DEFAULTS.batch.batch_size))),
    Flag("micro_batch_size", int, "batch.micro_batch_size", _option("--micro-batch-size",
         help="Rows per forward; accumulation follows.", show_default="batch size / processes")),
    Flag("steps", int, "budget.steps", _option("--steps",
         help="Budget: optimizer steps (one of --steps, --tokens, --time).",
         show_default=f"{DEFAULT_STEPS} when no budget is given")),
    Flag("tokens", int, "budget.tokens", _option("--tokens", help="Budget: model input tokens.")),
    Flag("time_budget", float, "budget.seconds", _option("--time", help="Budget: seconds of training.")),
    Flag("lr", float, "optim.lr", _option("--lr", help="Peak learning rate.",
         show_default=f"{_DEFAULTS.optim.lr:g}")),
    Flag("seed", int, "seed", _option("--seed", help="Seed of the weights, data order and corruption.",
         show_default=str(_DEFAULTS.seed))),
    Flag("dtype", str, "precision.dtype", _option("--dtype",
         help="auto | fp32 | bf16 | fp16 (auto: bf16 only where fast).",
         show_default=_DEFAULTS.precision.dtype)),
    Flag("device", str, "device", _option("--device", help=DEVICE_HELP, show_default=_DEFAULTS.device)),
    Flag("compile_", bool, "precision.compile", _option("--compile/--no-compile",
         help="torch.compile the step (default: on CUDA only, eager on CPU; precision.compile=auto).",
         show_default="auto")),
    Flag("save_every", int, "checkpoint.every", _option("--save-every",
         help="Steps between checkpoints (0: at the end).", show_default=str(_DEFAULTS.checkpoint.every))),
    Flag("keep", int, "checkpoint.keep", _option("--keep", help="Newest checkpoints kept.",
         show_default=str(_DEFAULTS.checkpoint.keep))),
    Flag("init_from", Path, "init_from", _option("--init-from",
         help="Start from these weights: an objtrain run or checkpoint, or a local Hugging Face Llama "
         "directory (decoders). The model's shape comes from it; the objective may be any its kind trains. "
         "STORE must be tokenized with its tokenizer (for a Hugging Face directory: --tokenizer DIR; "
         "rows for objtrain's added special tokens start as the mean of the embedding).",
         show_default="a fresh init"), hint=False),
    Flag("resume", bool, None, _option("--resume", default=False,
         help="Continue RUN from its newest complete checkpoint.")),
    Flag("force", bool, None, _option("--force", default=False, help="Replace an existing RUN.")),
    Flag("nproc", int, None, _option("--nproc", help="Processes on this machine (launches torchrun).",
         show_default="1")),
    Flag("dry_run", bool, None, _option("--dry-run", default=False,
         help="Print sizes, FLOPs and memory, then exit.")),
)  # fmt: skip
ARGS = typer.Argument(
    None, metavar="[DATA] [KEY=VALUE]...", help="Token or packed store (default: the embedded corpus).",
    show_default=False,
)  # fmt: skip
# The flags that set a run key, for hints ("did you mean optim.lr or --lr?").
FLAGS = {f.key: f.flag for f in TRAIN_FLAGS if f.key is not None and f.hint}


def _flag_keys(data: str | None, given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run keys DATA and the flags set, nested ({"optim": {"lr": 3e-4}}), and the budget they give (a
    flag budget replaces the YAML's, whichever kind it was)."""
    flags: dict[str, Any] = {} if data is None else {"data": {"store": data}}
    budget: dict[str, Any] = {}
    for f in TRAIN_FLAGS:
        value = given[f.name]
        if f.key is None or value is None:
            continue
        if isinstance(value, Path):
            value = str(value)
        section, _, leaf = f.key.rpartition(".")
        if section == "budget":
            budget[leaf] = value
            continue
        node = flags
        for p in section.split(".") if section else ():
            node = node.setdefault(p, {})
        node[leaf] = value
    if budget:
        flags["budget"] = budget
    return flags, budget


def run(args: list[str] | None = None, **given: Any) -> None:
    data, kv = split_args(args or [])
    config: Path | None = given["config"]
    objective, output, nproc = given["objective"], given["output"], given["nproc"]
    resume, force = given["resume"], given["force"]
    # A path, or the name of a shipped run (fim-tiny) so an installed objtrain finds it from anywhere.
    base: dict[str, Any] = load_yaml(packaged_config(config, "train")) if config is not None else {}
    flags, budget = _flag_keys(data, given)
    data_dict = merged(base, kv, flags)
    if budget:
        data_dict["budget"] = budget
    section = data_dict.get("objective", {})
    if objective is None and isinstance(section, dict) and "name" not in section:  # else build_config says
        raise UserError("--objective is required (or a --config naming one); see `objtrain corrupt --list`")
    cfg = build_config(data_dict)
    _check_objective_keys(cfg, kv)
    run_dir = output or default_run_dir(cfg)

    console = Console(stderr=True, highlight=False, soft_wrap=not sys.stderr.isatty())
    under_torchrun = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if nproc is not None and nproc < 1:
        raise UserError(f"--nproc must be at least 1, got {nproc}")
    if nproc is not None and nproc > 1 and not under_torchrun:
        from objtrain.training.config import check_divisible
        from objtrain.training.distributed import World, launch

        check_divisible(cfg, nproc)
        checked = prepare(cfg, run_dir, resume=resume, force=force, world=World(0, 1, 0), console=console)
        checked.release()  # the launched rank 0 takes RUN's lock
        argv = _without_nproc(sys.argv[1:])
        raise typer.Exit(launch(nproc, argv))

    if given["dry_run"]:
        plan = prepare(cfg, run_dir, resume=resume, force=force, console=console)
        _dry_run(console, plan)
        return
    created = ckpt.first_missing(run_dir)
    try:
        result = train(cfg, run_dir, resume=resume, force=force, console=console, after=print_sample)
    except Unwritable as exc:
        # A new run whose first checkpoint did not fit leaves nothing behind: a run directory without a
        # checkpoint would only be refused next time ("already exists").
        if created is not None and ckpt.discard_unsaved(run_dir, created):
            raise Unwritable(
                exc.output, exc.reason, f"no checkpoint was saved; {run_dir} was removed"
            ) from None
        raise
    except UserError:
        # So does a new run refused once it had started (weights that --init-from cannot use)
        if created is not None:
            ckpt.discard_unsaved(run_dir, created)
        raise
    if result.stopped:
        console.print(
            f"interrupted at step {result.step}; saved {result.checkpoint}", highlight=False, markup=False
        )
        raise typer.Exit(143 if result.stopped == "SIGTERM" else 130)


# Typer reads the options from the signature: the table's, in its order.
run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("args", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=ARGS, annotation=list[str])]
    + [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.option, annotation=f.kind)
       for f in TRAIN_FLAGS]
)  # fmt: skip
run.__annotations__ = {"args": list[str], **{f.name: f.kind for f in TRAIN_FLAGS}, "return": None}


def default_run_dir(cfg: TrainConfig) -> Path:
    """runs/OBJECTIVE-KIND-SIZE (as --help says): the kind the run trains, the objective's first when none
    is given (`objtrain train --objective fim` -> runs/fim-decoder-tiny)."""
    from objtrain.objectives.registry import canonical_name, objective_class, objective_config

    name = canonical_name(cfg.objective.name)
    cls = objective_class(name)
    kinds = cls.model_kinds
    # the kinds under its settings (a mixture: those its components share); malformed settings: the run's
    # own checks say how, next
    with contextlib.suppress(UserError, LookupError, TypeError, ValueError):
        kinds = cls.model_kinds_of(objective_config(name, cfg.objective.overrides)) or kinds
    return Path("runs") / f"{name}-{cfg.model.kind or kinds[0]}-{cfg.model.size}"


def _check_objective_keys(cfg: TrainConfig, kv: dict[str, Any]) -> None:
    """A KEY=VALUE the objective does not know but that names a run setting the wrong way (`lr=1e-3`,
    `optimizer.lr=1e-3`) is refused with the run key and flag it probably meant; other unknown keys are
    left to the objective's own check (with its did-you-mean)."""
    from dataclasses import fields

    from objtrain.models.config import ModelConfig
    from objtrain.objectives.registry import objective_class

    typed = kv.get("objective", {}).get("overrides", {})
    if not typed:
        return
    known = {f.name for f in fields(objective_class(cfg.objective.name).Config)}
    dotted = dotted_keys(TrainConfig) + [f"model.{f.name}" for f in fields(ModelConfig)]
    for key, value in typed.items():
        if key in known:
            continue
        # {"optimizer": {"lr": ...}} came from optimizer.lr=...: name it as typed
        while isinstance(value, dict) and len(value) == 1:
            ((sub, value),) = value.items()
            key = f"{key}.{sub}"
        hint = key_hint(key, dotted, FLAGS)
        if hint:
            raise UserError(
                f"unknown key {key!r}: not a setting of objective {cfg.objective.name} "
                f"(its keys: {', '.join(sorted(known)) or 'none'}) nor a run key{hint}"
            )


def _without_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--nproc":
            skip = True
            continue
        if arg.startswith("--nproc="):
            continue
        out.append(arg)
    return out


def _dry_run(console: Console, plan: Plan) -> None:
    from objtrain.models.zoo import build_model, count_parameters

    cfg = plan.cfg
    model = build_model(plan.model_cfg)
    n = count_parameters(model)
    n_body = count_parameters(model, embeddings=False)
    total = total_steps(cfg, plan, lambda: float("nan")) if cfg.budget.seconds is None else None
    flops = accounting.flops_per_step(plan.model_cfg, 1, plan.seq_len) / plan.seq_len
    mem = accounting.memory_estimate(model, plan.model_cfg, plan.micro_batch, plan.seq_len, plan.dtype)
    tokens_per_step = cfg.batch.batch_size * plan.seq_len
    lines = [
        ("objective", f"{plan.objective.name} on a {cfg.model.size} {plan.model_cfg.kind}"),
        ("parameters", f"{n:,} ({n_body:,} without the embedding)"),
        ("FLOPs per token", f"{flops:,.0f} (6N + 12·L·d·T)"),
        ("tokens per step", f"{tokens_per_step:,} ({cfg.batch.batch_size} rows x {plan.seq_len})"),
        (
            "micro-batches",
            f"{plan.accumulation} x {plan.micro_batch} rows"
            + (f" on each of {plan.world.world_size} processes" if plan.world.world_size > 1 else ""),
        ),
        (
            "steps",
            f"{total}"
            if total is not None
            else f"timed, then re-estimated as it runs ({cfg.budget.seconds} s budget)",
        ),
        ("weights + grads", _mib(mem["weights_bytes"] + mem["gradients_bytes"])),
        ("optimizer state", _mib(mem["optimizer_bytes"])),
        ("activations", f"{_mib(mem['activation_bytes'])} per micro-batch (estimate)"),
        ("precision / device", f"{plan.dtype} on {plan.device}"),
        ("budget", ", ".join(f"{k} {v}" for k, v in config_dict(cfg)["budget"].items() if v) or "default"),
        *_data_lines(plan, total),
    ]
    width = max(len(k) for k, _ in lines)
    out = make_console(highlight=False, soft_wrap=True)
    for key, value in lines:
        out.print(f"{key:<{width}}  {value}", markup=False)


def _data_lines(plan: Plan, total: int | None) -> list[tuple[str, str]]:
    """Each source as training will read it: its weight, its share of the run's rows as drawn, and the
    passes over it the run makes (a time budget: the first 1,000 steps)."""
    from objtrain.data.mixture import plan_sources

    steps = total if total is not None else 1000
    rows = steps * plan.cfg.batch.batch_size
    sources = plan_sources(plan.source, plan.objective, plan.seq_len, plan.cfg.seed, rows)
    span = f"over {steps:,} steps" if total is not None else "per 1,000 steps"
    lines = []
    for s in sources:
        share = f"weight {s.weight:.1%}, {s.rows / max(rows, 1):.1%} of rows, " if plan.source.mixture else ""
        lines.append(
            (
                "data" if not lines else "",
                f"{s.name} ({s.path}): {share}{s.epoch_tokens:,} tokens a pass, {s.epochs:.2f} passes {span}",
            )
        )
    return lines


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


# Paragraphs rewrapped to the terminal by rich: join their lines.
run.__doc__ = "\n\n".join(" ".join(p.split()) for p in HELP.split("\n\n"))
