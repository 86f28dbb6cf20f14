"""Tokenize and pack at corpus scale: throughput against raw sentencepiece, peak memory against corpus size,
and the time training takes to open the store.

The corpus is real text: the Project Gutenberg books of ../shared/data/gutenberg-en (64 MB), decompressed
once and repeated (hard links, so a 2 GB corpus costs 64 MB of disk) until each requested size; documents
are paragraphs (`--doc-split blank-line`), about 1.5M per GB, which makes `pack --mode bestfit` work as
hard as it can. A tokenizer is trained once on one copy. For each size, in fresh child processes (peak RSS
from getrusage of the child, wall time around it):

- ours: `objtrain tokenize COPIES --tokenizer MODEL --doc-split blank-line` (read, split, encode on all
  cores, write the store);
- sp: raw sentencepiece on the same text and the same cores: the files read and split at blank lines
  in 1 MB batches, `sp.encode(batch, num_threads=N)`, ids dropped (no store written);
- `objtrain pack STORE --mode bestfit --seq-len 1024` and `--mode concat`;
- open: `StoreMixture([STORE]).stream("train", seed)` and the first batch of 8 CLM rows, timed inside a child
  (imports excluded): what `objtrain train` does before its first step.

    .venv/bin/python benchmarks/bench_scale.py --sizes 200            # one point, a few minutes
    .venv/bin/python benchmarks/bench_scale.py --sizes 200,2000       # the issue's table (long)

Skips with a message when ../shared/data/gutenberg-en is absent.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _data_common import SHARED_DATA, table

from objtrain.data.tokenize import default_threads

BOOKS = SHARED_DATA / "gutenberg-en" / "books"

WRAPPER = (
    "import resource, subprocess, sys, time; t = time.perf_counter(); "
    "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
    "print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)

RAW_SP = """
import sys, sentencepiece as spm
model, threads, files = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
sp = spm.SentencePieceProcessor(model_file=model)
batch, size, tokens = [], 0, 0
def flush():
    global batch, size, tokens
    tokens += sum(map(len, sp.encode(batch, num_threads=threads)))
    batch, size = [], 0
for name in files:
    with open(name, encoding="utf-8") as f:
        for para in f.read().split("\\n\\n"):
            if para.strip():
                batch.append(para)
                size += len(para)
                if size >= 1 << 20:
                    flush()
flush()
print(tokens, file=sys.stderr)
"""

OPEN = """
import sys, time
t0 = time.perf_counter()
import numpy as np
from objtrain.objectives.registry import build_objective
from objtrain.data.mixture import StoreMixture
from objtrain.data.batches import leading_batches
t1 = time.perf_counter()
source = StoreMixture([sys.argv[1]])
stream = source.stream("train", 0)
clm = build_objective("clm", source.specials, source.tokenizer, "decoder")
(batch,) = leading_batches(stream, clm, 1024, 8, 8, 0, within_epoch=False)
t2 = time.perf_counter()
print(f"{t2 - t1:.4f}")
"""


def run(args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of a child command."""
    out = subprocess.run([sys.executable, "-c", WRAPPER, *args], check=True, capture_output=True, text=True)
    seconds, kb = out.stdout.strip().splitlines()[-1].split()
    return float(seconds), int(kb) / 1024


def build_corpus(root: Path, copies: int) -> list[Path]:
    """`copies` directories of the Gutenberg books as .txt, the first real files, the rest hard links."""
    base = root / "copy0"
    if not base.exists():
        base.mkdir(parents=True)
        for i, gz in enumerate(sorted(BOOKS.rglob("*.txt.gz"))):
            (base / f"{i:04d}.txt").write_bytes(gzip.decompress(gz.read_bytes()))
    dirs = []
    for k in range(copies):
        d = root / f"copy{k}"
        if not d.exists():
            d.mkdir()
            for f in base.iterdir():
                os.link(f, d / f.name)
        dirs.append(d)
    return dirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="200", help="corpus sizes in MB, comma-separated")
    parser.add_argument("--workdir", type=Path, default=None, help="where to build (default: a temp dir)")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument(
        "--peer-max-mb", type=float, default=1e9, help="run raw sentencepiece only up to this corpus size"
    )
    args = parser.parse_args()
    if not BOOKS.is_dir():
        print(f"skipping: {BOOKS} not found (the shared corpora are not on this machine)")
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    threads = default_threads()
    with tempfile.TemporaryDirectory(prefix="bench_scale.", dir=args.workdir) as tmp:
        root = Path(tmp)
        one = build_corpus(root / "corpus", 1)[0]
        copy_mb = sum(f.stat().st_size for f in one.iterdir()) / 1e6
        obj = [sys.executable, "-m", "objtrain"]
        subprocess.run(
            [*obj, "tokenize", str(one), "--doc-split", "blank-line", "-o", str(root / "trained")],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        model = root / "trained" / "tokenizer.model"
        print(f"one copy: {copy_mb:.1f} MB; tokenizer trained (vocab 8192); {threads} threads", flush=True)
        # The same commands on a one-document corpus: the interpreter, torch and numpy alone.
        (root / "tiny").mkdir()
        (root / "tiny" / "a.txt").write_text("A tiny corpus.\n\nOf two paragraphs.\n")
        _, base_tok = run(
            [*obj, "tokenize", str(root / "tiny"), "--tokenizer", str(model), "-o", str(root / "t0")]
        )
        _, base_pack = run([*obj, "pack", str(root / "t0"), "--seq-len", "8", "-o", str(root / "p0")])
        print(f"baseline peak RSS: tokenize {base_tok:.0f} MB, pack {base_pack:.0f} MB", flush=True)
        rows = []
        for size in sizes:
            copies = max(round(size / copy_mb), 1)
            dirs = build_corpus(root / "corpus", copies)
            mb = copies * copy_mb
            files = [str(f) for d in dirs for f in sorted(d.iterdir())]
            store, packed = root / f"store{size}", root / f"packed{size}"
            tok_s, tok_rss = run(
                [*obj, "tokenize", *map(str, dirs), "--tokenizer", str(model), "--doc-split", "blank-line",
                 "-o", str(store), "--force"]
            )  # fmt: skip
            print(f"  {mb:.0f} MB: tokenize {tok_s:.1f} s, peak RSS {tok_rss:.0f} MB", flush=True)
            meta = json.loads((store / "meta.json").read_text())
            seq = str(args.seq_len)
            fit_s, fit_rss = run(
                [
                    *obj,
                    "pack",
                    str(store),
                    "--mode",
                    "bestfit",
                    "--seq-len",
                    seq,
                    "-o",
                    str(packed),
                    "--force",
                ]
            )
            print(f"  {mb:.0f} MB: pack bestfit {fit_s:.1f} s, peak RSS {fit_rss:.0f} MB", flush=True)
            fill = json.loads((packed / "meta.json").read_text())["splits"]["train"]["fill"]
            cat_s, cat_rss = run(
                [*obj, "pack", str(store), "--mode", "concat", "--seq-len", seq, "-o", str(packed), "--force"]
            )
            print(f"  {mb:.0f} MB: pack concat {cat_s:.1f} s, peak RSS {cat_rss:.0f} MB", flush=True)
            opened = subprocess.run(
                [sys.executable, "-c", OPEN, str(store)], check=True, capture_output=True, text=True
            )
            open_s = float(opened.stdout.strip().splitlines()[-1])
            print(f"  {mb:.0f} MB: open + first batch {open_s:.3f} s", flush=True)
            sp_s, sp_rss = float("nan"), float("nan")
            if mb <= args.peer_max_mb:  # last: the slowest step, and only a ratio
                sp_s, sp_rss = run([sys.executable, "-c", RAW_SP, str(model), str(threads), *files])
                print(f"  {mb:.0f} MB: raw sentencepiece {sp_s:.1f} s, peak RSS {sp_rss:.0f} MB", flush=True)
            rows.append([
                f"{mb:,.0f} MB", f"{meta['documents']:,}", f"{meta['tokens']:,}", mb / tok_s, mb / sp_s,
                tok_s / sp_s, tok_rss - base_tok, sp_rss, fit_s, fit_rss - base_pack, fill, cat_s,
                cat_rss - base_pack, open_s,
            ])  # fmt: skip
            for d in (store, packed):
                subprocess.run(["rm", "-rf", str(d)], check=True)
        print()
        header = [
            "corpus", "docs", "tokens", "ours MB/s", "sp MB/s", "wall x", "tok +RSS MB", "sp RSS MB",
            "bestfit s", "bestfit +RSS MB", "fill", "concat s", "concat +RSS MB", "open s",
        ]  # fmt: skip
        print(table(header, rows))
        print(
            "ours: objtrain tokenize end to end (store written); sp: sp.encode on the same paragraphs, "
            f"{threads} threads, nothing written; wall x = ours / sp.\n+RSS: peak RSS of the child over the "
            f"same command on a tiny corpus (tokenize {base_tok:.0f} MB, pack {base_pack:.0f} MB: the "
            "interpreter, numpy, torch)."
        )


if __name__ == "__main__":
    main()
