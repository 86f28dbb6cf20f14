"""`objtrain tokenize` on Parquet: peak memory against the size of one file (it must not grow with it).

Each size is ONE Parquet file of real text (the standard library's modules, cut into paragraphs, each row
prefixed with its row number so no two rows are equal; row groups of 2,000 rows), as a user's single
large export would be: shards of a few tens of MB would hide a reader whose memory follows the file
(pyarrow's pre_buffer, on by default, kept reads of the whole file). A tokenizer is trained once on a
sample; each file is then tokenized in a child process (`python -m objtrain tokenize FILE --tokenizer
...`) whose peak RSS comes from getrusage(RUSAGE_CHILDREN) in a fresh wrapper process. Target: growth
over the smallest size within 100 MB.

    .venv/bin/python benchmarks/bench_parquet.py                  # 100 MB and 1 GB (about 10 min idle)
    .venv/bin/python benchmarks/bench_parquet.py --sizes 50 400   # quicker
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

ROW_GROUP = 2000
BUDGET_MB = 100


def paragraphs() -> list[str]:
    out = []
    for path in sources.stdlib_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        out += [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    return out


def write_file(path: Path, target_mb: int, paras: list[str]) -> float:
    """One Parquet file holding `target_mb` MB of text, written a row group at a time (the benchmark's
    own memory stays small); returns the MB of text written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("text", pa.string())])
    size = row = 0
    with pq.ParquetWriter(path, schema) as writer:
        while size < target_mb * 1e6:
            texts = [f"# row {r}\n{paras[r % len(paras)]}" for r in range(row, row + ROW_GROUP)]
            row += ROW_GROUP
            size += sum(len(t.encode("utf-8")) for t in texts)
            writer.write_table(pa.table({"text": texts}, schema=schema), row_group_size=ROW_GROUP)
    return size / 1e6


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
        first: float | None = None
        model = None
        for mb in sorted(args.sizes):
            path = root / f"corpus-{mb}.parquet"
            text_mb = write_file(path, mb, paras)
            if model is None:
                peak_rss_mb(["tokenize", str(path), "--vocab-size", "4096", "-o", str(root / "tok")])
                model = root / "tok" / "tokenizer.model"
            rss, seconds = peak_rss_mb(
                ["tokenize", str(path), "--tokenizer", str(model), "-o", str(root / "s"), "--force"]
            )
            file_mb = path.stat().st_size / 1e6
            path.unlink()  # one file on disk at a time
            first = rss if first is None else first
            growth = rss - first
            rows.append(
                [
                    f"{text_mb:,.0f}",
                    f"{file_mb:,.0f}",
                    rss,
                    growth,
                    text_mb / seconds,
                    "yes" if growth <= BUDGET_MB else "NO",
                ]
            )
            print(
                f"  {text_mb:.0f} MB of text in one {file_mb:.0f} MB file: "
                f"peak RSS {rss:.0f} MB, {seconds:.0f} s",
                flush=True,
            )
    print(
        table(["text MB", "file MB", "peak RSS MB", "growth MB", "MB/s", f"growth <= {BUDGET_MB} MB"], rows)
    )


if __name__ == "__main__":
    main()
