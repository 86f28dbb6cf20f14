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
from objtrain.interop.model_card import model_card
from objtrain.io import atomic_dir, check_output_free, save_tensors, write_json
from objtrain.models.checkpoint import Checkpoint, clean_state_dict, load_checkpoint, resolve_checkpoint
from objtrain.objectives.registry import recorded_segments

REMOTE_ARCHITECTURE = "ObjtrainEncDecForConditionalGeneration"
REMOTE_FILES = ("configuration_objtrain.py", "modeling_objtrain.py")
TOLERANCE = 1e-4  # max |logit difference| accepted, fp32, relative to max(1, |logits|.max())
GREEDY_TOKENS = 32
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # config.json's spelling
MAX_SHARD_SIZE = "50GB"  # save_pretrained's default in transformers 5
INDEX = "model.safetensors.index.json"
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
    dtype: str = "fp32"
    dtype_reason: str = ""
    rounding_diff: float = 0.0  # max |logit change| (relative) from storing the weights in `dtype`
    shards: int = 1


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
    objtrain's training fixes: for an encoder-decoder, the `</s>` ending every encoder input. No
    `model_max_length` is set from the run's rows (rotary positions run longer inputs, whose logits still
    match): transformers would warn of "indexing errors" there."""
    from objtrain.interop.hf_tokenizer import save_hf_tokenizer

    assert ckpt.tokenizer is not None
    if ckpt.tokenizer.kind == "huggingface":  # a store made with another model's tokenizer.json
        from objtrain.data.foreign_tokenizer import HFTokenizer, save_hf_files

        assert isinstance(ckpt.tokenizer, HFTokenizer)
        save_hf_files(ckpt.tokenizer, directory)
    else:
        save_hf_tokenizer(ckpt.tokenizer, directory)
    if ckpt.config.kind == "encdec":
        _append_eos(directory / "tokenizer.json", ckpt.tokenizer.piece(ckpt.specials.eos), ckpt.specials.eos)


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
        "decoder_start_token_id": _decoder_start(ckpt),
        "is_encoder_decoder": True,
        "use_cache": False,
        "tie_word_embeddings": False,
    }


def run_dtype(path: Path) -> str | None:
    """The precision the checkpoint's run trained in (its state.json), or None where it is not recorded."""
    try:
        value = json.loads((Path(path) / "state.json").read_text(encoding="utf-8")).get("dtype")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return value if value in DTYPES else None


def choose_dtype(requested: str | None, path: Path) -> tuple[str, str]:
    """(dtype, why). By default the run's own precision: a bf16 run is published in bf16, as models on the
    Hugging Face hub are published in the precision they were trained in, at half the size of the fp32
    master weights; a run that records none (or an fp32 one) exports fp32. `--dtype fp32` keeps the
    master weights exactly."""
    if requested is not None:
        if requested not in DTYPES:
            raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {requested!r}")
        return requested, "--dtype"
    trained = run_dtype(path)
    if trained is None:
        return "fp32", "the checkpoint records no training precision"
    return (
        trained,
        f"the run's precision{'' if trained == 'fp32' else '; --dtype fp32 keeps the fp32 weights'}",
    )


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})


def parse_size(value: str | int) -> int:
    """Bytes from `--max-shard-size`, spelled as transformers spells it: 5GB (10^9), 5GiB (2^30), 500MB,
    or a plain number of bytes."""
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*", str(value), re.IGNORECASE)
    size = int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()]) if match else 0
    if size <= 0:
        raise UserError(f"--max-shard-size must be a size such as 5GB, 500MB or 2GiB, got {value!r}")
    return size


def save_weights(tensors: dict[str, Tensor], directory: Path, max_shard_size: int) -> int:
    """model.safetensors, or past `max_shard_size` bytes the shards model-0000k-of-0000n.safetensors with
    model.safetensors.index.json, as transformers' save_pretrained writes them: tensors in order, a new
    shard when the next would overflow this one, a tensor larger than the limit alone in its own.
    Returns the number of files."""
    groups: list[dict[str, Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > max_shard_size:
            groups.append({})
            size = 0
        groups[-1][name] = tensor
        size += nbytes
    if len(groups) == 1:
        save_tensors(tensors, directory / "model.safetensors", metadata={"format": "pt"})
        return 1
    weight_map: dict[str, str] = {}
    for k, group in enumerate(groups, 1):
        name = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        save_tensors(group, directory / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    write_json(directory / INDEX, {"metadata": {"total_size": total}, "weight_map": weight_map})
    return len(groups)


def export_checkpoint(
    source: Path,
    output: Path,
    force: bool = False,
    dtype: str | None = None,
    max_shard_size: str | int = MAX_SHARD_SIZE,
) -> ExportSummary:
    """Write `output` from the checkpoint (or run's newest checkpoint) at `source`, checked by loading it
    back with transformers. `dtype` (fp32, bf16, fp16): the weights' precision, by default the run's
    (`choose_dtype`). Raises `UserError` for bad input or a failed check; `output` then stays as it
    was."""
    output = Path(output)
    require("transformers", "objtrain export")
    shard_bytes = parse_size(max_shard_size)
    if dtype is not None:
        choose_dtype(dtype, Path(source))  # a bad --dtype is refused before any work
    check_output_free(
        output, force, inputs=[Path(source)], replaces=("a Hugging Face export", ("config.json",))
    )
    path = resolve_checkpoint(Path(source))
    dtype, dtype_reason = choose_dtype(dtype, path)
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
            if recorded_segments(ckpt.training):
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
    # transformers 5 reads `dtype`, 4.x `torch_dtype`: from_pretrained(dtype="auto") loads in this one
    config.update(dtype=DTYPE_NAMES[dtype], torch_dtype=DTYPE_NAMES[dtype])
    tensors = {name: t.to(DTYPES[dtype]).contiguous() for name, t in tensors.items()}
    config["transformers_version"] = require("transformers", "objtrain export").__version__
    config["objtrain"] = {
        "checkpoint": path.name,  # its name, not its local path: an export is made to be published
        "step": ckpt.training.get("step"),
        "objective": ckpt.training.get("objective"),
        "kind": cfg.kind,
    }

    with atomic_dir(output, force=force) as tmp:
        shards = save_weights(tensors, tmp, shard_bytes)
        write_json(tmp / "config.json", config)
        if cfg.kind in ("decoder", "encdec"):
            generation = {
                "bos_token_id": specials.bos,
                "eos_token_id": specials.eos,
                "pad_token_id": specials.pad,
                "do_sample": False,
            }
            if cfg.kind == "encdec":  # T5's start token; no key/value cache in the written code
                generation.update(decoder_start_token_id=_decoder_start(ckpt), use_cache=False)
            write_json(tmp / "generation_config.json", generation)
        if cfg.kind == "encdec":
            for name in REMOTE_FILES:
                (tmp / name).write_text(_remote_source(name), encoding="utf-8")
        _tokenizer_files(ckpt, tmp)
        rounding = _round_weights(ckpt, DTYPES[dtype])
        diff, greedy, stops_after = check_export(ckpt, tmp)
        parameters = sum(t.numel() for t in tensors.values())
        summary = ExportSummary(output, path, architecture, diff, greedy, stops_after, parameters, notes)
        summary.dtype, summary.dtype_reason, summary.rounding_diff, summary.shards = (
            dtype,
            dtype_reason,
            rounding,
            shards,
        )
        card = model_card(ckpt, path, output.name, architecture, dtype, describe(summary)[1:])
        (tmp / "README.md").write_text(card, encoding="utf-8")
    return summary


def _decoder_start(ckpt: Checkpoint) -> int:
    """An encoder-decoder's first decoder input, as objtrain's `generate` starts (T5: pad)."""
    return int(ckpt.training.get("decoder_start_id", ckpt.specials.pad))


def _round_weights(ckpt: Checkpoint, dtype: torch.dtype) -> float:
    """Round the objtrain model's weights to the exported precision (computing on in fp32), so that the
    load-back check compares the same weights; returns how far that moves the logits on the sample rows
    (relative to their scale; 0 for fp32)."""
    model = ckpt.model.float().eval()
    if dtype == torch.float32:
        return 0.0
    ids = sample_rows(ckpt, length=min(64, _max_positions(ckpt)))
    decoder_ids = ids.roll(1, dims=0)
    with torch.no_grad():
        before = _any_logits(model, ids, decoder_ids)
        for param in model.parameters():
            param.copy_(param.to(dtype).float())
        after = _any_logits(model, ids, decoder_ids)
    return float((before - after).abs().max()) / max(1.0, float(before.abs().max()))


def _any_logits(model: Any, ids: Tensor, decoder_ids: Tensor) -> Tensor:
    if model.config.kind == "encdec":
        return _objtrain_encdec_logits(model, ids, decoder_ids)
    return _objtrain_logits(model, ids)


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
    from objtrain.models.generate import generate_decoder, generate_encdec

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
    stored = f"weights stored as {summary.dtype} ({summary.dtype_reason})"
    if summary.dtype != "fp32":
        stored += f"; rounding them moves objtrain's logits by {summary.rounding_diff:.1e} (relative)"
    lines.append(stored)
    if summary.shards > 1:
        lines.append(f"weights in {summary.shards} shards, listed in {INDEX}")
    return lines + summary.notes


def read_config(directory: Path) -> dict[str, Any]:
    return json.loads((Path(directory) / "config.json").read_text())
