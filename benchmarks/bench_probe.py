"""Probe features: the shipped extraction against the way it was done before, on the same model and texts.

A probe (`objtrain eval`'s SST-2 / TREC / CoLA) reads frozen features of thousands of short texts. The
shipped `layer_features` batches the texts by length and stops at the last layer's normed hidden states;
before, texts were batched in their given order and each batch ran the model's whole forward, the
unembedding included (a (V, D) product per position: at vocab 8,192 most of a tiny model's forward). Both
run here on one randomly initialised tiny model per kind, over texts of SST-2's lengths (2 to 60 tokens,
log-normal), interleaved, medians; the features must agree to float tolerance.

    .venv/bin/python benchmarks/bench_probe.py
    .venv/bin/python benchmarks/bench_probe.py --texts 4000 --rounds 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from objtrain.__main__ import openmp_defaults, other_work

openmp_defaults(others=other_work())  # as `objtrain eval` waits, chosen before torch loads OpenMP

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from objtrain.batch import Batch  # noqa: E402
from objtrain.evaluation import probe  # noqa: E402
from objtrain.models import build_model, model_config  # noqa: E402


class Lookup:
    """A tokenizer stand-in: each text is the decimal index of a prepared id list."""

    def __init__(self, ids: list[list[int]], pad: int, eos: int) -> None:
        self.ids = ids
        self.specials = SimpleNamespace(pad=pad, eos=eos)

    def encode(self, text: str) -> list[int]:
        return self.ids[int(text)]


@torch.no_grad()
def before(model: nn.Module, tok: Lookup, texts: list[str], max_len: int, batch_size: int) -> Tensor:
    """The previous extraction: batches in the given order, the whole forward, its hidden states pooled."""
    encoded = probe.encode_texts(tok, texts, max_len)  # type: ignore[arg-type]
    out = []
    for lo in range(0, len(encoded), batch_size):
        ids, valid, lengths = probe.padded(encoded[lo : lo + batch_size], tok.specials.pad)
        B, L = ids.shape
        docs = torch.where(valid, 0, -1)
        positions = torch.arange(L).expand(B, L)
        kind = model.config.kind  # type: ignore[union-attr]
        if kind == "encdec":
            hidden = model.encode(ids, positions, docs)  # type: ignore[operator]
        else:
            attention = "causal" if kind == "decoder" else "bidirectional"
            batch = Batch(ids, ids, positions, docs, attention, segment_ids=torch.zeros_like(ids))  # type: ignore[arg-type]
            hidden = model(batch).hidden
        out.append(probe._pool(hidden.double(), valid, lengths, "mean"))
    return torch.cat(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--kinds", default="decoder,encoder")
    parser.add_argument("--json", type=Path)
    a = parser.parse_args()
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(18), 0.6, size=a.texts), 2, 60).astype(int)
    tok = Lookup([rng.integers(10, a.vocab, size=n).tolist() for n in lengths], pad=0, eos=3)
    texts = [str(i) for i in range(a.texts)]
    shape = f"{lengths.min()}-{lengths.max()} tokens (mean {lengths.mean():.1f})"
    print(f"{a.texts} texts of {shape}, vocab {a.vocab}, {torch.get_num_threads()} threads")
    rows: dict[str, Any] = {}
    for kind in a.kinds.split(","):
        torch.manual_seed(0)
        model = build_model(model_config(kind, "tiny", {}, vocab_size=a.vocab)).eval()
        times: dict[str, list[float]] = {"shipped": [], "before": []}
        for r in range(a.rounds):
            for name in ("shipped", "before") if r % 2 == 0 else ("before", "shipped"):
                t0 = time.perf_counter()
                if name == "shipped":
                    got = probe.features(model, tok, texts, 64)  # type: ignore[arg-type]
                else:
                    ref = before(model, tok, texts, 64, 32)
                times[name].append(time.perf_counter() - t0)
        gap = float((got - ref).abs().max())
        med = {k: statistics.median(v) for k, v in times.items()}
        rows[kind] = {**med, "speedup": med["before"] / med["shipped"], "max_abs_diff": gap}
        print(
            f"{kind:8s} shipped {med['shipped']:6.2f} s  before {med['before']:6.2f} s  "
            f"x{med['before'] / med['shipped']:.2f}  features max |diff| {gap:.1e}",
            flush=True,
        )
        assert gap < 1e-4, f"{kind}: the features differ by {gap}"
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
