"""`objtrain tokenize`: throughput against sentencepiece's own batch encoder, and peak memory vs corpus size.

1. Throughput, per corpus (the standard library; tinyshakespeare and wikitext-2 when ../shared/data has them):
   a tokenizer is trained once (vocab 4096), then the whole `tokenize_corpus` pipeline with that tokenizer
   (scan + hash files, read, split, encode, write the store) is timed against `sp.encode(list_of_texts,
   num_threads=N)` on the same documents, already in memory, with the same model, in the same run,
   alternating the two. Target: ours within 1.2x of the bare encoder.
2. Memory: corpora of 1, 4, 16, 32 copies of the standard library (12 MB each, up to ~390 MB) are
   tokenized in a child process (`python -m objtrain tokenize --tokenizer ...`); its peak RSS comes from
   getrusage(RUSAGE_CHILDREN) in a fresh wrapper process per run. Streaming shows as a flat peak RSS.
3. One long document: a file of one line (random words, --long-mb MB, 200 by default) tokenized the same
   way, its peak RSS printed against its size (a document is encoded in pieces of
   `objtrain.data.tokenize.PIECE_CHARS` characters; before that, one such line peaked at 47x its size).

    .venv/bin/python benchmarks/bench_tokenize.py            # about 3-4 minutes on 2 busy cores
    .venv/bin/python benchmarks/bench_tokenize.py --quick    # smaller memory sweep
    .venv/bin/python benchmarks/bench_tokenize.py --long-only --long-mb 200  # the one-line file alone
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


def long_line(root: Path, megabytes: float, model: Path) -> list[object]:
    """[MB, peak RSS MB, RSS / size, seconds] for one file of one line of random words."""
    import random

    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    path = root / "one-line.txt"
    with open(path, "w") as f:
        while f.tell() < megabytes * 1e6:
            f.write(" ".join(rng.choice(words) for _ in range(100_000)) + " ")
    mb = path.stat().st_size / 1e6
    rss, seconds = peak_rss_mb(
        ["tokenize", str(path), "--tokenizer", str(model), "-o", str(root / "l"), "--force"]
    )
    return [mb, rss, rss / mb, seconds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, memory sweep up to 4 copies")
    parser.add_argument("--long-mb", type=float, default=200, help="size of the one-line file, MB")
    parser.add_argument(
        "--long-only", action="store_true", help="only the one-line file (trains a tokenizer)"
    )
    args = parser.parse_args()
    copies = [1, 2, 4] if args.quick else [1, 4, 16, 32]
    with tempfile.TemporaryDirectory(prefix="bench_tokenize.") as tmp:
        root = Path(tmp)
        if args.long_only:
            tokenize_corpus(
                [], root / "t", TokenizeConfig(corpus="stdlib", vocab_size=2000, train_bytes=400_000)
            )
            print(
                table(
                    ["one-line MB", "peak RSS MB", "x size", "s"],
                    [long_line(root, args.long_mb, root / "t" / "tokenizer.model")],
                )
            )
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
        print(f"\none document of one line ({args.long_mb:g} MB)", flush=True)
        row = long_line(root, args.long_mb, root / "trained-0" / "tokenizer.model")
        print(table(["one-line MB", "peak RSS MB", "x size", "s"], [row]))


if __name__ == "__main__":
    main()
