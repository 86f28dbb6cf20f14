"""`objtrain train --init-from`: a new run starts from an objtrain checkpoint's or a Hugging Face Llama
directory's weights, exactly (logits equal before the first step), with any objective of its kind."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from interop_helpers import tiny_checkpoint

from objtrain.batch import Batch
from objtrain.data.store import TokenStore
from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.models.checkpoint import load_checkpoint
from objtrain.training.config import build_config, merged
from objtrain.training.loop import Trainer, prepare

Cli = Callable[..., tuple[int, str, str]]


# A short CPU run's shapes and quiet logging, shared by the CLI tests below.
SMALL_RUN = ["--seq-len", "64", "--batch-size", "8", "--dtype", "fp32", "--device", "cpu"]
QUIET = ["workers=0", "logging.tensorboard=false", "logging.sample=false", "validation.every=-1"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, stdlib_texts: list[str], tokenizer: Tokenizer) -> Path:
    root = tmp_path_factory.mktemp("init")
    (root / "corpus").mkdir()
    for i, text in enumerate(stdlib_texts):
        (root / "corpus" / f"m{i}.py").write_text(text, encoding="utf-8")
    (root / "tok.model").write_bytes(tokenizer.model_proto)
    cfg = TokenizeConfig(tokenizer=root / "tok.model", doc_split="blank-line", valid_fraction=0.1)
    tokenize_corpus([root / "corpus"], root / "store", cfg)
    return root / "store"


def config(store: Path, init_from: Path, objective: str = "clm", **sections: Any) -> Any:
    base: dict[str, Any] = {
        "data": {"store": str(store)},
        "model": {"size": "debug"},
        "objective": {"name": objective},
        "batch": {"seq_len": 64, "batch_size": 8},
        "budget": {"steps": 4},
        "validation": {"every": -1},
        "logging": {"tensorboard": False, "sample": False},
        "precision": {"dtype": "fp32"},
        "device": "cpu",
        "workers": 0,
        "init_from": str(init_from),
    }
    return build_config(merged(base, sections))


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    B, T = ids.shape
    batch = Batch(ids, ids, torch.arange(T).expand(B, T), torch.zeros_like(ids), "causal")
    with torch.no_grad():
        return model(batch).logits


def test_from_objtrain_checkpoint_logits_equal_and_heads_follow_the_objective(
    tmp_path: Path, store: Path, tokenizer: Tokenizer
) -> None:
    src = tiny_checkpoint(tmp_path / "ck", tokenizer)
    ids = torch.randint(300, tokenizer.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    expected = logits(load_checkpoint(src).model, ids)
    trainer = Trainer(prepare(config(store, src, "fim"), tmp_path / "run"))
    assert torch.equal(logits(trainer.model.eval(), ids), expected)
    assert trainer.model.config.d_model == 64  # the source's shape, not the debug size's
    # MTP adds heads 2..n fresh; head 1 and the trunk are the source's
    trainer = Trainer(prepare(config(store, src, "mtp"), tmp_path / "run2"))
    assert torch.equal(logits(trainer.model.eval(), ids), expected)
    assert any("fresh" in note and "mtp" in note for note in trainer.init_notes)


def test_from_hugging_face_llama_logits_equal(tmp_path: Path, store: Path, tokenizer: Tokenizer) -> None:
    transformers = pytest.importorskip(
        "transformers", reason="the 'hf' extra (transformers) is not installed"
    )
    pytest.importorskip("google.protobuf", reason="the 'hf' extra (protobuf) is not installed")
    from objtrain.interop.export import export_checkpoint

    src = tiny_checkpoint(tmp_path / "ck", tokenizer, seed=3)
    export_checkpoint(src, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    ids = torch.randint(300, tokenizer.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1))
    trainer = Trainer(prepare(config(store, tmp_path / "hf", "fim"), tmp_path / "run"))
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
    assert float((logits(trainer.model.eval(), ids) - theirs).abs().max()) < 1e-4
    # the mapping in and out is exact: the same weights as the checkpoint exported
    original = load_checkpoint(src).model.state_dict()
    assert all(torch.equal(original[k], v) for k, v in trainer.model.state_dict().items())


def test_cli_trains_on_with_falling_loss(
    tmp_path: Path, store: Path, tokenizer: Tokenizer, objtrain_cli: Cli
) -> None:
    common = ["--model", "debug", *SMALL_RUN]
    quiet = QUIET
    code, _, err = objtrain_cli(
        "train",
        store,
        "--objective",
        "clm",
        "--steps",
        "30",
        "--lr",
        "3e-3",
        *common,
        *quiet,
        "-o",
        tmp_path / "clm",
    )
    assert code == 0, err
    code, _, err = objtrain_cli(
        "train",
        store,
        "--objective",
        "fim",
        "--init-from",
        tmp_path / "clm",
        "--steps",
        "12",
        "--lr",
        "1e-3",
        *common,
        *quiet,
        "-o",
        tmp_path / "fim",
    )
    assert code == 0, err
    assert "initialised from" in err

    def losses(run: str) -> list[float]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if "loss" in r and "step" in r]

    records = [json.loads(line) for line in (tmp_path / "fim" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("event") == "init_from" for r in records)
    clm, fim = losses("clm"), losses("fim")
    # FIM starts near where CLM ended, far below a fresh model's first loss, and keeps falling
    assert fim[0] < clm[0] - 0.5 and fim[0] < clm[-1] + 0.5
    assert sum(fim[-3:]) / 3 < sum(fim[:3]) / 3


def test_refusals_are_one_line_and_leave_no_run(
    tmp_path: Path, store: Path, tokenizer: Tokenizer, objtrain_cli: Cli
) -> None:
    def refused(source: Path, match: str, objective: str = "clm") -> None:
        out = tmp_path / "run"
        code, _, err = objtrain_cli(
            "train", store, "--objective", objective, "--init-from", source, "--steps", "2", "-o", out
        )
        assert code == 2 and match in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, (
            err
        )
        assert not out.exists()

    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    )
    refused(gpt2, "Llama-architecture (LlamaForCausalLM) directories only")
    gqa = tmp_path / "gqa"
    gqa.mkdir()
    llama_cfg = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": tokenizer.vocab_size,
        "intermediate_size": 192,
    }
    # grouped-query attention and an untied head are read; what objtrain cannot compute is refused
    for unsupported, match in (
        ({"num_key_value_heads": 3}, "3 key/value heads do not divide 4 query heads"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "RoPE type 'llama3'"),
        ({"attention_bias": True}, "attention_bias is true"),
    ):
        (gqa / "config.json").write_text(json.dumps(llama_cfg | unsupported))
        refused(gqa, match)
    (gqa / "config.json").write_text(json.dumps(llama_cfg | {"tie_word_embeddings": False}))
    refused(gqa, "no model.safetensors")
    refused(tmp_path / "missing", "nothing at")
    encoder = tiny_checkpoint(tmp_path / "enc", tokenizer, kind="encoder")
    refused(encoder, "is an encoder model; this objective trains a decoder")
    # another tokenizer than the store's
    other = tiny_checkpoint(tmp_path / "other", tokenizer)
    (other / "tokenizer.model").write_bytes(tokenizer.model_proto)
    meta = json.loads((other / "config.json").read_text())
    meta["tokenizer"]["sha256"] = None
    (other / "config.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match="another tokenizer"):
        from objtrain.interop import init_from

        different = SimpleNamespace(kind="sentencepiece", model_proto=b"a different model")
        init_from.check_tokenizer(init_from.load_source(other), different, store)


def test_a_run_started_from_weights_resumes_with_its_shape(
    tmp_path: Path, store: Path, tokenizer: Tokenizer
) -> None:
    """The source's shape is not the --model size's: a resume must rebuild the source's shape, with or
    without --init-from given again, and keep saying where the run started."""
    import shutil

    from objtrain.training.loop import train

    src = tiny_checkpoint(tmp_path / "ck", tokenizer)
    run = tmp_path / "run"
    train(config(store, src, "clm", checkpoint={"every": 2, "keep": 5}), run)
    shutil.rmtree(run / "checkpoints" / "step-00000004")
    (run / "checkpoints" / "latest").unlink()
    cfg = config(store, src, "clm", checkpoint={"every": 2, "keep": 5})
    cfg.init_from = None  # resumed as users do: the same command without --init-from
    assert train(cfg, run, resume=True).step == 4
    meta = json.loads((run / "checkpoints" / "step-00000004" / "config.json").read_text())
    assert meta["model"]["d_model"] == 64 and meta["training"]["init_from"] == str(src)


# A Hugging Face model with its own tokenizer: a store made with that tokenizer.json has objtrain's special
# tokens the tokenizer lacks after its vocabulary; the model grows embedding rows for them.
SPARE = 8  # the model's vocabulary is padded past its tokenizer's, as published models' often are


@pytest.fixture(scope="module")
def own_llama(tmp_path_factory: pytest.TempPathFactory, stdlib_texts: list[str]) -> tuple[Path, Path]:
    """(a tiny LlamaForCausalLM directory with its own byte-level BPE tokenizer.json, a store tokenized
    with that directory)."""
    pytest.importorskip("transformers", reason="the 'hf' extra (transformers) is not installed")
    pytest.importorskip("tokenizers", reason="the 'hf' extra (tokenizers) is not installed")
    from interop_helpers import byte_level_bpe, tiny_llama_dir

    root = tmp_path_factory.mktemp("own")
    (root / "corpus").mkdir()
    for i, text in enumerate(stdlib_texts):
        (root / "corpus" / f"m{i}.py").write_text(text, encoding="utf-8")
    bpe = byte_level_bpe(stdlib_texts, vocab_size=500, specials=("<|endoftext|>",))
    hf = tiny_llama_dir(root / "hf", bpe, spare_rows=SPARE, seed=5)
    cfg = TokenizeConfig(tokenizer=hf, doc_split="blank-line", valid_fraction=0.1, n_sentinels=16)
    tokenize_corpus([root / "corpus"], root / "store", cfg)
    return hf, root / "store"


def test_hf_model_on_its_own_tokenizer_grows_rows_and_keeps_its_logits(
    tmp_path: Path, own_llama: tuple[Path, Path]
) -> None:
    import transformers
    from safetensors.torch import load_file

    hf_dir, store = own_llama
    meta = json.loads((store / "meta.json").read_text())
    rows = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    base = rows - SPARE
    assert meta["specials"]["eos"] < base  # the tokenizer's own <|endoftext|>
    assert meta["vocab_size"] > rows  # some added special tokens fall past the model's rows
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    trainer = Trainer(prepare(config(store, hf_dir, "fim"), tmp_path / "run"))
    model = trainer.model.eval()
    assert model.config.vocab_size == meta["vocab_size"]
    ids = torch.randint(0, rows, (2, 48), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
    mine = logits(model, ids)
    assert mine.shape[-1] == meta["vocab_size"]
    assert float((mine[..., :rows] - theirs).abs().max()) < 1e-4
    # every row the model had is copied as is (its spare rows too); the new ones are the rows' mean
    embed = load_file(str(hf_dir / "model.safetensors"))["model.embed_tokens.weight"]
    table = model.state_dict()["embed.weight"]
    assert torch.equal(table[:rows], embed)
    assert torch.allclose(table[rows:], embed.mean(0).expand(meta["vocab_size"] - rows, -1))
    note = " ".join(trainer.init_notes)
    assert f"{SPARE} on the model's spare embedding rows" in note and "the mean of the model's" in note
    # the added special tokens run through the model (FIM's, the sentinels)
    specials = TokenStore.open(store).specials
    row = torch.tensor([[specials.fim_prefix, 5, 6, specials.fim_suffix, 7, specials.fim_middle]])
    assert torch.isfinite(logits(model, torch.cat((row, torch.tensor([[specials.sentinel(0)] * 6]))))).all()


@pytest.mark.parametrize(
    ("objective", "kind"), [("clm", None), ("mtp", None), ("prefix_lm", "decoder"), ("ul2", "decoder")]
)
def test_hf_model_on_its_own_tokenizer_for_decoder_objectives(
    tmp_path: Path, own_llama: tuple[Path, Path], objective: str, kind: str | None
) -> None:
    import transformers

    hf_dir, store = own_llama
    rows = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    model_section = {"size": "debug", "kind": kind} if kind else {"size": "debug"}
    trainer = Trainer(prepare(config(store, hf_dir, objective, model=model_section), tmp_path / "run"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    ids = torch.randint(0, rows, (1, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
    assert float((logits(trainer.model.eval(), ids)[..., :rows] - theirs).abs().max()) < 1e-4


def test_cli_fim_on_hf_model_with_its_tokenizer_loss_falls(
    tmp_path: Path, own_llama: tuple[Path, Path], objtrain_cli: Cli
) -> None:
    hf_dir, store = own_llama
    code, _, err = objtrain_cli(
        "train",
        store,
        "--objective",
        "fim",
        "--init-from",
        hf_dir,
        "--steps",
        "12",
        "--lr",
        "3e-3",
        *SMALL_RUN,
        *QUIET,
        "-o",
        tmp_path / "fim",
    )
    assert code == 0, err
    assert "initialised from" in err and "special tokens the tokenizer lacks" in err
    records = [json.loads(line) for line in (tmp_path / "fim" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r and "step" in r]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.1, losses


def test_hf_model_on_another_tokenizer_is_refused(
    tmp_path: Path, own_llama: tuple[Path, Path], store: Path, stdlib_texts: list[str], objtrain_cli: Cli
) -> None:
    from interop_helpers import byte_level_bpe

    hf_dir, own_store = own_llama
    other = tmp_path / "other.json"
    byte_level_bpe(stdlib_texts[:3], vocab_size=400, specials=("<|endoftext|>",)).save(str(other))
    cfg = TokenizeConfig(tokenizer=other, doc_split="blank-line", valid_fraction=0.1, n_sentinels=16)
    tokenize_corpus([own_store.parent / "corpus"], tmp_path / "other-store", cfg)
    for data in (tmp_path / "other-store", store):  # another tokenizer.json; a sentencepiece store
        out = tmp_path / "run"
        code, _, err = objtrain_cli(
            "train", data, "--objective", "fim", "--init-from", hf_dir, "--steps", "2", "-o", out
        )
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "tokenized with another tokenizer than" in err and "--tokenizer" in err, err
        assert not out.exists()


def test_a_run_grown_from_a_hf_model_resumes_with_its_grown_vocabulary(
    tmp_path: Path, own_llama: tuple[Path, Path]
) -> None:
    import shutil

    from objtrain.training.loop import train

    hf_dir, store = own_llama
    run = tmp_path / "run"
    train(config(store, hf_dir, "fim", checkpoint={"every": 2, "keep": 5}), run)
    shutil.rmtree(run / "checkpoints" / "step-00000004")
    (run / "checkpoints" / "latest").unlink()
    cfg = config(store, hf_dir, "fim", checkpoint={"every": 2, "keep": 5})
    cfg.init_from = None
    assert train(cfg, run, resume=True).step == 4
    meta = json.loads((run / "checkpoints" / "step-00000004" / "config.json").read_text())
    assert meta["model"]["vocab_size"] == json.loads((store / "meta.json").read_text())["vocab_size"]
    assert meta["training"]["init_from"] == str(hf_dir)


def test_hf_tokenizer_json_is_compared_as_json_and_must_fit_the_model(
    tmp_path: Path, own_llama: tuple[Path, Path]
) -> None:
    import shutil

    from objtrain.interop import init_from

    hf_dir, store = own_llama
    tokenizer = TokenStore.open(store).tokenizer
    copy = tmp_path / "copy"
    shutil.copytree(hf_dir, copy)
    table = json.loads((copy / "tokenizer.json").read_text())
    (copy / "tokenizer.json").write_text(json.dumps(table, indent=4, sort_keys=True))  # saved again
    source = init_from.load_source(copy)
    init_from.check_tokenizer(source, tokenizer, store)
    assert source.vocab_size == tokenizer.vocab_size and source.grow_rows > 0
    config_json = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(config_json | {"vocab_size": 100}))
    with pytest.raises(UserError, match=r"tokenizer\.json has 500 tokens, its model only 100 embedding rows"):
        init_from.check_tokenizer(init_from.load_source(copy), tokenizer, store)


def test_mistral_without_a_sliding_window_is_a_llama(
    tmp_path: Path,
    store: Path,
    tokenizer: Tokenizer,
    objtrain_cli: Cli,
    capsys: pytest.CaptureFixture[str],
) -> None:
    transformers = pytest.importorskip(
        "transformers", reason="the 'hf' extra (transformers) is not installed"
    )
    torch.manual_seed(0)
    mistral = transformers.MistralConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        sliding_window=None,
        tie_word_embeddings=False,
    )
    model = transformers.MistralForCausalLM(mistral).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param *= 8  # attention far from uniform, so a wrong RoPE layout would show
    source = tmp_path / "mistral"
    model.save_pretrained(str(source))
    (source / "tokenizer.model").write_bytes(tokenizer.model_proto)
    assert json.loads((source / "config.json").read_text())["sliding_window"] is None
    ids = torch.randint(300, tokenizer.vocab_size, (2, 40), generator=torch.Generator().manual_seed(2))
    trainer = Trainer(prepare(config(store, source, "clm"), tmp_path / "run"))
    with torch.no_grad():
        theirs = model(input_ids=ids).logits
    assert float((logits(trainer.model.eval(), ids) - theirs).abs().max()) < 1e-4
    # a real sliding window is another function than objtrain's attention: refused in one line
    windowed = json.loads((source / "config.json").read_text()) | {"sliding_window": 4096}
    (source / "config.json").write_text(json.dumps(windowed))
    out = tmp_path / "refused"
    capsys.readouterr()  # save_pretrained's progress bar
    code, _, err = objtrain_cli("train", store, "--objective", "clm", "--init-from", source, "-o", out)
    assert code == 2 and "sliding_window 4096" in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and not out.exists()
