"""`objtrain eval`: evaluation, coming in a later release."""

from __future__ import annotations

from objtrain.errors import UserError


def run() -> None:
    """Not available yet: evaluation comes in a later release."""
    raise UserError("`objtrain eval` is not available yet: evaluation comes in a later release")
