"""The training loader: a sampler of work items in the training process, corruption in worker processes.

Corruption runs in DataLoader worker processes (`workers`), so the step does not wait for data: the
sampler (in the training process) hands each worker a work item (rows, offsets, lengths), the worker
reads the raw tokens and applies the objective (`objtrain.data.batches.read_batch`). Rows are laid out as
`objtrain.data.stream` describes: a row index maps to the same raw tokens whatever the process layout.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import multiprocessing
import os
import signal
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from objtrain.batch import Batch
from objtrain.data.batches import read_batch
from objtrain.data.stream import (
    DocumentStream,
    MixedStream,
    Position,
    RowObjective,
    as_mixed,
    layout,
    row_needs,
)
from objtrain.data.worker_lifetime import die_with_parent
from objtrain.errors import UserError


@dataclass(frozen=True)
class WorkItem:
    """One micro-batch of one rank: global row indices, their stream offsets and raw lengths."""

    step: int
    micro: int
    rows: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    after: Position  # the data position once this step's last micro-batch is consumed
    sources: np.ndarray | None = None  # each row's source in a mixture (None: the one store)


class RowSampler(Sampler[WorkItem]):
    """Yields this rank's work items step by step, from a `Position`; runs in the training process."""

    def __init__(
        self,
        objective: RowObjective,
        model_length: int,
        seed: int,
        global_batch: int,
        micro_batch: int,
        rank: int,
        world_size: int,
        start: Position,
        first_step: int,
        steps: int,
        stream: DocumentStream | MixedStream | None = None,
    ) -> None:
        self.objective = objective
        self.model_length = model_length
        self.seed = seed
        self.global_batch = global_batch
        self.micro_batch = micro_batch
        self.rank = rank
        self.world_size = world_size
        self.start = start
        self.first_step = first_step
        self.steps = steps
        self.mixed = as_mixed(stream) if stream is not None else None  # None: one source

    def __len__(self) -> int:
        return max(self.steps - self.first_step, 0) * self.accumulation

    @property
    def accumulation(self) -> int:
        return self.global_batch // (self.world_size * self.micro_batch)

    def __iter__(self) -> Iterator[WorkItem]:
        position = self.start
        for step in range(self.first_step, self.steps):
            rows = np.arange(position.rows, position.rows + self.global_batch, dtype=np.int64)
            lengths = row_needs(self.objective, self.model_length, rows, self.seed)
            sources, offsets, after = layout(rows, lengths, position, self.mixed)
            mb, W = self.micro_batch, self.world_size
            for m in range(self.accumulation):
                lo = m * W * mb + self.rank * mb
                sl = slice(lo, lo + mb)
                yield WorkItem(step, m, rows[sl], offsets[sl], lengths[sl], after, sources[sl])
            position = after


class CorruptedRows(Dataset[tuple[WorkItem, Batch]]):
    """Work item -> (item, Batch): read the raw rows from the stream and apply the objective."""

    def __init__(
        self, stream: DocumentStream | MixedStream, objective: RowObjective, model_length: int, seed: int
    ) -> None:
        self.stream = stream
        self.objective = objective
        self.width = objective.raw_length(model_length)
        self.seed = seed

    def __len__(self) -> int:  # pragma: no cover - indexed by work items, never by position
        raise TypeError("CorruptedRows is indexed by WorkItem")

    def __getitem__(self, item: WorkItem) -> tuple[WorkItem, Batch]:  # type: ignore[override]
        batch = read_batch(
            self.stream,
            self.objective,
            item.rows,
            item.offsets,
            item.lengths,
            self.width,
            self.seed,
            item.sources,
        )
        return item, batch


class Wire:
    """A batch's fields as numpy arrays, for the trip from a worker: pickled through the pipe, a
    micro-batch costs ~1.5 ms to receive, against ~5 ms for torch's shared-memory handoff of each tensor
    (a file descriptor per tensor), which on a small model is several percent of the step. Bound for a
    GPU, the DataLoader's pinning thread calls `pin_memory`: the arrays become page-locked tensors there,
    off the training thread, ready for a copy that does not wait (PyTorch's pin_memory tutorial)."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def pin_memory(self, device: Any = None) -> Wire:
        return Wire(
            {
                k: torch.from_numpy(v).pin_memory() if isinstance(v, np.ndarray) else v
                for k, v in self.fields.items()
            }
        )


def _to_wire(pair: tuple[WorkItem, Batch]) -> tuple[WorkItem, Wire]:
    """A batch as numpy arrays (`Wire`)."""
    item, batch = pair
    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
    return item, Wire({k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in fields.items()})


def received(wire: Iterator[tuple[WorkItem, Wire]]) -> Iterator[tuple[WorkItem, Batch]]:
    """The loader's (item, batch) pairs back as tensors (views of the received arrays, no copy; pinned
    tensors as they are). A refusal raised in a worker (a damaged id in a store too large to check at
    start) comes back as its own one line, not as the worker's traceback torch wraps it in."""
    try:
        for item, fields in wire:
            yield (
                item,
                Batch(
                    **{
                        k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                        for k, v in fields.fields.items()
                    }
                ),
            )
    except UserError as exc:
        last = str(exc).strip().splitlines()[-1]
        raise UserError(last.split("UserError: ", 1)[-1]) from None


def _leave_signals_to_the_trainer(
    worker_id: int, trainer: int = 0, on_start: Callable[[], None] | None = None
) -> None:
    """Loader workers ignore Ctrl-C and SIGTERM. `timeout`, `kill -- -PGID`, Slurm and systemd signal the
    whole process group: a worker dying of it made the DataLoader raise in the training process before the
    loop could save. The training process saves, then shuts its workers down; if it dies instead (SIGKILL,
    OOM), its workers die with it (`objtrain.data.worker_lifetime`). `on_start` runs first in each worker:
    the training loop's gives a worker forked while the trainer's threads were packed every core back
    (`objtrain.training.cores.unpin_this_process`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if on_start is not None:
        on_start()
    if trainer:
        die_with_parent(trainer)


@contextlib.contextmanager
def workers_stopped(wire: Iterator[Any]) -> Iterator[None]:
    """Shut the loader's worker processes down when the block ends, by an exception too. They ignore SIGTERM
    (`_leave_signals_to_the_trainer`), so left to interpreter exit, which terminates and then joins them,
    they would keep the process alive forever after an error."""
    try:
        yield
    finally:
        shutdown = getattr(wire, "_shutdown_workers", None)  # torch's own cleanup, what its __del__ calls
        if shutdown is not None:
            shutdown()


_WORKERS: weakref.WeakSet[multiprocessing.process.BaseProcess] = weakref.WeakSet()


def _kill_leftover_workers() -> None:
    """At interpreter exit, SIGKILL the loader workers still alive (a loader dropped after an error, its
    iterator kept alive by the traceback). multiprocessing's own exit handler, which runs after this one,
    sends them SIGTERM, which they ignore, and then joins them: the process would never exit."""
    for worker in list(_WORKERS):
        if worker.is_alive():
            worker.kill()
            worker.join(timeout=5)


class _Loader(DataLoader):
    """A DataLoader that remembers its worker processes, for `_kill_leftover_workers`."""

    def _get_iterator(self) -> Any:
        wire = super()._get_iterator()
        _WORKERS.update(getattr(wire, "_workers", ()))
        return wire


def make_loader(
    dataset: CorruptedRows,
    sampler: RowSampler,
    workers: int,
    pin: bool = False,
    on_worker_start: Callable[[], None] | None = None,
) -> DataLoader:
    """Work items through `workers` processes (0 = in this process), a few micro-batches ahead; iterate it
    through `received`. `pin`: batches come page-locked (for a GPU), pinned by the loader's own thread.
    `on_worker_start`: called first in each worker process (`_leave_signals_to_the_trainer`)."""
    init = functools.partial(  # forked from this process
        _leave_signals_to_the_trainer, trainer=os.getpid(), on_start=on_worker_start
    )
    if workers:
        # Registered after multiprocessing's exit handler, so run before it (atexit is last in, first out).
        atexit.unregister(_kill_leftover_workers)
        atexit.register(_kill_leftover_workers)
    return _Loader(
        dataset,  # type: ignore[arg-type]
        sampler=sampler,
        batch_size=None,
        num_workers=workers,
        collate_fn=_to_wire,
        pin_memory=pin,
        prefetch_factor=4 if workers else None,
        persistent_workers=False,
        worker_init_fn=init if workers else None,
        # Each iterator draws a base seed from the global RNG unless given a generator: keep the training
        # RNG (dropout) untouched by data loading (`objtrain.training.checkpoint.restore_rng`).
        generator=torch.Generator().manual_seed(0),
    )


def auto_workers(device_type: str, processes_per_host: int, cores: int | None = None) -> int:
    """Loader worker processes for `workers: auto`, from the cores this process may use and the training
    processes on this host. On a GPU: each process's share of the cores less 2 (its own training thread
    and the pinning thread), between 1 and 4 (torchtitan's example and litgpt use 4 and 8; one worker
    left the GPU waiting 4-6% of a small model's step on a 16-core H200 host; 8-GPU hosts have 13-14
    cores a GPU). On a CPU the training's own threads need the cores: 1
    worker, none where a process has a single core (a worker would only take turns with it)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    share = cores // max(processes_per_host, 1)
    if device_type == "cuda":
        return max(1, min(4, share - 2))
    return 1 if share >= 2 else 0
