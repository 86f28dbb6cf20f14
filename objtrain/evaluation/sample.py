"""What `objtrain train` prints once a run has trained to its end: a short greedy continuation of a held-out
document (decoders) and, for a FIM model, an infill, a first look at what was learnt. Called by the loop
through its `after` hook, so that decoding stays above training."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from torch import nn

from objtrain.models import generate as gen
from objtrain.models.checkpoint import unwrap
from objtrain.training.plan import Plan
from objtrain.training.records import training_info


def print_sample(console: Console, plan: Plan, model: nn.Module) -> None:
    """A short greedy continuation (decoders) and, for FIM models, an infill: a look at what was learnt."""
    plain: Any = unwrap(model)
    plain.eval()
    tok = plan.source.tokenizer
    s = plan.source.specials
    if plan.model_cfg.kind != "decoder":
        return
    docs = plan.source.documents(plan.cfg.data.valid_split if plan.has_valid else "train")
    first = tok.decode(docs.tokens[docs.offsets[0] : docs.offsets[0] + 24].tolist())
    prompt = first[: max(len(first) // 2, 1)]
    ids = tok.encode(prompt)
    out = list(gen.generate_decoder(plain, ids, 48, stop_ids=(s.eos,)))
    console.print("[bold]sample[/] (greedy):", highlight=False)
    console.print(f"[dim]{escape(prompt)}[/]{escape(tok.decode(out))}", highlight=False, markup=True)
    if plan.objective.fim_sentinels:
        prefix, suffix = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
        mode = training_info(plan, 0, 0)["fim_mode"]
        fill = list(
            gen.generate_decoder(
                plain, gen.fim_prompt(tok, prefix, suffix, mode), 24, stop_ids=(s.eos, s.fim_pad)
            )
        )
        console.print(
            f"[bold]infill[/] ({mode}): {escape(repr(prefix))} [bold]{escape(repr(tok.decode(fill)))}[/] "
            f"{escape(repr(suffix))}",
            highlight=False,
        )
