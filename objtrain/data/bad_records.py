"""Malformed input records, counted as they are read (`sources` for JSONL, `tables` for table cells)."""

from __future__ import annotations

from typing import Any

from objtrain.errors import UserError


class BadRecords:
    """Malformed records met while reading (JSONL lines, null table cells): counted, the first few kept
    with their place for meta.json, or refused at once when `strict`."""

    KEEP = 20

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self.count = 0
        self.examples: list[dict[str, Any]] = []

    def add(self, where: str, reason: str) -> None:
        if self.strict:
            raise UserError(f"{where}: {reason} (drop --strict to skip and count such records)")
        self.count += 1
        if len(self.examples) < self.KEEP:
            self.examples.append({"where": where, "reason": reason})
