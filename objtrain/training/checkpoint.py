"""Training checkpoints: the model checkpoint plus optimizer state and `state.json`, atomic, newest K kept.

    RUN/checkpoints/step-00000020/   model.safetensors, config.json, tokenizer.model  (objtrain generate/eval)
                                     optimizer.safetensors  Adam moments by parameter name, RNG states
                                     state.json             step, data position, counters, resolved config,
                                                            and the size of every file (written last)
    RUN/checkpoints/latest           the newest complete checkpoint's name, rewritten once it is complete

A checkpoint directory appears by one rename of a finished temporary directory (`objtrain.io.atomic_dir`),
so a kill at any moment leaves either a complete checkpoint or a `.step-*.tmp` that the next run removes.
`--resume` takes `latest` if it names a complete checkpoint, else the highest complete `step-*`. No pickle:
tensors in safetensors, everything else JSON.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.io import OutputLock, is_count, save_tensors
from objtrain.models.checkpoint import load_weights, mark_latest, read_latest, save_checkpoint, unwrap
from objtrain.specials import Specials

STATE = "state.json"
OPTIMIZER = "optimizer.safetensors"
STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoints_dir(run: Path) -> Path:
    return Path(run) / "checkpoints"


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def _fsync_dir(path: Path) -> None:
    """A file's fsync does not persist its directory entry: fsync the directory after a rename."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def moments_to_tensors(moments: dict[str, dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Adam state keyed by parameter name (`optim/<name>/<key>`): a changed grouping cannot mis-assign it."""
    return {
        f"optim/{name}/{key}": value.detach().cpu().contiguous()
        for name, state in moments.items()
        for key, value in state.items()
        if isinstance(value, torch.Tensor)
    }


def tensors_to_moments(tensors: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    moments: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim/"):
            name, _, field = key[len("optim/") :].rpartition("/")
            moments.setdefault(name, {})[field] = value
    return moments


def load_moments(optimizer: torch.optim.Optimizer, moments: dict[str, dict[str, torch.Tensor]]) -> None:
    for group in optimizer.param_groups:
        for name, p in zip(group["names"], group["params"], strict=True):
            if name in moments:
                # Adam's `step` counter stays on the CPU (non-capturable AdamW keeps it there).
                optimizer.state[p] = {
                    k: v if k == "step" else v.to(p.device) for k, v in moments[name].items()
                }


def rng_tensors() -> dict[str, torch.Tensor]:
    out = {"rng/torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["rng/cuda"] = torch.cuda.get_rng_state()
    return out


def restore_rng(tensors: dict[str, torch.Tensor]) -> None:
    if "rng/torch_cpu" in tensors:
        torch.set_rng_state(tensors["rng/torch_cpu"])
    if "rng/cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng/cuda"])


def save_training_checkpoint(
    run: Path,
    step: int,
    model: nn.Module,
    weights: dict[str, torch.Tensor],
    moments: dict[str, dict[str, Any]],
    specials: Specials,
    tokenizer: Tokenizer,
    training: dict[str, Any],
    state: dict[str, Any],
    keep: int,
) -> Path:
    """Write RUN/checkpoints/step-N atomically, then point `latest` at it, then prune to `keep`.

    `weights` and `moments` are the full model and Adam state (gathered first when the model is sharded)."""
    root = checkpoints_dir(run)
    path = root / step_name(step)
    delay = float(os.environ.get("OBJTRAIN_SAVE_DELAY", "0") or 0)  # tests: widen the mid-save window

    def extra(tmp: Path) -> None:
        if delay:
            time.sleep(delay)
        save_tensors({**moments_to_tensors(moments), **rng_tensors()}, tmp / OPTIMIZER)
        if delay:
            time.sleep(delay)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        body = json.dumps({**state, "files": files}, indent=2, allow_nan=False)
        with open(tmp / STATE, "w", encoding="utf-8") as handle:
            handle.write(body + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        for p in tmp.iterdir():  # model files were written by safetensors without fsync
            with open(p, "rb") as handle:
                os.fsync(handle.fileno())

    save_checkpoint(
        path, model, specials, tokenizer, training=training, force=True, extra=extra, weights=weights
    )
    _fsync_dir(root)
    mark_latest(run, path.name)
    _fsync_dir(root)
    prune(run, keep)
    return path


def is_complete(path: Path) -> bool:
    """state.json parses and every file it lists is there with its recorded size."""
    try:
        state = json.loads((path / STATE).read_text(encoding="utf-8"))
        files = state["files"]
        return all((path / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def complete_checkpoints(run: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint in RUN, oldest first."""
    root = checkpoints_dir(run)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if m and p.is_dir() and is_complete(p):
            found.append((int(m.group(1)), p))
    return sorted(found)


def clean_leftovers(run: Path) -> None:
    """Remove what a killed run left: temporary checkpoint directories and half-pruned ones."""
    root = checkpoints_dir(run)
    if not root.is_dir():
        return
    for p in root.iterdir():
        if p.name.startswith(".") and (p.name.endswith(".tmp") or p.name.startswith(".trash-")):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def latest_checkpoint(run: Path) -> Path | None:
    """`latest` if it names a complete checkpoint, else the highest complete step, else None."""
    root = checkpoints_dir(run)
    latest = root / "latest"
    if latest.is_file() and not latest.is_symlink():
        name = read_latest(latest)
        if name and is_complete(root / name):
            return root / name
    elif latest.is_symlink() and is_complete(latest.resolve()):
        return latest.resolve()
    found = complete_checkpoints(run)
    return found[-1][1] if found else None


def first_missing(path: Path) -> Path | None:
    """The outermost directory of `path` that does not exist yet (what a run into it would create)."""
    path = Path(path).absolute()
    if path.exists() or path.is_symlink():
        return None
    while not path.parent.exists() and path.parent != path.parent.parent:
        path = path.parent
    return path


def discard_unsaved(run: Path, created: Path) -> bool:
    """Remove a run that this command created and that never saved a checkpoint (a full disk at its first
    save), then the empty directories made above it up to `created`; True if it is gone. A run another
    process holds, or one with a complete checkpoint, is left alone."""
    run = Path(run).absolute()
    if not run.is_dir() or run.is_symlink() or complete_checkpoints(run):
        return False
    try:
        lock = OutputLock(run).acquire()
    except UserError:  # in use by another run since: not ours to remove
        return False
    try:
        if complete_checkpoints(run):
            return False
        shutil.rmtree(run, ignore_errors=True)
    finally:
        lock.release()
    parent = run.parent
    created = Path(created).absolute()
    while parent != created.parent and created in (parent, *parent.parents):
        try:
            parent.rmdir()  # only if empty: another run may have been made beside this one meanwhile
        except OSError:
            break
        parent = parent.parent
    return not run.exists()


def skipped_newer(run: Path, chosen: Path) -> list[Path]:
    """Step directories newer than `chosen` that `latest_checkpoint` passed over as incomplete."""
    m = STEP_DIR.match(chosen.name)
    root = checkpoints_dir(run)
    if m is None or not root.is_dir():
        return []
    newer = [p for p in root.iterdir() if (n := STEP_DIR.match(p.name)) and int(n.group(1)) > int(m.group(1))]
    return sorted(p for p in newer if p.is_dir() and not is_complete(p))


def prune(run: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints; a victim is renamed before deletion, so a half-deleted
    directory never looks complete."""
    found = complete_checkpoints(run)
    for _, path in found[: max(len(found) - max(keep, 1), 0)]:
        trash = path.with_name(f".trash-{path.name}")
        os.replace(path, trash)
        shutil.rmtree(trash, ignore_errors=True)


def read_state(path: Path) -> dict[str, Any]:
    """A checkpoint's state.json with every field `--resume` reads back present and of its type: a damaged
    or hand-edited one is refused in one line, not a traceback later or a count silently restarted at 0."""

    def damaged(problem: str) -> UserError:
        return UserError(
            f"{path / STATE} {problem}: the checkpoint is damaged; resume refused "
            f"(remove {path.name} to resume from the one before it)"
        )

    try:
        state = json.loads((path / STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise damaged(f"cannot be read ({type(exc).__name__})") from None
    if not isinstance(state, dict):
        raise damaged("is not a JSON object")
    for key in ("step", "optimizer_steps", "tokens", "target_tokens", "total_steps", "seq_len"):
        if (key == "step" or key in state) and not is_count(state.get(key)):
            raise damaged(f"has no usable {key!r} (found {state.get(key)!r})")
    position = state.get("position")
    if not _usable_position(position):
        raise damaged(f"has no usable 'position' (found {position!r})")
    seconds = state.get("seconds", 0.0)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < math.inf:
        raise damaged(f"has no usable 'seconds' (found {seconds!r})")
    totals = state.get("schedule_totals")  # [[optimizer step, total steps], ...] since each raise
    if totals is not None and not (
        isinstance(totals, list)
        and totals
        and all(isinstance(t, list) and len(t) == 2 and all(map(is_count, t)) for t in totals)
    ):
        raise damaged(f"has no usable 'schedule_totals' (found {totals!r})")
    if not isinstance(state.get("config"), dict):  # the run's settings, which a resume must match
        raise damaged("has no 'config' mapping")
    if state.get("scaler") is not None and not isinstance(state["scaler"], dict):
        raise damaged("has a 'scaler' that is not a mapping")
    return state


def _usable_position(position: Any) -> bool:
    """{"rows", "offset"} counts (one store), or a mixture's rows and equally long lists of counts."""
    if not isinstance(position, dict):
        return False
    if set(position) == {"rows", "offset"}:
        return all(map(is_count, position.values()))
    if set(position) != {"rows", "offsets", "source_rows"}:
        return False
    offsets, rows = position["offsets"], position["source_rows"]
    return (
        is_count(position["rows"])
        and isinstance(offsets, list)
        and isinstance(rows, list)
        and len(offsets) == len(rows) > 0
        and all(map(is_count, offsets + rows))
    )


@dataclass
class Restored:
    path: Path
    state: dict[str, Any]
    rng: dict[str, torch.Tensor]  # for `restore_rng`, which the caller runs right before the next step


def restore(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    device: torch.device,
    sharded: bool = False,
) -> Restored:
    """Load weights and optimizer state from a complete checkpoint into the live objects. The RNG states come
    back in `Restored.rng`, not restored here: whatever the caller does before its next step (a probe, a
    timing) must not draw from the RNG the resumed steps will use."""
    state = read_state(path)
    weights = load_weights(path / "model.safetensors")
    names = [n for g in optimizer.param_groups for n in g["names"]]
    if state.get("param_names") not in (None, names):
        raise UserError(f"{path}: the optimizer's parameters differ from this run's model; resume refused")
    try:
        tensors = load_file(str(path / OPTIMIZER))
    except Exception as exc:  # safetensors raises its own error types for torn files
        raise UserError(
            f"{path / OPTIMIZER} is not readable ({type(exc).__name__}); resume refused"
        ) from None
    moments = tensors_to_moments(tensors)
    if sharded:
        from objtrain.training.distributed import load_full_state

        load_full_state(model, optimizer, weights, moments, sharded=True)
    else:
        plain = unwrap(model)
        try:
            plain.load_state_dict(weights, strict=True)
        except RuntimeError as exc:
            first = str(exc).splitlines()[0]
            raise UserError(f"{path}: the weights do not fit this run's model ({first})") from None
        load_moments(optimizer, moments)
        plain.to(device)
    return Restored(path, state, {k: v for k, v in tensors.items() if k.startswith("rng/")})
