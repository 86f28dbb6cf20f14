"""Decoding from zoo models: greedy / temperature / top-k / top-p with a KV cache, FIM infilling,
fill-mask, sentinel span filling, and self-speculative decoding with MTP heads.

Generators yield token ids one at a time (so the CLI can stream) and stop before a stop token.
Per-token Python loops are inherent to autoregressive decoding; each step is one batched forward.

Self-speculative decoding (Gloeckle et al. 2024 section 3.2; blockwise parallel decoding, Stern et al.
2018; tree drafting as in Medusa, Cai et al. 2024): the heads 2..n at the last verified position each
offer their top-k next tokens, a small tree of their combinations (`default_tree`) is fed in one forward
with a tree attention mask (each node sees the cache and its own ancestors, at position start + depth),
and head 1's argmax at every node checks its children. The longest path that agrees with head 1 is kept
plus head 1's own next token, so each forward yields 1..n tokens, and greedy output equals plain greedy.
The path's keys and values are then moved to contiguous cache slots (none move when it is the
argmax chain, which the layout puts first). The n head layers run as one batched block
(`StackedBlocks`), so a step costs about the trunk plus one layer over the tree's nodes, against the
trunk plus head 1 of a plain greedy step.

Static decoding (`static=True`, the default on CUDA; `objtrain.models.static`): the same arithmetic on
caches of fixed size, with the token, its position and (speculative) the drafts and cache length kept on
the device, each step captured once in a CUDA graph and replayed, and the host reading a step's tokens
while the next one runs. Its output is the dynamic path's, token for token (tests check it on CPU, where
the dynamic path stays the default: there the full-size masked cache costs more than it saves).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from objtrain.batch import Batch
from objtrain.data.tokenizer import Tokenizer
from objtrain.errors import UserError
from objtrain.models.decoder import Decoder
from objtrain.models.encdec import EncoderDecoder
from objtrain.models.encoder import Encoder
from objtrain.models.static import (
    DecoderSteps,
    EncDecSteps,
    HostReads,
    SpeculativeSteps,
    TreeLayout,
    steps_for,
)
from objtrain.specials import Specials

FimMode = Literal["psm", "spm"]
MASK_MARKER = "[MASK]"

# The positions one generation may use (prompt and output together), whatever `max_new_tokens` asks: the
# KV cache is sized by this, never by the request alone, so "-n 100000000" (until </s>) runs in bounded
# memory and time. Rotary models have no position table; beyond the rows they trained on their output
# degrades, so the bound is the trained row length, and at least CONTEXT_FLOOR positions.
CONTEXT_FLOOR = 4096


def usable_context(training: dict[str, object]) -> int:
    """A checkpoint's usable context in positions: its training record's `seq_len`, at least
    CONTEXT_FLOOR (a checkpoint that records none gets the floor)."""
    seq_len = training.get("seq_len")
    trained = seq_len if isinstance(seq_len, int) and not isinstance(seq_len, bool) else 0
    return max(trained, CONTEXT_FLOOR)


def within_context(max_new_tokens: int, prompt_length: int, context: int) -> int:
    """`max_new_tokens` cut so that the prompt and the output fit `context` positions; a prompt that
    leaves no room is a UserError."""
    if prompt_length >= context:
        raise UserError(
            f"the input is {prompt_length:,} tokens, as long as the model's usable context of {context:,} "
            "positions or longer: shorten it"
        )
    return min(max_new_tokens, context - prompt_length)


@dataclass
class Sampling:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = no top-k filter
    top_p: float = 1.0  # 1 = no nucleus filter
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.temperature < math.inf:  # NaN fails every comparison
            raise UserError(f"--temperature must be >= 0 and finite, got {self.temperature}")
        if self.top_k < 0:
            raise UserError(f"--top-k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class SpeculativeStats:
    forwards: int = 0  # verification forwards (the prompt's prefill not counted)
    tokens: int = 0  # tokens produced by them
    drafted: int = 0  # draft positions offered: the tree's depth per forward
    accepted: int = 0  # draft tokens accepted (the kept path's length)

    def verified(self, depth: int, kept: int) -> None:
        """One verification forward offered `depth` drafts and produced `kept` tokens (accepted + 1)."""
        self.forwards += 1
        self.drafted += depth
        self.accepted += kept - 1
        self.tokens += kept

    @property
    def acceptance(self) -> float:
        return self.accepted / max(self.drafted, 1)

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / max(self.forwards, 1)


def choose(logits: Tensor, sampling: Sampling, generator: torch.Generator | None) -> Tensor:
    """Next token (B,) from logits (B, V): argmax, or a sample after temperature, top-k and top-p."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    logits = logits.float() / sampling.temperature
    if sampling.top_k:
        kth = logits.topk(min(sampling.top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= sampling.top_p  # keep the smallest set reaching top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


def _generator(sampling: Sampling, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(sampling.seed)


def static_default(device: torch.device, static: bool | None) -> bool:
    """Whether decoding takes the static path: as asked, else on CUDA only."""
    return device.type == "cuda" if static is None else static


def _graphs(model: torch.nn.Module, device: torch.device) -> bool:
    """Capture the steps in CUDA graphs: on CUDA, unless dropout is live (a model left in training mode)."""
    live_dropout = model.training and any(
        isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()
    )
    return device.type == "cuda" and not live_dropout


@torch.no_grad()
def generate_decoder(
    model: Decoder,
    prompt: list[int],
    max_new_tokens: int,
    sampling: Sampling | None = None,
    stop_ids: tuple[int, ...] = (),
    use_cache: bool = True,
    static: bool | None = None,
    compile: bool = False,
) -> Iterator[int]:
    """Continue `prompt` (a non-empty id list) with up to `max_new_tokens` tokens.

    `static` (default: on CUDA) decodes with static caches and captured steps; `compile` also compiles
    each step with torch.compile first (fused kernels; a slow first call)."""
    if not prompt:
        raise UserError("the prompt is empty: give at least one token")
    sampling = sampling or Sampling()
    device = model.embed.weight.device
    generator = _generator(sampling, device)
    ids = torch.tensor([prompt], device=device)  # (1, T)
    if use_cache and static_default(device, static):
        need = len(prompt) + max_new_tokens
        steps: DecoderSteps = steps_for(
            model,
            f"decoder-{compile}",
            lambda st: st.max_len >= need,
            lambda: DecoderSteps(model, need, _graphs(model, device), compile),
        )
        first = choose(steps.prefill(ids), sampling, generator)
        steps.start(first, len(prompt))
        yield from _static_stream(steps, first, max_new_tokens, sampling, generator, stop_ids)
        return
    if use_cache:
        caches = model.new_cache(1, len(prompt) + max_new_tokens)
        logits = model.step(ids, torch.arange(len(prompt), device=device)[None], caches)[0][:, -1]
    else:
        logits = model.logits(ids)[:, -1]
    for _ in range(max_new_tokens):
        token = choose(logits, sampling, generator)  # (1,)
        if int(token) in stop_ids:
            return
        yield int(token)
        ids = torch.cat([ids, token[:, None]], dim=1)
        if use_cache:
            pos = torch.full((1, 1), ids.size(1) - 1, device=device)
            logits = model.step(token[:, None], pos, caches)[0][:, -1]
        else:
            logits = model.logits(ids)[:, -1]


@torch.no_grad()  # a decorated generator holds no_grad only while it runs, not while it is suspended
def _static_stream(
    steps: DecoderSteps | EncDecSteps,
    first: Tensor,
    max_new_tokens: int,
    sampling: Sampling,
    generator: torch.Generator,
    stop_ids: tuple[int, ...],
) -> Iterator[int]:
    """Tokens from static steps whose input is `first` (1,). Greedy, the argmax is taken inside the step
    and fed to the next one on the device, so step i + 1 is queued before token i is read (one step in
    flight, no wait between them). Sampling draws on the host's generator as the dynamic path does, so
    its steps run one at a time."""
    reads = HostReads(1, first.device)
    reads.put(0, first)
    for i in range(max_new_tokens):
        if sampling.greedy and i + 1 < max_new_tokens:
            steps.advance(greedy=True)  # consumes token i, leaves token i + 1 in steps.token
            reads.put(i + 1, steps.token)
        token = reads.get(i)[0]
        if token in stop_ids:
            return
        yield token
        if not sampling.greedy and i + 1 < max_new_tokens:
            nxt = choose(steps.advance(greedy=False), sampling, generator)
            steps.token.copy_(nxt[:, None])
            reads.put(i + 1, nxt)


# A draft tree is a set of rank paths: (r_1, ..., r_d) is the node whose token at depth i is draft head
# i + 1's rank-r_i candidate (0 = its argmax) and whose parent is (r_1, ..., r_{d-1}); the root is the
# verified token. The paths must be prefix-closed. The chain (0,), (0, 0), ... is blockwise decoding.
DraftTree = Sequence[tuple[int, ...]]


def chain_tree(depth: int) -> tuple[tuple[int, ...], ...]:
    """Each draft head's argmax only: blockwise parallel decoding (Stern et al. 2018)."""
    return tuple((0,) * d for d in range(1, depth + 1))


def default_tree(n: int) -> tuple[tuple[int, ...], ...]:
    """The draft tree `generate_speculative` uses for n heads. For n = 4, the 10 paths most often
    accepted in two 4-head models' greedy continuations of train-split prompts (tiny models, 10 and
    70 minutes of MTP training), which measured fastest among the 3..16-node trees tried (bigger trees
    accept more but cost more per forward). For other n, the chain of argmaxes plus each head's second
    candidate after it."""
    if n == 4:
        return (
            *((0,), (1,), (2,), (3,)),
            *((0, 0), (0, 1)),
            *((0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)),
        )
    chain = chain_tree(n - 1)
    return tuple(sorted({*chain, *((*p[:-1], 1) for p in chain)}, key=lambda p: (len(p), p)))


def tree_layout(tree: DraftTree, n: int, device: torch.device) -> TreeLayout:
    """Check `tree` against n heads and lay it out (see `TreeLayout`)."""
    nodes = sorted({tuple(p) for p in tree}, key=lambda p: (len(p), p))
    if not nodes or len(nodes) != len(tree):
        raise UserError("a draft tree needs at least one path, each once")
    for p in nodes:
        if not 1 <= len(p) <= n - 1 or min(p) < 0:
            raise UserError(f"draft tree path {p}: 1..{n - 1} ranks (one per draft head), each >= 0")
        if len(p) > 1 and p[:-1] not in nodes:
            raise UserError(f"draft tree path {p}: its parent {p[:-1]} is not in the tree")
    nodes = [p for p in nodes if not any(p)] + [p for p in nodes if any(p)]  # the argmax chain first
    index = {(): 0, **{p: i + 1 for i, p in enumerate(nodes)}}
    k = max(max(p) for p in nodes) + 1
    ancestry = [[index[p[:d]] for d in range(len(p) + 1)] for p in ((), *nodes)]
    depth = max(len(p) for p in nodes)
    sees = torch.zeros(len(index), len(index), dtype=torch.bool)
    for i, chain in enumerate(ancestry):
        sees[i, chain] = True
    return TreeLayout(
        draft=torch.tensor([(len(p) - 1) * k + p[-1] for p in nodes], device=device),
        parent=torch.tensor([index[p[:-1]] for p in nodes], device=device),
        depth=torch.tensor([len(p) for p in ((), *nodes)], device=device),
        sees=sees.to(device),
        paths=torch.tensor([c + c[-1:] * (depth + 1 - len(c)) for c in ancestry], device=device),
        in_place=tuple(c == list(range(len(c))) for c in ancestry),
        k=k,
        max_depth=depth,
    )


class TreeSpeculator:
    """The state of one greedy self-speculative generation: the stacked heads, their KV caches, the
    draft tree's layout, the current token (verified, not yet in the cache) and the draft heads'
    candidates after it."""

    @torch.no_grad()
    def __init__(self, model: Decoder, prompt: list[int], max_new_tokens: int, tree: DraftTree) -> None:
        n = model.config.mtp_heads
        if n < 2:
            raise UserError("--speculative needs a model with MTP heads (mtp_heads > 1)")
        if not prompt:
            raise UserError("the prompt is empty: give at least one token")
        device = model.embed.weight.device
        self.model = model
        self.layout = tree_layout(tree, n, device)
        self.heads = model.stacked_heads()  # the n head layers as one batched block
        self.caches = model.new_stacked_cache(1, len(prompt) + max_new_tokens + self.layout.size)
        self.visible = torch.ones(self.layout.size, self.caches[0].k.size(2), dtype=torch.bool, device=device)
        ids, positions = torch.tensor([prompt], device=device), torch.arange(len(prompt), device=device)
        hidden = model.step_stacked(ids, positions[None], self.caches, self.heads)[:, 0, -1]  # (n, D)
        logits = model.unembed(hidden)
        self.root = logits[0].argmax()[None]  # (1,) the current token
        self.token = int(self.root)
        self.candidates = logits[1:].topk(self.layout.k, dim=-1).indices.flatten()  # ((n-1) k,)

    @torch.no_grad()
    def step(self) -> list[int]:
        """Verify the draft tree after the current token in one forward, keep the accepted path in the
        caches, and return its drafts followed by head 1's next token (1 to depth + 1 tokens); that last
        token becomes the current one."""
        layout, caches, model = self.layout, self.caches, self.model
        start = caches[0].length
        ids = torch.cat([self.root, self.candidates[layout.draft]])  # (N,)
        mask = torch.cat([self.visible[:, :start], layout.sees], dim=1)[None, None]  # (1, 1, N, start + N)
        hidden = model.step_stacked(ids[None], (start + layout.depth)[None], caches, self.heads, mask)[:, 0]
        verified = model.unembed(hidden[0]).argmax(dim=-1)  # (N,) head 1's next token after each node
        # a node is accepted iff every node on its path equals head 1's pick at its parent; accepted
        # nodes form one chain (siblings differ), so the deepest is its end
        wrong = ids[1:] != verified[layout.parent]  # (N-1,)
        accepted = ~(layout.sees[:, 1:] & wrong).any(dim=-1)  # (N,)
        best = (layout.depth * accepted).argmax()  # the root (0) when nothing is accepted
        path = layout.paths[best]
        self.root = verified[best, None]
        *kept, self.token, m, node = torch.cat(
            [ids[path], self.root, layout.depth[best, None], best[None]]
        ).tolist()
        for cache in caches:  # the path's keys/values, contiguous after `start`; the rest dropped
            if layout.in_place[node]:
                cache.length = start + m + 1
            else:
                cache.compact(start, start + path, m + 1)
        # next drafts: heads 2..n at the path's end only ((n-1) rows unembedded, not n x N)
        self.candidates = model.unembed(hidden[1:, best]).topk(layout.k, dim=-1).indices.flatten()
        return [*kept[1 : m + 1], self.token]


def generate_speculative(
    model: Decoder,
    prompt: list[int],
    max_new_tokens: int,
    stop_ids: tuple[int, ...] = (),
    stats: SpeculativeStats | None = None,
    tree: DraftTree | None = None,
    static: bool | None = None,
    compile: bool = False,
) -> Iterator[int]:
    """Greedy self-speculative decoding with the MTP heads (see the module docstring): each forward
    verifies a tree of drafts, `default_tree(n)` unless `tree` is given. The output is greedy's.
    `static` (default: on CUDA) and `compile` as for `generate_decoder`."""
    stats = stats if stats is not None else SpeculativeStats()
    tree = default_tree(model.config.mtp_heads) if tree is None else tree
    device = model.embed.weight.device
    if static_default(device, static):
        yield from _static_speculative(model, prompt, max_new_tokens, stop_ids, stats, tree, compile)
        return
    spec = TreeSpeculator(model, prompt, max_new_tokens, tree)

    def chunks() -> Iterator[list[int]]:
        yield [spec.token]
        while True:
            out = spec.step()
            stats.verified(spec.layout.max_depth, len(out))
            yield out

    yield from _until_stop(chunks(), stop_ids, max_new_tokens)


def _until_stop(chunks: Iterator[list[int]], stop_ids: tuple[int, ...], max_new_tokens: int) -> Iterator[int]:
    """The tokens of `chunks` up to the first stop token or `max_new_tokens`; a chunk is asked for only
    once the previous one is used up (a speculative step runs only when its tokens are needed)."""
    produced = 0
    for out in chunks:
        for token in out:
            if token in stop_ids:
                return
            yield token
            produced += 1
            if produced >= max_new_tokens:
                return


@torch.no_grad()
def _static_speculative(
    model: Decoder,
    prompt: list[int],
    max_new_tokens: int,
    stop_ids: tuple[int, ...],
    stats: SpeculativeStats,
    tree: DraftTree,
    compile: bool,
) -> Iterator[int]:
    """`generate_speculative` on `SpeculativeSteps`: step k + 1 is queued before step k's tokens are read."""
    n = model.config.mtp_heads
    if n < 2:
        raise UserError("--speculative needs a model with MTP heads (mtp_heads > 1)")
    if not prompt:
        raise UserError("the prompt is empty: give at least one token")
    device = model.embed.weight.device
    layout = tree_layout(tree, n, device)
    # a queued step may run after the last one read: room for its whole tree past a full output
    need = len(prompt) + max_new_tokens + layout.max_depth + layout.size
    key = (tuple(sorted(tuple(p) for p in tree)), compile)
    steps: SpeculativeSteps = steps_for(
        model,
        f"speculative-{key}",
        lambda st: st.max_len >= need,
        lambda: SpeculativeSteps(model, layout, need, _graphs(model, device), compile),
    )
    steps.prefill(torch.tensor([prompt], device=device))
    depth = steps.layout.max_depth
    reads = HostReads(depth + 2, device)
    first = HostReads(1, device)
    first.put(0, steps.root)
    steps.advance()
    reads.put(1, steps.out)

    def chunks() -> Iterator[list[int]]:
        yield first.get(0)
        k = 1  # the step whose tokens come next
        while True:
            # queue step k + 1 (its input is on the device already), then read step k
            steps.advance()
            reads.put(k + 1, steps.out)
            row = reads.get(k)
            m = row[-1]
            k += 1
            stats.verified(depth, m + 1)
            yield [*row[:m], row[depth]]

    yield from _until_stop(chunks(), stop_ids, max_new_tokens)


def encode_input(
    tokenizer: Tokenizer, text: str, fill: str = "mask", append_eos: bool = False
) -> tuple[list[int], int]:
    """Encode `text`, replacing each `[MASK]` by an id inserted directly (never through the tokenizer):
    the mask token (`fill="mask"`) or sentinels <extra_id_0>, <extra_id_1>, ... (`fill="sentinel"`).
    Returns (ids, number of markers)."""
    parts = text.split(MASK_MARKER)
    specials = tokenizer.specials
    ids: list[int] = []
    for k, part in enumerate(parts):
        if k:
            ids.append(specials.mask if fill == "mask" else specials.sentinel(k - 1))
        ids.extend(tokenizer.encode(part) if part else [])
    if append_eos:
        ids.append(specials.eos)
    return ids, len(parts) - 1


def fim_prompt(tokenizer: Tokenizer, prefix: str, suffix: str, mode: FimMode) -> list[int]:
    """PSM: <PRE> prefix <SUF> suffix <MID>; SPM (FIM paper App. D variant 2):
    <PRE> <SUF> suffix <MID> prefix. In both the model then writes the middle."""
    s: Specials = tokenizer.specials
    pre, suf = tokenizer.encode(prefix) if prefix else [], tokenizer.encode(suffix) if suffix else []
    if mode == "psm":
        return [s.fim_prefix, *pre, s.fim_suffix, *suf, s.fim_middle]
    if mode == "spm":
        return [s.fim_prefix, s.fim_suffix, *suf, s.fim_middle, *pre]
    raise UserError(f"--fim-mode must be psm or spm, got {mode!r}")


@dataclass
class Candidate:
    token_id: int
    piece: str
    text: str
    prob: float


@torch.no_grad()
def fill_mask(
    model: Encoder, tokenizer: Tokenizer, text: str, top_k: int = 5, segments: bool = False
) -> list[list[Candidate]]:
    """Top-k candidates with probabilities for every `[MASK]` in `text` (one bidirectional forward).

    `segments`: read the text as sentence A (segment 0 at every token), for a model trained on sentence
    pairs (NSP/SOP) only; any other model never trained its segment embedding and reads no segment ids
    (`probe.trained_with_segments` decides from a checkpoint's training record)."""
    ids, n_masks = encode_input(tokenizer, text, fill="mask")
    if not n_masks:
        raise UserError(f"--text has no {MASK_MARKER} to fill")
    device = model.embed.weight.device
    x = torch.tensor([ids], device=device)  # (1, T)
    T = x.size(1)
    batch = Batch(
        x,
        x,
        torch.arange(T, device=device)[None],
        torch.zeros_like(x),
        "bidirectional",
        segment_ids=torch.zeros_like(x) if segments else None,
    )
    probs = model(batch).logits[0].float().softmax(dim=-1)  # (T, V)
    where = (x[0] == tokenizer.specials.mask).nonzero().squeeze(1)
    # Reserved ids (pad, bos/eos, <mask>, sentinels, ...) are no text to fill in: candidates are the
    # ordinary tokens, with the model's probabilities over the whole vocabulary.
    text_ids = tokenizer.specials.ordinary_ids(probs.size(-1))
    ordinary = probs[where][:, text_ids]
    top = ordinary.topk(min(top_k, ordinary.size(-1)), dim=-1)  # (n_masks, k)
    return [
        [
            Candidate(int(i), tokenizer.piece(int(i)), tokenizer.decode([int(i)]), float(p))
            for p, i in zip(ps.tolist(), text_ids[ids_].tolist(), strict=True)
        ]
        for ps, ids_ in zip(top.values, top.indices, strict=True)
    ]


@torch.no_grad()
def generate_encdec(
    model: EncoderDecoder,
    encoder_ids: list[int],
    max_new_tokens: int,
    sampling: Sampling | None = None,
    stop_ids: tuple[int, ...] = (),
    start_id: int = 0,
    use_cache: bool = True,
    static: bool | None = None,
    compile: bool = False,
) -> Iterator[int]:
    """Decode from the encoder input `encoder_ids`, starting from `start_id` (T5: pad = 0).
    `static` (default: on CUDA) and `compile` as for `generate_decoder`."""
    if not encoder_ids:
        raise UserError("the encoder input is empty")
    sampling = sampling or Sampling()
    device = model.embed.weight.device
    generator = _generator(sampling, device)
    enc = torch.tensor([encoder_ids], device=device)  # (1, T)
    enc_pos = torch.arange(enc.size(1), device=device)[None]
    dec = torch.tensor([[start_id]], device=device)  # (1, 1)
    if use_cache and static_default(device, static):
        need, memory = max_new_tokens + 1, len(encoder_ids)
        steps: EncDecSteps = steps_for(
            model,
            f"encdec-{compile}",
            lambda st: st.max_len >= need and st.memory_len >= memory,
            lambda: EncDecSteps(model, need, memory, _graphs(model, device), compile),
        )
        steps.encode(enc)
        first = choose(steps.prefill(dec), sampling, generator)
        steps.start(first, 1)
        yield from _static_stream(steps, first, max_new_tokens, sampling, generator, stop_ids)
        return
    if use_cache:
        memory = model.encode(enc, enc_pos, torch.zeros_like(enc))
        kv = model.memory_kv(memory)
        caches = model.new_cache(1, max_new_tokens + 1)
        logits = model.step(dec, torch.zeros_like(dec), caches, kv)[:, -1]
    for i in range(max_new_tokens):
        if not use_cache:
            S = dec.size(1)
            batch = Batch(
                enc,
                dec,
                enc_pos,
                torch.zeros_like(enc),
                "bidirectional",
                decoder_input_ids=dec,
                decoder_positions=torch.arange(S, device=device)[None],
                decoder_document_ids=torch.zeros_like(dec),
            )
            logits = model(batch).logits[:, -1]
        token = choose(logits, sampling, generator)
        if int(token) in stop_ids:
            return
        yield int(token)
        dec = torch.cat([dec, token[:, None]], dim=1)
        if use_cache and i + 1 < max_new_tokens:
            logits = model.step(token[:, None], torch.full((1, 1), i + 1, device=device), caches, kv)[:, -1]


def split_spans(output: list[int], n_spans: int, specials: Specials) -> list[list[int]]:
    """T5 targets `S0 fill0 S1 fill1 ...` -> the fill of each span (empty if its sentinel never came)."""
    fills: list[list[int]] = [[] for _ in range(n_spans)]
    current = -1
    for token in output:
        k = specials.sentinel_index(token)
        if k is not None:
            current = k
            continue
        if 0 <= current < n_spans:
            fills[current].append(token)
    return fills
