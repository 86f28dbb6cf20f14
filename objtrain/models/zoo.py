"""The model zoo: `ModelConfig`, named sizes from `configs/models/<size>.yaml`, and `build_model`.

A size file holds one section per model kind (decoder / encoder / encdec), so `small` means about the
same parameter budget for every kind. Any field can be overridden (`n_layer=8`, `mtp_heads=4`); the
vocabulary size is filled in from the tokenizer or store when the model is built.

    cfg = model_config("decoder", "small", {"mtp_heads": 4}, vocab_size=tokenizer.vocab_size)
    model = build_model(cfg)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from objtrain.batch import MODEL_KINDS, ModelKind
from objtrain.config import config_dir, from_dict, load_yaml, merge, to_dict
from objtrain.errors import UserError, pick_name


@dataclass
class ModelConfig:
    kind: ModelKind = "decoder"
    vocab_size: int = 0  # 0 = take it from the tokenizer/store at build time
    d_model: int = 256  # residual width D
    n_layer: int = 4  # decoder-only / encoder layers (encdec: encoder side)
    n_decoder_layer: int = 0  # encdec decoder layers; 0 = same as n_layer
    n_head: int = 4  # head width D / n_head must be even (rotary pairs)
    d_ff: int = 0  # SwiGLU hidden width; 0 = 8/3 * D rounded up to a multiple of 64 (Llama)
    rope_base: float = 10000.0
    norm_eps: float = 1e-6
    dropout: float = 0.0
    init_std: float = 0.02
    mtp_heads: int = 1  # decoder: n future-token heads (1 = plain next-token model); head 1 is the last layer
    n_segments: int = 0  # encoder: segment (sentence A/B) embeddings; 0 = none
    n_classes: int = 0  # encoder: pooled classification head outputs (2 for NSP/SOP); 0 = no head

    def __post_init__(self) -> None:
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"kind must be one of {', '.join(MODEL_KINDS)}, got {self.kind!r}")
        if self.d_model % self.n_head or (self.d_model // self.n_head) % 2:
            raise ValueError(f"d_model {self.d_model} must split into {self.n_head} heads of even width")
        if min(self.d_model, self.n_layer, self.n_head, self.mtp_heads) < 1:
            raise ValueError("d_model, n_layer, n_head and mtp_heads must be positive")
        if self.mtp_heads > 1 and self.kind != "decoder":
            raise ValueError("mtp_heads > 1 needs a decoder model")
        if (self.n_segments or self.n_classes) and self.kind != "encoder":
            raise ValueError("n_segments and n_classes are for encoder models")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def ffn_dim(self) -> int:
        if self.d_ff:
            return self.d_ff
        return -(-(8 * self.d_model // 3) // 64) * 64

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layer or self.n_layer


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


def config_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    return to_dict(cfg)


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
