"""`objtrain pack` (being built, see issue 2)."""

from __future__ import annotations

from objtrain.errors import UserError


def run() -> None:
    """Not available yet."""
    raise UserError("`objtrain pack` is not available yet (issue 2)")
