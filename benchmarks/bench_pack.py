"""`objtrain pack`: packing throughput (tokens/s) and quality (fill, documents split), concat vs bestfit.

The store is synthetic, so its size is free: document lengths drawn from a log-normal (median ~300 tokens,
long tail, like code files or web pages), tokens random, written as a real token store. For each mode and
row length, `pack_store` runs end to end (memory-mapped input, both output files written) and its input
tokens per second are reported next to a copy floor measured in the same run: reading the same tokens
and writing the same bytes (tokens + int16 document ids) with no packing at all. Target: concat > 100M
tokens/s.

    .venv/bin/python benchmarks/bench_pack.py                # 100M tokens, about 1-2 minutes
    .venv/bin/python benchmarks/bench_pack.py --tokens 20e6  # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from _data_common import table

from objtrain.data import sources
from objtrain.data.pack import (
    PackConfig,
    assemble_rows,
    bestfit_layout,
    concat_rows,
    pack_store,
)
from objtrain.data.store import TokenSplit, TokenStore
from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus


def synthetic_store(root: Path, n_tokens: int, seed: int = 0) -> Path:
    """A token store whose train split holds `n_tokens` tokens in log-normal-length documents."""
    text = root / "seed.txt"  # a real tokenizer and store layout, from a bit of the standard library
    text.write_text("".join(path.read_text(encoding="utf-8") for path in sources.stdlib_files()[:40]))
    store = root / "store"
    tokenize_corpus(
        [text], store, TokenizeConfig(vocab_size=2000, train_bytes=300_000, doc_split="blank-line", seed=seed)
    )
    rng = np.random.default_rng(seed)
    lengths = np.maximum(rng.lognormal(mean=np.log(300), sigma=1.2, size=n_tokens // 200), 1).astype(np.int64)
    lengths = lengths[np.cumsum(lengths) <= n_tokens]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype("<i8")
    tokens = rng.integers(300, 2000, size=int(offsets[-1]), dtype=np.uint16)
    tokens.tofile(store / "train.bin")
    offsets.tofile(store / "train.idx")
    meta = json.loads((store / "meta.json").read_text())
    meta["splits"]["train"].update(documents=len(lengths), tokens=int(offsets[-1]))
    meta["documents"] = sum(s["documents"] for s in meta["splits"].values())
    meta["tokens"] = sum(s["tokens"] for s in meta["splits"].values())
    (store / "meta.json").write_text(json.dumps(meta))
    return store


def copy_floor(store: Path, out: Path) -> float:
    """Seconds to read the train tokens and write (and sync) them plus an int16 array of the same length."""
    start = time.perf_counter()
    tokens = np.memmap(store / "train.bin", dtype=np.uint16, mode="r")
    with open(out / "floor.tokens", "wb") as f:
        np.asarray(tokens).tofile(f)
        os.fsync(f.fileno())  # pack_store syncs its outputs too
    with open(out / "floor.docs", "wb") as f:
        np.zeros(len(tokens), dtype=np.int16).tofile(f)
        os.fsync(f.fileno())
    return time.perf_counter() - start


def kernel_seconds(split: TokenSplit, seq_len: int, mode: str) -> float:
    """Seconds to lay out and assemble every row in memory (the packing itself, no disk writes)."""
    start = time.perf_counter()
    step = max((1 << 22) // seq_len, 1)
    if mode == "concat":
        n_rows = -(-(split.n_tokens + len(split)) // seq_len)
        for r0 in range(0, n_rows, step):
            concat_rows(split, seq_len, 3, 0, r0, min(r0 + step, n_rows))
    else:
        layout = bestfit_layout(split.lengths, np.asarray(split.offsets), seq_len, 0)
        for r0 in range(0, layout.n_rows, step):
            assemble_rows(split, layout, seq_len, 3, 0, r0, min(r0 + step, layout.n_rows))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=100e6, help="tokens in the synthetic train split")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_pack.") as tmp:
        root = Path(tmp)
        store = synthetic_store(root, int(args.tokens))
        meta = json.loads((store / "meta.json").read_text())["splits"]["train"]
        print(f"synthetic store: {meta['tokens']:,} tokens in {meta['documents']:,} documents", flush=True)
        rows = []
        split = TokenStore.open(store).split("train")
        for seq_len in (256, 1024, 4096):
            for mode in ("concat", "bestfit"):
                times, floors, kernels = [], [], []
                for _ in range(args.repeats):  # alternate with the floor, so both see the same load
                    floors.append(copy_floor(store, root))
                    start = time.perf_counter()
                    summary = pack_store(
                        store, root / "packed", PackConfig(seq_len, mode, splits=("train",)), force=True
                    )
                    times.append(time.perf_counter() - start)
                    kernels.append(kernel_seconds(split, seq_len, mode))
                t, floor, kernel = (statistics.median(x) for x in (times, floors, kernels))
                c = summary.splits["train"]
                n = meta["tokens"]
                rows.append([
                    mode, seq_len, f"{c.rows:,}", f"{c.fill:.2%}", f"{c.documents_split:,}",
                    f"{n / kernel / 1e6:.0f}M", f"{n / t / 1e6:.0f}M", f"{n / floor / 1e6:.0f}M", t / floor,
                ])  # fmt: skip
                print(
                    f"  {mode} seq_len {seq_len}: {t:.2f} s (in memory {kernel:.2f} s, floor {floor:.2f} s)"
                )
        print()
        header = ["mode", "seq_len", "rows", "fill", "docs split", "in memory", "end to end", "copy floor",
                  "x floor"]  # fmt: skip
        print(table(header, rows))
        print("columns in input tokens/s (medians): in memory = layout + row assembly, no disk; end to end =")
        print("pack_store with both files written; copy floor = read + write the same bytes without packing")


if __name__ == "__main__":
    main()
