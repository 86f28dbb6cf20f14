"""The evaluation every arm gets: `objtrain.evaluation.suite.evaluate`, the same call and options for all.

`Evaluator` is the one thing `compare` needs from evaluation: a run directory in, a flat dict of numbers
out. Tests pass their own; the default is the suite behind `objtrain eval`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from objtrain.config import from_dict
from objtrain.stats.seeds import lower_is_better

Evaluator = Callable[[Path, str | None, dict[str, Any]], dict[str, Any]]

# `--budget tiny`: the suite on a handful of documents, so the smoke run stays under a minute an arm. Every
# part that counts its own work is capped here, not only through max_docs: conditional scoring and sentence
# order take their own counts, and each probe (with its baselines) refits once per probe seed; two seeds
# still give the probe-seed sd a value, so the smoke run exercises it.
TINY_OPTIONS: dict[str, Any] = {
    "max_docs": 2,
    "conditional_docs": 2,
    "sentence_order_pairs": 32,
    "corrupt_rows": 8,
    "infill_tasks": 4,
    "middle_tasks": 16,
    "probe_seeds": 2,
    "finetune_steps": 10,  # only where an experiment asks for --finetune
    "samples": 1,
    "blimp_per_paradigm": 2,  # only where an experiment asks for --blimp
}
ZERO_MEANS_ALL = ("blimp_per_paradigm",)  # a count where 0 means no limit
# Counts whose default is already the least (1: none), capped only where an experiment gives them.
TINY_WHEN_GIVEN: dict[str, int] = {"finetune_seeds": 2}

# Each objective's own loss: meaningful within one objective, never ranked across different ones.
OWN_LOSSES = ("val_loss", "objective_loss")


def _suite() -> Any:
    try:
        from objtrain.evaluation import suite
    except ImportError:
        return None
    return suite


def available() -> bool:
    return _suite() is not None


def share_baselines(folder: Path) -> None:
    """Let this process share the suite's baselines through `folder` with the others evaluating beside it
    (`compare --jobs`): each fitted once, not once a process."""
    suite = _suite()
    if suite is not None:
        suite.SHARED_BASELINES = folder


def options_for(options: dict[str, Any], tiny: bool) -> dict[str, Any]:
    """The suite's keyword options, tiny-budget limits laid over the experiment's own."""
    merged = {**(TINY_OPTIONS if tiny else {}), **options}
    return capped(merged, tiny)


def capped(options: dict[str, Any], tiny: bool) -> dict[str, Any]:
    """`options` with each count given at a tiny budget held to its limit (a smaller one is kept)."""
    out = dict(options)
    if tiny:
        for key, limit in {**TINY_OPTIONS, **TINY_WHEN_GIVEN}.items():
            given = out.get(key)
            if isinstance(given, int) and not isinstance(given, bool):  # a mistyped one is check_options's
                out[key] = limit if given == 0 and key in ZERO_MEANS_ALL else min(given, limit)
    return out


def check_options(options: dict[str, Any]) -> None:
    """Refuse an unknown or mistyped suite option, or a file it names that cannot be read, before any arm
    trains (the suite reads them only after training)."""
    suite = _suite()
    if suite is None:
        return
    built = _build_options(suite, options)
    from objtrain.evaluation import blimp, infill, probe

    for labelled in (built.probe_train, built.probe_valid):
        if labelled is not None:
            probe.read_labelled(labelled)
    if built.infill_file is not None:
        infill.read_infill_file(built.infill_file)
    if built.blimp is not None:
        blimp.read_pairs(built.blimp, built.blimp_per_paradigm)
    if built.blimp_paper is not None:
        blimp.read_paper_rows(built.blimp_paper)
    suite.check_probe_tasks(built)


def _build_options(suite: Any, options: dict[str, Any]) -> Any:
    cls = suite.EvalOptions
    hints = typing.get_type_hints(cls)
    data = dict(options)
    for name, value in options.items():
        # YAML gives strings; path options want Path objects.
        hint = hints.get(name)
        if isinstance(value, str) and (hint is Path or Path in typing.get_args(hint)):
            data[name] = Path(value)
    plain = {k: v for k, v in data.items() if not isinstance(v, Path)}
    checked = from_dict(cls, plain, where="eval.options")
    return dataclasses.replace(checked, **{k: v for k, v in data.items() if isinstance(v, Path)})


def default_evaluator(run_dir: Path, data: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """The `objtrain eval` suite on the run's final checkpoint; {} when this build has no suite."""
    suite = _suite()
    if suite is None:
        return {}
    built = _build_options(suite, options)
    if "units" in {f.name for f in dataclasses.fields(built)}:  # per-unit scores for paired errors
        built = dataclasses.replace(built, units=True)
    return dict(suite.evaluate(run_dir, data, built))


def direction(metric: str) -> str:
    """'lower', 'higher' or 'info' (not ranked): the suite's own table first, else by name."""
    suite = _suite()
    table = getattr(suite, "METRICS", {}) if suite is not None else {}
    if metric in table:
        return str(table[metric][0])
    if metric in ("val_loss", "val_bpb"):
        return "lower"
    return "lower" if lower_is_better(metric) else "higher"


def numeric_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The rankable numbers of a suite result: the suite's named metrics (its METRICS table, without the
    'info' ones) or, for an evaluator without a table, every number whose name says its direction."""
    suite = _suite()
    table = getattr(suite, "METRICS", None) if suite is not None else None
    out: dict[str, float] = {}
    for key, value in result.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            continue
        if table is not None and result_is_suites(result):
            if key not in table or table[key][0] not in ("lower", "higher"):
                continue
        elif key in NOT_METRICS:
            continue
        out[key] = float(value)
    return out


def result_is_suites(result: dict[str, Any]) -> bool:
    """A result from `objtrain.evaluation.suite` (it names its checkpoint and eval seed)."""
    return "checkpoint" in result and "eval_seed" in result


# Counts and settings a suite-less evaluator may return beside its metrics.
NOT_METRICS = ("seconds", "parameters", "train_step", "train_tokens", "eval_seed")


def describe_missing() -> str:
    return "objtrain.evaluation.suite is not installed: metrics are the training validation's only"
