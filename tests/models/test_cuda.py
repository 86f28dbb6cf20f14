"""What only a GPU shows, skipped without CUDA: FlexAttention's training step against masked SDPA in bf16,
and decoding steps captured in CUDA graphs giving the dynamic path's tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_helpers import docs_row, make_batch, tiny_model

from objtrain.models import generate as gen
from objtrain.models import static as static_module

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PACKED = [docs_row([40, 50, 38], 128), docs_row([70, 58], 128), docs_row([100], 128)]


@pytest.mark.parametrize(
    ("kind", "attention"),
    [("decoder", "causal"), ("decoder", "prefix"), ("encoder", "bidirectional"), ("encdec", "bidirectional")],
)
def test_flex_training_step_matches_masked_sdpa_in_bf16(kind: str, attention: str) -> None:
    batch = make_batch(
        PACKED, attention, prefix_len=5, decoder_doc_rows=PACKED if kind == "encdec" else None
    ).to("cuda")
    grads, logits = {}, {}
    for kernel in ("sdpa", "flex"):
        model = tiny_model(kind, attention_kernel=kernel).cuda().train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(batch).logits
        F.cross_entropy(out.flatten(0, 1).float(), batch.labels.flatten()).backward()
        logits[kernel] = out.float()
        grads[kernel] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert torch.allclose(logits["flex"], logits["sdpa"], atol=5e-2, rtol=2e-2)  # bf16 rounding
    cos = F.cosine_similarity(grads["flex"], grads["sdpa"], dim=0)
    assert cos > 0.999


def test_auto_takes_flex_on_cuda_for_packed_rows() -> None:
    from torch.nn.attention.flex_attention import BlockMask

    model = tiny_model("decoder").cuda().train()
    ctx = model.trunk(make_batch(PACKED, "causal").to("cuda")).ctx
    assert isinstance(ctx.mask, BlockMask)


@pytest.mark.parametrize("compile", [False, True])
def test_captured_decoding_equals_dynamic(compile: bool) -> None:
    model = tiny_model("decoder", mtp_heads=3).cuda()
    prompt = list(range(5, 40))
    want = list(gen.generate_decoder(model, prompt, 48, static=False))
    for _ in range(2):  # the second generation replays the graphs captured by the first
        assert list(gen.generate_decoder(model, prompt, 48, compile=compile)) == want
        assert list(gen.generate_speculative(model, prompt, 48, compile=compile)) == want
    captured = static_module._STEPS[model][1][f"decoder-{compile}"].steps[True]
    assert captured.graphs and captured.graph is not None  # not fallen back to eager
    sampling = gen.Sampling(temperature=1.0, top_k=20, seed=3)
    assert list(gen.generate_decoder(model, prompt, 32, sampling, compile=compile)) == list(
        gen.generate_decoder(model, prompt, 32, sampling, static=False)
    )
    encdec = tiny_model("encdec").cuda()
    for p in (prompt, prompt[:7]):
        want = list(gen.generate_encdec(encdec, p, 24, static=False))
        assert list(gen.generate_encdec(encdec, p, 24, compile=compile)) == want


def test_captured_steps_do_not_sync() -> None:
    """After capture, a greedy generation reads the device only through its pinned copies."""
    model = tiny_model("decoder", mtp_heads=3).cuda()
    prompt = list(range(5, 40))
    list(gen.generate_decoder(model, prompt, 16))  # build and capture
    steps = static_module._STEPS[model][1]["decoder-False"]
    steps.start(torch.tensor([7], device="cuda"), len(prompt))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(8):
            steps.advance(greedy=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
