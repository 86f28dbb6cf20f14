"""Fixtures for the training loop: small run configs over the shared `train_store` (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from objtrain.training.config import TrainConfig, build_config, merged


def _small_config(store: Path, **sections: Any) -> TrainConfig:
    """A debug-size run: quick on 2 cores, every code path of the loop."""
    base: dict[str, Any] = {
        "data": {"store": str(store)},
        "model": {"size": "debug"},
        "objective": {"name": "clm"},
        "batch": {"seq_len": 64, "batch_size": 8},
        "optim": {"lr": 3e-3},
        "schedule": {"warmup": 2},
        "budget": {"steps": 6},
        "validation": {"every": -1, "rows": 8},
        "logging": {"tensorboard": False, "sample": False},
        "precision": {"dtype": "fp32"},
        "device": "cpu",
        "workers": 0,
    }
    return build_config(merged(base, sections))


@pytest.fixture(scope="session")
def small_config() -> Callable[..., TrainConfig]:
    """`small_config(store, **sections)`: a debug-size run config, sections merged over the defaults."""
    return _small_config


@pytest.fixture
def poison_clm_loss(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], dict[str, int]]:
    """`poison_clm_loss(k)`: the causal LM's k-th loss call (counting from 1) returns NaN; the returned
    `{"n": calls}` counts the calls."""
    from objtrain.objectives.clm import CausalLM

    def poison(at: int) -> dict[str, int]:
        calls = {"n": 0}
        original = CausalLM.loss

        def poisoned(self, output, batch):  # type: ignore[no-untyped-def]
            calls["n"] += 1
            out = original(self, output, batch)
            if calls["n"] == at:
                out.loss_sum = out.loss_sum * float("nan")
            return out

        monkeypatch.setattr(CausalLM, "loss", poisoned)
        return calls

    return poison
