"""Decoding steps of fixed shape: preallocated caches, masks over the whole cache, state kept on the device,
and on CUDA each step captured once in a CUDA graph and replayed (after
gpt-fast's static cache and compiled decode step).

The dynamic path (`KVCache.append` returning the valid prefix, a Python length, `int(token)` per token)
changes shapes every token and reads the GPU after every step, so a small model spends its time launching
kernels and waiting. Here the token, its position and (speculative) the cache length and the drafts live in
device tensors that each step reads and advances itself; every key/value buffer has `max_len` positions and
a mask row hides those not yet written. A step is then the same kernels on the same addresses every time:
on CUDA one graph replay, and the host only copies each step's tokens out (`HostReads`) while the next
step runs. On CPU the same steps run eagerly (what the tests check against the dynamic path).

Attending over all `max_len` positions with the invalid ones masked gives the dynamic path's softmax up to
float rounding (masked keys weigh exactly 0), so greedy output is the same token for token.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from objtrain.models.blocks import KVCache

if TYPE_CHECKING:  # the steps take models; the models never import this module
    from objtrain.models.decoder import Decoder
    from objtrain.models.encdec import EncoderDecoder

ALIGN = 64  # cache lengths are multiples of this: reused across prompts, aligned rows for the masked kernels


def round_up(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class TreeLayout:
    """A draft tree's index tensors, built once per generation. Node 0 is the root, then the chain of
    argmaxes (0,), (0, 0), ..., then the rest breadth-first: every parent comes before its children, and
    node i's tensors are row i. With the chain first, a step that accepts only argmaxes (the most common
    outcome) finds its keys and values already contiguous in the caches, and moves none."""

    draft: Tensor  # (N-1,) each non-root node's entry in the flattened (n-1, k) candidate table
    parent: Tensor  # (N-1,) each non-root node's parent
    depth: Tensor  # (N,) position offset from the root
    sees: Tensor  # (N, N) bool: node j is node i or one of its ancestors
    paths: Tensor  # (N, depth + 1) root .. node, padded by repeating the node
    in_place: tuple[bool, ...]  # (N,) the path root .. node is nodes 0, 1, .., depth: nothing to move
    k: int  # candidates taken from each draft head
    max_depth: int

    @property
    def size(self) -> int:
        return self.depth.numel()


class CapturedStep:
    """`fn()` (a step on static buffers, advancing its own state) run eagerly, or on CUDA captured in a
    CUDA graph on first use and replayed after.

    Capture runs `fn` a few times first (on a side stream, as CUDA graphs require, which also compiles it
    when `compile`), each time from the same `state` (the tensors it advances), put back after each run:
    the warm-up writes only the cache positions the real step is about to overwrite before it reads them,
    and never past them (a cache sized for the real steps holds it).
    """

    def __init__(self, fn: Callable[[], Tensor], state: list[Tensor], graphs: bool, compile: bool) -> None:
        self.fn = torch.compile(fn, fullgraph=True, dynamic=False) if compile else fn
        self.state = state
        self.graphs = graphs
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: Tensor | None = None

    def __call__(self) -> Tensor:
        if not self.graphs:
            return self.fn()
        if self.graph is None:
            self._capture()
            if self.graph is None:  # capture failed: eager from now on
                return self.fn()
        self.graph.replay()
        assert self.out is not None
        return self.out

    def warm_up(self, runs: int = 3) -> None:
        """Run `fn` `runs` times, each from the current state, which is then as it was."""
        saved = [t.clone() for t in self.state]
        for _ in range(runs):
            self.fn()
            for t, value in zip(self.state, saved, strict=True):
                t.copy_(value)

    def _capture(self) -> None:
        saved = [t.clone() for t in self.state]
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.warm_up()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread-local: CUDA work of other threads (a loader's pinning thread) does not break the capture
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.out = self.fn()
            self.graph = graph
        except Exception as exc:  # a kernel that cannot be captured must not stop decoding: run eager
            warnings.warn(
                f"decoding step not captured in a CUDA graph ({exc}); running it eagerly", stacklevel=3
            )
            self.graphs = False
            torch.cuda.synchronize()
            for t, value in zip(self.state, saved, strict=True):
                t.copy_(value)


class HostReads:
    """Device values copied into host memory and read later. On CUDA the copies go to pinned memory behind
    an event, so the host queues the next step before it waits for the values of this one. Rows are a ring
    of two: at most one step is in flight while the previous one's values are read."""

    def __init__(self, width: int, device: torch.device) -> None:
        cuda = device.type == "cuda"
        self.host = torch.zeros(2, width, dtype=torch.long, pin_memory=cuda)
        self.events = [torch.cuda.Event(), torch.cuda.Event()] if cuda else None

    def put(self, i: int, value: Tensor) -> None:
        self.host[i % 2].copy_(value.reshape(-1), non_blocking=True)
        if self.events is not None:
            self.events[i % 2].record()

    def get(self, i: int) -> list[int]:
        if self.events is not None:
            self.events[i % 2].synchronize()
        return self.host[i % 2].tolist()  # type: ignore[no-any-return]


def parameters_key(model: torch.nn.Module) -> tuple[object, ...]:
    """Where the weights live: a captured step reads them by address, so a model moved or cast since
    (new storage) needs new steps. In-place updates (an optimizer step, `load_state_dict`) keep it."""
    return tuple((p.data_ptr(), p.dtype, p.device) for p in model.parameters())


def _causal_rows(keys: Tensor, n: int) -> Tensor:
    """(1, 1, n, max_len): row i sees cache positions 0..i (a prompt written at positions 0..n-1)."""
    return (keys[None, :] <= keys[:n, None])[None, None]


class _Steps:
    _model: Callable[[], object]

    @property
    def model(self) -> Any:
        model = self._model()
        assert model is not None, "decoding steps outlived their model"
        return model


_STEPS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[tuple[object, ...], dict[str, object]]] = (
    weakref.WeakKeyDictionary()
)


def steps_for(
    model: torch.nn.Module, kind: str, fits: Callable[[Any], bool], build: Callable[[], Any]
) -> Any:
    """The model's steps of `kind`, kept from an earlier generation while `fits(steps)` and the weights
    have not moved (a CUDA graph is captured once and replayed for every later prompt), else `build()`.
    Kept beside the model, not on it: a model that is copied or saved carries no graphs."""
    key = parameters_key(model)
    entry = _STEPS.get(model)
    if entry is None or entry[0] != key:
        entry = (key, {})
        _STEPS[model] = entry
    steps = entry[1].get(kind)
    if steps is None or not fits(steps):
        entry[1].pop(kind, None)  # free the old buffers before the new ones take their place
        steps = build()
        entry[1][kind] = steps
    return steps


class DecoderSteps(_Steps):
    """Plain decoding of one row: a prompt's prefill, then one token per step from (`token`, `pos`)."""

    def __init__(self, model: Decoder, max_len: int, graphs: bool, compile: bool = False) -> None:
        self._model = weakref.ref(model)  # steps are kept per model (`steps_for`), never keeping it alive
        self.max_len = round_up(max_len)
        device = model.embed.weight.device
        self.caches = model.new_cache(1, self.max_len)
        self.keys = torch.arange(self.max_len, device=device)
        self.token = torch.zeros(1, 1, dtype=torch.long, device=device)  # the last token, not yet cached
        self.pos = torch.zeros(1, 1, dtype=torch.long, device=device)  # its position
        state = [self.token, self.pos]
        self.steps = {
            greedy: CapturedStep(lambda g=greedy: self._advance(g), state, graphs, compile)  # type: ignore[misc]
            for greedy in (True, False)
        }

    def _hidden(self, ids: Tensor, slots: Tensor, mask: Tensor) -> Tensor:
        for cache in self.caches:
            cache.slots = slots
        return self.model.step_hidden(ids, slots[None], self.caches, mask=mask)[0]  # (1, t, D)

    def prefill(self, ids: Tensor) -> Tensor:
        """Write the prompt ids (1, T) at positions 0..T-1; return the next-token logits (1, V)."""
        T = ids.size(1)
        if self.max_len <= T:
            raise ValueError(f"a prompt of {T} tokens does not fit a cache of {self.max_len}")
        hidden = self._hidden(ids, self.keys[:T], _causal_rows(self.keys, T))
        return self.model.unembed(hidden[:, -1])

    def start(self, token: Tensor, pos: int) -> None:
        """Make `token` (1,) at position `pos` the next step's input."""
        self.token.copy_(token[:, None])
        self.pos.fill_(pos)

    def advance(self, greedy: bool) -> Tensor:
        """One step: feed `token` at `pos`, return the next-token logits (1, V) (a buffer the next step
        overwrites) and move `pos` on; greedy, also put the argmax into `token`."""
        return self.steps[greedy]()

    def _advance(self, greedy: bool) -> Tensor:
        mask = (self.keys <= self.pos[:, :, None])[:, None]  # (1, 1, 1, max_len)
        logits = self.model.unembed(self._hidden(self.token, self.pos[0], mask)[:, -1])  # (1, V)
        if greedy:
            self.token.copy_(logits.argmax(dim=-1, keepdim=True))
        self.pos.add_(1)
        return logits


class EncDecSteps(_Steps):
    """Decoding from an encoder-decoder: the encoder's memory in fixed buffers of `memory_len` positions
    (padded ones masked), the decoder as `DecoderSteps`."""

    def __init__(
        self, model: EncoderDecoder, max_len: int, memory_len: int, graphs: bool, compile: bool = False
    ) -> None:
        self._model = weakref.ref(model)
        self.max_len, self.memory_len = round_up(max_len), round_up(memory_len)
        device = model.embed.weight.device
        cfg = model.config
        self.caches = model.new_cache(1, self.max_len)
        shape = (1, cfg.n_head, self.memory_len, cfg.head_dim)
        like = model.embed.weight
        self.memory_kv = [(like.new_zeros(shape), like.new_zeros(shape)) for _ in range(len(model.decoder))]
        self.keys = torch.arange(self.max_len, device=device)
        self.memory_keys = torch.arange(self.memory_len, device=device)
        self.filled = torch.zeros((), dtype=torch.long, device=device)  # encoder positions in the memory
        self.token = torch.zeros(1, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, 1, dtype=torch.long, device=device)
        state = [self.token, self.pos]
        self.steps = {
            greedy: CapturedStep(lambda g=greedy: self._advance(g), state, graphs, compile)  # type: ignore[misc]
            for greedy in (True, False)
        }

    def encode(self, encoder_ids: Tensor) -> None:
        """Run the encoder on (1, T) ids and keep its cross-attention keys/values."""
        T = encoder_ids.size(1)
        if self.memory_len < T:
            raise ValueError(f"an encoder input of {T} tokens does not fit {self.memory_len} positions")
        positions = self.memory_keys[:T][None]
        memory = self.model.encode(encoder_ids, positions, torch.zeros_like(encoder_ids))
        for (k, v), (new_k, new_v) in zip(self.memory_kv, self.model.memory_kv(memory), strict=True):
            k[:, :, :T] = new_k
            v[:, :, :T] = new_v
        self.filled.fill_(T)

    def _logits(self, ids: Tensor, slots: Tensor, mask: Tensor) -> Tensor:
        for cache in self.caches:
            cache.slots = slots
        cross = (self.memory_keys < self.filled)[None, None, None]  # (1, 1, 1, memory_len)
        return self.model.step(ids, slots[None], self.caches, self.memory_kv, mask, cross)[:, -1]

    def prefill(self, ids: Tensor) -> Tensor:
        """Decoder ids (1, t) at positions 0..t-1 (the start token) -> next-token logits (1, V)."""
        t = ids.size(1)
        return self._logits(ids, self.keys[:t], _causal_rows(self.keys, t))

    def start(self, token: Tensor, pos: int) -> None:
        self.token.copy_(token[:, None])
        self.pos.fill_(pos)

    def advance(self, greedy: bool) -> Tensor:
        return self.steps[greedy]()

    def _advance(self, greedy: bool) -> Tensor:
        mask = (self.keys <= self.pos[:, :, None])[:, None]
        logits = self._logits(self.token, self.pos[0], mask)
        if greedy:
            self.token.copy_(logits.argmax(dim=-1, keepdim=True))
        self.pos.add_(1)
        return logits


def _share_buffer(caches: list[KVCache]) -> Tensor:
    """One (layers, 2, B, G, max_len, K) tensor holding the caches' keys and values (now its views)."""
    buffer = torch.stack([torch.stack([c.k, c.v]) for c in caches])
    for i, cache in enumerate(caches):
        cache.k, cache.v = buffer[i, 0], buffer[i, 1]
    return buffer


class SpeculativeSteps(_Steps):
    """Greedy self-speculative decoding (see `objtrain.models.generate`) with every step on the
    device: the current token (`root`), the draft heads' candidates after it and the cache length
    (`start`) are tensors, acceptance is decided on the device, and the accepted path's keys/values are
    always moved into place (a copy onto itself when it is already there). Each step writes its tokens to
    `out`: the path's drafts (padded to the tree's depth), head 1's next token, and how many drafts hold.

    `layout` is a `TreeLayout` (built by `objtrain.models.generate.tree_layout`) on the model's device.
    """

    def __init__(
        self, model: Decoder, layout: TreeLayout, max_len: int, graphs: bool, compile: bool = False
    ) -> None:
        assert isinstance(layout, TreeLayout)
        self._model, self.layout = weakref.ref(model), layout
        self.max_len = round_up(max_len)
        device = model.embed.weight.device
        n, depth = model.config.mtp_heads, layout.max_depth
        self.heads = model.stacked_heads()
        self.caches = model.new_stacked_cache(1, self.max_len)
        # every cache's keys and values as views of two buffers (trunk layers; the stacked heads), so moving
        # the accepted path is two gathers and two scatters, not four per layer
        self.buffers = [_share_buffer(c) for c in (self.caches[:-1], self.caches[-1:]) if c]
        self.keys = torch.arange(self.max_len, device=device)
        self.nodes = torch.arange(layout.size, device=device)
        self.path_slots = torch.arange(depth + 1, device=device)
        self.start = torch.zeros(1, dtype=torch.long, device=device)  # cache positions in use
        self.root = torch.zeros(1, dtype=torch.long, device=device)  # verified, not yet cached
        self.candidates = torch.zeros((n - 1) * layout.k, dtype=torch.long, device=device)
        self.out = torch.zeros(depth + 2, dtype=torch.long, device=device)
        state = [self.start, self.root, self.candidates, self.out]
        self.step = CapturedStep(self._advance, state, graphs, compile)

    def prefill(self, ids: Tensor) -> None:
        """Feed the prompt ids (1, T) through the trunk and every head; set the first token and drafts."""
        self.heads.refresh(self.model.head_layers)  # a step captured earlier reads these tensors
        T = ids.size(1)
        if T + self.layout.size > self.max_len:
            raise ValueError(f"a prompt of {T} tokens does not fit a cache of {self.max_len}")
        slots = self.keys[:T]
        for cache in self.caches:
            cache.slots = slots
        mask = _causal_rows(self.keys, T)
        hidden = self.model.step_stacked(ids, slots[None], self.caches, self.heads, mask)[:, 0, -1]  # (n, D)
        logits = self.model.unembed(hidden)
        self.root.copy_(logits[0].argmax()[None])
        self.candidates.copy_(logits[1:].topk(self.layout.k, dim=-1).indices.flatten())
        self.start.fill_(T)

    def advance(self) -> Tensor:
        """One verification step; returns `out` (depth + 2,) (a buffer the next step overwrites)."""
        return self.step()

    def _advance(self) -> Tensor:
        layout, model, caches = self.layout, self.model, self.caches
        N = layout.size
        ids = torch.cat([self.root, self.candidates[layout.draft]])  # (N,)
        slots = self.start + self.nodes
        for cache in caches:
            cache.slots = slots
        # node i sees every position before `start` and, among the tree's N slots, its own ancestors
        rel = self.keys - self.start  # (max_len,)
        in_tree = layout.sees[:, rel.clamp(0, N - 1)] & ((rel >= 0) & (rel < N))  # (N, max_len)
        mask = (in_tree | (rel < 0))[None, None]
        positions = (self.start + layout.depth)[None]
        hidden = model.step_stacked(ids[None], positions, caches, self.heads, mask)[:, 0]  # (n, N, D)
        verified = model.unembed(hidden[0]).argmax(dim=-1)  # (N,) head 1's next token after each node
        wrong = ids[1:] != verified[layout.parent]
        accepted = ~(layout.sees[:, 1:] & wrong).any(dim=-1)
        # `best` stays a (1,) tensor: indexing with a 0-d one reads it on the host (a sync, and no graph)
        best = (layout.depth * accepted).argmax(dim=0, keepdim=True)
        path = layout.paths[best][0]  # (depth + 1,) root .. best, padded with best
        m = layout.depth[best]  # (1,)
        source, target = self.start + path, self.start + self.path_slots
        for (
            buffer
        ) in self.buffers:  # the path's keys/values to start, start + 1, ...: the rest is overwritten
            buffer.index_copy_(-2, target, buffer.index_select(-2, source))
        root = verified[best]  # (1,)
        self.out.copy_(torch.cat([ids[path[1:]], root, m]))
        self.root.copy_(root)
        self.start.add_(m + 1)
        drafts = model.unembed(hidden[1:, best][:, 0])  # (n - 1, V): heads 2..n at the path's end
        self.candidates.copy_(drafts.topk(layout.k, dim=-1).indices.flatten())
        return self.out
