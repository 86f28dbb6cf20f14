"""`objtrain export`: a checkpoint or run -> a Hugging Face transformers directory, checked by loading it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from objtrain.cli.common import make_console

# `\\[hf]`: --help renders rich markup, where a bare [hf] is a tag and vanishes
HELP = """Export a checkpoint (or a run's newest one) as a Hugging Face transformers directory.

A decoder becomes a stock LlamaForCausalLM (an MTP model: its trunk with head 1), an encoder a stock
EuroBertForMaskedLM, an encoder-decoder ObjtrainEncDecForConditionalGeneration with its modelling code
written beside it (load with trust_remote_code=True); each with config.json, model.safetensors, tokenizer
files that AutoTokenizer loads (every objtrain special token at its id) and, for a decoder or an
encoder-decoder, generation_config.json.

Every export is checked before it is kept: transformers loads the directory and its logits on sample rows
equal objtrain's (fp32, 1e-4), and greedy decoding is identical, for 32 tokens without a stop token and
again with </s> ending it on both sides (as generation_config.json makes transformers stop). If not,
nothing is written.
Needs the `hf` extra: pip install 'objtrain\\[hf]'.

Example: objtrain export runs/clm -o runs/clm-hf
"""


def run(
    source: Annotated[
        Path, typer.Argument(help="A run directory or a checkpoint directory.", show_default=False)
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory to create.", show_default=False)],
    force: Annotated[
        bool, typer.Option("--force", help="Replace OUTPUT if it is an earlier export.")
    ] = False,
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype",
            help="Precision of the exported weights: fp32, bf16 or fp16. Default: the run's own "
            "(a bf16 run exports bf16; fp32 where the checkpoint records none).",
            show_default=False,
        ),
    ] = None,
    max_shard_size: Annotated[
        str,
        typer.Option(
            "--max-shard-size",
            help="Split the weights into shards of at most this size, with "
            "model.safetensors.index.json (as transformers' save_pretrained): e.g. 5GB, 500MB, 2GiB.",
        ),
    ] = "50GB",
) -> None:
    from objtrain.interop.export import describe, export_checkpoint

    summary = export_checkpoint(source, output, force=force, dtype=dtype, max_shard_size=max_shard_size)
    console = make_console(highlight=False)
    for line in describe(summary):
        console.print(line, markup=False)


run.__doc__ = "\n\n".join(" ".join(p.split()) for p in HELP.split("\n\n"))
