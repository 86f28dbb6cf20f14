"""The model zoo: decoder, encoder and encoder-decoder transformers built from shared blocks."""

from objtrain.models.config import ModelConfig
from objtrain.models.zoo import build_model, count_parameters, model_config

__all__ = ["ModelConfig", "build_model", "count_parameters", "model_config"]
