"""`objtrain tokenize`: throughput against sentencepiece's own batch encoder, and peak memory vs corpus size.

1. Throughput, per corpus (the standard library; tinyshakespeare and wikitext-2 when ../shared/data has them):
   a tokenizer is trained once (vocab 4096), then the whole `tokenize_corpus` pipeline with that tokenizer
   (scan + hash files, read, split, encode, write the store) is timed against `sp.encode(list_of_texts,
   num_threads=N)` on the same documents, already in memory, with the same model, in the same run,
   alternating the two. Target: ours within 1.2x of the bare encoder.
2. Memory: corpora of 1, 4, 16, 32 copies of the standard library (12 MB each, up to ~390 MB) are
   tokenized in a child process (`python -m objtrain tokenize --tokenizer ...`); its peak RSS comes from
   getrusage(RUSAGE_CHILDREN) in a fresh wrapper process per run. Streaming shows as a flat peak RSS.
3. One long document: files of one line (random words with accented and CJK ones, no line break;
   --long-mb sizes, 60 and 200 MB by default; plain, and gzip with --long-gz) tokenized the same way,
   their peak RSS printed against their size and against the tiny corpus' baseline. A document is read
   and encoded in pieces of `objtrain.data.tokenize.PIECE_CHARS` characters, so the peak should not follow
   the size. Measured with `/usr/bin/time -v objtrain tokenize FILE --tokenizer MODEL` on 2 cores shared
   with other jobs (load 10-12, so wall seconds are loose; CPU seconds are user + system), baseline (one
   short file) 242-248 MB:

   | one line       | read whole, encoded in pieces (a40a019) | read in pieces too            |
   |----------------|------------------------------------------|-------------------------------|
   | 60 MB          | 533 MB peak, 11 s CPU, 30 s wall         | 456 MB, 14 s CPU, 42 s wall   |
   | 200 MB         | 801 MB peak, 50 s CPU, 376 s wall        | 455 MB, 51 s CPU, 356 s wall  |
   | 60 / 200 MB gz | -                                        | 453 / 424 MB (this script)    |

   (the 200 MB rows ran back to back; before pieces at all, one such 200 MB line peaked at 9.48 GB, 47x
   its size). Skipped, with a note, when the temporary folder has less than twice the largest size free.

    .venv/bin/python benchmarks/bench_tokenize.py            # about 3-4 minutes on 2 busy cores
    .venv/bin/python benchmarks/bench_tokenize.py --quick    # smaller memory sweep
    .venv/bin/python benchmarks/bench_tokenize.py --long-only --long-mb 60,200  # the one-line files alone
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sentencepiece as spm
from _data_common import Corpus, corpora, table

from objtrain.data import sources
from objtrain.data.tokenize import TokenizeConfig, default_threads, tokenize_corpus

# Peak RSS growth over the same command on a tiny corpus. What may grow: chunks in flight (2 per thread,
# 256 KB of text each, with their token lists), per-file metadata, allocator arenas of the worker threads.
MEMORY_BUDGET_MB = 100


def documents(corpus: Corpus) -> list[str]:
    paths = sources.stdlib_files() if corpus.inputs is None else list(corpus.inputs)
    docs = []
    for path in paths:
        found = sources.scan(path, explicit=False)
        if isinstance(found, sources.Source):
            docs += [d for d in sources.iter_documents(found, corpus.doc_split) if d]
    return docs


def throughput(root: Path, repeats: int) -> list[list[object]]:
    threads = default_threads()
    rows: list[list[object]] = []
    for corpus in corpora():
        inputs = list(corpus.inputs or ())
        stdlib = "stdlib" if corpus.inputs is None else None
        trained = root / f"trained-{len(rows)}"
        start = time.perf_counter()
        summary = tokenize_corpus(
            inputs, trained, TokenizeConfig(corpus=stdlib, doc_split=corpus.doc_split, vocab_size=4096)
        )
        first = time.perf_counter() - start
        model = trained / "tokenizer.model"
        cfg = TokenizeConfig(corpus=stdlib, doc_split=corpus.doc_split, tokenizer=model)
        texts = documents(corpus)
        sp = spm.SentencePieceProcessor(model_file=str(model))
        ours, peer, ours_cpu, peer_cpu = [], [], [], []
        for _ in range(repeats):  # alternate, so both see the same background load
            t0, c0 = time.perf_counter(), time.process_time()
            tokenize_corpus(inputs, root / "again", cfg, force=True)
            t1, c1 = time.perf_counter(), time.process_time()
            sp.encode(texts, num_threads=threads)
            t2, c2 = time.perf_counter(), time.process_time()
            ours.append(t1 - t0)
            peer.append(t2 - t1)
            ours_cpu.append(c1 - c0)
            peer_cpu.append(c2 - c1)
        ours_s, peer_s = statistics.median(ours), statistics.median(peer)
        cpu_ratio = statistics.median(ours_cpu) / statistics.median(peer_cpu)
        mb = summary.bytes / 1e6
        rows.append([
            corpus.name, mb, f"{summary.documents:,}", f"{summary.tokens:,}", summary.train_seconds, first,
            mb / ours_s, mb / peer_s, ours_s / peer_s, cpu_ratio,
        ])  # fmt: skip
        print(f"  {corpus.name}: ours {ours_s:.2f} s, sp.encode {peer_s:.2f} s (medians)", flush=True)
    return rows


WRAPPER = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def peak_rss_mb(args: list[str]) -> tuple[float, float]:
    """(peak RSS of `python -m objtrain ARGS` in MB, seconds)."""
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", WRAPPER, sys.executable, "-m", "objtrain", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(out.stdout.strip().splitlines()[-1]) / 1024, time.perf_counter() - start


def memory(root: Path, copies: list[int], model: Path) -> list[list[object]]:
    files = sources.stdlib_files()
    base = sources.stdlib_root()
    tiny = root / "tiny"
    tiny.mkdir()
    (tiny / "a.py").write_text("print('hello')\n")
    baseline, _ = peak_rss_mb(
        ["tokenize", str(tiny), "--tokenizer", str(model), "-o", str(root / "m"), "--force"]
    )
    rows: list[list[object]] = [["tiny (baseline)", 0.0, baseline, 0.0, 0.0, "-"]]
    made = 0
    for n in copies:
        while made < n:  # copy k of the library, so a bigger corpus is a superset of a smaller one
            for f in files:
                dest = root / "big" / f"copy{made}" / f.relative_to(base)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, dest)
            made += 1
        inputs = [str(root / "big" / f"copy{k}") for k in range(n)]
        mb = sum(p.stat().st_size for k in range(n) for p in (root / "big" / f"copy{k}").rglob("*.py")) / 1e6
        rss, seconds = peak_rss_mb(
            ["tokenize", *inputs, "--tokenizer", str(model), "-o", str(root / "m"), "--force"]
        )
        growth = rss - baseline
        rows.append(
            [f"{n} x stdlib", mb, rss, growth, mb / seconds, "yes" if growth <= MEMORY_BUDGET_MB else "NO"]
        )
        print(f"  {n} x stdlib: {mb:.0f} MB, peak RSS {rss:.0f} MB, {seconds:.1f} s", flush=True)
    return rows


def long_lines(root: Path, sizes: list[float], model: Path, gz: bool) -> list[list[object]]:
    """[file, MB, peak RSS MB, growth over a tiny corpus MB, RSS / size, seconds] for files of one line of
    random words each (and their .gz copies with `gz`); [] with a note when the disk is too small."""
    import gzip
    import random

    need = 2 * max(sizes) * 1e6 * (1.5 if gz else 1.0)
    if shutil.disk_usage(root).free < need:
        print(f"  skipped: {root} has less than {need / 1e9:.1f} GB free for the one-line files")
        return []
    tiny = root / "tiny-line.txt"
    tiny.write_text("hello world")
    args = ["--tokenizer", str(model), "-o", str(root / "l"), "--force"]
    baseline, _ = peak_rss_mb(["tokenize", str(tiny), *args])
    rows: list[list[object]] = [["tiny (baseline)", 0.0, baseline, 0.0, "-", "-"]]
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "naïve", "日本"]
    for megabytes in sizes:
        path = root / f"one-line-{megabytes:g}.txt"
        with open(path, "w", encoding="utf-8") as f:
            while f.tell() < megabytes * 1e6:
                f.write(" ".join(rng.choice(words) for _ in range(100_000)) + " ")
        paths = [path]
        if gz:
            with (
                open(path, "rb") as plain,
                gzip.open(path.with_suffix(".txt.gz"), "wb", compresslevel=1) as out,
            ):
                shutil.copyfileobj(plain, out, 1 << 24)
            paths.append(path.with_suffix(".txt.gz"))
        mb = path.stat().st_size / 1e6
        for file in paths:
            rss, seconds = peak_rss_mb(["tokenize", str(file), *args])
            rows.append([file.name, mb, rss, rss - baseline, rss / mb, seconds])
            print(f"  {file.name}: {mb:.0f} MB of text, peak RSS {rss:.0f} MB, {seconds:.0f} s", flush=True)
            file.unlink()
    return rows


LONG_HEADER = ["one line", "MB", "peak RSS MB", "growth MB", "x size", "s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, memory sweep up to 4 copies")
    parser.add_argument(
        "--long-mb", default="60,200", help="sizes of the one-line files, MB, comma-separated"
    )
    parser.add_argument("--long-gz", action="store_true", help="also tokenize gzip copies of them")
    parser.add_argument(
        "--long-only", action="store_true", help="only the one-line file (trains a tokenizer)"
    )
    args = parser.parse_args()
    sizes = [float(x) for x in str(args.long_mb).split(",") if x]
    copies = [1, 2, 4] if args.quick else [1, 4, 16, 32]
    with tempfile.TemporaryDirectory(prefix="bench_tokenize.") as tmp:
        root = Path(tmp)
        if args.long_only:
            tokenize_corpus(
                [], root / "t", TokenizeConfig(corpus="stdlib", vocab_size=2000, train_bytes=400_000)
            )
            rows = long_lines(root, sizes, root / "t" / "tokenizer.model", args.long_gz)
            if rows:
                print(table(LONG_HEADER, rows))
            return
        print(f"throughput ({default_threads()} threads)", flush=True)
        rows = throughput(root, repeats=3 if args.quick else 5)
        print()
        header = [
            "corpus",
            "MB",
            "docs",
            "tokens",
            "train s",
            "first run s",
            "ours MB/s",
            "sp MB/s",
            "wall x",
            "cpu x",
        ]
        print(table(header, rows))
        print("ours: the whole tokenize pipeline, tokenizer given; sp: sp.encode(texts, num_threads) alone")
        print("wall x, cpu x: ours / sp in wall time and in process CPU time (CPU time is robust to load)")
        print(f"\npeak memory (budget: {MEMORY_BUDGET_MB} MB over the baseline)", flush=True)
        mem = memory(root, copies, root / "trained-0" / "tokenizer.model")
        print()
        print(table(["corpus", "MB", "peak RSS MB", "growth MB", "MB/s", "in budget"], mem))
        print(f"\none document of one line ({args.long_mb} MB)", flush=True)
        long = long_lines(root, sizes, root / "trained-0" / "tokenizer.model", args.long_gz)
        if long:
            print(table(LONG_HEADER, long))


if __name__ == "__main__":
    main()
