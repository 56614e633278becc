"""Sharded training (FSDP2, on a policy's modules: `Policy.shard` calls `shard`): the
policies' weights, gradients and optimizer state split over the ranks.

With sharded weights every forward pass would be a collective that all ranks must run
alike, which rollouts (a rank-dependent number of `generate` calls) do not. So rspo
gathers the weights whole for a block of passes (`gathered()`: a rollout, an eval, one
minibatch's update) and runs them with no collective but the gradients' reduce-scatter,
once, in the minibatch's last backward (`gradient_sync_off` before it). What this
saves is the optimizer state (each rank keeps its shard: `full_optimizer_state` gathers
it for a checkpoint, `load_full_optimizer_state` cuts it back), and weights and
gradients between blocks; inside one, a rank holds the whole weights (and, updating,
gradients).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from rspo.models import base_lm

# Wrappers that shard weights behind rspo's back: every forward pass becomes a collective
# that all ranks must run alike, which rollouts (a rank-dependent number of generate calls)
# do not. rspo shards with FSDP2 itself (`shard`), gathering around such passes.
SHARDED_ENGINES = ("FSDPModule", "FullyShardedDataParallel", "DeepSpeedEngine")
SHARDED_ENGINES_UNSUPPORTED = (
    "a weight-sharding wrapper from accelerate.prepare (FSDP / DeepSpeed) is not supported: with sharded "
    "weights every rank must run the same forward passes, but each rank's rollouts run their own number of "
    "generate calls. Shard with rspo's own FSDP instead (train.fsdp=true, or accelerate's "
    "configs/accelerate/fsdp.yaml), or use DDP (configs/accelerate/ddp.yaml); see the README, 'GPU and multi-GPU'"
)


def shard(nets: list[nn.Module], device: torch.device) -> None:
    """Shard every module of `nets` (a policy's `PolicyNet`s) over the ranks with FSDP2
    (`fully_shard`): each decoder layer, then the whole module (embeddings, norm, LM head,
    value heads).

    Needs an initialized process group (`accelerate launch`). Every rank starts from
    rank 0's weights (ranks seed their LoRA initializations apart). Build optimizers
    after this: the parameters become DTensor shards. The KL reference of full fine-tuning
    stays whole on every rank. One forward through each module makes it FSDP's root,
    before `generate` can run a layer alone (which would make that layer the root);
    the root keeps its weights gathered after a forward, so they are resharded.
    """
    for net in nets:
        for tensor in [*net.parameters(), *net.buffers()]:  # rank 0's initialization, as DDP does
            dist.broadcast(tensor.data, src=0)
        for layer in base_lm(net.lm).get_decoder().layers:
            fully_shard(layer)
        fully_shard(net)
        one = torch.ones(1, 1, dtype=torch.long, device=device)
        with torch.no_grad():
            net.eval()(one, one, logits_to_keep=1)
        net.reshard()
        for module in net.modules():  # loading keeps working: whole tensors in, this rank's shards kept
            module.register_load_state_dict_pre_hook(_shard_on_load)


@contextlib.contextmanager
def gathered(nets: list[nn.Module]) -> Iterator[None]:
    """The sharded weights of `nets` gathered whole on every rank for the block, which then
    runs its forward and backward passes with no collective (`gradient_sync_off` keeps
    backward passes local until the one that reduces the gradients). Every rank must enter
    it together. Parameters read inside it (`parameters_of`, `state_dict`) are the gathered
    copies: step optimizers on the shards they were built with."""
    modules = [m for net in nets for m in fsdp_modules(net)]
    for m in modules:
        m.set_reshard_after_forward(False, recurse=False)
        m.set_reshard_after_backward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in modules:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)
            m.set_reshard_after_backward(True, recurse=False)


def fsdp_modules(net: nn.Module) -> list[nn.Module]:
    """The modules of `net` that FSDP2 sharded (none when unsharded)."""
    return [m for m in net.modules() if isinstance(m, FSDPModule)]


def _shard_on_load(module: nn.Module, state: dict, prefix: str, *_) -> None:
    """A load_state_dict pre-hook: each whole tensor loaded into a sharded (DTensor)
    parameter of `module` is cut to this rank's shard first (locally: every rank has it)."""
    for name, param in module.named_parameters(recurse=False):
        value = state.get(prefix + name)
        if isinstance(param, DTensor) and value is not None and not isinstance(value, DTensor):
            state[prefix + name] = distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)


@contextlib.contextmanager
def gradient_sync_off(net: nn.Module) -> Iterator[None]:
    """FSDP2's `no_sync`: backward passes inside accumulate unsharded gradients locally,
    with no collective; the next backward outside reduce-scatters the sum."""
    modules = fsdp_modules(net)
    for m in modules:
        m.set_requires_gradient_sync(False, recurse=False)
    try:
        yield
    finally:
        for m in modules:
            m.set_requires_gradient_sync(True, recurse=False)


def full_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The state of `optimizer` (over `module`'s sharded parameters) gathered whole onto the
    main rank's CPU: a collective, every rank calls it."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(module, optimizer, options=options)


def load_full_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a `full_optimizer_state`: every rank holds the whole state and keeps its shards of it."""
    set_optimizer_state_dict(module, optimizer, state, options=StateDictOptions(full_state_dict=True))
