"""`objtrain train --init-from`: start a new run from existing weights.

The source is an objtrain checkpoint (or a run: its newest checkpoint), or a local Hugging Face directory
of a Llama-architecture causal LM (`config.json` + `model.safetensors`, possibly sharded). The new run's
model takes the source's shape (width, layers, heads, FFN, RoPE base, vocabulary); the run's own
objective decides its heads. Weights the source has and the new model has are copied exactly; a head the
new objective adds (MTP heads 2..n, an encoder's segment embedding or pooled head) starts fresh, and one
it does not use (a source's MTP heads for CLM) is left out; both are said.

The tokenizer must be the one the data was tokenized with: the same sentencepiece model (compared by
hash). A Hugging Face directory qualifies when it carries that model as `tokenizer.model` (an objtrain
export does). Other tokenizers (a foreign vocabulary) are refused: objtrain's stores need its fixed
special-token ids.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from objtrain.errors import UserError
from objtrain.interop import llama
from objtrain.models.config import ModelConfig

# ModelConfig fields that fix the weights' shapes or the function they compute: taken from the source.
SHAPE_FIELDS = (
    "vocab_size",
    "d_model",
    "n_layer",
    "n_decoder_layer",
    "n_head",
    "d_ff",
    "rope_base",
    "norm_eps",
)
# Weights a new objective may add or drop (its heads); any other difference is refused.
HEAD_PREFIXES = ("mtp.", "segment.", "pooler.")


@dataclass
class InitSource:
    path: Path
    description: str
    config: ModelConfig
    weights: dict[str, Tensor]
    tokenizer_sha256: str | None  # of the sentencepiece model the source was trained with
    notes: list[str] = field(default_factory=list)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_source(path: Path) -> InitSource:
    """Read an objtrain checkpoint/run or a Hugging Face Llama directory (weights on the CPU, fp32)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"--init-from: nothing at {path}")
    if (path / "config.json").is_file():
        try:
            config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserError(f"--init-from: {path / 'config.json'} is not readable JSON ({exc})") from None
        if (
            isinstance(config, dict)
            and "model" not in config
            and ("model_type" in config or "architectures" in config)
        ):
            return _hf_source(path, config)
    return _objtrain_source(path)


def _objtrain_source(path: Path) -> InitSource:
    from objtrain.models.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)
    weights = {k: v.detach().float() for k, v in ckpt.model.state_dict().items()}
    objective = ckpt.training.get("objective", "?")
    step = ckpt.training.get("step")
    at = f", step {step}" if step is not None else ""
    sha = _sha256(ckpt.tokenizer.model_proto) if ckpt.tokenizer is not None else None
    return InitSource(ckpt.path or path, f"{ckpt.path} ({objective}{at})", ckpt.config, weights, sha)


def _hf_weights(path: Path) -> dict[str, Tensor]:
    from objtrain.models.checkpoint import load_weights

    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UserError(f"--init-from: {index} is damaged ({exc})") from None
        weights: dict[str, Tensor] = {}
        for shard in shards:
            weights.update(load_weights(path / shard))
        return weights
    if not (path / "model.safetensors").is_file():
        found = ", ".join(sorted(p.name for p in path.iterdir())[:8])
        raise UserError(
            f"--init-from: {path} has no model.safetensors (found: {found}); objtrain reads safetensors "
            "only (never pickled .bin files): save the model with save_pretrained(safe_serialization=True)"
        )
    return load_weights(path / "model.safetensors")


def _hf_source(path: Path, config: dict[str, Any]) -> InitSource:
    where = str(path)
    cfg = llama.model_config_from_llama(config, where)
    weights = llama.llama_to_decoder(_hf_weights(path), cfg, where)
    model_file = path / "tokenizer.model"
    sha = _sha256(model_file.read_bytes()) if model_file.is_file() else None
    arch = ", ".join(config.get("architectures") or ["llama"])
    return InitSource(path, f"{path} (Hugging Face {arch})", cfg, weights, sha)


def check_tokenizer(source: InitSource, store_proto: bytes, store_path: Path) -> None:
    """The source must have been trained with the store's tokenizer: same ids for the same text."""
    if source.tokenizer_sha256 is None:
        raise UserError(
            f"--init-from: {source.path} carries no sentencepiece tokenizer.model to compare with "
            f"{store_path}'s; objtrain trains on stores tokenized with the model's own tokenizer"
        )
    if source.tokenizer_sha256 != _sha256(store_proto):
        raise UserError(
            f"--init-from: {source.path} was trained with another tokenizer than the one of {store_path}: "
            f"tokenize the data with it (objtrain tokenize ... --tokenizer {source.path / 'tokenizer.model'})"
        )


def model_config(source: InitSource, planned: ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
    """The new run's model: the source's shape with the planned heads (mtp_heads, segments, classes) and
    training-only settings (dropout). A shape override that differs from the source is refused."""
    for name in SHAPE_FIELDS:
        if name in overrides and name != "vocab_size":
            mine = getattr(source.config, name)
            if name == "d_ff":
                mine = source.config.ffn_dim
            if overrides[name] != mine:
                raise UserError(
                    f"--init-from: model.{name}={overrides[name]} differs from the source's {mine}; "
                    "the model's shape comes from --init-from"
                )
    if source.config.kind != planned.kind:
        raise UserError(
            f"--init-from: {source.path} is a{'n' if source.config.kind[0] in 'ae' else ''} "
            f"{source.config.kind} model; this objective trains a{'n' if planned.kind[0] in 'ae' else ''} "
            f"{planned.kind} (pick an objective for {source.config.kind} models, or --model-kind)"
        )
    shape = {name: getattr(source.config, name) for name in SHAPE_FIELDS}
    shape["d_ff"] = source.config.ffn_dim
    try:
        return dataclasses.replace(planned, **shape)
    except ValueError as exc:
        raise UserError(f"--init-from: {exc}") from None


def apply(model: nn.Module, source: InitSource) -> list[str]:
    """Copy the source's weights into `model` (a fresh model of `model_config`'s shape). Returns notes on
    heads that start fresh or are left out."""
    mine = model.state_dict()
    theirs = source.weights
    notes: list[str] = []
    fresh = sorted({k.split(".")[0] for k in mine if k not in theirs})
    dropped = sorted({k.split(".")[0] for k in theirs if k not in mine})
    for key in mine:
        if key not in theirs and not key.startswith(HEAD_PREFIXES):
            raise UserError(f"--init-from: {source.path} lacks {key!r}, which this model needs")
    for key in theirs:
        if key not in mine and not key.startswith(HEAD_PREFIXES):
            raise UserError(f"--init-from: {source.path} has {key!r}, which this model does not")
    with torch.no_grad():
        for key, tensor in theirs.items():
            if key not in mine:
                continue
            if mine[key].shape != tensor.shape:
                raise UserError(
                    f"--init-from: {key!r} has shape {tuple(tensor.shape)} in {source.path}, "
                    f"this model needs {tuple(mine[key].shape)}"
                )
            mine[key].copy_(tensor)
    if fresh:
        notes.append(f"fresh (not in the source): {', '.join(fresh)}")
    if dropped:
        notes.append(f"left out (this objective does not use them): {', '.join(dropped)}")
    return notes


def resumed_model_config(checkpoint: Path, planned: ModelConfig) -> tuple[ModelConfig, str | None]:
    """On --resume: the model of a run that started --init-from is the one its checkpoint records (the
    source's shape), returned with that source; any other run's is the one planned from its flags."""
    from objtrain.models.checkpoint import read_config
    from objtrain.models.zoo import config_from_dict

    try:
        meta = read_config(checkpoint)
    except UserError:
        return planned, None  # the restore itself reports a damaged checkpoint
    origin = (meta.get("training") or {}).get("init_from")
    if not origin:
        return planned, None
    return config_from_dict(meta["model"]), str(origin)
