"""Named sizes, strict configs and parameter budgets."""

from __future__ import annotations

import pytest
import torch

from objtrain.errors import UserError
from objtrain.models import build_model, count_parameters, model_config
from objtrain.models.zoo import model_sizes

# non-embedding parameter budgets per named size (the README table comes from `count_parameters`)
BUDGET = {"debug": (1e4, 1e5), "tiny": (0.7e6, 1.5e6), "small": (7e6, 15e6), "base": (70e6, 130e6)}


@pytest.mark.parametrize("kind", ["decoder", "encoder", "encdec"])
def test_every_named_size_builds_within_its_budget(kind: str) -> None:
    assert set(BUDGET) <= set(model_sizes())
    for size, (low, high) in BUDGET.items():
        cfg = model_config(kind, size, vocab_size=4096)
        with torch.device("meta"):
            model = build_model(cfg)
        assert low <= count_parameters(model, embeddings=False) <= high, (size, kind)
        assert count_parameters(model) - count_parameters(model, embeddings=False) == 4096 * cfg.d_model


def test_overrides_and_strictness() -> None:
    cfg = model_config("decoder", "tiny", {"n_layer": 2, "mtp_heads": 4}, vocab_size=100)
    assert (cfg.n_layer, cfg.mtp_heads, cfg.vocab_size, cfg.d_model) == (2, 4, 100, 128)
    model = build_model(cfg)
    assert len(model.blocks) == 2 and len(model.mtp) == 3  # type: ignore[arg-type]
    with pytest.raises(UserError, match="unknown key 'n_layers'"):
        model_config("decoder", "tiny", {"n_layers": 2})
    with pytest.raises(UserError, match="heads"):
        model_config("decoder", "tiny", {"n_head": 3})
    with pytest.raises(UserError, match="positive"):  # checked before d_model is divided by it
        model_config("decoder", "tiny", {"n_head": 0})
    with pytest.raises(UserError, match="decoder"):
        model_config("encoder", "tiny", {"mtp_heads": 2})
    with pytest.raises(UserError, match="unknown model size"):
        model_config("decoder", "huge")
    with pytest.raises(UserError, match="vocab_size"):
        build_model(model_config("decoder", "debug"))


def test_ffn_default_width_follows_llama() -> None:
    cfg = model_config("decoder", "debug", {"d_ff": 0, "d_model": 96, "n_head": 2}, vocab_size=10)
    assert cfg.ffn_dim == 256  # 8/3 * 96 = 256, already a multiple of 64
