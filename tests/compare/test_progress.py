"""compare's progress without a terminal (logs, CI, `make demo | tee`): never silent for a whole arm."""

from __future__ import annotations

import io

from rich.console import Console

from objtrain.compare.progress import ArmsProgress


def test_piped_progress_prints_a_line_every_tenth_of_an_arm() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=False, width=200)
    progress = ArmsProgress(console, [("clm", 40), ("fim-0.5", None)])
    with progress:
        progress.start("clm")
        for step in range(1, 41):
            progress.record({"step": step, "loss": 5.0 - step / 10})
        progress.start("fim-0.5")  # a seconds budget: no total known, a line every 10 steps
        for step in range(1, 21):
            progress.record({"step": step, "loss": 4.0})
    lines = buffer.getvalue().splitlines()
    steps = [line.split()[2] for line in lines if " step " in line]
    assert steps == [f"{s}/40" for s in range(4, 41, 4)] + ["10", "20"], lines
    assert "ETA 0:00" in next(line for line in lines if "40/40" in line)
    assert all("elapsed" in line for line in lines if " step " in line)
    assert lines[0] == "clm: training"
