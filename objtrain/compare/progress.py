"""One progress display across the arms of a comparison, fed by the training loop's `on_record`.

On a terminal: a bar for the runs done and one for the current run's steps (with its latest loss and
validation). Elsewhere (logs, CI, a pipe): one plain line when a run starts, validates and ends, and one
every tenth of its steps (step N/total, loss, elapsed, ETA), so a long arm is never silent for minutes.
"""

from __future__ import annotations

import time
from typing import Any

from rich import progress as rp
from rich.console import Console


class ArmsProgress:
    def __init__(self, console: Console, runs: list[tuple[str, int | None]], enabled: bool = True) -> None:
        self.console = console
        self.totals = dict(runs)
        self.enabled = enabled
        self.live = enabled and console.is_terminal
        self.current: str | None = None
        self.bar: rp.Progress | None = None
        if self.live:
            self.bar = rp.Progress(
                rp.TextColumn("{task.description}"),
                rp.BarColumn(),
                rp.MofNCompleteColumn(),
                rp.TextColumn("{task.fields[info]}"),
                rp.TimeElapsedColumn(),
                console=console,
                transient=False,
            )
            self.all = self.bar.add_task("runs", total=len(runs), info="")
            self.arm = self.bar.add_task("", total=None, info="", visible=False)

    def __enter__(self) -> ArmsProgress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()

    def _say(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.console.print(text, highlight=False)
        else:
            self.console.print(text, highlight=False)

    def start(self, key: str) -> None:
        self.current = key
        self.t0 = time.monotonic()
        self.first: int | None = None
        if self.bar is not None:
            self.bar.reset(self.arm, total=self.totals.get(key), description=key, info="", visible=True)
        else:
            self._say(f"{key}: training")

    def record(self, record: dict[str, Any]) -> None:
        if self.bar is not None:
            if record.get("split") == "val":
                val = "  ".join(f"{k} {v:.3f}" for k, v in record.items() if k.startswith("val_") and v)
                self.bar.update(self.arm, info=val)
            elif "loss" in record:
                self.bar.update(self.arm, completed=record["step"], info=f"loss {record['loss']:.3f}")
        elif self.enabled and record.get("split") == "val":
            val = "  ".join(f"{k} {v:.4f}" for k, v in record.items() if k.startswith("val_") and v)
            self._say(f"{self.current}: step {record['step']}  {val}")
        elif self.enabled and "loss" in record:
            self._plain_step(record)

    def _plain_step(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        if self.first is None:
            self.first = step - 1  # a resumed arm counts its rate from where it resumed
        total = self.totals.get(self.current or "")
        every = max((total or 100) // 10, 1)
        if step % every and step != total:
            return
        elapsed = time.monotonic() - self.t0
        done = step - self.first
        eta = ""
        if total:
            eta = f"  ETA {_clock(elapsed / max(done, 1) * (total - step))}"
        of = f"/{total}" if total else ""
        self._say(
            f"{self.current}: step {step}{of}  loss {record['loss']:.3f}  elapsed {_clock(elapsed)}{eta}"
        )

    def evaluating(self, key: str) -> None:
        if self.bar is not None:
            self.bar.update(self.arm, description=f"{key} (evaluating)")
        else:
            self._say(f"{key}: evaluating")

    def skip(self, key: str, why: str) -> None:
        self._say(f"{key}: {why}")
        if self.bar is not None and why == "done":
            self.bar.advance(self.all)

    def done(self, key: str, record: dict[str, Any]) -> None:
        t = record["train"]
        self._say(
            f"{key}: {t['steps']} steps, {t['tokens']:,} tokens in {t['seconds']:.1f}s "
            f"({t['tokens_per_s']:,.0f} tok/s), evaluated in {record['eval_seconds']:.1f}s"
        )
        if self.bar is not None:
            self.bar.advance(self.all)
            self.bar.update(self.arm, visible=False)


def _clock(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
