"""Helpers for the compare tests: a debug-size experiment and an evaluator with known numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def experiment(store: Path, arms: list[dict[str, Any]] | None = None, **top: Any) -> dict[str, Any]:
    """A debug-size experiment: 3 steps of 4 rows x 32 positions an arm."""
    data: dict[str, Any] = {
        "name": "unit",
        "question": "does the pipeline hold?",
        "expect": "it does",
        "data": {"store": str(store)},
        "seed": 0,
        "budget": {"tokens": 3 * 4 * 32},
        "train": {
            "batch": {"seq_len": 32, "batch_size": 4},
            "optim": {"lr": 3e-3},
            "schedule": {"warmup": 1},
            "precision": {"dtype": "fp32"},
            "validation": {"rows": 4, "every": 1},
            "device": "cpu",
            "workers": 0,
        },
        "arms": arms
        or [
            {"name": "clm", "objective": "clm", "model": {"kind": "decoder", "size": "debug"}},
            {"name": "mlm", "objective": "mlm", "model": {"kind": "encoder", "size": "debug"}},
        ],
    }
    data.update(top)
    return data


class FakeSuite:
    """An evaluator with known numbers: `values[(arm, seed)]` or defaults; it counts its calls."""

    def __init__(self, values: dict[tuple[str, int], dict[str, float]] | None = None) -> None:
        self.values = values or {}
        self.calls: list[Path] = []

    def __call__(self, run_dir: Path, data: str | None, options: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(run_dir)
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        arm = run_dir.name if not run_dir.name.startswith("seed-") else run_dir.parent.name
        return dict(self.values.get((arm, cfg["seed"]), {"probe_accuracy": 0.5, "objective": "x"}))
