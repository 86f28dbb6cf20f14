"""Talking to other tools: Hugging Face export and `--init-from` a Hugging Face or objtrain checkpoint.

Reading what users bring (Parquet and Arrow corpora, `.zst` files, a Hugging Face `tokenizer.json`) is the
data layer's job (`objtrain.data`). Everything here that needs an optional package imports it where it is
used and says which extra to install when it is missing (`require`, from `objtrain.extras`).
"""

from __future__ import annotations

from types import ModuleType

from objtrain.extras import EXTRAS, require

__all__ = ["EXTRAS", "quiet_transformers", "require"]


def quiet_transformers() -> ModuleType:
    """transformers, with its progress bars and advisory logging off: objtrain prints its own summary."""
    transformers = require("transformers", "this command")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers
