"""Fixtures for the evaluation tests: stub models with known outputs and debug-size checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from objtrain.batch import Batch, ModelOutput
from objtrain.data.tokenizer import Tokenizer
from objtrain.models.checkpoint import save_checkpoint
from objtrain.models.config import ModelConfig
from objtrain.models.zoo import build_model, model_config


class StubModel(nn.Module):
    """`model(batch) -> ModelOutput` whose logits are a function of the input token alone.

    `table` (V, V): row i is the logits after reading token i. A copy model puts `c` on the diagonal;
    a uniform model is all zeros; any table is a bigram model, whose scores ignore the context length."""

    def __init__(self, table: Tensor, kind: str = "decoder") -> None:
        super().__init__()
        V = table.size(0)
        self.config = ModelConfig(kind=kind, vocab_size=V, d_model=4, n_layer=1, n_head=2)  # type: ignore[arg-type]
        self.table = table.float()
        self.embed = nn.Embedding(V, 4)
        self.forwards = 0

    def forward(self, batch: Batch) -> ModelOutput:
        self.forwards += 1
        ids = batch.decoder_input_ids if batch.decoder_input_ids is not None else batch.input_ids
        return ModelOutput(logits=self.table[ids], hidden=self.embed(ids))


@pytest.fixture
def stub() -> Callable[..., StubModel]:
    return StubModel


def save_debug(
    path: Path, kind: str, tokenizer: Tokenizer, training: dict | None = None, zero: bool = False
) -> Path:
    torch.manual_seed(0)
    model = build_model(model_config(kind, "debug", vocab_size=tokenizer.vocab_size))
    if zero:  # tied unembedding of zeros: every logit 0, a uniform model
        with torch.no_grad():
            model.embed.weight.zero_()
    return save_checkpoint(path, model, tokenizer.specials, tokenizer, training=training or {})


@pytest.fixture
def debug_checkpoint(tmp_path: Path, tokenizer: Tokenizer) -> Callable[..., Path]:
    """`debug_checkpoint(kind, training=None, zero=False)`: a saved debug-size checkpoint directory."""
    counter = iter(range(1000))

    def make(kind: str = "decoder", training: dict | None = None, zero: bool = False) -> Path:
        return save_debug(tmp_path / f"ckpt{next(counter)}", kind, tokenizer, training, zero)

    return make
