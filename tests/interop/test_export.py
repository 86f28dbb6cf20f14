"""`objtrain export`: stock transformers classes load the export and compute what objtrain computes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from interop_helpers import tiny_checkpoint

from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.interop import llama

transformers = pytest.importorskip("transformers", reason="the 'hf' extra (transformers) is not installed")
pytest.importorskip("google.protobuf", reason="the 'hf' extra (protobuf) is not installed")

from objtrain.interop.export import _objtrain_logits, export_checkpoint, sample_rows  # noqa: E402
from objtrain.models.checkpoint import load_checkpoint  # noqa: E402


def test_half_split_round_trip_and_scores() -> None:
    torch.manual_seed(0)
    w = torch.randn(64, 32)
    assert torch.equal(llama.to_interleaved(llama.to_half_split(w, 4), 4), w)
    assert not torch.equal(llama.to_half_split(w, 4), w)


def test_decoder_exports_as_llama_with_equal_logits_and_greedy(tmp_path: Path, tokenizer: Tokenizer) -> None:
    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer)
    summary = export_checkpoint(ckpt, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["rope_parameters"]["rope_theta"] == 10000.0 and config["tie_word_embeddings"] is True
    assert summary.greedy_tokens == 32 and summary.max_logit_diff < 1e-4 and summary.stops_after is None
    # independently of the export's own check: reload and compare on fresh rows
    ours = load_checkpoint(ckpt)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    ids = sample_rows(ours, n_rows=4, length=48, seed=7)
    with torch.no_grad():
        diff = (_objtrain_logits(ours.model, ids) - hf(input_ids=ids).logits).abs().max()
    assert float(diff) < 1e-4
    gen = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (2, 3, 0)


def steer(ckpt: Any, prompt: list[int], k: int, token: int) -> None:
    """Make `token` the greedy pick at decoding step k of `prompt`, every earlier step unchanged: the last
    (decoder) block's output projection gets a rank-one term that reads only the part of step k's
    activation orthogonal to the earlier steps' and writes towards `token`'s (tied) embedding."""
    from objtrain.models.generate import generate_decoder, generate_encdec

    model = ckpt.model
    encdec = ckpt.config.kind == "encdec"
    blocks = model.decoder if encdec else model.blocks
    w2, norm = blocks[-1].mlp.w2, model.lm_head.norm
    seen: dict[str, list[torch.Tensor]] = {"act": [], "x": []}  # per decoding step, its last position
    hooks = [
        w2.register_forward_hook(lambda m, i, o: seen["act"].append(i[0][0, -1].detach())),
        norm.register_forward_hook(lambda m, i, o: seen["x"].append(i[0][0, -1].detach())),
    ]
    list(generate_encdec(model, prompt, k + 1) if encdec else generate_decoder(model, prompt, k + 1))
    for hook in hooks:
        hook.remove()
    acts = seen["act"]
    a = acts[k]
    if k:
        q, _ = torch.linalg.qr(torch.stack(acts[:k]).T)  # an orthonormal basis of the earlier activations
        a = a - q @ (q.T @ a)
    embed = model.embed.weight.detach()
    direction = embed[token] * norm.weight.detach()  # after the norm's gain: towards `token`'s logit
    scale = 1.0
    while int((norm(seen["x"][k] + scale * direction) @ embed.T).argmax()) != token:
        scale *= 2  # the smallest power of two that makes `token` step k's greedy pick
    with torch.no_grad():
        w2.weight += torch.outer(scale * direction, a / float(a @ a))


def emit_eos_early(path: Path, out: Path, k: int = 3) -> int:
    """The checkpoint at `path`, saved to `out` changed so that its greedy continuation of the export
    check's prompt ends with `</s>` after k tokens. Returns how many tokens objtrain's greedy decoding,
    stopping at `</s>`, then gives."""
    from objtrain.models.checkpoint import save_checkpoint
    from objtrain.models.generate import generate_decoder, generate_encdec

    ckpt = load_checkpoint(path)
    eos = ckpt.specials.eos
    row = sample_rows(ckpt)[0].tolist()
    prompt = [*row[:15], eos] if ckpt.config.kind == "encdec" else row[:8]
    # a tiny random encoder-decoder repeats the start token (pad) from the first step: at every step the
    # decoder then sees the same tokens and computes the same state, so none could differ; start it on
    # a text token first
    steer(ckpt, prompt, 0, int(ckpt.specials.ordinary_ids(ckpt.config.vocab_size)[7]))
    steer(ckpt, prompt, k, eos)
    save_checkpoint(out, ckpt.model, ckpt.specials, ckpt.tokenizer, ckpt.training)
    if ckpt.config.kind == "encdec":
        return len(list(generate_encdec(ckpt.model, prompt, 32, stop_ids=(eos,))))
    return len(list(generate_decoder(ckpt.model, prompt, 32, stop_ids=(eos,))))


@pytest.mark.parametrize("kind", ["decoder", "encdec"])
def test_a_model_that_emits_eos_early_exports(tmp_path: Path, tokenizer: Tokenizer, kind: str) -> None:
    """transformers stops at `</s>` by the export's generation_config.json; objtrain's check stops there too
    (and still compares 32 tokens without a stop token)."""
    ckpt = tmp_path / "eos"
    before = emit_eos_early(tiny_checkpoint(tmp_path / "ck", tokenizer, kind=kind), ckpt)
    assert before == 3
    summary = export_checkpoint(ckpt, tmp_path / "hf")
    assert summary.stops_after == before and summary.greedy_tokens == 32
    # what a user of the export sees: generate() with its defaults ends at </s>
    remote = {"trust_remote_code": True} if kind == "encdec" else {}
    auto = transformers.AutoModelForSeq2SeqLM if kind == "encdec" else transformers.AutoModelForCausalLM
    hf = auto.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32, **remote).eval()
    ours = load_checkpoint(ckpt)
    row = sample_rows(ours)[0].tolist()
    prompt = [*row[:15], ours.specials.eos] if kind == "encdec" else row[:8]
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=32)[0].tolist()
    assert out[-1] == ours.specials.eos and len(out) == (1 if kind == "encdec" else 8) + before + 1


def test_without_the_rope_permutation_the_check_fails(
    tmp_path: Path, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load-back check is what stands between a layout bug and a silently wrong model."""
    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer)
    monkeypatch.setattr(llama, "to_half_split", lambda w, n: w)
    with pytest.raises(UserError, match="load-back check failed"):
        export_checkpoint(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]  # no temporary left either


def test_mtp_exports_trunk_and_head_one(tmp_path: Path, tokenizer: Tokenizer) -> None:
    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer, mtp_heads=3)
    summary = export_checkpoint(ckpt, tmp_path / "hf")
    assert any("head 1" in note for note in summary.notes)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2


def test_encoder_exports_as_eurobert(tmp_path: Path, tokenizer: Tokenizer) -> None:
    if not hasattr(transformers, "EuroBertForMaskedLM"):
        pytest.skip("this transformers has no EuroBertForMaskedLM (added in transformers 5)")
    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer, kind="encoder")
    summary = export_checkpoint(ckpt, tmp_path / "hf")
    assert summary.architecture == "EuroBertForMaskedLM" and summary.max_logit_diff < 1e-4
    hf = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    ours = load_checkpoint(ckpt)
    ids = sample_rows(ours, n_rows=2, length=40, seed=3)
    with torch.no_grad():
        assert float((_objtrain_logits(ours.model, ids) - hf(input_ids=ids).logits).abs().max()) < 1e-4


def test_encdec_exports_with_its_modelling_code_and_loads_with_trust_remote_code(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    from objtrain.interop.export import _objtrain_encdec_logits

    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer, kind="encdec")
    summary = export_checkpoint(ckpt, tmp_path / "hf")
    assert summary.architecture == "ObjtrainEncDecForConditionalGeneration"
    assert summary.max_logit_diff < 1e-4 and summary.greedy_tokens == 32
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (
        config["auto_map"]["AutoModelForSeq2SeqLM"]
        == "modeling_objtrain.ObjtrainEncDecForConditionalGeneration"
    )
    assert (tmp_path / "hf" / "modeling_objtrain.py").is_file()
    # independently of the export's own check: the final directory, fresh rows, a padded encoder input
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(
        str(tmp_path / "hf"), dtype=torch.float32, trust_remote_code=True
    ).eval()
    ours = load_checkpoint(ckpt)
    ids = sample_rows(ours, n_rows=3, length=40, seed=5)
    dec = sample_rows(ours, n_rows=3, length=24, seed=6)
    with torch.no_grad():
        diff = _objtrain_encdec_logits(ours.model, ids, dec) - hf(input_ids=ids, decoder_input_ids=dec).logits
        assert float(diff.abs().max()) < 1e-4
        short = _objtrain_encdec_logits(ours.model, ids[:1, :30], dec[:1])
        mask = torch.ones(1, 40, dtype=torch.long)
        mask[:, 30:] = 0  # padding after the document is masked out
        padded = hf(input_ids=ids[:1], attention_mask=mask, decoder_input_ids=dec[:1]).logits
        assert float((short - padded).abs().max()) < 1e-4
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert tok.convert_tokens_to_ids("<extra_id_0>") == ours.specials.sentinel(0)


def test_encdec_tokenizer_ends_inputs_with_eos_and_generate_equals_objtrains(
    tmp_path: Path, tokenizer: Tokenizer, objtrain_cli: Callable[..., tuple[int, str, str]]
) -> None:
    """objtrain ends every encoder input with </s> (training, `generate`): so does the exported tokenizer,
    and transformers' seq2seq generation on the export gives `objtrain generate`'s tokens."""
    from objtrain.models.checkpoint import save_checkpoint
    from objtrain.models.generate import encode_input

    # A random tied model repeats its input token (its own embedding dominates the residual stream);
    # scaled-up block outputs make what it writes depend on the encoder input, and on its </s>.
    ckpt = tmp_path / "loud"
    model = load_checkpoint(tiny_checkpoint(tmp_path / "ck", tokenizer, kind="encdec"))
    with torch.no_grad():
        for name, param in model.model.named_parameters():
            if name.startswith("decoder.") and name.endswith(("proj.weight", "w2.weight")):
                param *= 10
    save_checkpoint(ckpt, model.model, model.specials, tokenizer, model.training)
    export_checkpoint(ckpt, tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"), trust_remote_code=True)
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(
        str(tmp_path / "hf"), dtype=torch.float32, trust_remote_code=True
    ).eval()
    eos = tokenizer.specials.eos
    assert tok("x = 1")["input_ids"] == [*tokenizer.encode("x = 1"), eos]
    for text in ("for i in [MASK](n):", "def [MASK](self):\n    return [MASK]", "[MASK] = 1"):
        pieces = text.split("[MASK]")
        spelled = pieces[0] + "".join(f"<extra_id_{k}>{p}" for k, p in enumerate(pieces[1:]))
        ids = tok(spelled)["input_ids"]
        assert ids == encode_input(tokenizer, text, fill="sentinel", append_eos=True)[0]
        code, out, err = objtrain_cli(
            "generate", ckpt, "--text", text, "--max-new-tokens", "10", "--format", "json"
        )
        assert code == 0, err
        with torch.no_grad():
            theirs = hf.generate(torch.tensor([ids]), max_new_tokens=10)[0, 1:].tolist()
        assert theirs[: len(theirs) - (theirs[-1:] == [eos])] == json.loads(out)["tokens"]


def test_encdec_export_with_wrong_modelling_code_fails_and_leaves_nothing(
    tmp_path: Path, tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from objtrain.interop import export

    original = export._remote_source

    def broken(name: str) -> str:  # a GELU where objtrain has SiLU
        source = original(name)
        return source.replace("F.silu(gate)", "F.gelu(gate)")

    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer, kind="encdec")
    monkeypatch.setattr(export, "_remote_source", broken)
    with pytest.raises(UserError, match="load-back check failed"):
        export_checkpoint(ckpt, tmp_path / "hf")
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


def test_nsp_encoder_is_refused_mlm_heads_left_out(tmp_path: Path, tokenizer: Tokenizer) -> None:
    nsp = tiny_checkpoint(
        tmp_path / "nsp", tokenizer, kind="encoder", objective="nsp", n_segments=2, n_classes=2
    )
    with pytest.raises(UserError, match="sentence pairs"):
        export_checkpoint(nsp, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    # an MLM encoder of the zoo has both too, untrained: they are left out, and said so
    mlm = tiny_checkpoint(tmp_path / "mlm", tokenizer, kind="encoder", n_segments=2, n_classes=2)
    summary = export_checkpoint(mlm, tmp_path / "hf")
    assert any("pooled head left out" in note for note in summary.notes)


def test_autotokenizer_round_trip_and_special_ids(
    tmp_path: Path, tokenizer: Tokenizer, stdlib_texts: list[str]
) -> None:
    export_checkpoint(tiny_checkpoint(tmp_path / "ck", tokenizer), tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    hard = [
        "\tdef  f(x):\r\n\t\treturn x  ",
        " lead",
        "trail ",
        "caf\u00e9 \u4e2d\u6587 \U0001f600",
        "",
        "a\x00b",
    ]
    for text in [*hard, *stdlib_texts]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
        assert ids == tokenizer.encode(text)
    assert tok("x")["input_ids"] == tokenizer.encode("x")  # no BOS/EOS added
    specials = tokenizer.specials
    for name in ("pad", "unk", "bos", "eos", "mask", "cls", "sep"):
        assert getattr(tok, f"{name}_token_id") == getattr(specials, name)
    assert tok.convert_tokens_to_ids(["<fim_prefix>", "<fim_middle>", "<extra_id_0>"]) == [
        specials.fim_prefix,
        specials.fim_middle,
        specials.sentinel(0),
    ]
    assert len(tok) == tokenizer.vocab_size
    # not the run's rows (64): rotary positions run longer inputs, which transformers would warn about
    assert tok.model_max_length >= 10**9


def test_cli_torn_checkpoint_refused_leaving_nothing(
    tmp_path: Path, tokenizer: Tokenizer, objtrain_cli: Callable[..., tuple[int, str, str]]
) -> None:
    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    code, _, err = objtrain_cli("export", ckpt, "-o", tmp_path / "hf")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "not a readable safetensors file" in err
    assert not (tmp_path / "hf").exists()
    code, _, err = objtrain_cli("export", tmp_path / "nothing", "-o", tmp_path / "hf")
    assert code == 2 and "no checkpoint or run directory" in err


def test_an_export_serves_as_tokenize_tokenizer(
    tmp_path: Path, tokenizer: Tokenizer, objtrain_cli: Callable[..., tuple[int, str, str]]
) -> None:
    export_checkpoint(tiny_checkpoint(tmp_path / "ck", tokenizer), tmp_path / "hf")
    (tmp_path / "a.txt").write_text("def f(x):\n    return x\n")
    code, _, err = objtrain_cli(
        "tokenize", tmp_path / "a.txt", "--tokenizer", tmp_path / "hf", "-o", tmp_path / "s"
    )
    assert code == 0, err
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert meta["tokenizer"]["hash"] == tokenizer.hash


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory: pytest.TempPathFactory, stdlib_texts: list[str], tokenizer: Tokenizer) -> Path:
    """A short real run in bf16 (a store of standard-library modules, validation at its end)."""
    from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
    from objtrain.training.config import build_config
    from objtrain.training.loop import train

    root = tmp_path_factory.mktemp("bf16")
    (root / "corpus").mkdir()
    for i, text in enumerate(stdlib_texts):
        (root / "corpus" / f"m{i}.py").write_text(text, encoding="utf-8")
    (root / "tok.model").write_bytes(tokenizer.model_proto)
    cfg = TokenizeConfig(tokenizer=root / "tok.model", doc_split="blank-line", valid_fraction=0.1)
    tokenize_corpus([root / "corpus"], root / "store", cfg)
    run = build_config(
        {
            "data": {"store": str(root / "store")},
            "model": {"size": "debug"},
            "objective": {"name": "clm"},
            "batch": {"seq_len": 64, "batch_size": 8},
            "budget": {"steps": 4},
            "validation": {"every": 4, "rows": 8},
            "logging": {"tensorboard": False, "sample": False},
            "precision": {"dtype": "bf16"},
            "device": "cpu",
            "workers": 0,
        }
    )
    train(run, root / "run", show_progress=False)
    return root / "run"


def test_a_bf16_run_exports_bf16_by_default_and_fp32_on_request(tmp_path: Path, bf16_run: Path) -> None:
    from safetensors import safe_open

    summary = export_checkpoint(bf16_run, tmp_path / "hf")
    assert summary.dtype == "bf16" and "the run's precision" in summary.dtype_reason
    assert 0 < summary.rounding_diff < 0.05 and summary.max_logit_diff < 1e-4
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["dtype"] == "bfloat16" == config["torch_dtype"]
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert next(hf.parameters()).dtype == torch.bfloat16  # transformers' default dtype "auto" reads it
    full = export_checkpoint(bf16_run, tmp_path / "fp32", dtype="fp32")
    assert full.dtype == "fp32" and full.rounding_diff == 0.0
    ours = load_checkpoint(bf16_run)
    expected = llama.decoder_to_llama(ours.model.state_dict(), ours.config)
    with safe_open(str(tmp_path / "fp32" / "model.safetensors"), "pt") as f:
        assert all(torch.equal(f.get_tensor(k), v) for k, v in expected.items())  # the master weights


def test_the_model_card_says_objective_data_budget_metrics_and_loading(
    tmp_path: Path, bf16_run: Path
) -> None:
    export_checkpoint(bf16_run, tmp_path / "my-model")
    card = (tmp_path / "my-model" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: text-generation\n")
    metadata = yaml.safe_load(card.split("---")[1])  # what the hub reads; left for the user to fill
    assert metadata["license"] == "unknown" and metadata["datasets"] == []
    assert "fill in `license` and `datasets`" in card
    assert "`clm`" in card and "token store: `store`" in card and "`m0.py`" in card
    assert "- steps: 4" in card and "- tokens seen: 2,048" in card and "trained in bf16" in card
    records = [json.loads(line) for line in (bf16_run / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in records if r.get("split") == "val"][-1]
    assert f"| val_loss | {val['val_loss']:.4g} |" in card
    last = [r for r in records if "loss" in r and "split" not in r][-1]
    assert f"| train loss | {last['loss']:.4g} |" in card
    assert 'AutoModelForCausalLM.from_pretrained("my-model")' in card
    for name in ("README.md", "config.json", "generation_config.json", "tokenizer_config.json"):
        text = (tmp_path / "my-model" / name).read_text()
        assert str(bf16_run.parent) not in text, name  # no local paths in what is meant to be published


def test_past_max_shard_size_the_weights_are_sharded_with_an_index(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    from objtrain.interop.init_from import load_source

    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer)
    summary = export_checkpoint(ckpt, tmp_path / "hf", max_shard_size="100KB")
    files = sorted(p.name for p in (tmp_path / "hf").glob("model*.safetensors"))
    assert summary.shards == len(files) > 2 and "model.safetensors" not in files
    assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    ours = load_checkpoint(ckpt)
    expected = llama.decoder_to_llama(ours.model.state_dict(), ours.config)
    assert set(index["weight_map"]) == set(expected) and set(index["weight_map"].values()) == set(files)
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in expected.values())
    embed = expected["model.embed_tokens.weight"].numel() * 4  # the one tensor past the limit
    for name in files:
        size = (tmp_path / "hf" / name).stat().st_size
        assert size < 100_000 + 2_000 or size > embed  # a shard holds at most the limit, or one big tensor
    # transformers loads it (the export's own check did), and --init-from reads it back exactly
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    assert torch.equal(hf.model.embed_tokens.weight, expected["model.embed_tokens.weight"])
    source = load_source(tmp_path / "hf")
    assert all(torch.equal(source.weights[k], v) for k, v in ours.model.state_dict().items())


def test_cli_bad_dtype_or_shard_size_is_one_line_and_writes_nothing(
    tmp_path: Path, tokenizer: Tokenizer, objtrain_cli: Callable[..., tuple[int, str, str]]
) -> None:
    ckpt = tiny_checkpoint(tmp_path / "ck", tokenizer)
    for flag, value, says in (
        ("--dtype", "fp8", "--dtype must be one of"),
        ("--max-shard-size", "5XB", "5GB"),
    ):
        code, _, err = objtrain_cli("export", ckpt, "-o", tmp_path / "hf", flag, value)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("kind", ["decoder", "encoder", "encdec"])
def test_the_model_cards_loading_example_runs(
    tmp_path: Path, tokenizer: Tokenizer, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import contextlib
    import io
    import re

    export_checkpoint(tiny_checkpoint(tmp_path / "ck", tokenizer, kind=kind), tmp_path / "card-test")
    card = (tmp_path / "card-test" / "README.md").read_text()
    pipeline = {"decoder": "text-generation", "encoder": "fill-mask", "encdec": "text2text-generation"}[kind]
    assert f"pipeline_tag: {pipeline}\n" in card and "metrics.jsonl` was not found" in card  # no run here
    example = re.search(r"```python\n(.*?)```", card, re.S)
    assert example is not None
    monkeypatch.chdir(tmp_path)  # the example names the export by its directory
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(example.group(1), {})
    assert printed.getvalue().strip()
