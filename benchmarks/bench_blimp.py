"""Minimal pairs at BLiMP's size: a tiny encoder's pseudo-log-likelihood over 33,500 pairs, and a tiny
decoder's summed log-probability beside it.

The pairs are ../shared/data/blimp/blimp-dev.jsonl.gz (pairs 0-499 of each of BLiMP's 67 paradigms); without
it the benchmark says so and stops. Both models are at random init (the cost does not depend on the
weights), tiny size (4 x 128), on the embedded standard-library store's tokenizer. The encoder's time covers
both PLL and PLL-word-l2r (one pass: `objtrain/evaluation/blimp.py`, `pll_scores`): one copy of each
sentence per token, plus a second copy of each piece that has later pieces in its word. Target: the encoder
well inside 10 minutes on the 2-core development machine.

Measured (2 shared cores, load average 6-14 from other work, 2 threads; 3,350 pairs, 128,030 sentence
tokens, about 19 a sentence): tiny decoder 62 s, tiny encoder 1,829 s. The encoder's cost is its copies:
a sentence of n tokens is n rows of n positions, about 3.5M positions per 3,350 pairs with PLL-word's second
copies, at about 1.6 MFLOP each for 4 x 128: about 65 TFLOP for all 33,500 pairs, over 10 minutes even at
100 GFLOP/s. The target is not met at this size on this machine; a GPU, or the debug size, meets it.

    .venv/bin/python benchmarks/bench_blimp.py                  # all 33,500 pairs
    .venv/bin/python benchmarks/bench_blimp.py --pairs 2000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from objtrain.data.default import default_store
from objtrain.data.store_reader import DataSource
from objtrain.evaluation import blimp
from objtrain.models.zoo import build_model, model_config

PAIRS = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "blimp" / "blimp-dev.jsonl.gz"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs-file", type=Path, default=PAIRS)
    ap.add_argument("--pairs", type=int, default=0, help="score the first N pairs only (0: all)")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--batch-tokens", type=int, default=16384)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not args.pairs_file.is_file():
        print(f"skipped: {args.pairs_file} is absent (BLiMP pairs in the release's format are needed)")
        return
    pairs = blimp.read_pairs(args.pairs_file)
    if args.pairs:
        keep = slice(0, args.pairs)
        pairs = blimp.Pairs(
            pairs.good[keep], pairs.bad[keep], pairs.uid[keep], pairs.term[keep], pairs.source
        )
    tokenizer = DataSource(default_store()).tokenizer
    t0 = time.perf_counter()
    good, bad = blimp.encode_texts(tokenizer, pairs.good), blimp.encode_texts(tokenizer, pairs.bad)
    encode_s = time.perf_counter() - t0
    tokens = int(good.lengths.sum() + bad.lengths.sum())
    out: dict[str, float | int | str] = {"pairs": len(pairs), "sentence_tokens": tokens, "encode_s": encode_s,
                                         "threads": torch.get_num_threads(), "size": args.size}  # fmt: skip
    sp = tokenizer.specials
    for kind, form in (("decoder", "causal"), ("encoder", "pll_word")):
        torch.manual_seed(0)
        model = build_model(model_config(kind, args.size, vocab_size=tokenizer.vocab_size)).eval()
        t0 = time.perf_counter()
        if form == "pll_word":
            scores = [blimp.pll_scores(model, e, sp, "cpu", args.batch_tokens) for e in (good, bad)]
            acc = float(np.mean(scores[0][1] > scores[1][1]))
        else:
            g, b = (blimp.score_sentences(model, form, e, sp, "cpu", args.batch_tokens) for e in (good, bad))
            acc = float(np.mean(g > b))
        seconds = time.perf_counter() - t0
        out[f"{kind}_{form}_s"] = seconds
        out[f"{kind}_{form}_random_init_accuracy"] = acc
        print(f"{kind} {args.size} {form}: {len(pairs):,} pairs ({tokens:,} tokens) in {seconds:.1f} s "
              f"(random-init accuracy {acc:.3f})", flush=True)  # fmt: skip
    print(json.dumps(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
