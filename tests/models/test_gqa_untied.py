"""Grouped-query attention (n_kv_head < n_head) and an untied output layer (tie_embeddings=false) in the
decoder: what they compute, their caches, their checkpoints; and that the defaults change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from model_helpers import docs_row, make_batch, tiny_model
from safetensors.torch import load_file

import objtrain.models.checkpoint as ck
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.models import generate as gen
from objtrain.models import model_config
from objtrain.models.zoo import config_to_dict
from objtrain.specials import Specials

PROMPT = [5, 17, 33, 60, 21, 8]
PACKED_ROWS = [docs_row([3, 5, 2], 12), docs_row([7, 4], 12), docs_row([12], 12)]


def repeated_kv_copy(gqa: torch.nn.Module) -> torch.nn.Module:
    """A multi-head model computing what `gqa` should: each key/value head's rows copied to the query
    heads of its group (query head h reads key/value head h // (H/G), as in Hugging Face's Llama)."""
    cfg = gqa.config
    mha = tiny_model("decoder", n_head=cfg.n_head, mtp_heads=cfg.mtp_heads)
    D, H, G, K = cfg.d_model, cfg.n_head, cfg.kv_heads, cfg.head_dim
    state = dict(gqa.state_dict())
    for key, w in gqa.state_dict().items():
        if key.endswith("attn.qkv.weight"):
            q, k, v = w[:D], w[D : D + G * K], w[D + G * K :]
            k, v = (t.unflatten(0, (G, K)).repeat_interleave(H // G, dim=0).flatten(0, 1) for t in (k, v))
            state[key] = torch.cat((q, k, v))
    mha.load_state_dict(state)
    return mha


@pytest.mark.parametrize("n_kv_head", [2, 1])
@pytest.mark.parametrize("doc_rows", [[[0] * 12] * 2, PACKED_ROWS], ids=["one-document", "packed"])
def test_grouped_attention_is_multi_head_attention_with_shared_kv(
    n_kv_head: int, doc_rows: list[list[int]]
) -> None:
    gqa = tiny_model("decoder", n_head=4, n_kv_head=n_kv_head)
    qkv = gqa.blocks[0].attn.qkv.weight  # type: ignore[index]
    assert qkv.shape == (32 + 2 * n_kv_head * 8, 32)  # q (D) | k (G*K) | v (G*K)
    batch = make_batch(doc_rows, "causal").mark_layout()
    with torch.no_grad():
        expected = repeated_kv_copy(gqa)(batch).logits
        got = gqa(batch).logits
        torch._dynamo.reset()
        compiled = torch.compile(gqa, backend="eager", fullgraph=True)(batch).logits
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.allclose(compiled, expected, atol=1e-5)  # the half-split layout rotates G key heads
    # a wrong grouping (query head h reading key/value head h % G) gives other logits
    wrong = repeated_kv_copy(gqa)
    with torch.no_grad():
        for block in wrong.blocks:  # type: ignore[attr-defined]
            w = block.attn.qkv.weight
            k = w[32:64].unflatten(0, (4, 8))
            w[32:64] = k[[0, 2, 1, 3]].flatten(0, 1)
    if n_kv_head == 2:
        with torch.no_grad():
            assert not torch.allclose(wrong(batch).logits, got, atol=1e-3)


@pytest.mark.parametrize("mtp_heads", [1, 3])
def test_grouped_kv_cache_holds_g_heads_and_equals_recomputation(mtp_heads: int) -> None:
    model = tiny_model("decoder", n_head=4, n_kv_head=2, mtp_heads=mtp_heads)
    assert model.new_cache(1, 8)[0].k.shape == (1, 2, 8, 8)  # type: ignore[operator]
    cached = list(gen.generate_decoder(model, PROMPT, 20))  # type: ignore[arg-type]
    assert cached == list(gen.generate_decoder(model, PROMPT, 20, use_cache=False))  # type: ignore[arg-type]
    assert len(set(cached)) > 3
    if mtp_heads > 1:  # self-speculative decoding runs the heads as one stacked block
        heads = model.stacked_heads()  # type: ignore[operator]
        ids = torch.tensor([[*PROMPT, 40, 41]])
        caches, stacked = model.new_cache(1, 8), model.new_stacked_cache(1, 8)  # type: ignore[operator]
        pos = torch.arange(8)[None]
        each = torch.stack(model.step_hidden(ids, pos, caches, n_heads=mtp_heads))  # type: ignore[operator]
        assert torch.allclose(model.step_stacked(ids, pos, stacked, heads), each, atol=1e-5)  # type: ignore[operator]


def test_untied_head_has_its_own_matrix_and_the_embedding_only_feeds_the_input() -> None:
    model = tiny_model("decoder", tie_embeddings=False, mtp_heads=2)
    out = model.lm_head.out  # type: ignore[union-attr]
    assert out is not None and out.weight.shape == (97, 32)
    assert not torch.equal(out.weight, model.embed.weight)
    batch = make_batch([[0] * 10] * 2, "causal")
    trunk = model.trunk(batch)
    hidden, logits = model.head(0, trunk)  # type: ignore[operator]
    assert torch.allclose(logits, F.linear(hidden, out.weight), atol=1e-6)
    assert torch.allclose(model.unembed(hidden), logits, atol=1e-5)  # type: ignore[operator]
    model.train()
    result = model(batch)
    (result.logits.sum() + result.mtp_logits[0].sum()).backward()  # type: ignore[index]
    assert out.weight.grad is not None and out.weight.grad.abs().sum() > 0
    # the embedding's gradient comes from the input lookup only: rows of unseen tokens get none
    unseen = sorted(set(range(97)) - set(batch.input_ids.flatten().tolist()))
    assert model.embed.weight.grad[unseen].abs().sum() == 0  # type: ignore[index]


def test_defaults_build_the_same_model_as_before() -> None:
    """n_kv_head = n_head and tie_embeddings=true are the old model: same tensors, same logits, and a
    config.json without the new keys."""
    plain = tiny_model("decoder", mtp_heads=2)
    explicit = tiny_model("decoder", mtp_heads=2, n_kv_head=2, tie_embeddings=True)
    assert plain.state_dict().keys() == explicit.state_dict().keys()
    assert all(torch.equal(v, explicit.state_dict()[k]) for k, v in plain.state_dict().items())
    batch = make_batch(PACKED_ROWS, "causal")
    with torch.no_grad():
        assert torch.equal(plain(batch).logits, explicit(batch).logits)
    assert not {"n_kv_head", "tie_embeddings"} & set(config_to_dict(plain.config))
    grouped = model_config("decoder", "debug", {"n_head": 4, "n_kv_head": 2, "tie_embeddings": False})
    assert config_to_dict(grouped)["n_kv_head"] == 2 and config_to_dict(grouped)["tie_embeddings"] is False


def test_bad_settings_are_one_clear_error() -> None:
    with pytest.raises(UserError, match="n_kv_head 3 must divide n_head 4"):
        model_config("decoder", "debug", {"n_head": 4, "n_kv_head": 3})
    with pytest.raises(UserError, match="for decoder models"):
        model_config("encoder", "debug", {"n_kv_head": 1})
    with pytest.raises(UserError, match="for decoder models"):
        model_config("encdec", "debug", {"tie_embeddings": False})


def test_checkpoint_saves_and_reloads_grouped_untied_weights(
    tmp_path: Path, tokenizer: Tokenizer, specials: Specials
) -> None:
    torch.manual_seed(0)
    cfg = model_config(
        "decoder",
        "debug",
        {"n_head": 4, "n_kv_head": 1, "tie_embeddings": False, "init_std": 0.3},
        vocab_size=tokenizer.vocab_size,
    )
    from objtrain.models import build_model

    model = build_model(cfg).eval()
    path = ck.save_checkpoint(tmp_path / "c", model, specials, tokenizer)
    stored = load_file(str(path / ck.WEIGHTS))
    assert stored["lm_head.out.weight"].shape == (tokenizer.vocab_size, 32)
    assert stored["blocks.0.attn.qkv.weight"].shape == (32 + 2 * 8, 32)
    loaded = ck.load_checkpoint(path)
    assert loaded.config == cfg
    batch = make_batch(PACKED_ROWS, "causal")
    with torch.no_grad():
        assert torch.equal(model(batch).logits, loaded.model(batch).logits)  # type: ignore[operator]
    # a tied model stores no output matrix: the embedding once
    tied = tiny_model("decoder")
    path = ck.save_checkpoint(tmp_path / "t", tied, specials, tokenizer)
    assert not any(k.startswith("lm_head.out") for k in load_file(str(path / ck.WEIGHTS)))
