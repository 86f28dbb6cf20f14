"""The one exception type for bad user input, and the "did you mean" that goes with unknown names.

Library code raises `UserError` with a message a user can act on; the CLI prints it as one line and
exits with code 2. Anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """Bad input (missing file, bad YAML, unknown objective, ...): one clear line, exit code 2."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`" (did you mean 'fim'?)"` for the closest known name, compared case-insensitively, or `""`."""
    known = list(known)
    lowered = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return f"; did you mean {lowered[close[0]]!r}?" if close else ""


def pick_name(name: str, known: Iterable[str], what: str) -> str:
    """The known name equal to `name` ignoring case (`SPAN` -> `span`), else a UserError that lists the
    known names and suggests the closest one."""
    known = list(known)
    if not isinstance(name, str):  # e.g. a number where a recorded or YAML config names one
        raise UserError(f"{what} must be given by name, got {name!r} (known: {', '.join(known)})")
    if name in known:
        return name
    folded = [k for k in known if k.lower() == name.lower()]
    if len(folded) == 1:
        return folded[0]
    raise UserError(f"unknown {what} {name!r}{did_you_mean(name, known)} (known: {', '.join(known)})")


# Seeds reach torch (`manual_seed` takes 64-bit values and raises OverflowError beyond), numpy and the
# standard library: one range for every command, checked once where the value comes in.
SEED_LIMIT = 2**63


def check_seed(seed: object, what: str = "--seed") -> int:
    """`seed` if it is an integer in [0, 2^63), else a UserError naming `what`."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < SEED_LIMIT:
        raise UserError(f"{what} must be an integer from 0 to 2^63 - 1, got {seed!r}")
    return seed
