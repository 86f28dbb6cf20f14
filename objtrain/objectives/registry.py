"""Name -> objective class, and building a configured objective from YAML defaults plus overrides.

Classes are named as "module:Class" and imported on first use, so the registry has no import-time side
effects and one broken objective cannot break the others.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from objtrain.batch import ModelKind
from objtrain.config import config_dir, from_dict, load_yaml, merge
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError, pick_name
from objtrain.objectives.base import Objective, Recorded
from objtrain.specials import Specials

# One line per objective. The YAML with its defaults is configs/objectives/<name>.yaml.
OBJECTIVES: dict[str, str] = {
    "clm": "objtrain.objectives.clm:CausalLM",
    "mtp": "objtrain.objectives.mtp:MultiTokenPrediction",
    "mlm": "objtrain.objectives.mlm:MaskedLM",
    "span": "objtrain.objectives.span:SpanCorruption",
    "prefix_lm": "objtrain.objectives.prefix_lm:PrefixLM",
    "fim": "objtrain.objectives.fim:FillInTheMiddle",
    "ul2": "objtrain.objectives.ul2:UL2",
    "bart": "objtrain.objectives.bart:BartDenoising",
    "nsp": "objtrain.objectives.sentence_pairs:NextSentencePrediction",
    "sop": "objtrain.objectives.sentence_pairs:SentenceOrderPrediction",
    "mixture": "objtrain.objectives.mixture:Mixture",
    "contrastive": "objtrain.objectives.contrastive:Contrastive",
    "gpt_bert": "objtrain.objectives.gpt_bert:GptBert",
}


__all__ = [
    "OBJECTIVES",
    "build_objective",
    "config_dir",
    "objective_class",
    "objective_config",
    "recorded_class",
    "recorded_parts",
]


def canonical_name(name: str) -> str:
    """`SPAN` -> `span`; an unknown name is a UserError with the closest known one."""
    return pick_name(name, OBJECTIVES, "objective")


def objective_class(name: str) -> type[Objective]:
    name = canonical_name(name)
    module_name, _, class_name = OBJECTIVES[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def objective_defaults(name: str) -> dict[str, Any]:
    """The defaults from configs/objectives/<name>.yaml."""
    name = canonical_name(name)
    return load_yaml(config_dir() / "objectives" / f"{name}.yaml")


def objective_config(name: str, overrides: dict[str, Any] | None = None) -> Any:
    name = canonical_name(name)
    cls = objective_class(name)
    if not isinstance(overrides, (dict, type(None))):
        raise UserError(f"{name} settings must be a mapping of key: value, got {overrides!r}")
    data = merge(objective_defaults(name), overrides or {})
    return from_dict(cls.Config, data, where=name)


def build_objective(
    name: str,
    specials: Specials,
    tokenizer: Tokenizer | None = None,
    model_kind: ModelKind | None = None,
    overrides: dict[str, Any] | None = None,
) -> Objective:
    """Configure objective `name` from its YAML defaults plus `overrides` (e.g. {"noise_density": 0.3})."""
    name = canonical_name(name)
    cls = objective_class(name)
    return cls(objective_config(name, overrides), specials, tokenizer=tokenizer, model_kind=model_kind)


def find_class(name: object) -> type[Objective] | None:
    """The class registered under exactly `name`, or None (a record of another version, or no name)."""
    if not isinstance(name, str) or name not in OBJECTIVES:
        return None
    return objective_class(name)


def recorded_class(training: Mapping[str, Any]) -> type[Objective] | None:
    """The objective class a checkpoint's training record names (`objective`), or None."""
    return find_class(training.get("objective"))


def recorded_parts(training: Mapping[str, Any]) -> list[Recorded]:
    """The recorded objective and the ones it trained on besides (a mixture's components), each with its
    recorded settings: what evaluation asks a checkpoint's capabilities of."""
    cls = recorded_class(training)
    if cls is None:
        return []
    settings = training.get("objective_config")
    settings = settings if isinstance(settings, Mapping) else {}
    return [(cls, settings), *cls.recorded_components(settings)]


def recorded_segments(training: Mapping[str, Any]) -> bool:
    """Whether the recorded run fed segment ids (`Objective.feeds_segments`) through any of its objectives."""
    return any(cls.feeds_segments for cls, _ in recorded_parts(training))
