"""Interop tests build everything they load locally (tiny models, the session tokenizer); nothing comes
from a hub. Tests that need an optional extra skip with one line naming it."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
