"""Checkpoints: safetensors weights + a JSON config, loadable without pickle, written atomically.

A checkpoint is a directory:

    model.safetensors   the unwrapped module's state_dict (no `_orig_mod.`/`module.` prefixes; the tied
                        embedding/unembedding stored once, as `embed.weight`)
    config.json         {"format_version", "kind", "model": ModelConfig, "specials": Specials.to_dict(),
                         "tokenizer": {"file", "sha256", "vocab_size"}, "training": {...}}
    tokenizer.model     the sentencepiece model, so `objtrain generate` needs nothing else

`training` is free-form information from the training loop, read by generation: e.g.
`{"objective": "fim", "objective_config": {"fim_spm_rate": 0.5, ...}, "fim_mode": "psm",
"decoder_start_id": 0, "step": 1000}`.

Run directories (the training loop follows this): a run directory RUN holds its checkpoints as

    RUN/checkpoints/<name>/     one checkpoint per save (e.g. step-001000)
    RUN/checkpoints/latest      a text file holding the name of the newest one (a symlink also works)
    RUN/checkpoint/             or: a single checkpoint

and `resolve_checkpoint(RUN)` finds the checkpoint in that order; a run without `latest` gives its highest
`step-N` checkpoint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor, nn

from objtrain.batch import MODEL_KINDS
from objtrain.data.foreign_tokenizer import tokenizer_from_file
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.io import atomic_dir, atomic_file, read_json, save_tensors, write_json
from objtrain.models.config import ModelConfig
from objtrain.models.zoo import build_model, config_from_dict, config_to_dict
from objtrain.specials import Specials

FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TOKENIZER = "tokenizer.model"
TOKENIZER_FILES = (TOKENIZER, "tokenizer.json")  # sentencepiece, or a Hugging Face tokenizer's JSON
WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile, DDP/FSDP


@dataclass
class Checkpoint:
    model: nn.Module
    config: ModelConfig
    specials: Specials
    tokenizer: Tokenizer | None
    training: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module under torch.compile (`_orig_mod`) and DDP (`module`) wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def clean_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """State dict with wrapper prefixes stripped, contiguous and detached, ready for safetensors."""
    out = {}
    for key, tensor in unwrap(model).state_dict().items():
        for prefix in WRAPPER_PREFIXES:
            key = key.replace(prefix, "")
        out[key] = tensor.detach().contiguous()
    return out


def save_checkpoint(
    path: Path,
    model: nn.Module,
    specials: Specials,
    tokenizer: Tokenizer | None = None,
    training: dict[str, Any] | None = None,
    force: bool = False,
    extra: Callable[[Path], None] | None = None,
    weights: dict[str, Tensor] | None = None,
) -> Path:
    """Write a checkpoint directory atomically: a crash mid-save leaves the old one (or none), never a torn
    one. `model` may be wrapped (torch.compile, DDP): the plain module's weights are saved. `extra(tmp)`
    writes more files into the same directory before it is renamed into place (the training state);
    `weights` replaces the module's own state dict (a sharded model's, gathered in full)."""
    path = Path(path)
    plain = unwrap(model)
    config: ModelConfig = plain.config  # type: ignore[assignment]
    meta: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "kind": config.kind,
        "model": config_to_dict(config),
        "specials": specials.to_dict(),
        "tokenizer": None,
        "training": training or {},
    }
    with atomic_dir(path, force=force) as tmp:
        tensors = clean_state_dict(model) if weights is None else weights
        save_tensors(tensors, tmp / WEIGHTS, metadata={"format": "pt"})
        if tokenizer is not None:
            with atomic_file(tmp / tokenizer.file_name) as handle:
                handle.write(tokenizer.model_proto)
            meta["tokenizer"] = {
                "file": tokenizer.file_name,
                "sha256": hashlib.sha256(tokenizer.model_proto).hexdigest(),
                "vocab_size": tokenizer.vocab_size,
            }
        write_json(tmp / CONFIG, meta)
        if extra is not None:
            extra(tmp)
    return path


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint directory, or the newest checkpoint of a run directory (see the module docstring)."""
    path = Path(path)
    if (path / CONFIG).is_file():
        return path
    if not path.exists():
        raise UserError(f"no checkpoint or run directory at {path}")
    latest = path / "checkpoints" / "latest"
    if latest.is_symlink() or latest.is_dir():
        if (latest / CONFIG).is_file():
            return latest.resolve()
    elif latest.is_file():
        name = read_latest(latest)
        target = path / "checkpoints" / name
        if name and (target / CONFIG).is_file():
            return target
        if name:
            raise UserError(f"{latest} names {name!r}, which is not a checkpoint in {target.parent}")
    if (path / "checkpoint" / CONFIG).is_file():
        return path / "checkpoint"
    # No `latest` yet: a run killed between its first checkpoint's rename and the pointer's write. The
    # loop writes each checkpoint whole under a temporary name, so a `step-N` directory is a finished one.
    steps = [p for p in (path / "checkpoints").glob("step-*") if p.name[5:].isdigit()]
    if steps := [p for p in steps if (p / CONFIG).is_file()]:
        return max(steps, key=lambda p: int(p.name[5:]))
    raise UserError(
        f"{path} is neither a checkpoint (config.json + model.safetensors) nor a run directory "
        "with checkpoints/latest or checkpoint/"
    )


def read_latest(latest: Path) -> str:
    """The checkpoint name a `latest` file holds; "" when it cannot be read (a damaged pointer: the newest
    complete step-N then decides, as when there is none)."""
    try:
        return latest.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def mark_latest(run_dir: Path, name: str) -> None:
    """Point RUN/checkpoints/latest at checkpoint `name` (atomic rewrite of a one-line file)."""
    with atomic_file(Path(run_dir) / "checkpoints" / "latest", "w") as handle:
        handle.write(name + "\n")


def read_config(path: Path) -> dict[str, Any]:
    meta = read_json(path / CONFIG, what="checkpoint config")
    if not isinstance(meta, dict) or "model" not in meta:
        raise UserError(f"{path / CONFIG} is not an objtrain checkpoint config (no 'model' section)")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise UserError(
            f"{path} has checkpoint format_version {version!r}; this objtrain reads version {FORMAT_VERSION}"
        )
    kind, model = meta.get("kind"), meta["model"]
    model_kind = model.get("kind", "decoder") if isinstance(model, dict) else None
    if "kind" in meta and (kind not in MODEL_KINDS or kind != model_kind):
        raise UserError(
            f"{path / CONFIG}: its kind {kind!r} is not one of {', '.join(MODEL_KINDS)} matching the model's "
            f"({model_kind!r}): the file is damaged"
        )
    return meta


def load_weights(file: Path) -> dict[str, Tensor]:
    """safetensors -> tensors (no pickle); a missing, truncated or corrupt file is one clear line."""
    if not file.is_file():
        raise UserError(f"checkpoint weights not found: {file}")
    try:
        weights = load_file(str(file))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"{file} is not a readable safetensors file (truncated or corrupt?): {reason}"
        ) from None
    check_finite(weights, file)
    return weights


def check_finite(weights: dict[str, Tensor], where: Path) -> None:
    """Refuse weights holding NaN or infinity, naming the first such tensor: every output computed from
    them (generated text, metrics, an export) would be NaN or noise. Every reader of checkpoint weights
    comes through `load_weights`, so generate, eval, --init-from, --resume and export refuse alike."""
    for key, tensor in weights.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise UserError(
                f"{where}: tensor {key!r} holds {bad:,} NaN or infinite values (a diverged run or a damaged "
                "file): nothing sound can be computed from it"
            )


def check_state_dict(model: nn.Module, weights: dict[str, Tensor], where: Path) -> None:
    """Strict key and shape check, naming the first offending tensor and why."""
    expected = model.state_dict()
    for key, tensor in expected.items():
        if key not in weights:
            raise UserError(
                f"{where}: tensor {key!r} is missing (the config asks for shape {tuple(tensor.shape)})"
            )
        if weights[key].shape != tensor.shape:
            raise UserError(
                f"{where}: tensor {key!r} has shape {tuple(weights[key].shape)}, "
                f"the config asks for {tuple(tensor.shape)}"
            )
    extra = sorted(set(weights) - set(expected))
    if extra:
        raise UserError(f"{where}: unexpected tensor {extra[0]!r} that this model config does not have")


def load_checkpoint(path: Path, device: torch.device | str = "cpu") -> Checkpoint:
    """Rebuild the model from config.json and load its weights strictly (eval mode, on `device`)."""
    path = resolve_checkpoint(Path(path))
    meta = read_config(path)
    config = config_from_dict(meta["model"])
    specials = Specials.from_dict(meta["specials"]) if meta.get("specials") else Specials()
    tokenizer = None
    info = meta.get("tokenizer")
    training = meta.get("training") or {}
    if info and not (isinstance(info, dict) and info.get("file", TOKENIZER) in TOKENIZER_FILES):
        raise UserError(f"{path / CONFIG}: its 'tokenizer' section is not {{file, sha256}}: damaged")
    if not isinstance(training, dict):
        raise UserError(f"{path / CONFIG}: its 'training' section is not a mapping: the file is damaged")
    if info:
        file = path / info.get("file", TOKENIZER)
        tokenizer = tokenizer_from_file(file, specials)
        digest = hashlib.sha256(tokenizer.model_proto).hexdigest()
        if info.get("sha256") not in (None, digest):
            raise UserError(f"{file} does not match the sha256 recorded in {path / CONFIG}")
        if tokenizer.vocab_size != config.vocab_size:
            raise UserError(
                f"{file} has {tokenizer.vocab_size} tokens but the model's vocab_size is {config.vocab_size}"
            )
    model = build_model(config)
    weights = load_weights(path / WEIGHTS)
    check_state_dict(model, weights, path / WEIGHTS)
    model.load_state_dict(weights, strict=True)
    model.to(device).eval()
    return Checkpoint(model, config, specials, tokenizer, training, path)
