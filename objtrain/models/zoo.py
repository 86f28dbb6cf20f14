"""The model zoo: named sizes from `configs/models/<size>.yaml` and `build_model`; `ModelConfig` (from
`objtrain.models.config`, where every model kind imports it) is re-exported here.

A size file holds one section per model kind (decoder / encoder / encdec), so `small` means about the
same parameter budget for every kind. Any field can be overridden (`n_layer=8`, `mtp_heads=4`); the
vocabulary size is filled in from the tokenizer or store when the model is built.

    cfg = model_config("decoder", "small", {"mtp_heads": 4}, vocab_size=tokenizer.vocab_size)
    model = build_model(cfg)
"""

from __future__ import annotations

from typing import Any

from torch import nn

from objtrain.batch import MODEL_KINDS
from objtrain.config import config_dir, from_dict, load_yaml, merge, to_dict
from objtrain.errors import UserError, pick_name
from objtrain.models.config import ModelConfig

__all__ = ["ModelConfig", "build_model", "config_dir", "count_parameters", "model_config", "model_sizes"]


def model_sizes() -> list[str]:
    return sorted(p.stem for p in (config_dir() / "models").glob("*.yaml"))


def model_config(
    kind: str, size: str, overrides: dict[str, Any] | None = None, vocab_size: int | None = None
) -> ModelConfig:
    """The `kind` section of configs/models/<size>.yaml, merged with `overrides`, strictly checked."""
    kind = pick_name(kind, MODEL_KINDS, "model kind")
    size = pick_name(size, model_sizes(), "model size")
    path = config_dir() / "models" / f"{size}.yaml"
    sections = load_yaml(path)
    if kind not in sections:
        raise UserError(f"{path} has no {kind!r} section")
    data = merge({"kind": kind, **sections[kind]}, overrides or {})
    if vocab_size is not None:
        data["vocab_size"] = vocab_size
    return from_dict(ModelConfig, data, where=f"model {size}/{kind}")


def config_from_dict(data: dict[str, Any]) -> ModelConfig:
    return from_dict(ModelConfig, data, where="model")


# Later fields left out of a checkpoint's config.json at their defaults: a default model's file reads as
# it did before they existed, and objtrain versions without them still load it.
OMITTED_AT_DEFAULT = {"n_kv_head": 0, "tie_embeddings": True}


# Run-time choices that leave the computed function as it is: never written into a checkpoint.
NOT_RECORDED = ("attention_kernel",)


def config_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    data = to_dict(cfg)
    for key, default in OMITTED_AT_DEFAULT.items():
        if data[key] == default:
            del data[key]
    for key in NOT_RECORDED:
        del data[key]
    return data


def build_model(cfg: ModelConfig) -> nn.Module:
    """A freshly initialised model of `cfg.kind`: `model(batch) -> ModelOutput`."""
    if cfg.vocab_size < 1:
        raise UserError("model vocab_size is not set: it comes from the tokenizer or store")
    if cfg.kind == "decoder":
        from objtrain.models.decoder import Decoder

        return Decoder(cfg)
    if cfg.kind == "encoder":
        from objtrain.models.encoder import Encoder

        return Encoder(cfg)
    from objtrain.models.encdec import EncoderDecoder

    return EncoderDecoder(cfg)


def count_parameters(model: nn.Module, embeddings: bool = True) -> int:
    """Parameters, each tied tensor once; `embeddings=False` leaves out the token embedding."""
    total = sum(p.numel() for p in model.parameters())
    if not embeddings:
        total -= model.embed.weight.numel()  # type: ignore[union-attr]
    return total
