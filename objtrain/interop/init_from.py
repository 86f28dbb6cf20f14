"""`objtrain train --init-from`: start a new run from existing weights.

The source is an objtrain checkpoint (or a run: its newest checkpoint), or a local Hugging Face
directory of a Llama-architecture causal LM (`config.json` + `model.safetensors`, possibly sharded),
grouped-query attention and an untied output layer included (a Mistral model without a sliding window is
one). The new run's model takes the source's shape (width, layers, heads, key/value heads, FFN, RoPE
base, vocabulary, tied or untied output); the run's own objective decides its heads. Weights the source
has and the new model has are copied exactly; a head the new objective adds (MTP heads 2..n, an
encoder's segment embedding or pooled head) starts fresh, and one it does not use (a source's MTP heads
for CLM) is left out; both are said.

The tokenizer must be the one the data was tokenized with: the same sentencepiece model (compared by
hash), or, for a store tokenized with a Hugging Face `tokenizer.json`, the same file. A Hugging Face
directory qualifies when it carries that model as `tokenizer.model` (an objtrain export does) or the
store was made from its own `tokenizer.json` (`objtrain tokenize ... --tokenizer HF_DIR`). Such a store
gives objtrain's special tokens the tokenizer lacks ids after its vocabulary; the model gets embedding
rows (and, untied, output rows) for them (`grow_rows`): each the mean of the model's rows, so every logit
over the model's own vocabulary is unchanged before the first step. Any other tokenizer is refused.
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
    "n_kv_head",
    "d_ff",
    "rope_base",
    "norm_eps",
    "tie_embeddings",
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
    tokenizer_json: bytes | None = None  # a Hugging Face directory's own tokenizer.json, as found
    # Embedding rows the store's vocabulary needs beyond the source's (objtrain's special tokens added
    # after a Hugging Face tokenizer's vocabulary): set by `check_tokenizer`, filled in by `apply`.
    grow_rows: int = 0
    added_note: str = ""

    @property
    def vocab_size(self) -> int:
        """The new run's vocabulary: the source's rows and the rows grown for added special tokens."""
        return self.config.vocab_size + self.grow_rows


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
    json_file = path / "tokenizer.json"
    own_json = json_file.read_bytes() if json_file.is_file() else None
    arch = ", ".join(config.get("architectures") or ["llama"])
    return InitSource(path, f"{path} (Hugging Face {arch})", cfg, weights, sha, tokenizer_json=own_json)


def _same_json(a: bytes, b: bytes) -> bool:
    """Two tokenizer.json files are the same tokenizer: equal bytes, or equal once parsed (a file saved
    again with other whitespace or key order)."""
    if a == b:
        return True
    try:
        return bool(json.loads(a) == json.loads(b))
    except (UnicodeDecodeError, ValueError):
        return False


def check_tokenizer(source: InitSource, tokenizer: Any, store_path: Path) -> None:
    """The source must have been trained with the store's tokenizer (`tokenizer`, the store's): same ids
    for the same text. A store made from a Hugging Face directory's own tokenizer.json qualifies, and sets
    how many embedding rows its added special tokens need (`source.grow_rows`)."""
    store_proto: bytes = tokenizer.model_proto
    if getattr(tokenizer, "kind", None) == "huggingface" and source.tokenizer_json is not None:
        _check_own_hf_tokenizer(source, tokenizer, store_path)
        return
    if source.tokenizer_sha256 is None and source.tokenizer_json is not None:
        raise UserError(
            f"--init-from: {store_path} was tokenized with another tokenizer than {source.path}'s "
            f"tokenizer.json: tokenize the data with it (objtrain tokenize ... --tokenizer {source.path})"
        )
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


def _check_own_hf_tokenizer(source: InitSource, tokenizer: Any, store_path: Path) -> None:
    assert source.tokenizer_json is not None
    if not _same_json(source.tokenizer_json, tokenizer.model_proto):
        raise UserError(
            f"--init-from: {store_path} was tokenized with another tokenizer than {source.path}'s "
            f"tokenizer.json: tokenize the data with it (objtrain tokenize ... --tokenizer {source.path})"
        )
    rows, base, size = source.config.vocab_size, int(tokenizer.base_size), int(tokenizer.vocab_size)
    if base > rows:
        raise UserError(
            f"--init-from: {source.path}'s tokenizer.json has {base} tokens, its model only {rows} "
            "embedding rows: the directory's tokenizer and weights do not belong together"
        )
    source.grow_rows = max(0, size - rows)
    # objtrain's special tokens that the tokenizer lacks have ids base..size-1. A model whose vocabulary
    # is padded past its tokenizer's (to a multiple of 64, say) already has rows there, never produced by
    # the tokenizer: those are kept as they are (so every logit of the model is unchanged), and rows are
    # added only past the model's vocabulary.
    spare = min(size, rows) - base
    parts = []
    if spare > 0:
        parts.append(f"{spare} on the model's spare embedding rows (ids {base}..{base + spare - 1}, kept)")
    if source.grow_rows:
        parts.append(
            f"{source.grow_rows} on new rows (ids {rows}..{rows + source.grow_rows - 1}), "
            f"each the mean of the model's {rows} rows"
        )
    if parts:
        source.added_note = "objtrain's special tokens the tokenizer lacks: " + ", ".join(parts)


def model_config(source: InitSource, planned: ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
    """The new run's model: the source's shape with the planned heads (mtp_heads, segments, classes) and
    training-only settings (dropout). A shape override that differs from the source is refused."""
    for name in SHAPE_FIELDS:
        if name in overrides and name != "vocab_size":
            mine, wanted = getattr(source.config, name), overrides[name]
            if name == "d_ff":
                mine = source.config.ffn_dim
            if name == "n_kv_head":  # 0 stands for n_head
                mine, wanted = source.config.kv_heads, wanted or source.config.n_head
            if wanted != mine:
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
    shape["vocab_size"] = source.vocab_size
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
            # An untied output matrix grows with the embedding: its new rows are the new tokens' logit
            # weights, and the mean row gives each new token the average of the old logits, as tied.
            if key in ("embed.weight", "lm_head.out.weight") and source.grow_rows:
                tensor = grown_embedding(tensor, source.grow_rows)
            if mine[key].shape != tensor.shape:
                raise UserError(
                    f"--init-from: {key!r} has shape {tuple(tensor.shape)} in {source.path}, "
                    f"this model needs {tuple(mine[key].shape)}"
                )
            mine[key].copy_(tensor)
    if source.added_note:
        notes.append(source.added_note)
    if fresh:
        notes.append(f"fresh (not in the source): {', '.join(fresh)}")
    if dropped:
        notes.append(f"left out (this objective does not use them): {', '.join(dropped)}")
    return notes


def grown_embedding(embed: Tensor, rows: int) -> Tensor:
    """`embed` (V, D) with `rows` more rows, each the mean of its V rows.

    This is how transformers' `resize_token_embeddings(..., mean_resizing=True)` (its default) starts new
    tokens: it draws them from a normal with the old rows' mean and their covariance scaled by 1e-9, i.e.
    the mean up to noise far below any weight's size; objtrain takes the mean itself, deterministically.
    A new token's logit is then h . mean, the average of the old logits, so the model's next-token
    distribution over its own vocabulary moves as little as it can (Hewitt, "Initializing new word
    embeddings for pretrained language models", 2021). A tied unembedding is this matrix, so the output
    rows grow with it; an untied one (`lm_head.out.weight`, also V x D) is grown the same way by `apply`.
    """
    mean = embed.float().mean(dim=0, keepdim=True).to(embed.dtype)
    return torch.cat((embed, mean.expand(rows, -1)))


def resumed_model_config(checkpoint: Path, planned: ModelConfig) -> tuple[ModelConfig, str | None]:
    """On --resume: the model of a run that started --init-from is the one its checkpoint records (the
    source's shape), returned with that source; any other run's is the one planned from its flags."""
    from objtrain.models.checkpoint import read_config
    from objtrain.models.zoo import config_from_dict

    try:
        meta = read_config(checkpoint)
    except UserError:
        return planned, None  # the restore itself reports a damaged checkpoint
    saved = meta["model"].get("kind", "decoder") if isinstance(meta["model"], dict) else planned.kind
    if saved != planned.kind:  # else the optimizer state's shapes are what would differ, a riddle
        objective = (meta.get("training") or {}).get("objective")
        trained = f" with {objective}" if isinstance(objective, str) else ""
        names = {"decoder": "a decoder", "encoder": "an encoder", "encdec": "an encoder-decoder"}
        raise UserError(
            f"{checkpoint.parent.parent} holds {names.get(saved, repr(saved))} model (trained{trained}); "
            f"this run asks for {names[planned.kind]}: resume it with its own objective, or start a new "
            "run with another -o"
        )
    origin = (meta.get("training") or {}).get("init_from")
    if not origin:
        return planned, None
    return config_from_dict(meta["model"]), str(origin)
