"""`objtrain export`: a checkpoint -> a Hugging Face directory that stock `transformers` loads.

What each model kind becomes:
- decoder -> `LlamaForCausalLM` (stock class; exact: same blocks, RoPE rows reordered, see `llama.py`).
  Grouped-query attention and an untied output layer carry over as `num_key_value_heads` and
  `tie_word_embeddings` (with `lm_head.weight`). An MTP model exports its trunk with head 1, a plain
  next-token model; heads 2..n are left out.
- encoder -> `EuroBertForMaskedLM` (stock since transformers 5: Llama blocks without the causal mask,
  final norm, tied MLM head). Segment embeddings and the NSP/SOP pooler have no place there: a model
  trained with them is refused rather than exported without them.
- encoder-decoder -> `ObjtrainEncDecForConditionalGeneration`, modelling code written into the directory
  (`configuration_objtrain.py`, `modeling_objtrain.py`, from `objtrain/interop/hf_remote/`) and named in
  config.json's `auto_map`, so `AutoModelForSeq2SeqLM.from_pretrained(DIR, trust_remote_code=True)` loads
  it. No stock class computes it: T5 positions attention by learned relative-position biases (objtrain
  rotates q and k), T5Gemma adds sandwich norms and scaled embeddings that cannot be switched off. The
  weights keep objtrain's names; the code is objtrain's arithmetic for one document per row.

Every export is checked before it is kept: `transformers` loads the written directory, its logits on
sample rows equal objtrain's (fp32, 1e-4), and greedy decoding is identical (decoders and
encoder-decoders): 32 tokens without a stop token, and again with `</s>` stopping both sides, as
`objtrain generate` stops and as transformers stops by the export's generation_config.json (which names
`</s>` as eos), so a model that ends its text early is compared the way it is used. A failed check
leaves no directory behind (the directory is written under a temporary name).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from objtrain.errors import UserError
from objtrain.interop import llama, quiet_transformers, require
from objtrain.io import atomic_dir, check_output_free, save_tensors, write_json
from objtrain.models.checkpoint import Checkpoint, clean_state_dict, load_checkpoint, resolve_checkpoint

REMOTE_ARCHITECTURE = "ObjtrainEncDecForConditionalGeneration"
REMOTE_FILES = ("configuration_objtrain.py", "modeling_objtrain.py")
TOLERANCE = 1e-4  # max |logit difference| accepted, fp32, relative to max(1, |logits|.max())
GREEDY_TOKENS = 32
SAMPLE_TEXT = (
    "def add(a, b):\n    return a + b\n\n\nclass Point:\n    def __init__(self, x, y):\n"
    "        self.x, self.y = x, y\n\nThe quick brown fox jumps over the lazy dog.\n"
    "\u00e9\u00e8 \u4e2d\u6587 \U0001f600\n"
)


@dataclass
class ExportSummary:
    path: Path
    checkpoint: Path
    architecture: str
    max_logit_diff: float
    greedy_tokens: int
    stops_after: int | None  # tokens decoded before `</s>` (both sides), None if it never came
    parameters: int
    notes: list[str]


def _max_positions(ckpt: Checkpoint) -> int:
    """The longest row the model trained on (a default for generation lengths in transformers)."""
    training = ckpt.training
    for key in ("seq_len", "max_seq_len"):
        value = training.get(key)
        if isinstance(value, int) and value > 0:
            return value
    resolved = training.get("resolved") if isinstance(training.get("resolved"), dict) else {}
    value = resolved.get("seq_len") if resolved else None
    return value if isinstance(value, int) and value > 0 else 2048


def _tokenizer_files(ckpt: Checkpoint, directory: Path) -> None:
    """tokenizer.json + tokenizer_config.json built from the sentencepiece model by transformers' own
    converter (which follows the model's settings: no dummy prefix, no whitespace folding, byte fallback),
    with every objtrain special registered at its id; `tokenizer.model` is kept beside them. Then what
    objtrain's training fixes: the longest input (`model_max_length`, the run's sequence length) and,
    for an encoder-decoder, the `</s>` ending every encoder input."""
    from objtrain.interop.hf_tokenizer import save_hf_tokenizer

    assert ckpt.tokenizer is not None
    if ckpt.tokenizer.kind == "huggingface":  # a store made with another model's tokenizer.json
        from objtrain.data.foreign_tokenizer import HFTokenizer, save_hf_files

        assert isinstance(ckpt.tokenizer, HFTokenizer)
        save_hf_files(ckpt.tokenizer, directory)
    else:
        save_hf_tokenizer(ckpt.tokenizer, directory)
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["model_max_length"] = _max_positions(ckpt)
    if ckpt.config.kind == "encdec":
        _append_eos(directory / "tokenizer.json", ckpt.tokenizer.piece(ckpt.specials.eos), ckpt.specials.eos)
    write_json(config_file, config)


def _append_eos(path: Path, piece: str, eos: int) -> None:
    """Make tokenizer.json end every encoding with `</s>` (its post-processor), as objtrain ends every
    encoder input of an encoder-decoder, in training and in `generate` (T5's tokenizer does the same).
    A byte-level post-processor (offsets only) is kept before it; one that adds other tokens is replaced:
    objtrain adds none."""
    tokenizers = require("tokenizers", "objtrain export")
    processors = tokenizers.processors
    tok = tokenizers.Tokenizer.from_file(str(path))
    template = processors.TemplateProcessing(
        single=f"$A {piece}", pair=f"$A {piece} $B:1 {piece}:1", special_tokens=[(piece, eos)]
    )
    if isinstance(tok.post_processor, processors.ByteLevel):
        template = processors.Sequence([tok.post_processor, template])
    tok.post_processor = template
    tok.save(str(path))


def _remote_source(name: str) -> str:
    return (Path(__file__).parent / "hf_remote" / name).read_text(encoding="utf-8")


def encdec_config(ckpt: Checkpoint) -> dict[str, Any]:
    """config.json of an encoder-decoder export: the remote-code classes named in `auto_map`."""
    cfg, specials = ckpt.config, ckpt.specials
    return {
        "architectures": [REMOTE_ARCHITECTURE],
        "model_type": "objtrain_encdec",
        "auto_map": {
            "AutoConfig": "configuration_objtrain.ObjtrainEncDecConfig",
            "AutoModelForSeq2SeqLM": f"modeling_objtrain.{REMOTE_ARCHITECTURE}",
        },
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim,
        "num_attention_heads": cfg.n_head,
        "num_encoder_layers": cfg.n_layer,
        "num_decoder_layers": cfg.decoder_layers,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_base,
        "max_position_embeddings": _max_positions(ckpt),
        "pad_token_id": specials.pad,
        "bos_token_id": specials.bos,
        "eos_token_id": specials.eos,
        "decoder_start_token_id": specials.pad,
        "is_encoder_decoder": True,
        "use_cache": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def export_checkpoint(source: Path, output: Path, force: bool = False) -> ExportSummary:
    """Write `output` from the checkpoint (or run's newest checkpoint) at `source`, checked by loading it
    back with transformers. Raises `UserError` for bad input or a failed check; `output` then stays as it
    was."""
    output = Path(output)
    require("transformers", "objtrain export")
    check_output_free(
        output, force, inputs=[Path(source)], replaces=("a Hugging Face export", ("config.json",))
    )
    path = resolve_checkpoint(Path(source))
    ckpt = load_checkpoint(path)
    if ckpt.tokenizer is None:
        raise UserError(
            f"{path} holds no tokenizer.model: an export needs the tokenizer the model was trained with"
        )
    cfg = ckpt.config
    notes: list[str] = []
    weights = clean_state_dict(ckpt.model)
    if cfg.kind == "decoder":
        architecture = "LlamaForCausalLM"
        tensors = llama.decoder_to_llama(weights, cfg)
        config = llama.llama_config(cfg, _max_positions(ckpt))
        if cfg.mtp_heads > 1:
            notes.append(
                "MTP model: exported its trunk with head 1 as a plain causal LM; "
                f"heads 2..{cfg.mtp_heads} left out"
            )
    elif cfg.kind == "encoder":
        if cfg.n_segments or cfg.n_classes:
            trained = json.dumps([ckpt.training.get("objective"), ckpt.training.get("objective_config")])
            if "nsp" in trained or "sop" in trained:
                raise UserError(
                    f"{path}: this encoder was trained with sentence pairs (NSP/SOP): its segment embedding "
                    "and pooled classification head are part of it, and EuroBertForMaskedLM cannot hold them"
                )
            # the zoo's encoders carry both; an objective without sentence pairs never trains them
            notes.append("segment embedding and pooled head left out (untrained: the objective uses neither)")
        architecture = "EuroBertForMaskedLM"
        tensors = llama.export_layers(weights, cfg, [f"blocks.{i}" for i in range(cfg.n_layer)])
        config = llama.llama_config(cfg, _max_positions(ckpt), architecture, "eurobert")
        config.update(mask_token_id=ckpt.specials.mask, classifier_pooling="bos")
    else:
        architecture = REMOTE_ARCHITECTURE
        tensors = dict(weights)
        config = encdec_config(ckpt)
    specials = ckpt.specials
    config.update(pad_token_id=specials.pad, bos_token_id=specials.bos, eos_token_id=specials.eos)
    config["transformers_version"] = require("transformers", "objtrain export").__version__
    config["objtrain"] = {
        "checkpoint": str(path),
        "objective": ckpt.training.get("objective"),
        "kind": cfg.kind,
    }

    with atomic_dir(output, force=force) as tmp:
        save_tensors(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        write_json(tmp / "config.json", config)
        if cfg.kind in ("decoder", "encdec"):
            generation = {
                "bos_token_id": specials.bos,
                "eos_token_id": specials.eos,
                "pad_token_id": specials.pad,
                "do_sample": False,
            }
            if cfg.kind == "encdec":  # T5's start token; no key/value cache in the written code
                generation.update(decoder_start_token_id=specials.pad, use_cache=False)
            write_json(tmp / "generation_config.json", generation)
        if cfg.kind == "encdec":
            for name in REMOTE_FILES:
                (tmp / name).write_text(_remote_source(name), encoding="utf-8")
        _tokenizer_files(ckpt, tmp)
        diff, greedy, stops_after = check_export(ckpt, tmp)
    parameters = sum(t.numel() for t in tensors.values())
    return ExportSummary(output, path, architecture, diff, greedy, stops_after, parameters, notes)


def sample_rows(ckpt: Checkpoint, n_rows: int = 3, length: int = 64, seed: int = 0) -> Tensor:
    """Rows of ids to compare logits on: the sample text encoded, and random ordinary tokens."""
    assert ckpt.tokenizer is not None
    vocab = ckpt.config.vocab_size
    ordinary = ckpt.specials.ordinary_ids(vocab)
    text = ckpt.tokenizer.encode(SAMPLE_TEXT * 8)[:length]
    text += [int(ordinary[0])] * (length - len(text))
    generator = torch.Generator().manual_seed(seed)
    rows = [torch.tensor(text)]
    for _ in range(n_rows - 1):
        rows.append(ordinary[torch.randint(0, ordinary.numel(), (length,), generator=generator)])
    return torch.stack(rows)


def check_export(ckpt: Checkpoint, directory: Path) -> tuple[float, int, int | None]:
    """Load `directory` with transformers and compare with the objtrain model: max |logit diff| over the
    sample rows (relative to the logits' scale), then greedy decoding (decoders). Raises `UserError`."""
    transformers = quiet_transformers()
    model = ckpt.model.float().eval()
    cfg = ckpt.config
    auto = {
        "decoder": transformers.AutoModelForCausalLM,
        "encoder": transformers.AutoModelForMaskedLM,
        "encdec": transformers.AutoModelForSeq2SeqLM,
    }[cfg.kind]
    remote = {"trust_remote_code": True} if cfg.kind == "encdec" else {}  # the code it just wrote
    try:
        hf = auto.from_pretrained(str(directory), dtype=torch.float32, **remote).eval()
    except Exception as exc:  # transformers raises many types; any of them means the export is unusable
        raise UserError(f"transformers could not load the export: {type(exc).__name__}: {exc}") from None
    ids = sample_rows(ckpt, length=min(64, _max_positions(ckpt)))
    decoder_ids = ids.roll(1, dims=0)  # another row as the decoder's input, after the start token
    decoder_ids[:, 0] = ckpt.specials.pad
    with torch.no_grad():
        if cfg.kind == "encdec":
            ours = _objtrain_encdec_logits(model, ids, decoder_ids)
            theirs = _run(lambda: hf(input_ids=ids, decoder_input_ids=decoder_ids).logits.float())
        else:
            ours = _objtrain_logits(model, ids)
            theirs = _run(lambda: hf(input_ids=ids).logits.float())
    scale = max(1.0, float(ours.abs().max()))
    diff = float((ours - theirs).abs().max()) / scale
    if not math.isfinite(diff) or diff > TOLERANCE:
        raise UserError(
            f"load-back check failed: transformers' logits differ from objtrain's by {diff:.2e} "
            f"(relative; at most {TOLERANCE:g} allowed); nothing written"
        )
    if cfg.kind == "encoder":
        return diff, 0, None
    if cfg.kind == "encdec":
        _check_appends_eos(transformers, directory, ckpt.specials.eos)
    return diff, *_check_greedy(ckpt, hf, ids[0])


def _check_appends_eos(transformers: Any, directory: Path, eos: int) -> None:
    """The exported tokenizer ends an encoder-decoder's input with `</s>`, as objtrain's inputs end."""
    # trust_remote_code: config.json names the modelling code written beside it (else a prompt on stdout)
    tok = _run(lambda: transformers.AutoTokenizer.from_pretrained(str(directory), trust_remote_code=True))
    text = SAMPLE_TEXT.splitlines()[0]
    plain = tok(text, add_special_tokens=False)["input_ids"]
    if tok(text)["input_ids"] != [*plain, eos]:
        raise UserError(
            "load-back check failed: the exported tokenizer does not end its input with </s> as objtrain "
            "does for an encoder-decoder; nothing written"
        )


def _check_greedy(ckpt: Checkpoint, hf: Any, row: Tensor) -> tuple[int, int | None]:
    """Greedy decoding by objtrain and by transformers on the loaded export, compared twice: without a
    stop token (GREEDY_TOKENS tokens each, so a model that emits `</s>` early is still compared at length),
    and with `</s>` stopping both, as `objtrain generate` stops and as transformers stops by the export's
    own generation_config.json. Returns (GREEDY_TOKENS, tokens before `</s>` or None if neither emitted
    it); raises `UserError` on the first difference."""
    transformers = quiet_transformers()
    from objtrain.evaluation.generate import generate_decoder, generate_encdec

    model, cfg, specials = ckpt.model, ckpt.config, ckpt.specials
    if cfg.kind == "encdec":
        # objtrain ends every encoder input with </s>, in training and in `generate`
        prompt = [*row[:15].tolist(), specials.eos]
        start = int(ckpt.training.get("decoder_start_id", specials.pad))

        def ours(stops: tuple[int, ...]) -> list[int]:
            return list(generate_encdec(model, prompt, GREEDY_TOKENS, stop_ids=stops, start_id=start))  # type: ignore[arg-type]

        skip = 1  # the decoder start token
    else:
        prompt = row[:8].tolist()

        def ours(stops: tuple[int, ...]) -> list[int]:
            return list(generate_decoder(model, prompt, GREEDY_TOKENS, stop_ids=stops))  # type: ignore[arg-type]

        skip = len(prompt)

    def theirs() -> list[int]:
        # the loaded generation_config.json supplies the stop token, the start token and the cache setting
        generation = transformers.GenerationConfig(max_new_tokens=GREEDY_TOKENS, do_sample=False)
        with torch.no_grad():
            out = _run(lambda: hf.generate(torch.tensor([prompt]), generation_config=generation))
        return list(out[0, skip:].tolist())

    eos = hf.generation_config.eos_token_id
    stopped = theirs()
    hf.generation_config.eos_token_id = None  # transformers fills an unset stop token from this default
    full = theirs()
    hf.generation_config.eos_token_id = eos
    ours_full = ours(())
    _same(ours_full, full, "without a stop token")
    ours_stopped = ours((specials.eos,))
    if stopped[-1:] == [specials.eos]:
        stopped = stopped[:-1]  # transformers keeps the stop token; objtrain's generators leave it out
    _same(ours_stopped, stopped, "with </s> as the stop token")
    return GREEDY_TOKENS, len(ours_stopped) if len(ours_stopped) < GREEDY_TOKENS else None


def _same(ours: list[int], theirs: list[int], how: str) -> None:
    if ours == theirs:
        return
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
    at = (
        f"at token {first}"
        if first is not None
        else f"in length ({len(ours)} tokens from objtrain, {len(theirs)} from transformers)"
    )
    raise UserError(
        f"load-back check failed: greedy decoding {how} differs {at} of {GREEDY_TOKENS} "
        "(transformers vs objtrain); nothing written"
    )


def _objtrain_logits(model: Any, ids: Tensor) -> Tensor:
    """Logits of single-document rows: causal for a decoder, bidirectional for an encoder."""
    from objtrain.batch import Batch

    B, T = ids.shape
    positions = torch.arange(T).expand(B, T)
    attention = "causal" if model.config.kind == "decoder" else "bidirectional"
    batch = Batch(ids, ids, positions, torch.zeros_like(ids), attention)
    return model(batch).logits.float()


def _run(call: Callable[[], Any]) -> Any:
    """A call into the loaded export: any failure means the export is unusable, said in one line."""
    try:
        return call()
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        why = f"{type(exc).__name__}: {first}"
        raise UserError(f"load-back check failed: transformers raised {why}; nothing written") from None


def _objtrain_encdec_logits(model: Any, ids: Tensor, decoder_ids: Tensor) -> Tensor:
    """Decoder logits (B, S, V) of one document per row: encoder input `ids`, decoder input `decoder_ids`."""
    from objtrain.batch import Batch

    B, T = ids.shape
    S = decoder_ids.size(1)
    batch = Batch(
        ids,
        decoder_ids,
        torch.arange(T).expand(B, T),
        torch.zeros_like(ids),
        "bidirectional",
        decoder_input_ids=decoder_ids,
        decoder_positions=torch.arange(S).expand(B, S),
        decoder_document_ids=torch.zeros_like(decoder_ids),
    )
    return model(batch).logits.float()


def describe(summary: ExportSummary) -> list[str]:
    lines = [
        f"exported {summary.checkpoint} as {summary.architecture} to {summary.path} "
        f"({summary.parameters:,} parameters)",
        f"load-back check: transformers' logits equal objtrain's to {summary.max_logit_diff:.1e} (relative)"
        + (f", greedy decoding of {summary.greedy_tokens} tokens identical" if summary.greedy_tokens else ""),
    ]
    if summary.greedy_tokens:
        how = "with </s> as the stop token (generation_config.json)"
        lines.append(
            f"{how} both stop after {summary.stops_after} tokens"
            if summary.stops_after is not None
            else f"{how} neither emits it within {summary.greedy_tokens} tokens"
        )
    return lines + summary.notes


def read_config(directory: Path) -> dict[str, Any]:
    return json.loads((Path(directory) / "config.json").read_text())
