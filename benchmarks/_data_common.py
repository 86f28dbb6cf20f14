"""Helpers shared by the data benchmarks (bench_tokenize.py, bench_pack.py): corpora, timing, tables."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from objtrain.data.sources import DocSplit

SHARED_DATA = Path(__file__).parents[1] / ".." / "shared" / "data"


@dataclass(frozen=True)
class Corpus:
    name: str
    inputs: tuple[Path, ...] | None  # None: the standard library (--corpus stdlib)
    doc_split: DocSplit = "file"


def corpora() -> list[Corpus]:
    """The standard library, plus the shared corpora that are present (a clear note for each one absent)."""
    found = [Corpus("stdlib (no tests)", None)]
    for name, rel in (
        ("tinyshakespeare", "tinyshakespeare/input.txt"),
        ("wikitext-2 valid", "wikitext-2/valid.txt"),
    ):
        path = SHARED_DATA / rel
        if path.is_file():
            found.append(Corpus(name, (path.resolve(),), "blank-line"))
        else:
            print(f"skipping {name}: {path} not found (the shared corpora are not on this machine)")
    return found


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in header]] + [
        [f"{c:,.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
