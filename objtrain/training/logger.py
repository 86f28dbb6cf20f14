"""What a run reports: RUN/metrics.jsonl (every step), a progress display, TensorBoard when installed,
Weights & Biases when configured (`logging.wandb`).

metrics.jsonl is one JSON object per line, flushed per line; non-finite values are written as null (NaN is
not JSON). A resumed run appends `{"event": "resume", "step": s}`; readers keep the last record per step.
On a terminal the progress is a rich bar; without one (logs, CI, torchrun) it is a plain line every
`logging.every` steps.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from rich import progress as rp
from rich.console import Console


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """RUN/metrics.jsonl; every record written is also handed to `mirror` (Weights & Biases) if given."""

    def __init__(self, path: Path, mirror: Wandb | None = None) -> None:
        self.path = Path(path)
        self.handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.mirror = mirror

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: _finite(v) for k, v in record.items()}
        self.handle.write(json.dumps(clean, allow_nan=False) + "\n")
        self.handle.flush()
        if self.mirror is not None:
            self.mirror.write(clean)

    def sync(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        self.handle.close()
        if self.mirror is not None:
            self.mirror.close(self.path)


class Wandb:
    """The records of metrics.jsonl, mirrored to a Weights & Biases run (`logging.wandb`).

    Each record's numbers are logged at its step: a training record's under their own names (`loss`,
    `lr`, ...), a validation record's too (`val_loss`, `val_bpb`; its bookkeeping such as `tokens` under
    `val/`), an event's (`resume`, `init_from`, `epoch`) under
    `event/<name>/` with `event/<name>` = 1. Text fields have no chart; metrics.jsonl itself, every record
    whole, is saved into the run when it closes. `mode: offline` (the default) writes the run under
    RUN/wandb and needs no network or account (`wandb sync RUN/wandb/offline-run-*` uploads it later).
    A resumed objtrain run starts a new W&B run, in the same directory."""

    def __init__(self, run_dir: Path, project: str, mode: str, config: dict[str, Any], **init: Any) -> None:
        from objtrain.interop import require

        wandb = require("wandb", "logging.wandb")
        os.environ.setdefault("WANDB_SILENT", "true")  # objtrain prints its own progress
        (Path(run_dir) / "wandb").mkdir(parents=True, exist_ok=True)
        try:  # no console capture, no git probing, no system-metrics sampling: the records only
            settings = wandb.Settings(console="off", silent=True, disable_git=True, x_disable_stats=True)
        except (TypeError, ValueError):  # an older wandb without some of these settings
            settings = wandb.Settings(console="off", silent=True)
        self.run = wandb.init(
            project=project,
            mode=mode,
            dir=str(run_dir),
            config=config,
            name=init.pop("name", None) or Path(run_dir).name,
            settings=settings,
            **init,
        )
        self.wandb = wandb

    def write(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        if isinstance(record.get("event"), str):
            prefix = f"event/{record['event']}"
            data: dict[str, Any] = {prefix: 1}
        else:
            prefix = "val" if record.get("split") == "val" else ""
            data = {}
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                plain = not prefix or key.startswith(f"{prefix}_")  # val_loss stays val_loss
                data[key if plain else f"{prefix}/{key}"] = value
        if isinstance(step, int):
            self.run.log(data, step=step)
        else:
            self.run.log(data)

    def close(self, metrics: Path) -> None:
        self.run.save(str(metrics), base_path=str(metrics.parent), policy="now")
        self.run.finish()


class TensorBoard:
    """Scalars to RUN/tensorboard when the optional `tensorboard` package is installed, else nothing.

    `enabled` is `logging.tensorboard`: None (the default) writes when the package is there and is silent
    when it is not (most installs lack it: a note on every run would be noise); True is the user asking
    for event files, so a missing package is `missing`, the note to show, once per process (a compare's
    arms would repeat it); False writes nothing."""

    MISSING = (
        "note: logging.tensorboard is on but the tensorboard package is not installed, so no event files "
        "are written (pip install 'objtrain[tensorboard]', or logging.tensorboard=false to silence this)"
    )
    _said = False

    def __init__(self, path: Path, enabled: bool | None) -> None:
        self.writer = None
        self.missing = ""
        if enabled is False:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except (ImportError, ModuleNotFoundError):
            if enabled and not TensorBoard._said:
                TensorBoard._said = True
                self.missing = self.MISSING
            return
        self.writer = SummaryWriter(str(path), max_queue=1000)

    def write(self, step: int, record: dict[str, Any], prefix: str = "train") -> None:
        if self.writer is None:
            return
        for key, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                self.writer.add_scalar(f"{prefix}/{key}", value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Progress:
    """A rich bar on a terminal (step, loss, lr, tokens/s, ETA, data wait), plain lines otherwise: the same
    facts in words (`step 40/300  loss ...  grad 0.81  ...  elapsed 1:02  ETA 6:43`), for logs and CI."""

    def __init__(self, console: Console, total: int, start: int, every: int, enabled: bool = True) -> None:
        self.console = console
        self.every = max(every, 1)
        self.enabled = enabled
        self.total = total
        self.start = start
        self.t0 = time.monotonic()
        self.interactive = enabled and console.is_terminal and not console.is_dumb_terminal
        self.bar: rp.Progress | None = None
        if self.interactive:
            self.bar = rp.Progress(
                rp.TextColumn("[bold]step {task.completed}/{task.total}"),
                rp.BarColumn(),
                rp.TextColumn("{task.fields[info]}"),
                rp.TimeRemainingColumn(),
                console=console,
                transient=False,
            )
            self.task = self.bar.add_task("train", total=total, completed=start, info="")
            self.bar.start()

    def update(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        step = record["step"]
        info = (
            f"loss {record['loss']:.4f}  lr {record['lr']:.2e}  {record['tokens_per_s']:,.0f} tok/s  "
            f"wait {100 * record['data_wait_frac']:.1f}%"
        )
        if self.bar is not None:
            self.bar.update(self.task, completed=step, info=info)
        elif step % self.every == 0 or step == self.start + 1 or step == self.total:
            elapsed = time.monotonic() - self.t0
            done = step - self.start
            eta = elapsed / done * (self.total - step) if done > 0 else float("nan")
            grad = record.get("grad_norm")
            grad_text = f"  grad {grad:.3g}" if isinstance(grad, (int, float)) else ""
            self.console.print(
                f"step {step}/{self.total}  {info}{grad_text}  elapsed {_clock(elapsed)}  ETA {_clock(eta)}",
                highlight=False,
            )

    def set_total(self, total: int) -> None:
        """A new step count (a --time budget's checks)."""
        self.total = total
        if self.bar is not None:
            self.bar.update(self.task, total=total)

    def note(self, text: str) -> None:
        if not self.enabled:
            return
        # plain text: a note may quote brackets (pip install 'objtrain[tensorboard]') that markup would eat
        if self.bar is not None:
            self.bar.console.print(text, highlight=False, markup=False)
        else:
            self.console.print(text, highlight=False, markup=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _clock(seconds: float) -> str:
    """`1:02`, `1:02:03`; `?` before the first step gives a rate."""
    if not math.isfinite(seconds):
        return "?"
    s = round(seconds)
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"
