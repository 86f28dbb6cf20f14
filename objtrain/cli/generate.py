"""`objtrain generate` (being built, see issue 4)."""

from __future__ import annotations

from objtrain.errors import UserError


def run() -> None:
    """Not available yet."""
    raise UserError("`objtrain generate` is not available yet (issue 4)")
