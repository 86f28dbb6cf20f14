"""Columnar corpora: Parquet files and Arrow IPC streams (the files of a `datasets` save_to_disk folder).

Both are read one record batch at a time, with only the text column: memory follows the writer's row
group (Parquet) or record batch (Arrow), never the file. Parquet's footer holds the schema and row
counts, so checking a file costs no data reads. A `datasets` folder's `.arrow` files are Arrow IPC
*stream* format (no footer), memory-mapped here; `datasets` itself is not needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from objtrain.data.bad_records import BadRecords
from objtrain.extras import require

BATCH_ROWS = 1024  # rows per Parquet read: a few MB of text at most, well under a row group


def _pyarrow(path: Path) -> Any:
    return require("pyarrow", f"reading {path.name}")


def _schema(path: Path, fmt: str) -> Any:
    pa = _pyarrow(path)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).schema_arrow
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_stream(source).schema


def check(path: Path, fmt: str, field: str) -> str | None:
    """Why `path` cannot give texts from column `field`, or None when it can."""
    pa = _pyarrow(path)
    try:
        schema = _schema(path, fmt)
    except (pa.ArrowException, OSError) as exc:
        kind = "Parquet" if fmt == "parquet" else "Arrow IPC stream"
        return f"not a readable {kind} file ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
    if field not in schema.names:
        columns = ", ".join(schema.names[:8]) + (", ..." if len(schema.names) > 8 else "")
        return f"no {field!r} column (columns: {columns}; choose one with --text-field)"
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        return f"column {field!r} holds {kind}, not text"
    return None


def _batches(path: Path, fmt: str, field: str) -> Iterator[Any]:
    pa = _pyarrow(path)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        # pre_buffer (pyarrow's default) coalesces reads across the file and kept them: peak memory grew
        # with the file (336 MB at 50k rows, 447 MB at 400k). Without it, and one row group per call, only
        # that row group's text column is held.
        with pq.ParquetFile(path, pre_buffer=False) as parquet:
            for group in range(parquet.num_row_groups):
                yield from parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=[field])
        return
    with pa.memory_map(str(path)) as source:
        for batch in pa.ipc.open_stream(source):
            yield batch.select([field])


def iter_texts(path: Path, fmt: str, field: str, bad: BadRecords) -> Iterator[str]:
    """The strings of column `field`, in row order; a null cell is a malformed record."""
    row = 0
    for batch in _batches(path, fmt, field):
        for text in batch.column(0).to_pylist():
            row += 1
            if text is None:
                bad.add(f"{path}:row {row}", f"{field!r} is null")
                continue
            yield text
