"""An experiment: arms trained on the same data and seed under one equal budget, then evaluated alike.

    name: objectives
    question: Which objective teaches generation, which classification, at equal compute?
    expect: CLM has the lowest bits per byte; the MLM encoder the best probe accuracy.
    data: {store: null}                 # null = the embedded standard-library store
    seed: 0
    budget: {tokens: 2000000}           # tokens | flops | seconds: the control every arm shares
    budgets: {quick: {tokens: 200000}}  # named alternatives for --budget NAME (`tiny` is built in)
    sweep: {tokens: [2e5, 2e6, 6e6]}    # optional: train every arm at every point (objtrain.compare.sweep)
    train:                              # run settings shared by every arm (a TrainConfig without
      batch: {seq_len: 128, batch_size: 16}  # data, seed and budget)
    eval: {data: null, options: {}}     # what the suite scores: null = the store's valid split
    #   first_seed: {finetune_seeds: 3}   # optional: options for each arm's first seed only
    #   finetune_rates: first_seed        # optional: fine-tune rates chosen on each arm's first seed
    arms:
      - {name: clm, objective: clm, model: {kind: decoder, size: tiny}}
      - {name: mlm, objective: {name: mlm, overrides: {selection_rate: 0.15}}, model: {kind: encoder}}

Every key is read strictly (`objtrain.config.from_dict`); every arm is checked by the training loop's own
`prepare` before anything is written, so a bad arm is refused before the first arm trains.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from objtrain.config import config_dir, from_dict, load_yaml, merge, packaged_config, to_dict
from objtrain.errors import UserError, did_you_mean
from objtrain.training.config import (
    DataConfig,
    ModelSection,
    ObjectiveSection,
    TrainConfig,
    build_config,
    config_dict,
)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Experiment-level settings an arm's `train:` may not change: they are what makes the arms comparable.
SHARED_ONLY = ("data", "seed", "budget")


@dataclass
class BudgetSpec:
    """The one control every arm shares. `tokens` = model input positions (the default control)."""

    tokens: int | None = None
    flops: float | None = None  # training FLOPs, estimated per arm (6N + attention, see accounting)
    seconds: float | None = None  # wall time of training steps
    # A budget at another scale (`gpu:`): every arm's model size, and run settings over the shared ones.
    size: str | None = None
    train: dict[str, Any] = field(default_factory=dict)
    # A sweep experiment's grid at this budget (`{flops: [...], size: [...]}`, as its `sweep:`), with `train`
    # laid over every point; its control is the grid's largest point.
    sweep: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        axis = [k for k in ("tokens", "flops") if k in self.sweep]
        if (
            self.sweep
            and len(axis) == 1
            and self.tokens is None
            and self.flops is None
            and self.seconds is None
        ):
            points = self.sweep[axis[0]]
            if isinstance(points, list) and points and all(isinstance(v, (int, float)) for v in points):
                setattr(self, axis[0], int(max(points)) if axis[0] == "tokens" else float(max(points)))
        given = [v for v in (self.tokens, self.flops, self.seconds) if v is not None]
        if len(given) != 1:
            raise ValueError("a budget gives exactly one of tokens, flops or seconds")
        if not (math.isfinite(given[0]) and given[0] > 0):  # NaN compares false to everything
            raise ValueError(f"a budget must be positive and finite, got {given[0]}")

    @property
    def kind(self) -> str:
        return "tokens" if self.tokens is not None else "flops" if self.flops is not None else "seconds"

    @property
    def value(self) -> float:
        return float(getattr(self, self.kind))

    def describe(self) -> str:
        at = f" at size {self.size}" if self.size else ""
        if self.kind == "tokens":
            return f"{int(self.value):,} tokens an arm{at}"
        if self.kind == "flops":
            return f"{self.value:.3g} training FLOPs an arm{at}"
        return f"{self.value:g} seconds of training an arm{at}"


# `--budget tiny`: a smoke run of the whole pipeline, well under a minute an arm on 2 CPU cores. On an
# experiment held at equal FLOPs it stays FLOPs, these tokens' worth (`runner.tiny_flops`).
TINY = BudgetSpec(tokens=8192)
TINY_TRAIN = {"batch": {"batch_size": 8}, "validation": {"rows": 8}, "schedule": {"warmup": 2}}


@dataclass
class ArmSpec:
    name: str
    objective: ObjectiveSection
    model: ModelSection = field(default_factory=ModelSection)
    data: DataConfig | None = None  # None = the experiment's; another store must hold the same data
    train: dict[str, Any] = field(default_factory=dict)  # this arm's run settings over the shared ones

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise ValueError(f"arm name {self.name!r} must be letters, digits, '.', '_' or '-'")


@dataclass
class EvalSpec:
    data: str | None = None  # store or text file the suite scores; None = the arms' store (valid split)
    options: dict[str, Any] = field(default_factory=dict)  # passed to the suite as keyword arguments
    # Laid over `options` for each arm's first seed only: a measurement's own noise, measured apart on one
    # checkpoint (Dodge et al. 2020), e.g. {finetune_seeds: 3}, at a fraction of its cost on every run.
    first_seed: dict[str, Any] = field(default_factory=dict)
    # Where fine-tuning chooses its peak rate on dev: on every run, or on each arm's first seed only, the
    # other seeds (and their random-init twins) fine-tuned at the rate it chose: a quarter of the fine-tunes
    # with four rates, the rate still chosen on dev, never on the split reported (hyperparameters tuned on
    # one seed, as BERT and T5 tuned theirs on one pretraining run).
    finetune_rates: Literal["every_seed", "first_seed"] = "every_seed"


@dataclass
class PaperSetting:
    """The smallest setting a published claim was measured at (`regime:` of a claim or an experiment): a
    verdict here is set against it, and flagged out of regime when parameters, tokens or tokens per
    parameter lie more than `REGIME_FACTOR` times away. A number the
    paper does not state stays null and is left out of the gap."""

    source: str  # where the numbers come from ("T5 section 3.1.2: BERT-base-size stacks, 2^35 tokens")
    parameters: float | None = None  # total parameters of the paper's smallest model
    tokens: float | None = None  # its training tokens

    def __post_init__(self) -> None:
        for key in ("parameters", "tokens"):
            value = getattr(self, key)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"regime {key} must be positive, got {value}")


REGIME_FACTOR = 10.0  # beyond this factor from the paper's smallest setting a verdict is out of regime


@dataclass
class Claim:
    """A finding of the literature, stated as a paired comparison `a - b` of two arms on one metric, so the
    report can give its verdict: `expect` lower / higher (a below / above b), equal (within `margin`), or
    none (no published comparison: the report gives our direction only).

    One arm (`arms: [a]`) judges its metric against 0, for a metric that is already a difference within each
    model (`suffix_worth`: the same model with and without the suffix), so each seed is one pair."""

    claim: str
    literature: str
    metric: str
    arms: list[str]  # [a, b]
    expect: str = "lower"
    margin: float = 0.0  # expect equal: |a - b| at most this, in the metric's units
    regime: PaperSetting | None = None  # the paper's smallest setting; None = the experiment's `regime:`

    def __post_init__(self) -> None:
        if len(self.arms) not in (1, 2):
            raise ValueError(f"a claim compares two arms, or one against 0, got {self.arms}")
        if self.expect not in ("lower", "higher", "equal", "none"):
            raise ValueError(f"a claim's expect must be lower, higher, equal or none, got {self.expect!r}")
        if self.expect == "equal" and not self.margin > 0:
            raise ValueError("a claim that expects equal needs a margin > 0")


@dataclass
class Withdrawn:
    """A claim an earlier publication judged and this one does not, with the reason: the report says so
    instead of the claim's silently disappearing."""

    claim: str
    reason: str


@dataclass
class Experiment:
    arms: list[ArmSpec]
    name: str = ""
    question: str = ""
    expect: str = ""  # what the literature found, quoted in the report beside our result
    data: DataConfig = field(default_factory=DataConfig)
    seed: int = 0
    budget: BudgetSpec = field(default_factory=lambda: BudgetSpec(tokens=1_000_000))
    budgets: dict[str, BudgetSpec] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    eval: EvalSpec = field(default_factory=EvalSpec)
    claims: list[Claim] = field(default_factory=list)  # what the literature found, checked by the report
    withdrawn: list[Withdrawn] = field(default_factory=list)  # claims no longer judged, and why
    regime: PaperSetting | None = None  # the papers' smallest setting, for claims that give none of their own
    # A compute sweep (objtrain.compare.sweep): {tokens: [...]} or {flops: [...]}, optionally {size: [...]}.
    sweep: dict[str, Any] = field(default_factory=dict)
    # Gloeckle et al.'s protocol: an MTP arm with n heads takes its n - 1 extra head layers from the trunk
    # (n_layer of its size minus n - 1, unless the arm sets n_layer), so the arms' parameters agree.
    match_mtp_parameters: bool = False
    source: str = ""  # the YAML it was read from

    def __post_init__(self) -> None:
        if not self.arms:
            raise ValueError("an experiment needs at least one arm")
        names = [a.name for a in self.arms]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"arm names must be unique; {dup[0]!r} is used twice")
        for claim in self.claims:
            unknown = [a for a in claim.arms if a not in names]
            if unknown:
                raise ValueError(f"claim {claim.claim!r} names arm {unknown[0]!r}, which is not an arm")


def find_experiment(path: Path | str) -> Path:
    """An experiment YAML, or a shipped experiment by name (`objectives`, `fim-rate`), the name matched
    case-insensitively; otherwise one line naming the closest experiment."""
    found = packaged_config(path, "experiments")
    if found.is_file():
        return found
    path = Path(path)
    stem = path.stem if path.suffix in (".yaml", ".yml") else path.name
    # A bare name is looked for among the shipped experiments, a path beside its siblings.
    folder = path.parent if str(path.parent) != "." else config_dir() / "experiments"
    known = {p.stem: p for p in sorted(folder.glob("*.y*ml"))} if folder.is_dir() else {}
    folded = [name for name in known if name.lower() == stem.lower()]
    if len(folded) == 1:
        return known[folded[0]]
    shipped = f" (shipped: {', '.join(known)})" if str(path.parent) == "." and known else ""
    raise UserError(f"experiment not found: {path}{did_you_mean(stem, known)}{shipped}")


def load_experiment(path: Path) -> Experiment:
    """Read and strictly check an experiment YAML (one clear `UserError` for any bad key or value).
    `path` may also name a shipped experiment (`objectives`, `fim-rate`)."""
    path = find_experiment(path)
    data = load_yaml(path)
    exp = experiment_from_dict(data, where=Path(path).name)
    exp.source = str(path)
    if not exp.name:
        exp.name = Path(path).stem
    return exp


def experiment_from_dict(data: dict[str, Any], where: str = "experiment") -> Experiment:
    data = copy.deepcopy(data)
    arms = data.get("arms")
    if not arms and isinstance(data, dict):
        # `armz:` is a misspelt key, not a missing one: name it (with the closest key) before "no arms"
        known = [f.name for f in dataclasses.fields(Experiment) if f.init]
        unknown = sorted(k for k in data if k not in known)
        if unknown:
            raise UserError(
                f"unknown key {unknown[0]!r} in {where}{did_you_mean(str(unknown[0]), known)}"
                f" (known: {', '.join(sorted(known))})"
            )
    if not arms:  # an empty file or `arms: []`: say what is missing, not which argument
        raise UserError(
            f"{where}: the experiment has no arms: list them under `arms:` (see configs/experiments/)"
        )
    if isinstance(arms, list):
        for i, arm in enumerate(arms):
            # `objective: clm` is short for `objective: {name: clm}`.
            if isinstance(arm, dict) and isinstance(arm.get("objective"), str):
                arm["objective"] = {"name": arm["objective"]}
            if isinstance(arm, dict) and "objective" not in arm:
                raise UserError(f"{where}: arms[{i}] names no objective")
    exp = from_dict(Experiment, data, where=where)
    for key in SHARED_ONLY:
        if key in exp.train:
            raise UserError(f"{where}: set {key!r} at the experiment's top level, not under train:")
    for arm in exp.arms:
        for key in (*SHARED_ONLY, "model", "objective"):  # data: the arm's own `data:`, checked to agree
            if key in arm.train:
                raise UserError(
                    f"{where}: arm {arm.name!r} sets {key!r} under train:; "
                    + ("arms share it" if key in ("seed", "budget") else f"give it as the arm's {key}:")
                )
    return exp


def resolve_budget(exp: Experiment, budget: str | None) -> tuple[str, BudgetSpec]:
    """`--budget`: None = the experiment's own; `tiny`; a name from `budgets:`; a number = tokens."""
    if budget is None or budget == "default":
        return "default", exp.budget
    if budget in exp.budgets:
        return budget, exp.budgets[budget]
    if budget == "tiny":
        return "tiny", TINY
    try:
        value = float(budget.replace("_", ""))
    except ValueError:
        known = ", ".join(["tiny", *exp.budgets])
        raise UserError(f"--budget {budget!r} is not a number of tokens or a budget name ({known})") from None
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise UserError(f"--budget {budget!r}: a number means tokens, a positive whole number")
    return "tokens", BudgetSpec(tokens=int(value))


def arm_config(
    exp: Experiment,
    arm: ArmSpec,
    seed: int,
    budget: dict[str, Any],
    tiny: bool = False,
    data: str | None = None,
    defaults: dict[str, Any] | None = None,
    scale: BudgetSpec | None = None,
) -> TrainConfig:
    """The arm's full `TrainConfig`: `defaults` (under everything), the shared settings, the arm's own,
    the budget's scale (`scale`: its model size and run settings), then data, seed and the budget."""
    quiet = merge({"logging": {"tensorboard": False, "sample": False}}, defaults or {})
    base = merge(quiet, exp.train)
    if tiny:
        base = merge(base, TINY_TRAIN)
    settings = merge(base, arm.train)
    if scale is not None and scale.train:
        settings = merge(settings, scale.train)
    settings["objective"] = to_dict(arm.objective)
    settings["model"] = to_dict(arm.model)
    if scale is not None and scale.size:
        settings["model"]["size"] = scale.size
    if exp.match_mtp_parameters:
        settings["model"]["overrides"] = _mtp_matched(arm, settings["model"])
    own = to_dict(arm.data if arm.data is not None else exp.data)
    settings["data"] = own if data is None else merge(own, {"store": data})
    settings["seed"] = seed
    settings["budget"] = budget
    try:
        return build_config(settings)
    except UserError as exc:
        raise UserError(f"arm {arm.name!r}: {exc}") from None


def _mtp_matched(arm: ArmSpec, model: dict[str, Any]) -> dict[str, Any]:
    """The arm's model overrides with n_layer reduced by its n - 1 extra MTP heads (see Experiment)."""
    from objtrain.models.zoo import model_config
    from objtrain.objectives.registry import find_class, objective_config

    overrides = dict(model.get("overrides") or {})
    objective = find_class(arm.objective.name)
    extra = 0
    if objective is not None:  # the YAML's n where the arm sets none (mtp.yaml: 4), not 1
        extra = objective.extra_head_layers(objective_config(arm.objective.name, arm.objective.overrides))
    heads = 1 + extra
    if heads <= 1 or "n_layer" in overrides:
        return overrides
    full = model_config(model.get("kind") or "decoder", model.get("size", "tiny"), overrides).n_layer
    if full - (heads - 1) < 1:
        raise UserError(
            f"arm {arm.name!r}: {heads} heads take {heads - 1} layers from a {full}-layer trunk, leaving "
            "none (match_mtp_parameters): choose a deeper size or fewer heads"
        )
    return overrides | {"n_layer": full - (heads - 1)}


def experiment_dict(exp: Experiment) -> dict[str, Any]:
    out = to_dict(exp)
    out.pop("source", None)
    return out


def resolved(cfg: TrainConfig) -> dict[str, Any]:
    return config_dict(cfg)
