"""Data parallelism over `torchrun` processes: gloo on CPU, nccl on GPU.

Gradients are all-reduced by hand (a flat SUM per step) rather than through the DDP wrapper: the loop
runs the model's trunk and heads as separate calls for MTP's sequential backward, which DDP's forward
hooks do not see (FSDP2's "parameters applied outside forward"). Each rank's
loss is already divided by the *global* target count, so a SUM of gradients is the full-batch gradient.

    torchrun --standalone --nproc-per-node 2 -m objtrain train ...      # or: objtrain train --nproc 2 ...
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from objtrain.errors import UserError


@dataclass(frozen=True)
class World:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1  # processes on this host (torchrun's LOCAL_WORLD_SIZE): they share its cores

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def setup(device_type: str) -> World:
    """Join the process group torchrun describes in the environment (a single process needs none)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return World()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(local_rank)
        timeout = datetime.timedelta(seconds=float(os.environ.get("OBJTRAIN_DIST_TIMEOUT", "600")))
        dist.init_process_group(backend, timeout=timeout)
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    return World(rank, world_size, local_rank, local_world_size)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: torch.Tensor, world: World) -> torch.Tensor:
    if world.distributed:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_reduce_max(values: torch.Tensor, world: World) -> torch.Tensor:
    if world.distributed:
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return values


def all_reduce_gradients(params: Iterable[nn.Parameter], world: World) -> None:
    """SUM every gradient over the ranks, as one flat buffer (a parameter without a gradient adds zeros)."""
    if not world.distributed:
        return
    params = list(params)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(g).clone()
        offset += n


def broadcast_object(obj: object, world: World) -> object:
    if not world.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


def launch(nproc: int, argv: list[str]) -> int:
    """Re-run this command under `torchrun --standalone` with `nproc` processes on this machine."""
    if nproc < 1:
        raise UserError(f"--nproc must be at least 1, got {nproc}")
    env = dict(os.environ)
    # torchrun sets OMP_NUM_THREADS=1 when unset; give each process its share of the cores instead.
    env.setdefault("OMP_NUM_THREADS", str(max((os.cpu_count() or 1) // nproc, 1)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd += ["-m", "objtrain", *argv]
    if shutil.which(sys.executable) is None:  # pragma: no cover - the interpreter is always there
        raise UserError("cannot find the Python interpreter to launch torchrun")
    return subprocess.call(cmd, env=env)


# --- FSDP: parameters, gradients and optimizer state sharded over the ranks ---------------------------------


def shard(model: nn.Module, world: World, device: torch.device) -> nn.Module:
    """FSDP2 `fully_shard` on each transformer block, then the root (as torchtitan's `parallelize.py`), for
    models that do not fit one device. The mesh is always explicit: gloo on CPU, nccl on GPU."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard  # type: ignore[no-redef]
    from torch.distributed.device_mesh import init_device_mesh

    from objtrain.models.blocks import Block

    mesh = init_device_mesh(device.type, (world.world_size,))
    for module in list(model.modules()):
        if isinstance(module, Block):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _options(**kwargs: bool) -> Any:  # torch's StateDictOptions
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_model_state(model: nn.Module, sharded: bool) -> dict[str, torch.Tensor]:
    """The whole model's weights as plain tensors (a collective when sharded: every rank calls it)."""
    from objtrain.models.checkpoint import clean_state_dict

    if not sharded:
        return clean_state_dict(model)
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_options(cpu_offload=True))
    return {k: v.detach().contiguous() for k, v in state.items()}


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, sharded: bool) -> dict:
    """{parameter name: {exp_avg, exp_avg_sq, step}} for the whole model (a collective when sharded)."""
    if not sharded:
        return {
            name: dict(optimizer.state.get(p, {}))
            for group in optimizer.param_groups
            for name, p in zip(group["names"], group["params"], strict=True)
        }
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    # Only rank 0 receives the full state (cpu_offload); the others get an empty dict.
    full = get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))
    return dict(full.get("state", {}))


def load_full_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict, moments: dict, sharded: bool
) -> None:
    """Put full weights and optimizer state (as saved) into a sharded model and its optimizer."""
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    assert sharded
    set_model_state_dict(model, weights, options=_options())
    current = get_optimizer_state_dict(model, optimizer, options=_options())
    current["state"] = moments
    set_optimizer_state_dict(model, optimizer, current, options=_options())
