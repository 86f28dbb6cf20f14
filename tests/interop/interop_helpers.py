"""Tiny objtrain checkpoints, tokenizers and Hugging Face Llama directories for the interop tests, all built
here (nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
    **overrides: int | bool,
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
                param[: cfg.d_model + cfg.kv_heads * cfg.head_dim] *= qk_scale  # q and k rows
            if "norm" in name:  # gains away from 1, so a misplaced norm shows
                param.uniform_(0.5, 1.5)
    objective = objective or {"decoder": "clm", "encoder": "mlm", "encdec": "span"}[kind]
    save_checkpoint(path, model, tokenizer.specials, tokenizer, {"objective": objective, "seq_len": 64})
    return path


def byte_level_bpe(texts: list[str], vocab_size: int = 600, specials: tuple[str, ...] = ()) -> Any:
    """A GPT-2-style byte-level BPE tokenizer trained on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def tiny_llama_dir(
    path: Path,
    tokenizer_json: Any,
    spare_rows: int = 0,
    seed: int = 0,
    qk_scale: float = 8.0,
    kv_heads: int = 4,
    tied: bool = True,
) -> Path:
    """A random tiny `LlamaForCausalLM` (4 query heads, `kv_heads` key/value heads, the output layer tied
    to the embedding or not) saved with `save_pretrained`, beside its own `tokenizer.json` (a
    `tokenizers.Tokenizer`). `spare_rows` pads the model's vocabulary past the tokenizer's, as published
    models round theirs up. q/k are scaled up and norm gains moved off 1, so that a wrong RoPE layout or a
    misplaced norm shows in the logits."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=tokenizer_json.get_vocab_size() + spare_rows,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=tied,
        eos_token_id=tokenizer_json.token_to_id("<|endoftext|>"),
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param *= qk_scale
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(str(path))
    tokenizer_json.save(str(path / "tokenizer.json"))
    assert json.loads((path / "config.json").read_text()).get("tie_word_embeddings", False) is tied
    return path
