"""objtrain on a CUDA GPU, in one command: the training step, the loop around it, --time and decoding.

    PYTHONPATH=$PWD python3 benchmarks/bench_gpu.py                    # the standard-library store
    PYTHONPATH=$PWD python3 benchmarks/bench_gpu.py --store STORE --json gpu.json

1. bare: one training step (forward, loss, backward, clip, fused AdamW; bf16 autocast) on random ids, one
   document a row, at the small (32 x 1024) and base (16 x 1024) decoder shapes with a 32,000 vocabulary:
   objtrain eager and compiled against Hugging Face `LlamaForCausalLM` (the same widths, SDPA, fused
   AdamW) eager and compiled; and objtrain compiled on real packed rows of the store (document masking on),
   the bare step the loop is measured against, with FlexAttention block masks (the CUDA default) and with
   the dense masked SDPA they replace. Tokens/s and MFU over a window of synchronised steps
   after warm-up (compilation reported apart).
2. train: `objtrain train` (its `train()`, defaults: compile auto, workers auto) with a --time budget per
   objective on the small model at seq-len 1024, and clm on the base model: steady tokens/s (steps after
   the first, which compiles), MFU, data wait, the loop's share of its bare compiled step (clm), and
   --time accuracy (the steps' wall time over the budget).
3. decode: the MTP model trained in 2 (4 heads), 12 prompts of the store's held-out text, through
   bench_generate's `decoding_speed`: greedy on the dynamic path and on static caches with captured steps,
   and static MTP self-speculative decoding: tokens/s, speed-ups, acceptance, output identical to greedy.

The measurements run most telling first (`plan`), not section by section; none starts that would end
past --minutes (default 8) by its own estimate, and the skipped ones are named; the end prints them as
one Markdown table (`table`). All figures use one FLOPs formula (`training.accounting.flops_per_step`)
and the card's dense bf16 peak (`accounting.peak_flops`). Without CUDA it says so and exits 0: its
figures need a real card.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))  # bench_generate's decoding measurement

from objtrain.batch import Batch  # noqa: E402
from objtrain.training import accounting  # noqa: E402

OBJECTIVES = ["clm", "mtp", "fim", "ul2", "mlm", "span", "bart"]
SHAPES = {"small": (32, 1024), "base": (16, 1024), "tiny": (4, 128)}  # rows x seq-len of one step
DEVICE = torch.device("cuda")  # --device cpu only checks the script's code paths: its figures mean nothing


class Deadline:
    """The command's time budget: a section asks before starting a measurement."""

    def __init__(self, minutes: float) -> None:
        self.end = time.monotonic() + 60 * minutes
        self.skipped: list[str] = []

    def allows(self, what: str, needs_s: float = 0.0) -> bool:
        if time.monotonic() + needs_s <= self.end:
            return True
        self.skipped.append(what)
        print(f"  skipped (over --minutes): {what}", flush=True)
        return False


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def timed_steps(step: Callable[[], None], warmup: int, window_s: float) -> tuple[float, float, int]:
    """(warm-up seconds, seconds per step, steps timed): `warmup` steps (compilation), then steps until
    `window_s` has passed, synchronised at both ends."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    sync()
    warm = time.perf_counter() - t0
    n, t0 = 0, time.perf_counter()
    while True:
        for _ in range(5):
            step()
        n += 5
        sync()
        if time.perf_counter() - t0 >= window_s:
            break
    return warm, (time.perf_counter() - t0) / n, n


def random_batch(rows: int, seq: int, vocab: int, device: torch.device) -> Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (rows, seq + 1), generator=g)
    positions = torch.arange(seq).expand(rows, seq).clone()
    batch = Batch(
        input_ids=ids[:, :-1].contiguous(),
        labels=ids[:, 1:].contiguous(),
        positions=positions,
        document_ids=torch.zeros(rows, seq, dtype=torch.int64),
        attention="causal",
    ).mark_layout()
    return batch.to(device)


def store_batch(store: Path, rows: int, seq: int, device: torch.device) -> tuple[Batch, int]:
    """Real packed clm rows of the store (several documents a row: the document mask is on)."""
    from objtrain.data.batches import leading_batches
    from objtrain.data.mixture import open_stores
    from objtrain.objectives.registry import build_objective

    source = open_stores(str(store), None)
    objective = build_objective("clm", source.specials, source.tokenizer, "decoder")
    (batch,) = leading_batches(source.stream("train", 0), objective, seq, rows, rows, 0, within_epoch=False)
    return batch.mark_layout().to(device), source.tokenizer.vocab_size


def objtrain_step(model_cfg: Any, batch: Batch, compiled: bool, device: torch.device) -> Callable[[], None]:
    from objtrain.models.zoo import build_model
    from objtrain.objectives.base import token_loss
    from objtrain.training.config import OptimConfig
    from objtrain.training.optim import build_optimizer

    torch.manual_seed(0)
    model = build_model(model_cfg).to(device).train()
    optimizer = build_optimizer(model, OptimConfig(), device)
    params = [p for g in optimizer.param_groups for p in g["params"]]

    def loss(b: Batch) -> Any:
        return token_loss(model(b).logits, b.labels)

    loss_of = torch.compile(loss) if compiled else loss
    n = float((batch.labels != -100).sum())

    def step() -> None:
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            lo = loss_of(batch)
        (lo.loss_sum / n).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def hf_llama(model_cfg: Any, seq: int) -> Any:
    """Hugging Face `LlamaForCausalLM` with the decoder's widths (as `objtrain export` writes it), SDPA."""
    import transformers

    from objtrain.interop.llama import llama_config

    settings = llama_config(model_cfg, seq)
    for key in ("architectures", "model_type", "torch_dtype", "dtype"):
        settings.pop(key, None)  # the file's identity, not the model's shape
    config = transformers.LlamaConfig(**settings)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def hf_step(model_cfg: Any, batch: Batch, compiled: bool, device: torch.device) -> Callable[[], None]:
    model = hf_llama(model_cfg, batch.input_ids.size(1)).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), fused=DEVICE.type == "cuda")
    forward = torch.compile(model) if compiled else model
    ids, labels = batch.input_ids, batch.labels

    def step() -> None:
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            logits = forward(input_ids=ids, use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _made(maker: Callable[..., Callable[[], None]], cfg: Any, rows: int, seq: int, compiled: bool) -> Any:
    """A variant's step, built when it is measured (one model on the card at a time)."""
    device = DEVICE
    return lambda: maker(cfg, random_batch(rows, seq, cfg.vocab_size, device), compiled, device)


def _real(store: Path, size: str, rows: int, seq: int, kernel: str = "auto") -> Any:
    """objtrain compiled on the store's packed rows: with the default kernel (FlexAttention block masks on
    CUDA) the bare step the loop is measured against; with `sdpa`, the dense document mask it replaced."""
    from objtrain.models.zoo import model_config

    def make() -> Callable[[], None]:
        device = DEVICE
        batch, vocab = store_batch(store, rows, seq, device)
        cfg = model_config("decoder", size, {"attention_kernel": kernel}, vocab_size=vocab)
        return objtrain_step(cfg, batch, True, device)

    return make


STORE_ROWS = "objtrain compiled, store rows"  # the bare step the loop is measured against
BARE_VARIANTS = [
    "objtrain eager",
    "objtrain compiled",
    "HF Llama eager",
    "HF Llama compiled",
    STORE_ROWS,
    f"{STORE_ROWS}, masked SDPA",
]


def bench_bare(
    args: argparse.Namespace, deadline: Deadline, peak: float, size: str, names: list[str]
) -> list[dict[str, Any]]:
    """The bare step of the `size` decoder, for each of the variants `names` (of BARE_VARIANTS)."""
    from objtrain.models.zoo import model_config

    out: list[dict[str, Any]] = []
    rows, seq = SHAPES[size]
    cfg = model_config("decoder", size, {}, vocab_size=32000)
    flops = accounting.flops_per_step(cfg, rows, seq)
    makers = {
        "objtrain eager": _made(objtrain_step, cfg, rows, seq, False),
        "objtrain compiled": _made(objtrain_step, cfg, rows, seq, True),
        "HF Llama eager": _made(hf_step, cfg, rows, seq, False),
        "HF Llama compiled": _made(hf_step, cfg, rows, seq, True),
        STORE_ROWS: _real(args.store, size, rows, seq),
        f"{STORE_ROWS}, masked SDPA": _real(args.store, size, rows, seq, "sdpa"),
    }
    for name, make in ((n, makers[n]) for n in names):
        # what a variant may take: compilation (about a minute cold for the base decoder) and the window
        if not deadline.allows(f"bare {size} {name}", args.window + (15 if "eager" in name else 60)):
            continue
        row: dict[str, Any] = {"section": "bare", "size": size, "variant": name, "rows": rows, "seq": seq}
        try:
            step = make()
            warm, per_step, n = timed_steps(step, 3, args.window)
        except Exception as exc:  # a failed variant is reported, the others run
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"  bare {size:5s} {name:42s} failed: {row['error']}", flush=True)
            out.append(row)
            continue
        f = flops
        if name.startswith(STORE_ROWS):
            f = accounting.flops_per_step(model_config("decoder", size, {}, vocab_size=args.vocab), rows, seq)
        row |= {
            "tokens_per_s": rows * seq / per_step,
            "mfu": f / per_step / peak,
            "warmup_s": warm,
            "steps": n,
        }
        print(
            f"  bare {size:5s} {name:42s} {row['tokens_per_s']:>12,.0f} tok/s  MFU {row['mfu']:6.1%}  "
            f"(warm-up {warm:.1f} s, {n} steps)",
            flush=True,
        )
        out.append(row)
        torch.cuda.empty_cache()
    return out


def bench_train(
    args: argparse.Namespace,
    deadline: Deadline,
    work: Path,
    bare: list[dict[str, Any]],
    runs: list[tuple[str, str]],
) -> list[dict]:
    """`objtrain train` with a --time budget for each (objective, size) of `runs`."""
    from rich.console import Console

    from objtrain.training.config import build_config
    from objtrain.training.loop import train

    out: list[dict[str, Any]] = []
    for objective, size in runs:
        if not deadline.allows(f"train {objective} {size}", args.seconds + 60):  # + start-up, compilation
            continue
        kind = {"mlm": "encoder", "span": "encdec", "bart": "encdec"}.get(objective, "decoder")
        rows, seq = SHAPES[size]
        overrides = {"n": 4} if objective == "mtp" else {}
        cfg = build_config(
            {
                "data": {"store": str(args.store)},
                "model": {"kind": kind, "size": size},
                "objective": {"name": objective, "overrides": overrides},
                "batch": {"seq_len": seq, "batch_size": rows},
                "budget": {"seconds": args.seconds},
                "precision": {"dtype": "bf16"},
                "validation": {"every": -1},
                "checkpoint": {"keep": 1},
                "logging": {"every": 50, "tensorboard": False, "sample": False},
                "device": DEVICE.type,
            }
        )
        run = work / f"{objective}-{size}"
        row: dict[str, Any] = {"section": "train", "objective": objective, "size": size, "run": str(run)}
        try:
            result = train(
                cfg, run, force=True, console=Console(stderr=True, quiet=True), show_progress=False
            )
        except Exception as exc:  # a failed run is reported, the others run
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"  train {objective:5s} {size:5s} failed: {row['error']}", flush=True)
            out.append(row)
            continue
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        steps = [r for r in records if "loss" in r]
        compile_event = next((r for r in records if r.get("event") == "compile"), None)
        steady = steps[1:] or steps  # the first step compiles
        tokens = steady[-1]["tokens"] - steps[0]["tokens"]
        span = steady[-1]["wall_time"] - steps[0]["wall_time"]
        times = [1 / r["tokens_per_s"] for r in steady]  # each step's time, up to one factor
        waits = [r["data_wait_frac"] * t for r, t in zip(steady, times, strict=True)]
        row |= {
            "steps": result.step,
            "tokens_per_s": tokens / span if span > 0 else float("nan"),
            "mfu": result.mfu,
            "data_wait": sum(waits) / sum(times),
            "time_ratio": steps[-1]["wall_time"] / args.seconds,
            "first_step_s": compile_event["first_step_seconds"] if compile_event else steps[0]["wall_time"],
            "compiled": compile_event["mode"] if compile_event else "eager",
            "checkpoint": str(result.checkpoint),
        }
        if objective == "clm":
            ref = next((b for b in bare if b["size"] == size and b["variant"] == STORE_ROWS), None)
            if ref is not None and "tokens_per_s" in ref:
                row["of_bare_compiled"] = row["tokens_per_s"] / ref["tokens_per_s"]
        print(
            f"  train {objective:5s} {size:5s} {row['tokens_per_s']:>12,.0f} tok/s  MFU {row['mfu']:6.1%}  "
            f"data wait {row['data_wait']:6.2%}  --time {args.seconds:g} s -> {steps[-1]['wall_time']:.1f} s "
            f"({row['time_ratio']:.3f})  first step {row['first_step_s']:.1f} s ({row['compiled']})"
            + (f"  loop/bare {row['of_bare_compiled']:.2f}" if "of_bare_compiled" in row else ""),
            flush=True,
        )
        out.append(row)
        torch.cuda.empty_cache()
    return out


def bench_decode(
    args: argparse.Namespace, deadline: Deadline, trained: list[dict[str, Any]]
) -> dict[str, Any]:
    from bench_generate import decoding_speed  # the decoding benchmark's own measurement

    from objtrain.data.mixture import open_stores
    from objtrain.models.checkpoint import load_checkpoint

    mtp = next((r for r in trained if r.get("objective") == "mtp" and "checkpoint" in r), None)
    if mtp is None or not deadline.allows("decode", 60):
        print("  decode: no MTP model was trained (see train above): skipped", flush=True)
        return {}
    loaded = load_checkpoint(Path(mtp["checkpoint"]), device=DEVICE)
    model = loaded.model.eval()
    source = open_stores(str(args.store), None)
    docs = source.documents("valid" if source.has_split("valid") else "train")
    prompts = []
    for i in range(len(docs.offsets) - 1):
        a, b = int(docs.offsets[i]), int(docs.offsets[i + 1])
        if b - a >= 32:
            prompts.append(docs.tokens[a : a + 32].tolist())
        if len(prompts) == args.prompts:
            break
    with torch.no_grad():
        results = {"section": "decode", **decoding_speed(model, prompts, args.new_tokens)}
    print(
        f"  decode greedy {results['greedy_dynamic_tok_s']:,.0f} tok/s dynamic, "
        f"{results['greedy_static_tok_s']:,.0f} static (x{results['static_speedup']:.2f}); speculative "
        f"{results['speculative_tok_s']:,.0f} tok/s (x{results['speculative_speedup']:.2f} over static "
        f"greedy, acceptance {results['acceptance']:.0%}, {results['tokens_per_forward']:.2f} tokens a "
        f"forward); identical to greedy: {results['identical']}",
        flush=True,
    )
    return results


def table(report: dict[str, Any]) -> str:
    """The report as one Markdown table, side by side, in the order a reader compares them (the README's
    GPU section takes it as printed)."""
    lines = ["| measured | tokens/s | MFU | beside it |", "| --- | --- | --- | --- |"]
    bare = [b for b in report["bare"] if "tokens_per_s" in b]
    for b in sorted(bare, key=lambda b: (list(SHAPES).index(b["size"]), BARE_VARIANTS.index(b["variant"]))):
        # objtrain against HF Llama at the same shapes; FlexAttention block masks against the dense mask
        peer_name = (
            f"{STORE_ROWS}, masked SDPA"
            if b["variant"] == STORE_ROWS
            else b["variant"].replace("objtrain", "HF Llama")
        )
        peer = next((p for p in bare if p["size"] == b["size"] and p["variant"] == peer_name), None)
        note = (
            f"x{b['tokens_per_s'] / peer['tokens_per_s']:.2f} {peer_name}" if peer and peer is not b else ""
        )
        shape = f"{b['rows']} x {b['seq']}"
        lines.append(
            f"| bare step, {b['size']} decoder ({shape}), {b['variant']} | {b['tokens_per_s']:,.0f} | "
            f"{b['mfu']:.1%} | {note} |"
        )
    for r in report["train"]:
        if "tokens_per_s" not in r:
            continue
        loop = f", loop/bare {r['of_bare_compiled']:.2f}" if "of_bare_compiled" in r else ""
        lines.append(
            f"| `objtrain train` {r['objective']} {r['size']} ({r['compiled']}) | {r['tokens_per_s']:,.0f} | "
            f"{r['mfu']:.1%} | data wait {r['data_wait']:.2%}, --time x{r['time_ratio']:.3f}, first step "
            f"{r['first_step_s']:.1f} s{loop} |"
        )
    d = report["decode"]
    if d:
        lines.append(
            f"| greedy decoding, static caches, captured steps | {d['greedy_static_tok_s']:,.0f} | | "
            f"x{d['static_speedup']:.2f} the dynamic path ({d['greedy_dynamic_tok_s']:,.0f}) |"
        )
        lines.append(
            f"| MTP self-speculative decoding | {d['speculative_tok_s']:,.0f} | | "
            f"x{d['speculative_speedup']:.2f} greedy, acceptance {d['acceptance']:.0%}, "
            f"{d['tokens_per_forward']:.2f} tokens a forward, identical to greedy: {d['identical']} |"
        )
    failed = [
        f"{r.get('variant') or r.get('objective')} {r['size']}"
        for r in report["bare"] + report["train"]
        if "error" in r
    ]
    if failed:
        lines.append(f"\nfailed: {', '.join(failed)}")
    return "\n".join(lines)


def plan(args: argparse.Namespace) -> list[tuple[str, str, list[str]]]:
    """The measurements as (section, size, variants or objectives), most telling first, so that a card
    lent for less than the whole command still answers the main questions: the loop against its own bare
    compiled step (small, then base, whose MFU is the headline), the compiled step against HF Llama's, the
    MTP model and its decoding, the other objectives' data wait, then eager and masked-SDPA variants."""
    small = "small" if "small" in args.sizes else args.sizes[0]
    base = "base" if "base" in args.sizes else None
    steps: list[tuple[str, str, list[str]]] = [
        ("bare", small, [STORE_ROWS]),
        ("train", small, ["clm"]),
    ]
    if base is not None:
        steps += [
            ("bare", base, [STORE_ROWS]),
            ("train", base, ["clm"]),
            ("bare", base, ["objtrain compiled", "HF Llama compiled"]),
        ]
    steps += [
        ("train", small, ["mtp"]),
        ("decode", small, []),
        ("train", small, [o for o in args.objectives if o not in ("clm", "mtp")]),
        ("bare", small, ["objtrain compiled", "HF Llama compiled"]),
    ]
    steps += [
        ("bare", s, ["objtrain eager", "HF Llama eager", f"{STORE_ROWS}, masked SDPA"]) for s in args.sizes
    ]
    elsewhere = [s for s in args.sizes if s not in (small, base)]  # e.g. --sizes tiny small base
    steps += [("bare", s, ["objtrain compiled", "HF Llama compiled", STORE_ROWS]) for s in elsewhere]
    wanted = [
        (what, size, [i for i in items if what != "train" or i in args.objectives])
        for what, size, items in steps
        if what in args.only
    ]
    return [(what, size, items) for what, size, items in wanted if items or what == "decode"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--store", type=Path, default=None, help="a token store (default: the standard-library one)"
    )
    ap.add_argument("--sizes", nargs="+", default=["small", "base"], choices=sorted(SHAPES))
    ap.add_argument("--objectives", nargs="+", default=OBJECTIVES)
    ap.add_argument("--seconds", type=float, default=20.0, help="--time budget of each train run")
    ap.add_argument("--window", type=float, default=3.0, help="seconds of timed bare steps per variant")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument(
        "--minutes", type=float, default=8.0, help="start no measurement that would end past this"
    )
    ap.add_argument(
        "--only", nargs="+", default=["bare", "train", "decode"], choices=["bare", "train", "decode"]
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: a check of the script itself
    args = ap.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        print(
            f"bench_gpu.py needs a CUDA GPU: torch {torch.__version__} sees none on this machine, so nothing "
            "was measured (its figures must come from a real card; run it on a GPU host)."
        )
        return 0
    deadline = Deadline(args.minutes)
    device = DEVICE
    peak, peak_source = accounting.peak_flops(device, "bf16")
    try:
        import transformers

        hf = transformers.__version__
    except ImportError:
        hf = "not installed (HF rows fail)"
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (a check of the script)"
    print(
        f"{card}, torch {torch.__version__}, CUDA {torch.version.cuda}, transformers {hf}; "
        f"bf16 peak {peak / 1e12:,.0f} TFLOP/s ({peak_source})",
        flush=True,
    )
    if args.store is None:
        from objtrain.data.default import default_store

        args.store = default_store()
    from objtrain.data.mixture import open_stores

    args.vocab = open_stores(str(args.store), None).tokenizer.vocab_size
    print(f"store {args.store} (vocabulary {args.vocab:,})", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    report: dict[str, Any] = {"card": card, "torch": str(torch.__version__), "peak_flops": peak}
    started = time.monotonic()
    bare: list[dict[str, Any]] = []
    trained: list[dict[str, Any]] = []
    decoded: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for what, size, items in plan(args):
            if what == "bare":
                bare += bench_bare(args, deadline, peak, size, items)
            elif what == "train":
                trained += bench_train(args, deadline, Path(tmp), bare, [(o, size) for o in items])
            else:
                decoded = bench_decode(args, deadline, trained)
    report |= {"bare": bare, "train": trained, "decode": decoded, "skipped": deadline.skipped}
    report["minutes"] = (time.monotonic() - started) / 60
    print(f"\n{card}, torch {torch.__version__}, CUDA {torch.version.cuda}\n\n{table(report)}\n")
    print(
        f"done in {report['minutes']:.1f} min"
        + (f"; skipped: {', '.join(deadline.skipped)}" if deadline.skipped else "")
    )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
