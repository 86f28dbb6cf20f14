"""`objtrain tokenize` on Parquet: peak memory against corpus size (it must not grow with the corpus).

Synthetic Parquet shards are made from real text: the standard library's modules, cut into paragraphs,
each row prefixed with its row number so no two rows are equal (row groups of 2,000 rows, 64 MB shards).
Each size is a superset of the smaller one. A tokenizer is trained once on a sample; each size is then
tokenized in a child process (`python -m objtrain tokenize SHARDS --tokenizer ...`) whose peak RSS comes
from getrusage(RUSAGE_CHILDREN) in a fresh wrapper process. Target: growth over the smallest size within
100 MB.

    .venv/bin/python benchmarks/bench_parquet.py                  # 100 MB and 1 GB (about 10 min idle)
    .venv/bin/python benchmarks/bench_parquet.py --sizes 50 200   # quicker
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from _data_common import table
from bench_tokenize import peak_rss_mb

from objtrain.data import sources

SHARD_MB = 64
ROW_GROUP = 2000
BUDGET_MB = 100


def paragraphs() -> list[str]:
    out = []
    for path in sources.stdlib_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        out += [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    return out


def write_shards(root: Path, target_mb: int, made: list[Path], paras: list[str]) -> list[Path]:
    """Add shards under `root` until they hold `target_mb` of text; return all shards so far."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    total = sum(int(p.stem.split("-")[-1]) for p in made) / 1e6
    row = sum(1 for _ in made) * 10**9  # row numbers never repeat across shards
    while total < target_mb:
        texts: list[str] = []
        size = 0
        while size < SHARD_MB * 1e6 and total + size / 1e6 < target_mb:
            text = f"# row {row}\n{paras[row % len(paras)]}"
            texts.append(text)
            size += len(text.encode("utf-8"))
            row += 1
        path = root / f"shard-{len(made):04d}-{size}.parquet"
        pq.write_table(pa.table({"text": texts}), path, row_group_size=ROW_GROUP)
        made.append(path)
        total += size / 1e6
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[100, 1000], help="corpus sizes in MB of text"
    )
    args = parser.parse_args()
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        print("skipped: pyarrow is not installed (pip install 'objtrain[parquet]')")
        sys.exit(0)
    paras = paragraphs()
    rows: list[list[object]] = []
    with tempfile.TemporaryDirectory(prefix="bench_parquet.") as tmp:
        root = Path(tmp)
        (root / "shards").mkdir()
        made: list[Path] = []
        first: float | None = None
        model = None
        for mb in sorted(args.sizes):
            shards = write_shards(root / "shards", mb, made, paras)
            if model is None:
                peak_rss_mb(
                    ["tokenize", *map(str, shards[:1]), "--vocab-size", "4096", "-o", str(root / "tok")]
                )
                model = root / "tok" / "tokenizer.model"
            rss, seconds = peak_rss_mb(
                ["tokenize", *map(str, shards), "--tokenizer", str(model), "-o", str(root / "s"), "--force"]
            )
            text_mb = sum(int(p.stem.split("-")[-1]) for p in shards) / 1e6
            first = rss if first is None else first
            growth = rss - first
            rows.append(
                [
                    f"{text_mb:,.0f}",
                    len(shards),
                    rss,
                    growth,
                    text_mb / seconds,
                    "yes" if growth <= BUDGET_MB else "NO",
                ]
            )
            print(
                f"  {text_mb:.0f} MB in {len(shards)} shards: peak RSS {rss:.0f} MB, {seconds:.0f} s",
                flush=True,
            )
    print(table(["text MB", "shards", "peak RSS MB", "growth MB", "MB/s", f"growth <= {BUDGET_MB} MB"], rows))


if __name__ == "__main__":
    main()
