"""A run's log as the loop writes it: one place that knows which steps are logged and where a record goes.

A training step's record goes to RUN/metrics.jsonl (the main process only), TensorBoard, the progress
display and the caller's `on_record` (`objtrain compare` draws its progress from it), in that order; an
event (`epoch`, `compile`) to metrics.jsonl; a validation to all four. The writers themselves are in
`logger`; `window.MetricsWindow` hands the steps' records here as it reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from objtrain.training.logger import MetricsLog, Progress, TensorBoard

OnRecord = Callable[[dict[str, Any]], None]


@dataclass
class RunLog:
    """metrics.jsonl (None off the main process), TensorBoard, the progress display and `on_record`.

    `due` is the logging interval's decision: every `every` steps, the run's first step (it holds the
    compilation) and its last."""

    log: MetricsLog | None
    tb: TensorBoard
    progress: Progress
    on_record: OnRecord | None
    every: int
    first_step: int

    def due(self, step: int, finished: bool) -> bool:
        return step % self.every == 0 or step == self.first_step or finished

    def step(self, record: dict[str, Any]) -> None:
        """A training step's record, read (`window.MetricsWindow.read`)."""
        if self.log is not None:
            self.log.write(record)
        self.tb.write(record["step"], record)
        self.progress.update(record)
        if self.on_record is not None:
            self.on_record(record)

    def event(self, record: dict[str, Any]) -> None:
        if self.log is not None:
            self.log.write(record)

    def note(self, text: str) -> None:
        self.progress.note(text)

    def set_total(self, total: int) -> None:
        self.progress.set_total(total)

    def validation(self, where: dict[str, Any], validation: dict[str, float]) -> None:
        """A validation's figures at `where` (step, tokens, wall time, elapsed, time)."""
        step = where["step"]
        record = {"split": "val", **where, **validation}
        if self.log is not None:
            self.log.write(record)
        if self.on_record is not None:
            self.on_record(record)
        self.tb.write(step, validation, prefix="val")
        self.progress.note(f"step {step}  " + "  ".join(f"{k} {v:.4f}" for k, v in validation.items()))

    def compiled(self, mode: str, seconds: float, step: int) -> None:
        """Say what compiling cost: the first step's time, which holds the compilation."""
        self.progress.note(
            f"torch.compile ({mode}): the first step took {seconds:.1f} s, compilation included"
        )
        self.event({"event": "compile", "step": step, "mode": mode, "first_step_seconds": seconds})

    def close(self) -> None:
        self.progress.close()
        self.tb.close()
        if self.log is not None:
            self.log.close()
