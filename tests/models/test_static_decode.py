"""Static decoding (fixed-size caches, state on the device, steps captured on CUDA): the same tokens as the
dynamic path, greedy, sampled, speculative and encoder-decoder; steps kept across prompts."""

from __future__ import annotations

import functools

import pytest
import torch
from model_helpers import tiny_model

import objtrain.models.static as static_module
from objtrain.models import generate as gen
from objtrain.models.decoder import Decoder
from objtrain.models.static import SpeculativeSteps

PROMPTS = [[5, 17, 33, 60, 21, 8], [3], list(range(20, 90))]
SAMPLED = gen.Sampling(temperature=1.0, top_k=20, top_p=0.9, seed=7)


@pytest.mark.parametrize(
    "overrides", [{}, {"mtp_heads": 3}, {"n_head": 4, "n_kv_head": 2, "tie_embeddings": False}]
)
@pytest.mark.parametrize("sampling", [gen.Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_static_decoder_equals_dynamic(overrides: dict[str, object], sampling: gen.Sampling) -> None:
    model = tiny_model("decoder", **overrides)
    for prompt in PROMPTS:
        dynamic = list(gen.generate_decoder(model, prompt, 40, sampling))
        assert list(gen.generate_decoder(model, prompt, 40, sampling, static=True)) == dynamic
        assert len(dynamic) == 40 and len(set(dynamic)) > 3  # a non-degenerate sequence


def test_static_decoder_stops_where_dynamic_does() -> None:
    model = tiny_model("decoder")
    full = list(gen.generate_decoder(model, PROMPTS[0], 30))
    stop = full[7]
    want = full[: full.index(stop)]
    assert list(gen.generate_decoder(model, PROMPTS[0], 30, stop_ids=(stop,), static=True)) == want
    for n in (1, 2, 5):
        assert list(gen.generate_decoder(model, PROMPTS[0], n, static=True)) == full[:n]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("tree", ["default", "chain", "wide"])
def test_static_speculative_equals_greedy_and_dynamic_speculative(n: int, tree: str) -> None:
    model = tiny_model("decoder", mtp_heads=n)
    paths = {
        "default": None,
        "chain": gen.chain_tree(n - 1),
        "wide": tuple(
            p
            for p in ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (1, 0, 2))
            if len(p) <= n - 1
        ),
    }[tree]
    for prompt in PROMPTS:
        greedy = list(gen.generate_decoder(model, prompt, 30))
        stats, dynamic_stats = gen.SpeculativeStats(), gen.SpeculativeStats()
        got = list(gen.generate_speculative(model, prompt, 30, stats=stats, tree=paths, static=True))
        assert got == greedy
        assert list(gen.generate_speculative(model, prompt, 30, stats=dynamic_stats, tree=paths)) == greedy
        assert stats == dynamic_stats  # the same steps, the same drafts accepted


def test_static_speculative_without_trunk_layers() -> None:
    """n_layer 1: head 1's layer is the only block, so only the stacked heads hold a cache."""
    model = tiny_model("decoder", mtp_heads=3, n_layer=1)
    greedy = list(gen.generate_decoder(model, PROMPTS[0], 20))
    assert list(gen.generate_speculative(model, PROMPTS[0], 20, static=True)) == greedy


def test_static_speculative_accepts_every_draft_when_heads_agree() -> None:
    model = tiny_model("decoder", mtp_heads=4)
    with torch.no_grad():  # identity blocks: the model repeats its last token, every head agrees
        for name, p in model.named_parameters():
            if name.endswith(("proj.weight", "w2.weight")):
                p.zero_()
    greedy = list(gen.generate_decoder(model, [7] * 6, 13))
    assert len(set(greedy)) == 1
    for max_new in (1, 2, 5, 13):
        stats = gen.SpeculativeStats()
        assert (
            list(gen.generate_speculative(model, [7] * 6, max_new, stats=stats, static=True))
            == (greedy[:max_new])
        )
        assert stats.acceptance == 1.0 or max_new == 1


@pytest.mark.parametrize("accepted", ["side path", "argmax chain"])
def test_static_tree_step_moves_the_accepted_path_into_place(accepted: str) -> None:
    """As the dynamic step: the accepted path's keys/values end up contiguous after the old length."""
    model: Decoder = tiny_model("decoder", mtp_heads=3)  # type: ignore[assignment]
    prompt = PROMPTS[0]
    true = list(gen.generate_decoder(model, prompt, 4))
    tree = ((0,), (1,), (0, 0), (1, 0), (1, 1))  # nodes: root, (0,), (0,0), (1,), (1,0), (1,1)
    layout = gen.tree_layout(tree, 3, torch.device("cpu"))
    steps = SpeculativeSteps(model, layout, 64, graphs=False)
    with torch.no_grad():
        steps.prefill(torch.tensor([prompt]))
        assert steps.root.tolist() == true[:1]
        wrong = [(t + 1) % model.config.vocab_size for t in true]
        if accepted == "side path":  # root -> (1,) -> (1, 0): nodes 3 and 4 move to slots 1 and 2
            steps.candidates.copy_(torch.tensor([wrong[1], true[1], true[2], wrong[2]]))
        else:
            steps.candidates.copy_(torch.tensor([true[1], wrong[1], true[2], wrong[2]]))
        out = steps.advance().tolist()
        assert out == [*true[1:3], true[3], 2] and steps.start.tolist() == [len(prompt) + 3]
        plain = model.new_stacked_cache(1, 16)
        fed = torch.tensor([[*prompt, *true[:3]]])
        model.step_stacked(fed, torch.arange(fed.size(1))[None], plain, model.stacked_heads())
    n = fed.size(1)
    for got, want in zip(steps.caches, plain, strict=True):
        assert torch.allclose(got.k[:, :, :n], want.k[:, :, :n], atol=1e-5)
        assert torch.allclose(got.v[:, :, :n], want.v[:, :, :n], atol=1e-5)


@pytest.mark.parametrize("sampling", [gen.Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_static_encdec_equals_dynamic(sampling: gen.Sampling) -> None:
    model = tiny_model("encdec")
    for prompt in PROMPTS:  # the second memory is shorter than the first: its padding must stay hidden
        dynamic = list(gen.generate_encdec(model, prompt, 24, sampling))
        assert list(gen.generate_encdec(model, prompt, 24, sampling, static=True)) == dynamic
        assert sampling.greedy or len(set(dynamic)) > 2


def test_steps_are_kept_across_prompts_while_they_fit() -> None:
    model = tiny_model("decoder")
    list(gen.generate_decoder(model, PROMPTS[0], 8, static=True))
    (kept,) = static_module._STEPS[model][1].values()
    list(gen.generate_decoder(model, PROMPTS[1], 8, static=True))
    assert static_module._STEPS[model][1]["decoder-False"] is kept  # fits: the same buffers (and graph)
    list(gen.generate_decoder(model, PROMPTS[2], 200, static=True))
    longer = static_module._STEPS[model][1]["decoder-False"]
    assert longer is not kept and longer.max_len >= 270
    model.double()  # new weight storage: steps that read the old addresses are dropped
    assert list(gen.generate_decoder(model, PROMPTS[0], 8, static=True)) == list(
        gen.generate_decoder(model, PROMPTS[0], 8)
    )
    assert static_module._STEPS[model][1]["decoder-False"].max_len < longer.max_len


def test_warm_up_leaves_the_state_as_it_was() -> None:
    """Capturing a CUDA graph first runs the step a few times: that must not move the generation on."""
    model = tiny_model("decoder", mtp_heads=3)
    want = list(gen.generate_decoder(model, PROMPTS[0], 20))
    steps = static_module.DecoderSteps(model, 64, graphs=False)  # type: ignore[arg-type]
    with torch.no_grad():
        first = steps.prefill(torch.tensor([PROMPTS[0]])).argmax(dim=-1)
        steps.start(first, len(PROMPTS[0]))
        got = [int(first)]
        for _ in range(19):
            steps.steps[True].warm_up()
            steps.advance(greedy=True)
            got.append(int(steps.token))
    assert got == want
    layout = gen.tree_layout(gen.default_tree(3), 3, torch.device("cpu"))
    spec = SpeculativeSteps(model, layout, 128, graphs=False)  # type: ignore[arg-type]
    out: list[int] = []
    with torch.no_grad():
        spec.prefill(torch.tensor([PROMPTS[0]]))
        out.append(int(spec.root))
        while len(out) < 20:
            spec.step.warm_up()
            row = spec.advance().tolist()
            out.extend([*row[: row[-1]], row[layout.max_depth]])
    assert out[:20] == want


def test_compiled_steps_trace_as_one_graph_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch.compile(fullgraph=True) a step with a host read or a data-dependent shape fails: each
    step is one graph (what CUDA graph capture needs too)."""
    monkeypatch.setattr(static_module.torch, "compile", functools.partial(torch.compile, backend="eager"))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # counted since the process started, across tests
    model = tiny_model("decoder", mtp_heads=3)
    want = list(gen.generate_decoder(model, PROMPTS[0], 12))
    assert list(gen.generate_decoder(model, PROMPTS[0], 12, static=True, compile=True)) == want
    assert list(gen.generate_speculative(model, PROMPTS[0], 12, static=True, compile=True)) == want
    encdec = tiny_model("encdec")
    want = list(gen.generate_encdec(encdec, PROMPTS[0], 12))
    assert list(gen.generate_encdec(encdec, PROMPTS[0], 12, static=True, compile=True)) == want
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 3


def test_static_is_the_default_on_cuda_only() -> None:
    assert gen.static_default(torch.device("cuda"), None)
    assert not gen.static_default(torch.device("cpu"), None)
    assert gen.static_default(torch.device("cpu"), True) and not gen.static_default(
        torch.device("cuda"), False
    )


def test_a_paused_generation_leaves_gradients_on() -> None:
    model = tiny_model("decoder", mtp_heads=3)
    for stream in (
        gen.generate_decoder(model, PROMPTS[0], 10, static=True),
        gen.generate_speculative(model, PROMPTS[0], 10, static=True),
    ):
        next(stream)
        assert torch.is_grad_enabled()
        stream.close()
