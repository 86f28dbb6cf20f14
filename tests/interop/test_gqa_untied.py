"""Llama checkpoints with grouped-query attention and an untied output layer (Llama 2/3, TinyLlama): read
by --init-from exactly, trained on, and exported back to a stock LlamaForCausalLM."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from interop_helpers import tiny_checkpoint
from safetensors.torch import load_file, save_file

from objtrain.batch import Batch
from objtrain.data.tokenize import TokenizeConfig, tokenize_corpus
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.interop import init_from
from objtrain.interop.llama import to_interleaved
from objtrain.models.checkpoint import load_checkpoint
from objtrain.training.config import build_config
from objtrain.training.loop import Trainer, prepare

Cli = Callable[..., tuple[int, str, str]]
SPARE = 8  # the model's vocabulary padded past its tokenizer's
QUIET = ["workers=0", "logging.tensorboard=false", "logging.sample=false", "validation.every=-1"]


def run_config(store: Path, init: Path, objective: str = "clm") -> Any:
    return build_config(
        {
            "data": {"store": str(store)},
            "model": {"size": "debug"},
            "objective": {"name": objective},
            "batch": {"seq_len": 64, "batch_size": 8},
            "budget": {"steps": 2},
            "validation": {"every": -1},
            "logging": {"tensorboard": False, "sample": False},
            "precision": {"dtype": "fp32"},
            "device": "cpu",
            "workers": 0,
            "init_from": str(init),
        }
    )


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    B, T = ids.shape
    batch = Batch(ids, ids, torch.arange(T).expand(B, T), torch.zeros_like(ids), "causal")
    with torch.no_grad():
        return model(batch).logits


@pytest.fixture(scope="module")
def gqa_llama(tmp_path_factory: pytest.TempPathFactory, stdlib_texts: list[str]) -> tuple[Path, Path]:
    """(a tiny LlamaForCausalLM with 2 key/value heads for 4 query heads and an untied lm_head, beside its
    own byte-level BPE tokenizer.json; a store tokenized with that directory)."""
    pytest.importorskip("transformers", reason="the 'hf' extra (transformers) is not installed")
    pytest.importorskip("tokenizers", reason="the 'hf' extra (tokenizers) is not installed")
    from interop_helpers import byte_level_bpe, tiny_llama_dir

    root = tmp_path_factory.mktemp("gqa")
    (root / "corpus").mkdir()
    for i, text in enumerate(stdlib_texts):
        (root / "corpus" / f"m{i}.py").write_text(text, encoding="utf-8")
    bpe = byte_level_bpe(stdlib_texts, vocab_size=500, specials=("<|endoftext|>",))
    hf = tiny_llama_dir(root / "hf", bpe, spare_rows=SPARE, seed=7, kv_heads=2, tied=False)
    cfg = TokenizeConfig(tokenizer=hf, doc_split="blank-line", valid_fraction=0.1, n_sentinels=16)
    tokenize_corpus([root / "corpus"], root / "store", cfg)
    return hf, root / "store"


def test_grouped_untied_llama_logits_equal_and_output_rows_grow(
    tmp_path: Path, gqa_llama: tuple[Path, Path]
) -> None:
    import transformers

    hf_dir, store = gqa_llama
    rows = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    vocab = json.loads((store / "meta.json").read_text())["vocab_size"]
    assert vocab > rows  # objtrain's special tokens need rows past the model's
    trainer = Trainer(prepare(run_config(store, hf_dir, "fim"), tmp_path / "run"))
    model = trainer.model.eval()
    assert (model.config.n_head, model.config.kv_heads, model.config.tie_embeddings) == (4, 2, False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    ids = torch.randint(0, rows, (2, 48), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
    assert float((logits(model, ids)[..., :rows] - theirs).abs().max()) < 1e-4
    # exact mapping: k through the inverse RoPE reordering over its 2 heads; lm_head as the untied output
    source = load_file(str(hf_dir / "model.safetensors"))
    mine = model.state_dict()
    k = mine["blocks.1.attn.qkv.weight"][64:96]  # rows q (4 x 16) | k (2 x 16) | v
    assert torch.equal(k, to_interleaved(source["model.layers.1.self_attn.k_proj.weight"], 2))
    head, embed = source["lm_head.weight"], source["model.embed_tokens.weight"]
    assert not torch.equal(head, embed)
    assert torch.equal(mine["lm_head.out.weight"][:rows], head)
    assert torch.equal(mine["embed.weight"][:rows], embed)
    # the grown rows: each the mean of the old ones, in both matrices
    assert torch.allclose(mine["lm_head.out.weight"][rows:], head.mean(0).expand(vocab - rows, -1))
    assert torch.allclose(mine["embed.weight"][rows:], embed.mean(0).expand(vocab - rows, -1))
    # so a new token's logit is the mean of the old ones
    new_logits = logits(model, ids)
    assert torch.allclose(new_logits[..., rows], new_logits[..., :rows].mean(-1), atol=1e-4)


def test_round_trip_init_from_train_export_loads_in_transformers(
    tmp_path: Path, gqa_llama: tuple[Path, Path], objtrain_cli: Cli
) -> None:
    import transformers

    hf_dir, store = gqa_llama
    run, out = tmp_path / "run", tmp_path / "export"
    small = ["--seq-len", "64", "--batch-size", "8", "--dtype", "fp32", "--device", "cpu", "--lr", "3e-3"]
    code, _, err = objtrain_cli(
        "train", store, "--objective", "clm", "--init-from", hf_dir, "--steps", "2", *small, *QUIET, "-o", run
    )
    assert code == 0, err
    code, _, err = objtrain_cli("export", run, "-o", out)
    assert code == 0, err
    config = json.loads((out / "config.json").read_text())
    assert config["num_attention_heads"] == 4 and config["num_key_value_heads"] == 2
    assert config["tie_word_embeddings"] is False
    exported = load_file(str(out / "model.safetensors"))
    assert exported["model.layers.0.self_attn.k_proj.weight"].shape == (32, 64)
    trained = load_checkpoint(run)
    assert torch.equal(exported["lm_head.weight"], trained.model.state_dict()["lm_head.out.weight"])
    before = load_file(str(hf_dir / "model.safetensors"))["lm_head.weight"]
    assert not torch.equal(exported["lm_head.weight"][: len(before)], before)  # trained, not just copied
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert hf.lm_head.weight.data_ptr() != hf.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(0, 500, (2, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert float((hf(input_ids=ids).logits - logits(trained.model, ids)).abs().max()) < 1e-4


@pytest.mark.parametrize(
    ("n_kv_head", "tied"), [(2, True), (0, False), (1, False)], ids=["gqa", "untied", "mqa-untied"]
)
def test_objtrain_decoder_exports_as_stock_llama_and_reads_back_exactly(
    tmp_path: Path, tokenizer: Tokenizer, n_kv_head: int, tied: bool
) -> None:
    transformers = pytest.importorskip("transformers", reason="the 'hf' extra is not installed")
    from objtrain.interop.export import export_checkpoint

    src = tiny_checkpoint(tmp_path / "ck", tokenizer, seed=2, n_kv_head=n_kv_head, tie_embeddings=tied)
    summary = export_checkpoint(src, tmp_path / "hf")  # its load-back check: logits to 1e-4, greedy equal
    assert summary.max_logit_diff < 1e-4 and summary.greedy_tokens == 32
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["num_key_value_heads"] == (n_kv_head or 4) and config["tie_word_embeddings"] is tied
    assert ("lm_head.weight" in load_file(str(tmp_path / "hf" / "model.safetensors"))) is not tied
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    assert (hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()) is tied
    # and --init-from reads the export back to the very same weights
    original = load_checkpoint(src)
    source = init_from.load_source(tmp_path / "hf")
    assert source.config.kv_heads == original.config.kv_heads
    assert source.config.tie_embeddings is tied
    state = original.model.state_dict()
    assert source.weights.keys() == state.keys()
    assert all(torch.equal(state[k], v) for k, v in source.weights.items())


def test_inconsistent_output_layers_are_refused(tmp_path: Path, gqa_llama: tuple[Path, Path]) -> None:
    import shutil

    hf_dir, _ = gqa_llama
    copy = tmp_path / "copy"
    shutil.copytree(hf_dir, copy)
    weights = load_file(str(copy / "model.safetensors"))
    without_head = {k: v for k, v in weights.items() if k != "lm_head.weight"}
    save_file(without_head, str(copy / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"untied .* but there is no lm_head\.weight"):
        init_from.load_source(copy)
    save_file(weights, str(copy / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": True}))
    with pytest.raises(UserError, match=r"tie_word_embeddings is true, yet lm_head\.weight differs"):
        init_from.load_source(copy)


def test_init_from_keeps_the_source_shape_against_overrides(tmp_path: Path, tokenizer: Tokenizer) -> None:
    from objtrain.models import model_config

    src = tiny_checkpoint(tmp_path / "ck", tokenizer, n_kv_head=2, tie_embeddings=False)
    source = init_from.load_source(src)
    planned = model_config("decoder", "debug", vocab_size=tokenizer.vocab_size)
    cfg = init_from.model_config(source, planned, {})
    assert (cfg.kv_heads, cfg.tie_embeddings) == (2, False)
    assert init_from.model_config(source, planned, {"n_kv_head": 2}).kv_heads == 2
    for override in ({"n_kv_head": 0}, {"n_kv_head": 1}, {"tie_embeddings": True}):
        with pytest.raises(UserError, match="differs from the source's"):
            init_from.model_config(source, planned, override)
