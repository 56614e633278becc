"""The policies RL trains: target, explorer (RSPO) and critic (PPO), on one base model.

With LoRA (`model.lora.enabled`, the default) every policy is a named `peft` adapter on
ONE frozen base: `"target"` (the model we ship), `"explorer"` (RSPO's process-reward
agent, initialized as a copy of the target) and `"critic"` (PPO: its own adapter plus a
value head `nn.Linear(hidden, 1)`). The reference policy for the KL term is the base with
the adapters disabled, so it costs no memory. With full fine-tuning each policy is its
own copy of the model, and the reference is a frozen copy made only if asked for.

Selecting a policy: `with policy.use("explorer"): ...` makes every `logprobs` /
`generate` call inside run that policy. Only the active adapter enters the graph, so a
backward pass gives grads to its parameters only; the other adapters keep
`requires_grad=True` (peft's `set_adapter` would switch them off), so one optimizer per
policy over `parameters_of(name)` works: step the optimizer of the policy that just did
the backward, and `zero_grad(set_to_none=True)` it before its next backward.

Distributed training: every differentiable forward goes through `self.nets[name]`
(an `nn.Module` whose `forward` returns logits or values). `wrap(accelerator.prepare)`
swaps in the wrapped (DDP) modules. With LoRA all policies share one module and each
backward touches one adapter, so DDP needs `find_unused_parameters=True`.

Padding: prompts are left-padded, responses right-padded; attention masks are always
passed in explicitly (pad may equal eos) and position ids are derived from them the way
`generate` does, so a forward pass reproduces the sampling log-probs.

This file holds the policies and their forward passes; sharding them (FSDP2) is
`rspo.sharding`'s, on the policy's modules; saving, loading and building one are plain
functions in `rspo.policy_io`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Iterator

import peft
import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rspo import sharding
from rspo.algorithms.losses import logprobs_from_logits
from rspo.config import ModelConfig
from rspo.models import base_fingerprint, base_lm
from rspo.sharding import SHARDED_ENGINES, SHARDED_ENGINES_UNSUPPORTED

POLICIES = ("target", "explorer")
CRITIC = "critic"  # the target's critic; the explorer's is "explorer_critic"


def critic_name(policy: str) -> str:
    """The name of `policy`'s critic (PPO): "critic" for the target, "<policy>_critic" otherwise."""
    return CRITIC if policy == "target" else f"{policy}_{CRITIC}"


def position_ids(attention_mask: Tensor) -> Tensor:
    """Positions counted over real tokens only, as `generate` does for left padding. (N, L)"""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class PolicyNet(nn.Module):
    """A causal LM (maybe a PeftModel) plus value heads by critic name: one forward per call."""

    def __init__(self, lm: nn.Module, value_heads: dict[str, nn.Linear] | None = None):
        super().__init__()
        self.lm = lm
        self.value_heads = nn.ModuleDict(value_heads or {})

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, logits_to_keep: int = 0, value: str = "", **lm_kwargs
    ) -> Tensor:
        """Logits of the last `logits_to_keep` positions (N, K, V), or critic `value`'s values (N,).
        `lm_kwargs` go to the LM (peft's per-row `adapter_names`)."""
        pos = position_ids(attention_mask)
        if not value:
            kw = {"position_ids": pos, "use_cache": False, "logits_to_keep": logits_to_keep, **lm_kwargs}
            return self.lm(input_ids=input_ids, attention_mask=attention_mask, **kw).logits
        decoder = base_lm(self.lm).get_decoder()
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False)
        hidden = out.last_hidden_state  # (N, L, H)
        last = attention_mask.shape[1] - 1 - attention_mask.flip(1).argmax(1)  # last real token, (N,)
        h = hidden[torch.arange(len(last), device=last.device), last]  # (N, H)
        return self.value_heads[value](h.float()).squeeze(-1)


class Policy:
    """Target/explorer policies (+ optional critics and reference) over one base model.

    `critic=True` gives every policy its own critic (`critic_name(policy)`): with RSPO the
    target's critic learns outcome values and the explorer's process-reward values.

    Takes ownership of `model` (LoRA layers are injected into it in place).
    `reference=True` is only needed for full fine-tuning with a KL term (it keeps a frozen
    copy of the initial weights); with LoRA `reference()` always works.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        adapters: Iterable[str] = ("target",),
        critic: bool = False,
        reference: bool = False,
    ):
        self.names = list(dict.fromkeys(["target", *adapters]))
        unknown = set(self.names) - set(POLICIES)
        if unknown:
            raise ValueError(f"unknown policies {sorted(unknown)}; choose from {POLICIES}")
        self.lora = cfg.lora.enabled
        self.allow_pickle_adapters = cfg.allow_pickle_adapters  # `load`: peft's adapter_model.bin too
        self.tokenizer = tokenizer
        self.critics = [critic_name(n) for n in self.names] if critic else []
        self.active = "target"
        self._in_reference = False
        self.sharded = False  # FSDP2 (`shard`)
        self._gathered = False  # inside `gathered()`
        if cfg.gradient_checkpointing:
            enable_checkpointing(model, lora=self.lora)
        heads = {c: _value_head(model.config.hidden_size, model.device) for c in self.critics}
        self.base_fingerprint = base_fingerprint(model) if self.lora else ""  # before adapters go in
        if self.lora:
            self._setup_lora(cfg, model, heads)
        else:
            self._setup_full(model, heads, reference)

    def _setup_lora(self, cfg: ModelConfig, model: PreTrainedModel, heads: dict[str, nn.Linear]) -> None:
        self.peft_model = peft.get_peft_model(model, _lora_config(cfg), adapter_name="target")
        for name in self.names[1:] + self.critics:
            self.peft_model.add_adapter(name, _lora_config(cfg))
        for name in self.names[1:]:
            self.copy_weights("target", name)  # all policies start from the same initialization
        self.peft_model.set_requires_grad(list(self.peft_model.peft_config), True)
        net = PolicyNet(self.peft_model, heads)
        self.nets = {name: net for name in self.all_names()}
        self.raw_nets = dict(self.nets)
        self._ref_model = None

    def _setup_full(self, model: PreTrainedModel, heads: dict[str, nn.Linear], reference: bool) -> None:
        self.nets = {name: PolicyNet(model if name == "target" else copy.deepcopy(model)) for name in self.names}
        for critic, head in heads.items():
            lm = copy.deepcopy(model)
            out = lm.get_output_embeddings()
            if out is not None and out.weight is not lm.get_input_embeddings().weight:
                out.requires_grad_(False)  # the critic never uses the LM head
            self.nets[critic] = PolicyNet(lm, {critic: head})
        self.raw_nets = dict(self.nets)
        self._ref_model = copy.deepcopy(model).requires_grad_(False).eval() if reference else None

    def all_names(self) -> list[str]:
        return self.names + self.critics

    # --- selecting a policy -------------------------------------------------------------

    @contextlib.contextmanager
    def use(self, name: str) -> Iterator[Policy]:
        """Run `logprobs` / `generate` inside the block with policy `name`."""
        if name not in self.names:
            raise ValueError(f"unknown policy {name!r}; this Policy has {self.names}")
        previous, self.active = self.active, name
        self._set_adapter(name)
        try:
            yield self
        finally:
            self.active = previous
            self._set_adapter(previous)

    @contextlib.contextmanager
    def reference(self) -> Iterator[Policy]:
        """Run `logprobs` / `generate` inside the block with the reference policy, under no_grad.

        LoRA: the base model with every adapter disabled. Full FT: the frozen initial copy.
        Leaving peft's `disable_adapter` turns requires_grad off on every adapter but the
        active one, and autograd drops the gradients of a leaf that no longer requires grad,
        even from a graph built before: the explorer's update (the target stays active), whose
        KL term runs this block between its forward and its backward, got none. So every
        adapter is made trainable again on the way out.
        """
        if not self.lora and self._ref_model is None:
            raise RuntimeError("full fine-tuning keeps no reference model: build Policy(..., reference=True)")
        previous, self._in_reference = self._in_reference, True
        try:
            with torch.no_grad(), self.peft_model.disable_adapter() if self.lora else contextlib.nullcontext():
                yield self
        finally:
            self._in_reference = previous
            if self.lora:
                self.peft_model.set_requires_grad(list(self.peft_model.peft_config), True)

    @contextlib.contextmanager
    def merged(self) -> Iterator[Policy]:
        """Inside the block the active adapter is merged into the base weights (LoRA:
        W + s * B @ A), so a forward runs one matmul per layer instead of three: for sampling
        (`rollout.merge_adapter`), whose logits then equal the adapter's up to float rounding.
        The base weights are restored bit for bit on the way out (peft's own unmerge
        subtracts the product again, which rounds: the frozen base would drift). A no-op
        without LoRA and under `reference()`; not for sharded weights."""
        if not self.lora or self._in_reference:
            yield self
            return
        if self.sharded:
            raise RuntimeError("rollout.merge_adapter merges whole weights: not with train.fsdp")
        layers = [m for m in self.peft_model.modules() if isinstance(m, peft.tuners.lora.LoraLayer)]
        saved = [m.get_base_layer().weight.detach().clone() for m in layers]
        self.peft_model.merge_adapter([self.active])
        try:
            yield self
        finally:
            with torch.no_grad():
                for layer, weight in zip(layers, saved):
                    layer.get_base_layer().weight.copy_(weight)
                    layer.merged_adapters.clear()  # peft's record of what is merged: nothing now

    def _set_adapter(self, name: str) -> None:
        if self.lora and self.peft_model.active_adapter != name:
            self.peft_model.set_adapter(name)  # this sets requires_grad=False on the other adapters:
            self.peft_model.set_requires_grad(list(self.peft_model.peft_config), True)  # undo, for the optimizers

    def _net(self, name: str) -> nn.Module:
        """The (maybe wrapped) module to run for `name`, in train mode iff grads are on."""
        if self._in_reference and not self.lora and name not in self.critics:
            return PolicyNet(self._ref_model)
        net = self.nets[name]
        net.train(torch.is_grad_enabled())  # dropout only in differentiated forwards
        return net

    # --- forward passes -----------------------------------------------------------------

    def logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        response_len: int,
        with_entropy: bool = False,
        temperature: float = 1.0,
        rows: list[str] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Log-prob (and entropy) of each of the last `response_len` tokens, active policy.

        input_ids, attention_mask: (N, L), prompt left-padded + response right-padded.
        Returns (N, R) float32 log-probs and (N, R) entropies (None unless asked). Logits are
        divided by `temperature` (use the sampling temperature). Only the R response
        positions' logits are computed, and cast to float32. `rows`: a policy per row
        instead of the active one (`mixed_batch`).
        """
        R = response_len
        kw = self.mixed_batch(rows)
        logits = self._net(self.active)(input_ids, attention_mask, logits_to_keep=R + 1, **kw)[:, :-1]  # (N, R, V)
        return logprobs_from_logits(logits.float() / temperature, input_ids[:, -R:], with_entropy)

    def values(self, input_ids: Tensor, attention_mask: Tensor, critic: str = CRITIC) -> Tensor:
        """Critic `critic`'s value of each row's last real token (the prompt's end): (N,) float32.

        Call it outside `reference()` (which disables every adapter, the critic's too).
        """
        if critic not in self.critics:
            raise RuntimeError(
                f"no critic {critic!r} in this Policy (it has {self.critics}); build it with critic=True"
            )
        self._set_adapter(critic)
        try:
            return self._net(critic)(input_ids, attention_mask, value=critic)
        finally:
            self._set_adapter(self.active)

    @torch.no_grad()
    def generate(self, input_ids: Tensor, attention_mask: Tensor, rows: list[str] | None = None, **kwargs) -> Tensor:
        """`model.generate` with the active (or reference) policy, eval mode, no grads;
        `rows`: a policy per row instead (`mixed_batch`)."""
        lm = self._ref_model if self._in_reference and not self.lora else self.raw_nets[self.active].lm
        lm.eval()
        return lm.generate(input_ids=input_ids, attention_mask=attention_mask, **self.mixed_batch(rows), **kwargs)

    def mixed_batch(self, rows: list[str] | None) -> dict:
        """The LM kwargs that run row i with policy rows[i]: peft's mixed-adapter batches, one
        pass for the target's and the explorer's rows (LoRA only; not under `reference()`)."""
        if rows is None:
            return {}
        if not self.lora or self._in_reference:
            raise RuntimeError("a policy per row needs LoRA adapters, outside reference()")
        unknown = set(rows) - set(self.names)
        if unknown:
            raise ValueError(f"unknown policies {sorted(unknown)}; this Policy has {self.names}")
        return {"adapter_names": list(rows)}

    # --- parameters, copies, wrapping ---------------------------------------------------

    def parameters_of(self, name: str) -> list[nn.Parameter]:
        """The trainable parameters of one policy (or "critic"), for its optimizer."""
        if name not in self.all_names():
            raise ValueError(f"unknown policy {name!r}; this Policy has {self.all_names()}")
        net = self.raw_nets[name]
        if self.lora:
            params = [p for n, p in self.peft_model.named_parameters() if "lora_" in n and f".{name}." in n]
        else:
            params = [p for p in net.lm.parameters() if p.requires_grad]
        return params + (list(net.value_heads[name].parameters()) if name in self.critics else [])

    def parameters(self) -> list[nn.Parameter]:
        """Every parameter held (all policies, critics and the reference), each once."""
        modules = [*self.raw_nets.values(), *([self._ref_model] if self._ref_model is not None else [])]
        return list({id(p): p for m in modules for p in m.parameters()}.values())

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters of every policy and critic that an optimizer trains, each once."""
        return list({id(p): p for name in self.all_names() for p in self.parameters_of(name)}.values())

    @property
    def model_config(self):
        """The base model's Hugging Face config (sizes for `rspo.memory`)."""
        return self.raw_nets["target"].lm.config

    @torch.no_grad()
    def copy_weights(self, src: str, dst: str) -> None:
        """Copy policy `src`'s trainable weights into `dst` in place (optimizer state is kept)."""
        if self.lora:
            named = dict(self.peft_model.named_parameters())
            for n, p in named.items():
                if "lora_" in n and f".{src}." in n:
                    named[n.replace(f".{src}.", f".{dst}.")].copy_(p)
        else:
            self.raw_nets[dst].lm.load_state_dict(self.raw_nets[src].lm.state_dict())

    def wrap(self, prepare: Callable[[nn.Module], nn.Module]) -> None:
        """Replace each trainable module by `prepare(module)` (e.g. `accelerator.prepare`).

        Refuses weight-sharding wrappers (FSDP, DeepSpeed): see `SHARDED_ENGINES`.
        """
        wrapped: dict[int, nn.Module] = {}
        for name, net in self.raw_nets.items():
            wrapped.setdefault(id(net), prepare(net))
            self.nets[name] = wrapped[id(net)]
            if any(cls.__name__ in SHARDED_ENGINES for cls in type(self.nets[name]).__mro__):
                raise NotImplementedError(SHARDED_ENGINES_UNSUPPORTED)

    def shard(self) -> None:
        """Shard the trainable modules over the ranks with FSDP2 (`rspo.sharding.shard`)."""
        sharding.shard(self.unique_modules(), self.device)
        self.sharded = True

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Sharded weights gathered whole for the block (`rspo.sharding.gathered`): a rollout,
        an eval, one minibatch's update. Every rank enters it together. A no-op when
        unsharded, and inside another `gathered` (the outer block gathers and reshards)."""
        if not self.sharded or self._gathered:
            yield
            return
        self._gathered = True
        try:
            with sharding.gathered(self.unique_modules()):
                yield
        finally:
            self._gathered = False

    def unique_modules(self) -> list[nn.Module]:
        """The distinct trainable modules (one with LoRA; one per policy and critic otherwise)."""
        return list({id(n): n for n in self.raw_nets.values()}.values())

    def to(self, device: torch.device | str) -> Policy:
        for net in self.unique_modules():
            net.to(device)
        if self._ref_model is not None:
            self._ref_model.to(device)
        return self

    @property
    def eos_token_ids(self) -> set[int]:
        """Every id that ends a response: the tokenizer's eos and the model's generation eos."""
        gen = self.raw_nets["target"].lm.generation_config.eos_token_id
        ids = {self.tokenizer.eos_token_id, *(gen if isinstance(gen, (list, tuple)) else [gen])}
        return {i for i in ids if i is not None}

    @property
    def device(self) -> torch.device:
        return next(self.raw_nets["target"].parameters()).device


def enable_checkpointing(model: PreTrainedModel, lora: bool) -> None:
    """Activation (gradient) checkpointing: each decoder layer keeps only its input and
    recomputes the rest in the backward pass.

    Non-reentrant (`torch.utils.checkpoint`'s recommended mode). With LoRA the base is
    frozen, so the embeddings' output does not require grad; the input-grad hook
    (`enable_input_require_grads`) makes it, so that a reentrant checkpoint, or any other
    wrapper that only backpropagates through inputs requiring grad, still reaches the
    adapters. transformers >= 5.2x calls it `activation_checkpointing_enable`; older
    versions, `gradient_checkpointing_enable`.
    """
    kw = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    if lora:  # newer transformers add the hook themselves: remove it first, to add it once
        with contextlib.suppress(AttributeError):  # older ones fail when there is none
            model.disable_input_require_grads()
        model.enable_input_require_grads()


def _lora_config(cfg: ModelConfig) -> peft.LoraConfig:
    """`model.lora.*` as a peft config; target_modules `[all-linear]` is peft's shorthand for
    every linear layer but the LM head."""
    lc = cfg.lora
    targets = list(lc.target_modules)
    target_modules = "all-linear" if targets == ["all-linear"] else targets
    kw = {"lora_alpha": lc.alpha, "lora_dropout": lc.dropout, "target_modules": target_modules}
    return peft.LoraConfig(r=lc.r, task_type="CAUSAL_LM", **kw)


def _value_head(hidden_size: int, device: torch.device) -> nn.Linear:
    """float32, zero-initialized: every value starts at 0 (the head's grads are nonzero from step 1)."""
    head = nn.Linear(hidden_size, 1, device=device)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head
