"""`objtrain compare`: objective comparison, coming in a later release."""

from __future__ import annotations

from objtrain.errors import UserError


def run() -> None:
    """Not available yet: objective comparison comes in a later release."""
    raise UserError("`objtrain compare` is not available yet: objective comparison comes in a later release")
