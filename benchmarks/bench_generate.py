"""Decoding speed: KV cache vs recomputation, and self-speculative decoding with MTP heads.

1. tokens/s of greedy decoding with and without the KV cache (random-init decoder; speed only).
2. Self-speculative decoding (tree drafting; `--tree chain` for the argmax chain): the draft acceptance
   rate (accepted drafts / tree depth), tokens per forward, and the wall-clock speed-up
   of speculative over plain greedy decoding (both with the KV cache; outputs checked identical). The
   MTP model is either a checkpoint trained by `objtrain train --objective mtp` (--checkpoint; prompts
   from the valid split of its store, --store, default the embedded standard-library store) or, without
   one, a tiny n=4 MTP decoder this script trains with a minimal loop (AdamW, a few hundred steps on
   the Python standard library's source; prompts from modules left out of its training text). It also
   reports what one speculative forward costs in greedy steps (tokens/forward / speed-up): the
   tokens/forward a model must reach for a given speed-up on this device.
3. Verification cost by model size (random-init n=4 MTP decoders, speed only): the time of one
   speculative step (chain and default tree) against one greedy step of the same model. The speed-up
   is tokens/forward divided by this ratio, so it shows how far acceptance must carry each size here.
4. Static decoding (`--static`, on by default; `decoding_speed`): greedy tok/s of the dynamic path against
   static caches with captured steps (CUDA graphs on CUDA; `--compile` also torch.compiles each step),
   and static speculative decoding against static greedy, all checked identical to dynamic greedy. It
   runs on the MTP model of section 2 (or `--checkpoint`) on `--device` (default: cuda when there is one).
   Without CUDA it says so: the figures are then CPU ones (eager static steps, no graphs), not the GPU
   targets (small model: greedy >= 2,000 tok/s, speculative >= x2.5 over it, on an H100).

`decoding_speed(model, prompts, new_tokens, repeats, compile)` returns the section-4 figures for one decoder
on its own device; `decoding_benchmark(device, size, heads, train_seconds, n_prompts, new_tokens, compile)`
first trains that decoder itself (the issue's setting: small, n=4, 60 s, 12 prompts x 256 tokens). Other
benchmarks (benchmarks/bench_gpu.py) call them: `from bench_generate import decoding_benchmark`.

    .venv/bin/python benchmarks/bench_generate.py
    .venv/bin/python benchmarks/bench_generate.py --steps 400 --json out.json
    .venv/bin/objtrain train --objective mtp --model tiny --seq-len 128 --time 300 -o runs/mtp4
    .venv/bin/python benchmarks/bench_generate.py --skip-cache --checkpoint runs/mtp4

A character-level model (tiny shakespeare with nanoGPT's split, the store `bench_train.py` builds; prompts
spread over the one valid document):

    .venv/bin/python benchmarks/bench_generate.py --char-store runs/shakespeare-char   # builds it, exits
    .venv/bin/objtrain train runs/shakespeare-char --objective mtp --model tiny --seq-len 256 --time 1200 \
        -o runs/mtp4-char
    .venv/bin/python benchmarks/bench_generate.py --skip-cache --checkpoint runs/mtp4-char \
        --store runs/shakespeare-char --prompts-per-file 18
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from objtrain.batch import Batch
from objtrain.data.tokenizer import Tokenizer, train_sentencepiece
from objtrain.models import build_model, count_parameters, model_config
from objtrain.models import generate as gen
from objtrain.models.base import TrunkOutput
from objtrain.models.decoder import Decoder
from objtrain.specials import Specials

STDLIB = Path(sysconfig.get_paths()["stdlib"])
HELD_OUT = ["textwrap.py", "shlex.py", "fnmatch.py", "bisect.py", "heapq.py", "queue.py"]


def stdlib_corpus(max_bytes: int) -> list[str]:
    texts, total = [], 0
    for path in sorted(STDLIB.glob("*.py")):
        if path.name in HELD_OUT:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return texts


def time_decode(fn: Any, repeats: int) -> tuple[float, list[int]]:
    times, out = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = list(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def cache_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    model: Decoder = build_model(model_config("decoder", args.size, vocab_size=4096)).eval()  # type: ignore[assignment]
    prompt = torch.randint(300, 4096, (args.prompt_len,)).tolist()
    n = args.new_tokens
    rows = {"cached": [], "uncached": []}
    for _ in range(args.repeats):  # interleaved
        rows["cached"].append(time_decode(lambda: gen.generate_decoder(model, prompt, n), 1)[0])
        rows["uncached"].append(
            time_decode(lambda: gen.generate_decoder(model, prompt, n, use_cache=False), 1)[0]
        )
    cached, uncached = (n / statistics.median(rows[k]) for k in ("cached", "uncached"))
    print(
        f"KV cache ({args.size} decoder, prompt {args.prompt_len}, {n} new tokens): "
        f"{cached:.0f} tok/s cached vs {uncached:.0f} tok/s recomputed (x{cached / uncached:.1f})",
        flush=True,
    )
    return {
        "size": args.size,
        "cached_tok_s": cached,
        "uncached_tok_s": uncached,
        "speedup": cached / uncached,
    }


def train_mtp(args: argparse.Namespace) -> tuple[Decoder, Tokenizer, dict[str, Any]]:
    specials = Specials()
    texts = stdlib_corpus(args.corpus_bytes)
    lines = [line for text in texts for line in text.splitlines(keepends=True)]
    tokenizer = Tokenizer(train_sentencepiece(lines, vocab_size=args.vocab, specials=specials), specials)
    stream = []
    for ids in tokenizer.encode_batch(texts):
        stream.extend([*ids, specials.eos])
    data = torch.tensor(stream)
    n = args.heads
    size = getattr(args, "mtp_size", "tiny")
    device = torch.device(getattr(args, "train_device", None) or "cpu")
    seconds: float | None = getattr(args, "train_seconds", None)  # a time budget instead of a step count
    torch.manual_seed(0)
    overrides: dict[str, Any] = {"mtp_heads": n}
    if args.layers:
        overrides["n_layer"] = args.layers
    model: Decoder = build_model(model_config("decoder", size, overrides, vocab_size=tokenizer.vocab_size))  # type: ignore[assignment]
    model.to(device).train()
    data = data.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    B, T = args.batch, args.seq
    g = torch.Generator().manual_seed(0)
    positions = torch.arange(T, device=device).expand(B, T)
    offsets = torch.arange(T + n, device=device)
    cast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    t0 = time.perf_counter()
    losses: list[float] = []
    for step in range(args.steps):
        done = step / args.steps if seconds is None else (time.perf_counter() - t0) / seconds
        if done >= 1:
            break
        lr = args.lr * min(1.0, (step + 1) / 30) * (0.1 + 0.9 * (1 - done))  # warm-up, linear decay
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(data) - T - n, (B,), generator=g).to(device)
        window = data[starts[:, None] + offsets]  # (B, T + n)
        x = window[:, :T]
        batch = Batch(x, window[:, 1 : T + 1], positions, torch.zeros_like(x), "causal")
        # MTP sequential backward (reference section 10): trunk once, each head's forward+backward in
        # turn into the detached trunk output, then one backward through the trunk.
        with cast:
            trunk = model.trunk(batch)
        hidden = trunk.hidden.detach().requires_grad_()
        head1 = 0.0
        for k in range(n):
            with cast:
                logits = model.head(k, TrunkOutput(hidden, trunk.ctx))[1]  # (B, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), window[:, k + 1 : T + k + 1].flatten())
            loss.backward()
            head1 = float(loss.detach()) if k == 0 else head1
        trunk.hidden.backward(hidden.grad)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(head1)
        if step % 50 == 0 or step == args.steps - 1:
            print(f"  step {step:4d}  head-1 loss {head1:.3f}  ({time.perf_counter() - t0:.0f}s)", flush=True)
    info = {
        "train_tokens": len(stream),
        "size": size,
        "device": str(device),
        "steps": len(losses),
        "batch": B,
        "seq": T,
        "heads": n,
        "params": count_parameters(model),
        "final_head1_loss": statistics.mean(losses[-20:]),
        "train_seconds": time.perf_counter() - t0,
    }
    return model.eval(), tokenizer, info


def trained_mtp(args: argparse.Namespace) -> tuple[Decoder, list[list[int]], dict[str, Any]]:
    """The checkpoint's model, and prompts from the valid split of the store it was trained on."""
    from objtrain.data.default import default_store
    from objtrain.data.store_reader import DataSource
    from objtrain.models.checkpoint import load_checkpoint

    ckpt = load_checkpoint(Path(args.checkpoint))
    model: Decoder = ckpt.model  # type: ignore[assignment]
    if ckpt.config.kind != "decoder" or ckpt.config.mtp_heads < 2:
        raise SystemExit(f"{args.checkpoint}: not an MTP decoder (mtp_heads {ckpt.config.mtp_heads})")
    docs = DataSource(Path(args.store) if args.store else default_store()).documents("valid")
    prompts: list[list[int]] = []
    for d in range(len(docs)):
        ids = docs.tokens[docs.offsets[d] : docs.offsets[d + 1]].tolist()
        if len(ids) < args.prompt_len * args.prompts_per_file:
            continue
        for start in range(0, len(ids) - args.prompt_len, len(ids) // args.prompts_per_file):
            prompts.append(ids[start : start + args.prompt_len])
        if len(prompts) >= 6 * args.prompts_per_file:
            break
    info = {
        "checkpoint": str(ckpt.path),
        "heads": ckpt.config.mtp_heads,
        "params": count_parameters(model),
        "training": ckpt.training,
    }
    return model.eval(), prompts, info


def mtp_model(args: argparse.Namespace) -> tuple[Decoder, list[list[int]], dict[str, Any]]:
    """The MTP model of section 2 and its held-out prompts."""
    if args.checkpoint:
        model, prompts, info = trained_mtp(args)
        print(f"MTP checkpoint {info['checkpoint']} (n={info['heads']}, trained by objtrain train)")
    else:
        print(
            f"training a tiny n={args.heads} MTP decoder for {args.steps} steps (minimal loop in this script)"
        )
        model, tokenizer, info = train_mtp(args)
        prompts = held_out_prompts(tokenizer, args.prompt_len, args.prompts_per_file)
    return model, prompts, info


def speculative_benchmark(
    args: argparse.Namespace, model: Decoder, prompts: list[list[int]], info: dict[str, Any]
) -> dict[str, Any]:
    n_new = args.new_tokens
    n = info["heads"]
    tree = gen.chain_tree(n - 1) if args.tree == "chain" else gen.default_tree(n)
    plain_t, spec_t = [], []
    stats = gen.SpeculativeStats()
    identical = True
    for prompt in prompts:  # interleaved: plain, speculative, plain, ...
        t_plain, plain = time_decode(lambda p=prompt: gen.generate_decoder(model, p, n_new), args.repeats)
        # stats accumulate over the identical repeats: the ratios are unaffected
        t_spec, spec = time_decode(
            lambda p=prompt: gen.generate_speculative(model, p, n_new, stats=stats, tree=tree), args.repeats
        )
        identical &= spec == plain
        plain_t.append(t_plain / len(plain))
        spec_t.append(t_spec / len(spec))
    speedup = statistics.median(plain_t) / statistics.median(spec_t)
    cost = stats.tokens_per_forward / speedup  # one speculative forward, in greedy steps
    result = {
        **info,
        "prompts": len(prompts),
        "new_tokens": n_new,
        "tree": args.tree,
        "tree_nodes": len(tree),
        "acceptance": stats.acceptance,
        "tokens_per_forward": stats.tokens_per_forward,
        "speedup": speedup,
        "forward_cost_in_greedy_steps": cost,
        "identical_to_greedy": identical,
        "plain_tok_s": 1 / statistics.median(plain_t),
        "speculative_tok_s": 1 / statistics.median(spec_t),
    }
    print(
        f"speculative (n={n}, {args.tree} tree of {len(tree)} nodes, {len(prompts)} held-out prompts): "
        f"acceptance {stats.acceptance:.1%}, "
        f"{stats.tokens_per_forward:.2f} tokens/forward, {result['speculative_tok_s']:.0f} vs "
        f"{result['plain_tok_s']:.0f} tok/s greedy -> x{speedup:.2f} (target x1.8); "
        f"identical to greedy: {identical}\n"
        f"  one speculative forward costs {cost:.2f} greedy steps here: x1.8 needs "
        f"{1.8 * cost:.2f} tokens/forward",
        flush=True,
    )
    return result


def step_seconds(step: Callable[[], object], n: int) -> float:
    """Seconds per call of `step()` (one decoding step), over n calls after a short warm-up."""
    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) / n


def cost_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """One speculative step against one greedy step, per model size (random init: speed only)."""
    out: dict[str, Any] = {}
    n_steps = 40
    for size in args.cost_sizes:
        torch.manual_seed(0)
        cfg = model_config("decoder", size, {"mtp_heads": 4}, vocab_size=4096)
        model: Decoder = build_model(cfg).eval()  # type: ignore[assignment]
        prompt = torch.randint(300, 4096, (args.prompt_len,)).tolist()
        trees = {"chain": gen.chain_tree(3), "default": gen.default_tree(4)}
        times: dict[str, list[float]] = {"greedy": [], **{k: [] for k in trees}}
        for _ in range(args.repeats + 2):  # interleaved
            greedy = gen.generate_decoder(model, prompt, n_steps + 8)
            times["greedy"].append(step_seconds(lambda g=greedy: next(g), n_steps))
            for name, tree in trees.items():
                spec = gen.TreeSpeculator(model, prompt, 8 * (n_steps + 8), tree)
                times[name].append(step_seconds(spec.step, n_steps))
        greedy_s = statistics.median(times["greedy"])
        ratios = {k: statistics.median(times[k]) / greedy_s for k in trees}
        out[size] = {"greedy_ms": greedy_s * 1e3, **{f"{k}_in_greedy_steps": r for k, r in ratios.items()}}
        print(
            f"verification cost ({size} decoder, n=4, {count_parameters(model) / 1e6:.1f}M params): "
            f"greedy step {greedy_s * 1e3:.2f} ms; a speculative step costs "
            + ", ".join(
                f"{r:.2f} greedy steps with the {k} tree (x1.8 needs {1.8 * r:.2f} tokens/forward)"
                for k, r in ratios.items()
            ),
            flush=True,
        )
    return out


def _timed_tokens(run: Callable[[], list[int]], device: torch.device) -> tuple[float, list[int]]:
    """(seconds, tokens) of one generation; it ends by reading its last token on the host, and the
    device is synchronised as well, so the time covers all of its work."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = run()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def decoding_speed(
    model: Decoder,
    prompts: list[list[int]],
    new_tokens: int = 256,
    repeats: int = 1,
    compile: bool = False,
) -> dict[str, Any]:
    """Greedy and speculative decoding speed of `model` (eval mode, on its own device) over `prompts`.

    Returns tok/s (total new tokens / total seconds, medians over `repeats`) for: greedy on the dynamic
    path (`greedy_dynamic_tok_s`), greedy on static caches with captured steps (`greedy_static_tok_s`),
    and, for an MTP model (mtp_heads > 1), static speculative decoding (`speculative_tok_s`) with its
    `speculative_speedup` over static greedy, `acceptance` and `tokens_per_forward`; `identical` says
    every static and speculative output equals dynamic greedy. Each path decodes the longest prompt once
    untimed first: the steps are built (and on CUDA captured, or compiled) there and kept for the rest.
    """
    model = model.eval()
    device = model.embed.weight.device
    longest = max(prompts, key=len)
    spec = model.config.mtp_heads > 1
    runs: dict[str, Callable[[list[int], gen.SpeculativeStats], list[int]]] = {
        "greedy_dynamic": lambda p, st: list(gen.generate_decoder(model, p, new_tokens, static=False)),
        "greedy_static": lambda p, st: list(
            gen.generate_decoder(model, p, new_tokens, static=True, compile=compile)
        ),
    }
    if spec:
        runs["speculative"] = lambda p, st: list(
            gen.generate_speculative(model, p, new_tokens, stats=st, static=True, compile=compile)
        )
    warm_s: dict[str, float] = {}
    for name, run in runs.items():  # build, capture (or compile) once
        warm_s[name] = _timed_tokens(lambda r=run: r(longest, gen.SpeculativeStats()), device)[0]
    reference = {
        i: list(gen.generate_decoder(model, p, new_tokens, static=False)) for i, p in enumerate(prompts)
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    tokens = {name: 0 for name in runs}
    identical = True
    stats = gen.SpeculativeStats()
    for r in range(repeats):
        for name, run in runs.items():  # interleaved: the machine may be shared
            total = 0.0
            for i, prompt in enumerate(prompts):
                elapsed, out = _timed_tokens(lambda run=run, p=prompt: run(p, stats), device)
                total += elapsed
                identical &= out == reference[i]
                if r == 0:
                    tokens[name] += len(out)
            seconds[name].append(total)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "params": count_parameters(model),
        "prompts": len(prompts),
        "new_tokens": new_tokens,
        "compile": compile,
        "identical": identical,
        "first_call_s": warm_s,
        **{f"{name}_tok_s": tokens[name] / statistics.median(seconds[name]) for name in runs},
    }
    if spec:
        result["speculative_speedup"] = result["speculative_tok_s"] / result["greedy_static_tok_s"]
        result["acceptance"] = stats.acceptance
        result["tokens_per_forward"] = stats.tokens_per_forward
    result["static_speedup"] = result["greedy_static_tok_s"] / result["greedy_dynamic_tok_s"]
    return result


def held_out_prompts(tokenizer: Tokenizer, prompt_len: int, per_file: int) -> list[list[int]]:
    """`per_file` prompts of `prompt_len` tokens from each standard-library module left out of training."""
    prompts = []
    for name in HELD_OUT:
        ids = tokenizer.encode((STDLIB / name).read_text(encoding="utf-8"))
        for start in range(0, len(ids) - prompt_len, len(ids) // per_file):
            prompts.append(ids[start : start + prompt_len])
    return prompts


def decoding_benchmark(
    device: str | None = None,
    size: str = "small",
    heads: int = 4,
    train_seconds: float = 60.0,
    n_prompts: int = 12,
    new_tokens: int = 256,
    compile: bool = False,
) -> dict[str, Any]:
    """Everything `decoding_speed` needs, made here: an n-head MTP decoder of `size` trained for
    `train_seconds` on the standard library (this script's minimal loop, bf16 on CUDA), `n_prompts`
    held-out prompts of 64 tokens; then `decoding_speed` on `device` (default cuda when there is one).
    The result adds `cuda: False` when it measured the CPU only."""
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    args = argparse.Namespace(
        corpus_bytes=3_000_000, vocab=2048, heads=heads, layers=0, lr=3e-3, batch=32, seq=256,
        steps=1_000_000, mtp_size=size, train_device=dev, train_seconds=train_seconds,
    )  # fmt: skip
    model, tokenizer, info = train_mtp(args)
    prompts = held_out_prompts(tokenizer, 64, max(1, -(-n_prompts // len(HELD_OUT))))[:n_prompts]
    out = decoding_speed(model, prompts, new_tokens, compile=compile)
    return {**out, "cuda": dev.startswith("cuda"), "training": info}


def static_benchmark(args: argparse.Namespace, model: Decoder, prompts: list[list[int]]) -> dict[str, Any]:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        print("no CUDA here: static decoding measured on the CPU only (eager steps, no CUDA graphs)")
    model = model.to(device)
    out = decoding_speed(model, prompts, args.new_tokens, args.repeats, compile=args.compile)
    line = (
        f"static decoding on {out['device']} ({out['params'] / 1e6:.1f}M params, {len(prompts)} prompts x "
        f"{args.new_tokens} tokens{', compiled' if args.compile else ''}): greedy "
        f"{out['greedy_dynamic_tok_s']:.0f} tok/s dynamic -> {out['greedy_static_tok_s']:.0f} static "
        f"(x{out['static_speedup']:.2f})"
    )
    if "speculative_tok_s" in out:
        line += (
            f"; speculative {out['speculative_tok_s']:.0f} tok/s, x{out['speculative_speedup']:.2f} over "
            f"static greedy (acceptance {out['acceptance']:.0%}, "
            f"{out['tokens_per_forward']:.2f} tokens/forward)"
        )
    print(line + f"; identical to greedy: {out['identical']}", flush=True)
    return out


def build_char_store(path: Path) -> None:
    """Tiny shakespeare as `bench_train.py`'s nanoGPT benchmark tokenizes it, kept at `path`."""
    import shutil
    import tempfile

    from bench_train import SHAKESPEARE, shakespeare_store

    if not SHAKESPEARE.is_file():
        raise SystemExit(f"skipped: {SHAKESPEARE} is not here (the shared data sits beside the project)")
    with tempfile.TemporaryDirectory(prefix="char-store-") as tmp:
        store, info = shakespeare_store(Path(tmp))
        if path.exists():
            shutil.rmtree(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(store), str(path))
    print(
        f"{path}: {info['train_tokens']:,} train / {info['valid_tokens']:,} valid characters, "
        f"vocabulary {info['vocab_size']}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="tiny", help="model size for the KV-cache benchmark")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument(
        "--layers", type=int, default=0, help="n_layer of the MTP model (trunk = layers - 1; 0: its size's)"
    )
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--corpus-bytes", type=int, default=3_000_000)
    ap.add_argument("--prompts-per-file", type=int, default=3)
    ap.add_argument(
        "--tree", choices=["default", "chain"], default="default", help="draft tree (chain: argmaxes only)"
    )
    ap.add_argument("--skip-cache", action="store_true")
    ap.add_argument("--skip-static", action="store_true", help="leave out section 4 (static decoding)")
    ap.add_argument("--device", default=None, help="section 4's device (default: cuda when there is one)")
    ap.add_argument("--compile", action="store_true", help="section 4: torch.compile each static step too")
    ap.add_argument(
        "--cost-sizes",
        nargs="*",
        default=["tiny", "small"],
        help="model sizes for the verification-cost section (none: skip it)",
    )
    ap.add_argument("--checkpoint", default=None, help="an MTP run or checkpoint from `objtrain train`")
    ap.add_argument("--store", default=None, help="its token store (prompts from the valid split)")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--char-store",
        default=None,
        help="build tiny shakespeare's char store (nanoGPT's split, as bench_train.py) at this path and exit",
    )
    args = ap.parse_args()
    if args.char_store:
        build_char_store(Path(args.char_store))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    out: dict[str, Any] = {}
    if not args.skip_cache:
        out["kv_cache"] = cache_benchmark(args)
    model, prompts, info = mtp_model(args)
    out["speculative"] = speculative_benchmark(args, model, prompts, info)
    if args.cost_sizes:
        out["verification_cost"] = cost_benchmark(args)
    if not args.skip_static:
        out["static"] = static_benchmark(args, model, prompts)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
