"""Talking to other tools: Hugging Face export and import, foreign tokenizers, corpora as users keep them.

Everything here that needs an optional package (`transformers`, `tokenizers`, `pyarrow`, `zstandard`)
imports it where it is used and says which extra to install when it is missing (`require`).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from objtrain.errors import UserError

EXTRAS = {
    "transformers": "hf",
    "tokenizers": "hf",
    "pyarrow": "parquet",
    "zstandard": "parquet",
    "google": "hf",  # protobuf, which transformers needs to read a sentencepiece model
    "wandb": "wandb",
}


def require(module: str, purpose: str) -> ModuleType:
    """Import an optional dependency, or one line naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        extra = EXTRAS.get(module.split(".")[0], "hf")
        raise UserError(
            f"{purpose} needs the {module.split('.')[0]!r} package: pip install 'objtrain[{extra}]'"
        ) from None


def quiet_transformers() -> ModuleType:
    """transformers, with its progress bars and advisory logging off: objtrain prints its own summary."""
    transformers = require("transformers", "this command")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers
