"""What a run records about itself: its state in every checkpoint (`RunState`), what `eval` and `generate`
read back, RUN/config.yaml and one record per resume (with provenance), and the checks a resume makes
against what the run was.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from objtrain.config import to_dict
from objtrain.data.stream import Position
from objtrain.errors import UserError
from objtrain.io import OutputLock, atomic_file
from objtrain.training.config import config_dict
from objtrain.training.plan import RUN_MARKERS, Plan


@dataclass
class RunState:
    """Where a run stands: saved in every checkpoint's `state.json`, restored by `--resume`."""

    step: int = 0
    optimizer_steps: int = 0  # steps that updated the weights (fp16's scaler skips some): the lr's clock
    position: Position = field(default_factory=Position)  # the data: rows consumed, stream offset
    tokens: int = 0  # model positions trained on
    target_tokens: int = 0  # of which targets of the loss
    seconds: float = 0.0  # training time (the steps' own), summed over the resumed parts
    elapsed: float = 0.0  # wall-clock time up to the checkpoint (start-up, validation, saves), summed too

    @classmethod
    def restore(cls, saved: dict[str, Any]) -> RunState:
        step = int(saved.get("step", 0))
        return cls(
            step=step,
            optimizer_steps=int(saved.get("optimizer_steps", step)),
            position=Position.from_dict(saved["position"]) if "position" in saved else Position(),
            tokens=int(saved.get("tokens", 0)),
            target_tokens=int(saved.get("target_tokens", 0)),
            seconds=float(saved.get("seconds", 0.0)),
            elapsed=float(saved.get("elapsed", saved.get("seconds", 0.0))),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "optimizer_steps": self.optimizer_steps,
            "position": self.position.to_dict(),
            "tokens": self.tokens,
            "target_tokens": self.target_tokens,
            "seconds": self.seconds,
            "elapsed": self.elapsed,
        }


def training_info(plan: Plan, step: int, tokens: int) -> dict[str, Any]:
    """What `eval` and `generate` read back from the checkpoint."""
    cfg = plan.cfg
    objective_config = (
        to_dict(plan.objective.config) if hasattr(plan.objective.config, "__dataclass_fields__") else {}
    )
    info: dict[str, Any] = {
        "objective": plan.objective.name,
        "objective_config": objective_config,
        "model_kind": plan.model_cfg.kind,
        "model_size": cfg.model.size,
        "seq_len": plan.seq_len,
        "step": step,
        "tokens": tokens,
        "seed": cfg.seed,
    }
    if plan.init_origin is not None:
        info["init_from"] = plan.init_origin
    info.update(plan.objective.record())  # e.g. FIM's fim_mode
    return info


def resolved_settings(plan: Plan, total: int) -> dict[str, Any]:
    return {
        "model_kind": plan.model_cfg.kind,
        "model": to_dict(plan.model_cfg),
        "seq_len": plan.seq_len,
        "total_steps": total,
        "micro_batch_size": plan.micro_batch,
        "accumulation": plan.accumulation,
        "processes": plan.world.world_size,
        "loader_workers": plan.workers,
        "dtype": plan.dtype,
        "device": str(plan.device),
        "data": plan.source.identity if plan.source.mixture else str(plan.source.path),
    }


def claim(plan: Plan, force: bool) -> None:
    """Create (or, with --force, empty) RUN and hold its lock. A new RUN is locked as it is made: were
    another run to have made it since the checks, this one is refused rather than write into it."""
    run_dir = plan.run_dir
    if force and run_dir.exists() and plan.resume_from is None:
        for entry in run_dir.iterdir():  # --force replaces the run, all checks passed; the lock stays held
            if entry.name != OutputLock.NAME:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    if plan.lock is None:
        plan.lock = OutputLock(run_dir, "-o").acquire()
        if any((run_dir / marker).exists() for marker in RUN_MARKERS):
            plan.release()
            raise UserError(f"{run_dir} was made by another run meanwhile (pass --resume to continue it)")


def provenance() -> dict[str, Any]:
    """What made a run: objtrain's version and, installed from a git checkout, its commit (with `+dirty`
    when the tree had changes), torch and Python, the host, the command line, the time."""
    import objtrain

    out: dict[str, Any] = {
        "objtrain": objtrain.__version__,
        "git_commit": _git_commit(Path(objtrain.__file__).resolve().parent.parent),
        "torch": str(torch.__version__),  # a str subclass YAML cannot represent
        "python": platform.python_version(),
        "host": platform.node(),
        "command": _command_line(),
        "cwd": os.getcwd(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return out


def _command_line() -> str:
    """This process's command line as a shell would take it (`python -m objtrain` shown as `objtrain`)."""
    if not sys.argv:
        return ""
    head = Path(sys.argv[0]).name
    return shlex.join(["objtrain" if head == "__main__.py" else head, *sys.argv[1:]])


def _git_commit(root: Path) -> str | None:
    if not (root / ".git").exists():
        return None  # installed from a wheel or an sdist
    try:

        def git(*args: str) -> str:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
            )
            return done.stdout.strip()

        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


RESUMES = "resumes"  # RUN/resumes/NNN-from-step-SSSSSSSS.yaml: one record per resume


def write_record(plan: Plan, total: int, step: int) -> None:
    """RUN/config.yaml once, when the run starts; each later start (a resume, or a restart of a run with
    no complete checkpoint) adds its own record under RUN/resumes/ instead: the history stays."""
    record = config_dict(plan.cfg) | {"resolved": resolved_settings(plan, total), "provenance": provenance()}
    target = plan.run_dir / "config.yaml"
    if target.exists():
        folder = plan.run_dir / RESUMES
        n = 1 + sum(1 for p in folder.glob("*.yaml")) if folder.is_dir() else 1
        target = folder / f"{n:03d}-from-step-{step:08d}.yaml"
        record["resumed_from"] = plan.resume_from.name if plan.resume_from is not None else None
    with atomic_file(target, "w") as handle:
        yaml.safe_dump(record, handle, sort_keys=False)


def check_resume(plan: Plan, state: dict[str, Any]) -> None:
    """The schedule is that of the whole run: refuse a resume that changes what the run is."""
    saved = state.get("config", {})
    now = config_dict(plan.cfg)
    for section in ("model", "objective", "optim", "schedule", "data"):  # a budget may grow: `_extend`
        if section == "data" and _same_data(saved.get(section), now.get(section)):
            continue
        if saved.get(section) != now.get(section):
            raise UserError(
                f"--resume: the {section} settings differ from the checkpoint's ({plan.resume_from}); "
                "start a new run (-o) or use the same settings"
            )
    if (
        saved.get("batch", {}).get("batch_size") != now["batch"]["batch_size"]
        or saved.get("seed") != now["seed"]
    ):
        raise UserError("--resume: batch_size and seed must match the checkpoint's")
    # Every row's length and corruption depend on the sequence length (it may come from a packed store
    # rather than the config): a change would train the rest of the run on other rows.
    seq_len = state.get("seq_len", saved.get("batch", {}).get("seq_len"))
    if seq_len is not None and seq_len != plan.seq_len:
        raise UserError(f"--resume: --seq-len {plan.seq_len} differs from the checkpoint's {seq_len}")


def _same_data(saved: Any, now: Any) -> bool:
    """The same data settings, the store compared as a path: a run started as `train packed` (recorded so
    by older versions) resumes as the absolute path it now records."""
    if not (isinstance(saved, dict) and isinstance(now, dict)):
        return False

    def where(section: dict[str, Any]) -> dict[str, Any]:
        store = section.get("store")
        return section | {"store": None if store is None else str(Path(store).absolute())}

    return where(saved) == where(now)


def numerics_changed(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{field: (saved, now)} for each numerics field the checkpoint recorded that differs now (older
    checkpoints record only some)."""
    return {k: (saved[k], v) for k, v in now.items() if k in saved and saved[k] != v}
