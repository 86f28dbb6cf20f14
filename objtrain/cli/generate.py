"""`objtrain generate`: continue, infill, fill masks or fill spans with a trained checkpoint.

The mode follows from the model and the options:
- decoder: `--prompt` continues text; `--prefix/--suffix` infills (FIM, PSM/SPM); `--speculative` uses
  the MTP heads to draft (greedy only);
- encoder: `--text` with `[MASK]` markers prints the top candidates for each mask;
- encdec: `--text` with `[MASK]` markers fills sentinel spans; `--prompt` decodes from the prompt as input.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from objtrain.cli.common import DEVICE_HELP, check_format, interrupt_note, make_console
from objtrain.data.tokenizer import Tokenizer
from objtrain.devices import resolve_device
from objtrain.errors import UserError
from objtrain.evaluation.probe import trained_with_segments
from objtrain.models import generate as gen
from objtrain.models.checkpoint import Checkpoint, load_checkpoint
from objtrain.objectives.registry import recorded_parts


def run(
    checkpoint: Path = typer.Argument(..., help="A checkpoint directory or a run directory."),
    prompt: str | None = typer.Option(
        None, "--prompt", help="Text to continue (decoder) or encode (encdec)."
    ),
    text: str | None = typer.Option(None, "--text", help="Text with [MASK] markers (encoder / span models)."),
    prefix: str | None = typer.Option(None, "--prefix", help="FIM infill: the text before the gap."),
    suffix: str | None = typer.Option(None, "--suffix", help="FIM infill: the text after the gap."),
    fim_mode: str | None = typer.Option(
        None, "--fim-mode", help="psm or spm (default: from the checkpoint)."
    ),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n", min=1, help="Most tokens to generate."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    top_k: int = typer.Option(
        0, "--top-k", help="Sample from the k best tokens (fill-mask: candidates shown)."
    ),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    speculative: bool = typer.Option(
        False, "--speculative", help="Self-speculative decoding with MTP heads."
    ),
    no_cache: bool = typer.Option(False, "--no-cache", help="Recompute the whole sequence every step."),
    output_format: str = typer.Option(
        "text", "--format", help="text (streamed), json or jsonl (one object: text, tokens, mode, ...)."
    ),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
) -> None:
    """Generate text from a checkpoint: continue a prompt, infill (FIM), fill masks or spans.

    Example: objtrain generate runs/fim --prefix $'def add(a, b):\\n    ' --suffix $'\\n    return c\\n'
    """
    output_format = check_format(output_format)
    _check_inputs(prompt, text, prefix, suffix)
    if fim_mode is not None and prefix is None and suffix is None:  # else it would be ignored unsaid
        raise UserError("--fim-mode sets the infill order: it goes with --prefix/--suffix")
    if output_format == "jsonl":
        output_format = "json"  # one result: the same single line either way
    ckpt = load_checkpoint(checkpoint, device=resolve_device(device))
    if ckpt.tokenizer is None:
        raise UserError(f"{ckpt.path} has no tokenizer.model: it cannot encode a prompt")
    sampling = gen.Sampling(temperature, top_k if ckpt.config.kind != "encoder" else 0, top_p, seed)
    console = make_console()
    interrupt_note("interrupted")  # generate writes no files; what it printed before Ctrl-C stays printed
    kind = ckpt.config.kind
    if kind == "encoder":
        if text is None:
            raise UserError("an encoder model fills masks: pass --text with [MASK] markers")
        if top_k < 0:  # an encoder does not sample: --top-k is the number of candidates shown
            raise UserError(f"--top-k must be >= 0, got {top_k}")
        result = _fill_mask(ckpt, text, top_k or 5)
        _print_fill_mask(console, result, output_format)
        return
    if speculative and (kind != "decoder" or not sampling.greedy):
        raise UserError("--speculative needs a decoder with MTP heads and greedy decoding (no --temperature)")
    if speculative and ckpt.config.mtp_heads < 2:
        raise UserError(
            f"--speculative drafts with the extra MTP heads; {ckpt.path} has none (mtp_heads 1): "
            "train with --objective mtp, or leave out --speculative"
        )
    if (prefix is not None or suffix is not None) and kind == "decoder":
        _check_fim(ckpt)
    result = _generate(
        ckpt,
        sampling,
        prompt,
        text,
        prefix,
        suffix,
        fim_mode,
        max_new_tokens,
        speculative,
        not no_cache,
        console if output_format == "text" else None,
    )
    if output_format == "json":
        print(json.dumps(result, ensure_ascii=False))


def _check_inputs(prompt: str | None, text: str | None, prefix: str | None, suffix: str | None) -> None:
    """One input mode at a time: a mode that silently wins would drop what the user typed."""
    infill = prefix is not None or suffix is not None
    given = [
        flag
        for flag, used in (
            ("--prompt", prompt is not None),
            ("--text", text is not None),
            ("--prefix/--suffix", infill),
        )
        if used
    ]
    if len(given) > 1:
        raise UserError(
            f"{' and '.join(given)} do not go together: --prompt continues text, --prefix/--suffix "
            "infill between them, --text fills [MASK] markers; give one"
        )


def _check_fim(ckpt: Checkpoint) -> None:
    """--prefix/--suffix need a model that learned FIM's sentinels; the checkpoint records its objective."""
    info = ckpt.training
    objective = info.get("objective")
    # FIM itself, or a mixture with a FIM component (`Objective.fim_sentinels`)
    knows_fim = bool(info.get("fim_mode")) or any(cls.fim_sentinels for cls, _ in recorded_parts(info))
    if objective is None and not knows_fim:
        print(
            f"warning: {ckpt.path} does not record a FIM objective; infilling may be noise", file=sys.stderr
        )
    elif not knows_fim:
        raise UserError(
            f"{ckpt.path} was trained with {objective}, not fill-in-the-middle: --prefix/--suffix need a "
            "model trained with --objective fim (use --prompt to continue text)"
        )


def _recorded_fim_mode(info: dict[str, Any]) -> str:
    """The FIM order a checkpoint was trained for: `fim_mode`, else the FIM objective's `spm_rate`
    (the order it used most), else PSM."""
    if info.get("fim_mode"):
        return str(info["fim_mode"])
    spm_rate = (info.get("objective_config") or {}).get("spm_rate")
    return "spm" if isinstance(spm_rate, (int, float)) and spm_rate > 0.5 else "psm"


def _fill_mask(ckpt: Checkpoint, text: str, k: int) -> dict[str, Any]:
    assert ckpt.tokenizer is not None
    segments = trained_with_segments(ckpt.training)  # segment row 0 is trained by NSP/SOP only
    candidates = gen.fill_mask(ckpt.model, ckpt.tokenizer, text, k, segments)  # type: ignore[arg-type]
    best = iter(c[0].text for c in candidates)
    filled = "".join(
        part if i == 0 else next(best) + part for i, part in enumerate(text.split(gen.MASK_MARKER))
    )
    return {
        "mode": "fill-mask",
        "text": filled,
        "masks": [
            [{"token": c.text, "piece": c.piece, "id": c.token_id, "prob": c.prob} for c in m]
            for m in candidates
        ],
    }


def _print_fill_mask(console: Console, result: dict[str, Any], output_format: str) -> None:
    if output_format == "json":
        print(json.dumps(result, ensure_ascii=False))
        return
    for i, mask in enumerate(result["masks"]):
        table = Table(title=f"[MASK] {i}", show_edge=False)
        table.add_column("token")
        table.add_column("prob", justify="right")
        for c in mask:
            table.add_row(escape(repr(c["token"])), f"{c['prob']:.3f}")
        console.print(table)
    console.print(f"[bold]top-1:[/] {escape(result['text'])}", highlight=False, markup=True)


def _capped(max_new_tokens: int, prompt_length: int, ckpt: Checkpoint) -> int:
    """-n within the model's usable context (`gen.within_context`), with a note on stderr when cut."""
    context = gen.usable_context(ckpt.training)
    capped = gen.within_context(max_new_tokens, prompt_length, context)
    if capped < max_new_tokens:
        print(
            f"note: -n {max_new_tokens:,} is past the model's usable context ({context:,} positions with "
            f"the input): generating at most {capped:,} tokens, fewer if </s> comes first",
            file=sys.stderr,
        )
    return capped


def _collect(stream: Iterator[int], tok: Tokenizer, show: bool) -> list[int]:
    """The generated tokens; with `show`, their text printed as it comes."""
    out: list[int] = []
    shown = ""
    for token in stream:
        out.append(token)
        if show:
            now = tok.decode(out)
            if now.startswith(shown):  # print the new characters only (pieces can merge bytes)
                sys.stdout.write(now[len(shown) :])
                sys.stdout.flush()
                shown = now
    return out


def _generate(
    ckpt: Checkpoint,
    sampling: gen.Sampling,
    prompt: str | None,
    text: str | None,
    prefix: str | None,
    suffix: str | None,
    fim_mode: str | None,
    max_new_tokens: int,
    speculative: bool,
    use_cache: bool,
    console: Console | None,
) -> dict[str, Any]:
    tok: Tokenizer = ckpt.tokenizer  # type: ignore[assignment]
    s = ckpt.specials
    model: Any = ckpt.model
    info = ckpt.training
    stats = gen.SpeculativeStats()
    n_spans = 0
    if ckpt.config.kind == "encdec":
        if text is not None:
            ids, n_spans = gen.encode_input(tok, text, fill="sentinel", append_eos=True)
            if n_spans == 0:  # as for an encoder: nothing to fill would decode a span that is not there
                raise UserError("--text has no [MASK] to fill (--prompt encodes text without masks)")
            mode = "span-fill"
        elif prompt is not None:
            ids, mode = [*tok.encode(prompt), s.eos], "seq2seq"
        else:
            raise UserError("an encoder-decoder model needs --text (with [MASK] spans) or --prompt")
        start = int(info.get("decoder_start_id", s.pad))
        max_new_tokens = _capped(max_new_tokens, 1, ckpt)  # the decoder's own positions: start + output
        stream: Iterator[int] = gen.generate_encdec(
            model, ids, max_new_tokens, sampling, (s.eos,), start, use_cache
        )
    else:
        if prefix is not None or suffix is not None:
            chosen = (fim_mode or _recorded_fim_mode(info)).lower()
            ids = gen.fim_prompt(tok, prefix or "", suffix or "", chosen)  # type: ignore[arg-type]
            mode, stops = f"fim-{chosen}", (s.eos, s.fim_pad)  # EOT is EOS in objtrain's table
        elif prompt is not None:
            ids, mode, stops = ([s.bos] if info.get("bos") else []) + tok.encode(prompt), "continue", (s.eos,)
            if not ids:
                ids = [s.eos]  # an empty prompt starts a fresh document, as after an EOS in a packed stream
        else:
            raise UserError("a decoder model needs --prompt, or --prefix/--suffix for infilling")
        max_new_tokens = _capped(max_new_tokens, len(ids), ckpt)
        if speculative:
            stream = gen.generate_speculative(model, ids, max_new_tokens, stops, stats)
        else:
            stream = gen.generate_decoder(model, ids, max_new_tokens, sampling, stops, use_cache)
    start_time = time.perf_counter()
    if console is not None and mode in ("continue", "seq2seq") and prompt:
        console.print(prompt, end="", style="dim", highlight=False, markup=False)
    elif console is not None and mode.startswith("fim"):
        console.print(prefix or "", end="", style="dim", highlight=False, markup=False)
    out = _collect(stream, tok, console is not None and mode != "span-fill")
    elapsed = time.perf_counter() - start_time
    result: dict[str, Any] = {
        "mode": mode,
        "text": tok.decode(out),
        "tokens": out,
        "n_tokens": len(out),
        "seconds": round(elapsed, 4),
    }
    if mode == "span-fill":
        fills = [tok.decode(f) for f in gen.split_spans(out, n_spans, s)]
        result["spans"] = fills
        parts = (text or "").split(gen.MASK_MARKER)
        result["text"] = parts[0] + "".join(f + p for f, p in zip(fills, parts[1:], strict=True))
    if speculative:
        result["speculative"] = {
            "acceptance": stats.acceptance,
            "tokens_per_forward": stats.tokens_per_forward,
        }
    if console is not None:
        if mode.startswith("fim"):
            console.print(suffix or "", style="dim", highlight=False, markup=False)
        elif mode == "span-fill":
            for i, fill in enumerate(result["spans"]):
                console.print(f"[bold]<extra_id_{i}>[/] {escape(repr(fill))}", highlight=False)
            console.print(f"[bold]filled:[/] {escape(result['text'])}", highlight=False)
        else:
            console.print()
        extra = ""
        if speculative:
            extra = f", {stats.tokens_per_forward:.2f} tokens/forward, acceptance {stats.acceptance:.0%}"
        # stdout holds the text alone (`> out.txt`); how long it took is for the person watching
        make_console(stderr=True).print(
            f"[dim]{len(out)} tokens in {elapsed:.2f}s{extra}[/]", highlight=False
        )
    return result
