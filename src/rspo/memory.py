"""Where a run's accelerator memory goes: an estimate printed at the start of training.

    parameters      every weight held (base, adapters, value heads, full-FT copies): counted
    trainable       the parameters the optimizers train, and their gradients: counted
    optimizer       AdamW's two moments per trainable parameter (in the parameter's dtype);
                    under FSDP (`shards` processes) each process holds 1 / shards of them.
                    Weights and gradients are gathered whole for each pass, so they count whole
    kv_cache        one generate call: rollout.micro_batch sequences of
                    max_prompt_tokens + max_new_tokens positions, K and V in every layer
    activations     what one update micro-batch (train.micro_batch sequences of that
                    length) keeps for its backward pass: decoder layers + the loss's logits
    backward_extra  what that backward pass needs on top for a moment: the logits'
                    gradients, and with checkpointing one layer's recomputed activations

Notation: N = sequences in the micro-batch, L = positions (prompt + response), R =
response positions, H = hidden size, I = MLP width, D_kv = K/V width (kv_heads * head_dim),
V = vocabulary, n_layers = decoder layers.

Per layer and token a Llama / Qwen2 block with LoRA keeps about 9H + 2 D_kv + 4I values
in the activation dtype: the two RMSNorms' inputs and outputs, Q/K/V and the attention
output (SDPA keeps them for its backward), o_proj's input, and the MLP's gate, up,
SiLU(gate) and their product (down_proj's input). A frozen base linear keeps nothing for
its weight; LoRA keeps each adapter's input, which is a tensor already counted, except
that fp32 adapters on a 16-bit base keep an fp32 copy of every input they cast (the
inputs of q, k, v, o, gate, up: 6H; of down: I). With gradient checkpointing a layer
keeps only its input (H) and recomputes the rest, one layer at a time, in the backward.
The loss keeps the fp32 logits of the R + 1 response positions, N (R + 1) V floats; its
backward needs about two more of those (the softmax and the logits' gradient).

These are estimates for reading a run's shape at a glance ("will it fit?").
tests/test_memory.py checks each against tensors measured on the CPU (the optimizer
state after a step, a forward pass's KV cache, the tensors autograd saves) within a
factor of 1.5; the GPU check prints the estimate next to `torch.cuda.max_memory_allocated`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from rspo.config import Config

GIB = 1024**3


@dataclass
class MemoryEstimate:
    """Bytes, each as described in the module docstring."""

    parameters: int
    trainable: int  # their gradients take as much again
    optimizer: int
    kv_cache: int
    activations: int
    backward_extra: int

    @property
    def total(self) -> int:
        """Weights + gradients + optimizer + the larger of a generate call and an update micro-batch."""
        update = self.activations + self.backward_extra
        return self.parameters + self.trainable + self.optimizer + max(self.kv_cache, update)

    def report(self) -> str:
        rows = {**dataclasses.asdict(self), "total (peak, roughly)": self.total}
        return "memory estimate: " + ", ".join(f"{k} {v / GIB:.3g} GiB" for k, v in rows.items())


def unique_bytes(params: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct tensors in `params` (tied weights counted once)."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in params}
    return sum(seen.values())


def kv_cache_bytes(model_config, sequences: int, positions: int, dtype: torch.dtype) -> int:
    """K and V of every layer for `sequences` x `positions` tokens."""
    return 2 * model_config.num_hidden_layers * sequences * positions * _widths(model_config)[2] * _size(dtype)


def _widths(c) -> tuple[int, int, int]:
    """(H, I, D_kv) of a Hugging Face decoder config."""
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    return c.hidden_size, c.intermediate_size, kv_heads * head_dim


def layer_bytes(model_config, dtype: torch.dtype, lora_fp32: bool) -> int:
    """What one decoder layer keeps for its backward, per token (see the module docstring)."""
    H, I, kv_width = _widths(model_config)
    per_token = (9 * H + 2 * kv_width + 4 * I) * _size(dtype)
    if lora_fp32 and _size(dtype) < 4:
        per_token += (6 * H + I) * 4  # fp32 copies of the adapters' inputs
    return per_token


def activation_bytes(
    model_config, sequences: int, positions: int, response: int, dtype, checkpointing: bool, lora_fp32: bool
) -> tuple[int, int]:
    """(kept for the backward, needed on top during it) for one micro-batch."""
    c, tokens = model_config, sequences * positions
    per_layer = tokens * layer_bytes(c, dtype, lora_fp32)
    logits = sequences * (response + 1) * c.vocab_size * 4  # fp32
    if checkpointing:  # each layer keeps its input; one layer at a time is recomputed
        return tokens * c.num_hidden_layers * c.hidden_size * _size(dtype) + logits, per_layer + 2 * logits
    return c.num_hidden_layers * per_layer + logits, 2 * logits


def estimate(
    cfg: Config, model_config, parameters: Iterable[nn.Parameter], trainable: Iterable[nn.Parameter], shards: int = 1
):
    """The estimate, per process, for a run of `cfg` whose policy holds `parameters`, training
    `trainable`, its optimizer state sharded over `shards` processes."""
    parameters, trainable = list(parameters), list(trainable)
    dtype = getattr(torch, cfg.model.dtype)
    trainable_bytes = unique_bytes(trainable)
    positions = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
    lora_fp32 = cfg.model.lora.enabled and any(p.dtype == torch.float32 for p in trainable)
    micro_batch, response, ckpt = cfg.train.micro_batch, cfg.rollout.max_new_tokens, cfg.model.gradient_checkpointing
    kept, extra = activation_bytes(model_config, micro_batch, positions, response, dtype, ckpt, lora_fp32)
    return MemoryEstimate(
        parameters=unique_bytes(parameters),
        trainable=trainable_bytes,
        optimizer=2 * trainable_bytes // shards,
        kv_cache=kv_cache_bytes(model_config, cfg.rollout.micro_batch, positions, dtype),
        activations=kept,
        backward_extra=extra,
    )


def estimate_for(cfg: Config, policy, shards: int = 1) -> MemoryEstimate:
    """`estimate` for a built (not yet sharded) `rspo.policy.Policy`."""
    return estimate(cfg, policy.model_config, policy.parameters(), policy.trainable_parameters(), shards)


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
