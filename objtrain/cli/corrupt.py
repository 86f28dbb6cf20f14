"""`objtrain corrupt` (being built, see issue 3)."""

from __future__ import annotations

from objtrain.errors import UserError


def run() -> None:
    """Not available yet."""
    raise UserError("`objtrain corrupt` is not available yet (issue 3)")
