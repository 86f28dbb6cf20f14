"""The FLOPs accounting (`objtrain.training.accounting.batch_flops`) against a measured count: for every
objective and every model kind it trains (MTP at 1, 2 and 4 heads), one real corrupted batch through
forward, loss and backward under `torch.utils.flop_counter.FlopCounterMode`, the estimate over the count.

Attention runs through PyTorch's math kernel here: the counter has no formula for the CPU's fused
attention kernel and would miss attention altogether (the estimate then reads 16% high at T = 64,
d = 32). The models are the `debug` and `tiny` sizes at the sequence length given.

    .venv/bin/python benchmarks/bench_flops.py            # debug and tiny, seq-len 128
    .venv/bin/python benchmarks/bench_flops.py --seq-len 256 --sizes tiny
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

import torch

from objtrain.data.tokenizer import Tokenizer, train_sentencepiece
from objtrain.errors import UserError
from objtrain.models.zoo import build_model, model_config
from objtrain.objectives.base import Objective
from objtrain.objectives.registry import OBJECTIVES, build_objective, objective_class
from objtrain.specials import Specials
from objtrain.training import accounting

# Objective settings that make a batch exercise what the accounting must count.
OVERRIDES = {"contrastive": {"views": "crop"}}  # dropout views need model dropout; crops differ without it


def cases(tokenizer: Tokenizer) -> list[tuple[str, str, int]]:
    """(objective, model kind, MTP heads) for every objective and kind it trains (a mixture: the kinds its
    default components train)."""
    out = []
    for name in OBJECTIVES:
        for kind in objective_class(name).model_kinds:
            try:
                build_objective(name, tokenizer.specials, tokenizer, kind, OVERRIDES.get(name))
            except UserError:
                continue
            for heads in (1, 2, 4) if name == "mtp" else (1,):
                out.append((name, kind, heads))
    return out


def measure(
    name: str, kind: str, heads: int, size: str, seq_len: int, tokenizer: Tokenizer, ids: torch.Tensor,
    rows: int = 4,
) -> tuple[float, float]:  # fmt: skip
    """(estimated, measured) training FLOPs of one batch of `rows` raw rows."""
    overrides = dict(OVERRIDES.get(name, {}))
    if name == "mtp":
        overrides["n"] = heads
    objective: Objective = build_objective(
        name, tokenizer.specials, tokenizer=tokenizer, model_kind=kind, overrides=overrides
    )
    cfg = model_config(
        kind, size, {"mtp_heads": heads} if heads > 1 else None, vocab_size=tokenizer.vocab_size
    )
    torch.manual_seed(0)
    model = build_model(cfg)
    width = objective.raw_length(seq_len)
    raw = ids[: rows * width].reshape(rows, width)
    batch = objective(raw, torch.zeros_like(raw), torch.arange(rows), 0)
    return accounting.batch_flops(cfg, batch), accounting.measured_batch_flops(model, objective, batch)


def tokenizer_and_ids(specials: Specials | None = None) -> tuple[Tokenizer, torch.Tensor]:
    """A small tokenizer and a long token stream, from two standard-library modules."""
    specials = specials or Specials()
    src = Path(sysconfig.get_paths()["stdlib"])
    text = "".join((src / n).read_text(encoding="utf-8") for n in ("textwrap.py", "shlex.py", "argparse.py"))
    proto = train_sentencepiece(text.splitlines(keepends=True), 1000, "unigram", specials)
    tok = Tokenizer(proto, specials)
    return tok, torch.tensor(tok.encode(text), dtype=torch.long)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--sizes", default="debug,tiny")
    args = parser.parse_args()
    tok, ids = tokenizer_and_ids()
    print(
        f"{'objective':12} {'kind':8} {'heads':>5} {'size':6} {'estimated':>11} {'measured':>11} {'ratio':>7}"
    )
    for size in args.sizes.split(","):
        for name, kind, heads in cases(tok):
            est, got = measure(name, kind, heads, size, args.seq_len, tok, ids)
            print(f"{name:12} {kind:8} {heads:5d} {size:6} {est:11.4g} {got:11.4g} {est / got:7.3f}")


if __name__ == "__main__":
    main()
