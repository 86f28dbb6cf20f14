"""Tiny objtrain checkpoints for the interop tests."""

from __future__ import annotations

from pathlib import Path

import torch

from objtrain.data.tokenizer import Tokenizer
from objtrain.models.checkpoint import save_checkpoint
from objtrain.models.zoo import ModelConfig, build_model


def tiny_checkpoint(
    path: Path,
    tokenizer: Tokenizer,
    kind: str = "decoder",
    seed: int = 0,
    qk_scale: float = 8.0,
    objective: str | None = None,
    **overrides: int,
) -> Path:
    """A random tiny model saved as an objtrain checkpoint. q and k are scaled up so that attention is far
    from uniform: at init it nearly is, and a wrong RoPE layout would then go unnoticed."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        kind=kind, vocab_size=tokenizer.vocab_size, d_model=64, n_layer=2, n_head=4, **overrides
    )  # type: ignore[arg-type]
    model = build_model(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("attn.qkv.weight"):
                param[: 2 * cfg.d_model] *= qk_scale
            if "norm" in name:  # gains away from 1, so a misplaced norm shows
                param.uniform_(0.5, 1.5)
    objective = objective or {"decoder": "clm", "encoder": "mlm", "encdec": "span"}[kind]
    save_checkpoint(path, model, tokenizer.specials, tokenizer, {"objective": objective, "seq_len": 64})
    return path
