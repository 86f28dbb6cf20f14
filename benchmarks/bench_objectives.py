"""Corruption throughput of every objective, side by side with the collators people use today.

One thread (`torch.set_num_threads(1)`, as in a data-loader worker), batches of 64 rows x 512 model
tokens, median of several repeats, all measured in the same run (the machine is shared, so only ratios
measured together mean anything). Peers:
- Hugging Face transformers `DataCollatorForLanguageModeling` (mlm=True for the masked objectives,
  mlm=False for the causal ones), fed pre-stacked tensors, its fastest path;
- the numpy T5 span-corruption collator of transformers' `examples/flax/language-modeling/
  run_t5_mlm_flax.py` (`FlaxDataCollatorForT5MLM`), re-created below without flax.
Tokens/s counts model-input tokens (64 x 512 per batch) for everyone. "% of step" divides the
objective's time per token by the training-step time per token of objtrain's `small` decoder (forward,
loss, backward, AdamW at the machine's default thread count), measured in the same run; on a GPU the
step is far faster, so pass its measured rate with `--step-tokens-per-s` to see the share there.

    .venv/bin/python benchmarks/bench_objectives.py
    .venv/bin/python benchmarks/bench_objectives.py --objectives mlm span --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from objtrain.data.tokenizer import Tokenizer, train_sentencepiece
from objtrain.errors import UserError
from objtrain.objectives.registry import OBJECTIVES, build_objective, objective_class
from objtrain.specials import Specials
from objtrain.views import corrupt as shown

BATCH, LENGTH = 64, 512
PEER_OF = {  # which collator each objective is compared with
    "clm": "hf-clm",
    "mtp": "hf-clm",
    "fim": "hf-clm",
    "mlm": "hf-mlm",
    "nsp": "hf-mlm",
    "sop": "hf-mlm",
}  # everything else (span, prefix_lm, ul2, bart, mixture) against the T5 span collator


def median_seconds(fn: Callable[[int], object], repeats: int, budget_s: float = 20.0) -> float:
    """Median wall time of fn(i) over `repeats` calls after one warm-up (fewer if over `budget_s`)."""
    fn(-1)
    times: list[float] = []
    start = time.perf_counter()
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s and len(times) >= 3:
            break
    return statistics.median(times)


# ---------------------------------------------------------------------------------------------------
# Corpus


def corpus_documents(max_chars: int = 2_000_000) -> list[str]:
    """The Python standard library's own modules: a real code corpus on every machine."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    docs, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        docs.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return docs


def build_tokenizer(docs: list[str], vocab_size: int) -> Tokenizer:
    lines = [line for text in docs[:60] for line in text.splitlines(keepends=True)]
    specials = Specials()
    return Tokenizer(train_sentencepiece(lines, vocab_size=vocab_size, specials=specials), specials)


# ---------------------------------------------------------------------------------------------------
# Peers


def hf_collator(vocab_size: int, mlm: bool) -> Callable[[torch.Tensor], object]:
    """transformers' DataCollatorForLanguageModeling with an offline WordLevel tokenizer of the same size."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import WordLevel
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    vocab.update({f"w{i}": i for i in range(len(vocab), vocab_size)})
    fast = PreTrainedTokenizerFast(
        tokenizer_object=HFTokenizer(WordLevel(vocab, unk_token="[UNK]")),
        pad_token="[PAD]",
        unk_token="[UNK]",
        mask_token="[MASK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
    )
    collator = DataCollatorForLanguageModeling(fast, mlm=mlm, mlm_probability=0.15, return_tensors="pt")

    def run(rows: torch.Tensor) -> object:
        return collator(list(rows.unbind(0)))  # list of 1-D tensors: stacked, no tokenizer.pad

    return run


@dataclass
class NumpyT5SpanCollator:
    """T5 span corruption as done by transformers' examples/flax/language-modeling/run_t5_mlm_flax.py
    (`FlaxDataCollatorForT5MLM`: `random_spans_noise_mask`, `create_sentinel_ids`, `filter_input_ids`),
    re-created here in numpy without flax, with the same per-row structure: one Python-level mask per row
    (global `np.random` shuffles), then vectorised sentinel ids and compaction of the whole batch."""

    vocab_size: int
    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0
    eos_id: int = 1
    pad_id: int = 0

    def noise_mask(self, length: int) -> np.ndarray:
        n_noise = min(max(int(np.round(length * self.noise_density)), 1), length - 1)
        n_keep = length - n_noise
        n_spans = max(int(np.round(min(n_noise, n_keep) / self.mean_noise_span_length)), 1)

        def segment_lengths(items: int, parts: int) -> np.ndarray:
            first = np.arange(items - 1) < (parts - 1)
            np.random.shuffle(first)
            segment = np.cumsum(np.concatenate([[0], first]))
            return np.bincount(segment)

        spans = np.stack([segment_lengths(n_keep, n_spans), segment_lengths(n_noise, n_spans)], axis=1)
        starts = np.cumsum(spans.reshape(-1))[:-1]
        marks = np.zeros(length, dtype=np.int8)
        marks[starts] = 1
        return np.cumsum(marks) % 2 == 1

    def sentinel_ids(self, mask: np.ndarray) -> np.ndarray:
        """Sentinel id at each span start, -1 inside a span (to be dropped), 0 elsewhere."""
        mask = mask.astype(np.int8)
        starts = mask - np.roll(mask, 1, axis=-1) * mask
        starts[:, 0] = mask[:, 0]
        ids = np.where(starts != 0, np.cumsum(starts, axis=-1), 0)
        ids = np.where(ids != 0, self.vocab_size - ids, 0)
        return ids - (mask - starts)

    def filter_ids(self, ids: np.ndarray, sentinels: np.ndarray) -> np.ndarray:
        full = np.where(sentinels != 0, sentinels, ids)
        kept = full[full >= 0].reshape(ids.shape[0], -1)
        return np.concatenate([kept, np.full((ids.shape[0], 1), self.eos_id, dtype=kept.dtype)], axis=1)

    def __call__(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        B, L = ids.shape
        mask = np.asarray([self.noise_mask(L) for _ in range(B)])
        inputs = self.filter_ids(ids, self.sentinel_ids(mask))
        labels = self.filter_ids(ids, self.sentinel_ids(~mask))
        decoder_inputs = np.full_like(labels, self.pad_id)
        decoder_inputs[:, 1:] = labels[:, :-1]
        return {"input_ids": inputs, "labels": labels, "decoder_input_ids": decoder_inputs}


# ---------------------------------------------------------------------------------------------------
# Training step of the small decoder


def train_step_seconds_per_token(vocab_size: int, threads: int, repeats: int = 3) -> tuple[float, str]:
    """Seconds per token of one training step of the `small` decoder (batch 4 x 512), `threads` threads."""
    from objtrain.models import build_model, model_config

    torch.set_num_threads(threads)
    try:
        cfg = model_config("decoder", "small", vocab_size=vocab_size)
        model = build_model(cfg)
        clm = build_objective("clm", Specials())
        rows = torch.randint(Specials().first_ordinary, vocab_size, (4, LENGTH + 1))
        batch = clm(rows, torch.zeros_like(rows), torch.arange(4), 0)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(_: int) -> None:
            out = clm.loss(model(batch), batch)
            (out.loss_sum / out.n_targets).backward()
            optim.step()
            optim.zero_grad(set_to_none=True)

        seconds = median_seconds(step, repeats)
    finally:
        torch.set_num_threads(1)
    return seconds / (4 * LENGTH), f"objtrain small decoder ({cfg.n_layer}x{cfg.d_model}), {threads} threads"


# ---------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objectives", nargs="*", default=list(OBJECTIVES))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument(
        "--step-tokens-per-s",
        type=float,
        default=None,
        help="training throughput to compare with (e.g. the small decoder on a GPU from bench_models.py) "
        "instead of measuring the small decoder on this machine's CPU",
    )
    args = parser.parse_args()

    train_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    print(f"corpus: stdlib; training a {args.vocab_size}-piece tokenizer ...", flush=True)
    texts = corpus_documents()
    tokenizer = build_tokenizer(texts, args.vocab_size)
    specials = tokenizer.specials
    documents = tokenizer.encode_batch(texts)
    V = tokenizer.vocab_size
    tokens_per_batch = BATCH * LENGTH

    # Every runner (peers and objectives) is timed once per round, rounds interleaved, so load from
    # other processes on this shared machine hits all of them alike; the report takes medians.
    runners: dict[str, Callable[[int], object]] = {}
    for name, mlm in (("hf-mlm", True), ("hf-clm", False)):
        try:
            collate = hf_collator(V, mlm)
        except ImportError as exc:
            print(f"skipping {name}: transformers is not installed ({exc})")
            continue
        rows = torch.randint(5, V, (BATCH, LENGTH + (0 if mlm else 1)))
        runners[name] = lambda _i, c=collate, r=rows: c(r)
    t5 = NumpyT5SpanCollator(V)
    raw = 568  # T5's random_spans_helper(512, 0.15, 3): 568 raw tokens give 512 inputs
    t5_rows = np.random.default_rng(0).integers(5, V - 300, (BATCH, raw))
    runners["t5-numpy"] = lambda _i: t5(t5_rows)
    peer_names = list(runners)

    notes: dict[str, str] = {}
    peer_of: dict[str, str] = {}
    for name in args.objectives:
        try:
            kinds = objective_class(name).model_kinds
        except Exception as exc:
            notes[name] = f"unavailable ({type(exc).__name__})"
            continue
        for kind in kinds:
            label = f"{name} [{kind}]"
            try:
                objective = build_objective(name, specials, tokenizer=tokenizer, model_kind=kind)
                L = objective.raw_length(LENGTH)
            except UserError as exc:
                if "cannot train" not in str(exc):  # e.g. a mixture whose components rule a kind out
                    notes[label] = f"not configurable: {exc}"
                continue
            tokens, docs = shown.rows_from_documents(documents, L, BATCH, specials)
            index = torch.arange(BATCH)
            runners[label] = lambda i, o=objective, t=tokens, d=docs, r=index: o(t, d, r, i)
            peer_of[label] = PEER_OF.get(name, "t5-numpy")

    times: dict[str, list[float]] = {label: [] for label in runners}
    for run in runners.values():
        run(-1)  # warm-up
    for i in range(args.repeats):
        for label, run in runners.items():
            t0 = time.perf_counter()
            run(i)
            times[label].append(time.perf_counter() - t0)
    rate = {label: tokens_per_batch / statistics.median(t) for label, t in times.items()}
    peers = {name: rate[name] for name in peer_names}

    if args.step_tokens_per_s:
        step_s_per_token, step_what = 1 / args.step_tokens_per_s, "given with --step-tokens-per-s"
    else:
        step_s_per_token, step_what = train_step_seconds_per_token(V, train_threads)
    results = [(label, rate[label], peer_of[label], "") for label in peer_of]
    results += [(label, None, "", note) for label, note in notes.items()]

    print()
    print(f"batch {BATCH} x {LENGTH} model tokens, 1 thread, median of {args.repeats} interleaved rounds")
    print(f"training step: {step_what}: {1 / step_s_per_token:,.0f} tokens/s")
    for name, rate in peers.items():
        print(f"peer {name:9s} {rate:>14,.0f} tokens/s")
    print()
    header = f"{'objective':24s} {'tokens/s':>14s} {'peer':>9s} {'x peer':>8s} {'% of step':>10s}"
    print(header)
    print("-" * len(header))
    for label, tps, peer, note in results:
        if tps is None:
            print(f"{label:24s} {note}")
            continue
        ratio = tps / peers[peer] if peer in peers else float("nan")
        share = 100 * (1 / tps) / step_s_per_token
        print(f"{label:24s} {tps:>14,.0f} {peer:>9s} {ratio:>8.1f} {share:>9.2f}%")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
