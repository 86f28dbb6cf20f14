"""objtrain decoder/encoder weights <-> Hugging Face Llama-layout weights (pure torch, no transformers).

objtrain's blocks are Llama's: pre-norm RMSNorm, RoPE, SwiGLU, no biases, grouped-query attention when
n_kv_head < n_head (query head h reads key/value head h // (H/G) in both), the unembedding tied to the
embedding or not. Three things differ only in layout:
- q, k and v are one fused `attn.qkv` (rows q | k | v) and gate/up one fused `mlp.w13` (rows gate | up);
- objtrain rotates adjacent channel pairs (2i, 2i+1), Hugging Face's Llama rotates half-split pairs
  (i, i + K/2). Reordering each q and k head's rows as evens-then-odds turns one into the other (k with
  its G heads); q and k get the same reordering, so every score q.k is unchanged, and v is never touched;
- the final norm is `lm_head.norm`, Hugging Face's `model.norm`; an untied output matrix is
  `lm_head.out.weight`, Hugging Face's `lm_head.weight`.

Names (Hugging Face): model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
.self_attn.{q,k,v,o}_proj.weight, .post_attention_layernorm.weight, .mlp.{gate,up,down}_proj.weight,
model.norm.weight, lm_head.weight (left out when tied to the embedding).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from objtrain.errors import UserError
from objtrain.models.config import ModelConfig


def to_half_split(w: Tensor, n_heads: int) -> Tensor:
    """Rows of a q or k projection (H*K, D), interleaved pairs -> half-split pairs, head by head."""
    rows, cols = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def to_interleaved(w: Tensor, n_heads: int) -> Tensor:
    """The inverse of `to_half_split`."""
    rows, cols = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def export_layers(weights: dict[str, Tensor], cfg: ModelConfig, layer_names: list[str]) -> dict[str, Tensor]:
    """objtrain block weights -> Hugging Face `model.layers.{i}.*`; `layer_names[i]` is the objtrain
    prefix of layer i (`blocks.3`, or an MTP model's head-1 layer)."""
    D, F, H, G = cfg.d_model, cfg.ffn_dim, cfg.n_head, cfg.kv_heads
    QK = D + G * cfg.head_dim
    out: dict[str, Tensor] = {}
    for i, name in enumerate(layer_names):
        hf = f"model.layers.{i}"
        qkv = weights[f"{name}.attn.qkv.weight"]
        out[f"{hf}.self_attn.q_proj.weight"] = to_half_split(qkv[:D], H)
        out[f"{hf}.self_attn.k_proj.weight"] = to_half_split(qkv[D:QK], G)
        out[f"{hf}.self_attn.v_proj.weight"] = qkv[QK:]
        out[f"{hf}.self_attn.o_proj.weight"] = weights[f"{name}.attn.proj.weight"]
        out[f"{hf}.input_layernorm.weight"] = weights[f"{name}.norm1.weight"]
        out[f"{hf}.post_attention_layernorm.weight"] = weights[f"{name}.norm2.weight"]
        w13 = weights[f"{name}.mlp.w13.weight"]
        out[f"{hf}.mlp.gate_proj.weight"] = w13[:F]
        out[f"{hf}.mlp.up_proj.weight"] = w13[F:]
        out[f"{hf}.mlp.down_proj.weight"] = weights[f"{name}.mlp.w2.weight"]
    out["model.embed_tokens.weight"] = weights["embed.weight"]
    out["model.norm.weight"] = weights["lm_head.norm.weight"]
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = weights["lm_head.out.weight"]
    return {k: v.detach().float().contiguous().clone() for k, v in out.items()}  # cast on export


def decoder_to_llama(weights: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """A decoder's state dict -> LlamaForCausalLM's. An MTP model keeps its trunk and head 1 (the last
    of `blocks`), which together are a plain next-token decoder; heads 2..n have no place in Llama."""
    return export_layers(weights, cfg, [f"blocks.{i}" for i in range(cfg.n_layer)])


def llama_config(
    cfg: ModelConfig, max_positions: int, architecture: str = "LlamaForCausalLM", model_type: str = "llama"
) -> dict[str, Any]:
    """config.json for the Llama-family class `architecture`, with objtrain's special ids."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "initializer_range": cfg.init_std,
        "rms_norm_eps": cfg.norm_eps,
        # transformers 5 reads RoPE from rope_parameters; 4.x readers look for the top-level rope_theta,
        # and silently fall back to 10000 without it, so both are written
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_base},
        "rope_theta": cfg.rope_base,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_embeddings,
        "use_cache": True,
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": 3,
    }


def _get(config: dict[str, Any], key: str, default: Any = None) -> Any:
    value = config.get(key, default)
    return default if value is None else value


def model_config_from_llama(config: dict[str, Any], where: str) -> ModelConfig:
    """A decoder `ModelConfig` from a Llama config.json, refusing what objtrain's decoder cannot compute."""
    architectures = config.get("architectures") or []
    mistral = config.get("model_type") == "mistral" or "MistralForCausalLM" in architectures
    if config.get("model_type") != "llama" and "LlamaForCausalLM" not in architectures and not mistral:
        raise UserError(
            f"{where} holds a {config.get('model_type') or 'unknown'!s} model "
            f"({', '.join(map(str, architectures)) or 'no architectures'}); "
            "--init-from reads Llama-architecture (LlamaForCausalLM) directories only"
        )
    # Mistral's blocks, names and RoPE are Llama's; only a sliding attention window differs, and
    # `sliding_window: null` (Mistral 7B v0.2 on) switches it off: such a model is a Llama
    if mistral and config.get("sliding_window") is not None:
        raise UserError(
            f"{where}: a Mistral model with sliding_window {config['sliding_window']}; objtrain attends to "
            "every earlier token, so only sliding_window null (a Llama) is read"
        )
    try:
        D = int(config["hidden_size"])
        H = int(config["num_attention_heads"])
        L = int(config["num_hidden_layers"])
        V = int(config["vocab_size"])
        F = int(config["intermediate_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{where}: config.json lacks a usable {exc} for a Llama model") from None
    kv = int(_get(config, "num_key_value_heads", H))
    if kv < 1 or H % kv:
        raise UserError(f"{where}: {kv} key/value heads do not divide {H} query heads evenly")
    head_dim = int(_get(config, "head_dim", D // H))
    if head_dim * H != D:
        raise UserError(
            f"{where}: head_dim {head_dim} x {H} heads != hidden_size {D}; objtrain needs equality"
        )
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise UserError(f"{where}: {flag} is true; objtrain's layers have no biases")
    if _get(config, "hidden_act", "silu") != "silu":
        raise UserError(f"{where}: hidden_act {config['hidden_act']!r}; objtrain's SwiGLU uses silu")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type != "default":
        raise UserError(f"{where}: RoPE type {rope_type!r}; objtrain implements the default RoPE only")
    theta = (rope.get("rope_theta") if isinstance(rope, dict) else None) or _get(
        config, "rope_theta", 10000.0
    )
    try:
        return ModelConfig(
            kind="decoder",
            vocab_size=V,
            d_model=D,
            n_layer=L,
            n_head=H,
            n_kv_head=0 if kv == H else kv,
            d_ff=F,
            rope_base=float(theta),
            norm_eps=float(_get(config, "rms_norm_eps", 1e-6)),
            init_std=float(_get(config, "initializer_range", 0.02)),
            # LlamaConfig's own default is untied (Llama 2): a config.json without the key is untied
            tie_embeddings=bool(_get(config, "tie_word_embeddings", False)),
        )
    except ValueError as exc:
        raise UserError(f"{where}: {exc}") from None


def llama_to_decoder(hf: dict[str, Tensor], cfg: ModelConfig, where: str) -> dict[str, Tensor]:
    """LlamaForCausalLM weights -> an objtrain decoder's state dict (the inverse of `decoder_to_llama`)."""
    import torch

    def take(name: str) -> Tensor:
        for key in (name, name.removeprefix("model.")):  # a bare LlamaModel has no `model.` prefix
            if key in hf:
                return hf[key]
        raise UserError(f"{where}: tensor {name!r} is missing")

    embed = take("model.embed_tokens.weight")
    H, G = cfg.n_head, cfg.kv_heads
    out = {"embed.weight": embed, "lm_head.norm.weight": take("model.norm.weight")}
    head = hf.get("lm_head.weight")
    if cfg.tie_embeddings and head is not None and not torch.equal(head, embed):
        raise UserError(
            f"{where}: tie_word_embeddings is true, yet lm_head.weight differs from the token embedding"
        )
    if not cfg.tie_embeddings:
        if head is None:
            raise UserError(
                f"{where}: config.json says the output layer is untied (tie_word_embeddings false or "
                "absent), but there is no lm_head.weight"
            )
        out["lm_head.out.weight"] = head
    for i in range(cfg.n_layer):
        hf_name, name = f"model.layers.{i}", f"blocks.{i}"
        q = to_interleaved(take(f"{hf_name}.self_attn.q_proj.weight"), H)
        k = to_interleaved(take(f"{hf_name}.self_attn.k_proj.weight"), G)
        out[f"{name}.attn.qkv.weight"] = torch.cat((q, k, take(f"{hf_name}.self_attn.v_proj.weight")))
        out[f"{name}.attn.proj.weight"] = take(f"{hf_name}.self_attn.o_proj.weight")
        out[f"{name}.norm1.weight"] = take(f"{hf_name}.input_layernorm.weight")
        out[f"{name}.norm2.weight"] = take(f"{hf_name}.post_attention_layernorm.weight")
        out[f"{name}.mlp.w13.weight"] = torch.cat(
            (take(f"{hf_name}.mlp.gate_proj.weight"), take(f"{hf_name}.mlp.up_proj.weight"))
        )
        out[f"{name}.mlp.w2.weight"] = take(f"{hf_name}.mlp.down_proj.weight")
    layers = tuple(f"layers.{i}." for i in range(cfg.n_layer))
    for key in hf:
        bare = key.removeprefix("model.")
        if (
            key != "lm_head.weight"
            and "rotary_emb" not in key
            and not bare.startswith(layers)
            and bare not in ("embed_tokens.weight", "norm.weight")
        ):
            raise UserError(f"{where}: unexpected tensor {key!r} for a Llama model of this config")
    return {k: v.float().contiguous() for k, v in out.items()}
