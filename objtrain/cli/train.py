"""`objtrain train`: the training loop, coming in a later release."""

from __future__ import annotations

from objtrain.errors import UserError


def run() -> None:
    """Not available yet: the training loop comes in a later release."""
    raise UserError("`objtrain train` is not available yet: the training loop comes in a later release")
