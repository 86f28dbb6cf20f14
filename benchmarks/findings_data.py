"""The corpora the published findings train on (docs/findings), built from ../shared/data.

    python benchmarks/findings_data.py runs/findings/data

writes `OUT/gutenberg-text/` (each Project Gutenberg book's body, between its START and END markers, one
text file a book: the PG licence and header are not English prose a probe should reward) and tokenizes it
into `OUT/prose` (sentencepiece unigram, 8,192 pieces, each book one document, 5% of the books held out).
The code corpus is the embedded standard-library store that every objtrain install has; nothing to build.
Skips with a clear message when ../shared/data is absent (a user's clone has none).
"""

from __future__ import annotations

import csv
import gzip
import re
import subprocess
import sys
from pathlib import Path

SHARED_DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
MARKER = re.compile(r"^\*\*\* ?(START|END) OF (THIS|THE) PROJECT GUTENBERG", re.MULTILINE)


def book_body(text: str) -> str:
    """The text between the START and END markers; the whole text when a book has no markers."""
    marks = list(MARKER.finditer(text))
    starts = [m for m in marks if m.group(1) == "START"]
    ends = [m for m in marks if m.group(1) == "END"]
    lo = text.index("\n", starts[0].end()) + 1 if starts else 0
    hi = ends[-1].start() if ends and (not starts or ends[-1].start() > lo) else len(text)
    return text[lo:hi].strip() + "\n"


def write_books(out: Path) -> int:
    root = SHARED_DATA / "gutenberg-en"
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(root / "manifest.tsv", encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t"):
            with gzip.open(root / row["file"], "rt", encoding="utf-8") as book:
                body = book_body(book.read())
            name = row["file"].removeprefix("books/").removesuffix(".txt.gz").replace("/", "__")
            (out / f"{name}.txt").write_text(body, encoding="utf-8")
            n += 1
    return n


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip())
        return 2
    out = Path(sys.argv[1])
    if not (SHARED_DATA / "gutenberg-en" / "manifest.tsv").is_file():
        print(f"skipping: {SHARED_DATA / 'gutenberg-en'} not found (no shared corpora on this machine)")
        return 0
    store = out / "prose"
    if (store / "meta.json").is_file():
        print(f"{store} exists")
        return 0
    books = write_books(out / "gutenberg-text")
    print(f"{books} books written to {out / 'gutenberg-text'}")
    objtrain = Path(sys.executable).with_name("objtrain")
    cmd = [str(objtrain), "tokenize", str(out / "gutenberg-text"), "--vocab-size", "8192", "-o", str(store)]
    return subprocess.call(cmd)


if __name__ == "__main__":
    raise SystemExit(main())
