"""Optional dependencies: import one where it is used, or say in one line which extra provides it.

Kept below every subpackage (the data layer reads Parquet and Hugging Face tokenizers, training logs to
W&B, interop exports), so that none of them imports another just to ask for a package.
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
