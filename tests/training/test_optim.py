"""Optimizer groups and the learning-rate schedule."""

from __future__ import annotations

import itertools
import math

import pytest

from objtrain.models.zoo import build_model, model_config
from objtrain.training.config import ScheduleConfig
from objtrain.training.optim import lr_factor, parameter_groups


def test_decay_only_on_linear_weights() -> None:
    model = build_model(model_config("decoder", "debug", vocab_size=300))
    decay, no_decay = parameter_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert "embed.weight" in no_decay["names"]
    assert all("norm" in n or n == "embed.weight" for n in no_decay["names"])
    assert all(n.endswith(".weight") and "norm" not in n and n != "embed.weight" for n in decay["names"])
    n_params = len({id(p) for p in model.parameters()})
    assert len(decay["params"]) + len(no_decay["params"]) == n_params  # each tensor once (tied embedding)


@pytest.mark.parametrize("kind", ["cosine", "linear", "constant", "wsd"])
def test_schedule_shapes(kind: str) -> None:
    cfg = ScheduleConfig(kind=kind, warmup=10, min_lr_ratio=0.1, decay_ratio=0.2)  # type: ignore[arg-type]
    f = [lr_factor(s, 100, cfg) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)  # linear warmup (s+1)/W
    assert all(b >= a for a, b in itertools.pairwise(f[:10]))
    if kind == "constant":
        assert f[10:] == [1.0] * 90
        return
    assert f[-1] == pytest.approx(0.1)  # ends at min_lr_ratio
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(f[9:]))  # never rises after warmup
    if kind == "wsd":
        assert f[10:80] == [1.0] * 70 and f[85] < 1.0
    if kind == "cosine":
        assert f[55] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 45 / 89)))


def test_warmup_as_a_fraction_of_the_run() -> None:
    cfg = ScheduleConfig(warmup=0.1)
    assert lr_factor(0, 200, cfg) == pytest.approx(1 / 20)
    assert lr_factor(19, 200, cfg) == pytest.approx(1.0)
