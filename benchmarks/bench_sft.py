"""The warm start's loss: logits of the response positions only vs of every position.

    .venv/bin/python benchmarks/bench_sft.py           # batches of 16, prompts 300-700 tokens
    .venv/bin/python benchmarks/bench_sft.py --quick   # smaller, 1 repeat

`rspo.sft.sft_loss` left-pads prompts and right-pads responses (the rollout's layout), so the
LM head runs on the R response positions only. The reference here is how it was built before:
every sample right-padded, logits at every position, the prompt's masked out of the loss.
Both compute the same loss (tests/test_sft.py checks `sft_loss` against unpadded passes);
this times one forward + backward of each on the default config's tiny model, at its
vocabulary (1,024, `model.tiny.tokenizer=bpe`) and at 8,192 (`words`, as WebShop needs),
and prints the ratio measured in this run. CPU or CUDA, whichever torch sees.
"""

from __future__ import annotations

import argparse
import random

import torch
from common import default_model_config, timed

from rspo.models import load_base
from rspo.policy import Policy
from rspo.sft import sft_loss


def all_positions_loss(net, samples, pad_id: int, device) -> tuple[torch.Tensor, int]:
    """The reference: right-padded rows, logits at every position."""
    width = max(len(p) + len(r) for p, r in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (p, r) in enumerate(samples):
        ids[i, : len(p) + len(r)] = torch.tensor(p + r)
        attn[i, : len(p) + len(r)] = 1
        labels[i, len(p) : len(p) + len(r)] = torch.tensor(r)
    logits = net(ids.to(device), attn.to(device))[:, :-1].float()
    targets = labels[:, 1:].reshape(-1).to(device)
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets, ignore_index=-100, reduction="sum"
    )
    return loss, int((targets != -100).sum())


def time_both(kind: str, vocab: int, batch: int, lo: int, hi: int, repeats: int, device: str) -> None:
    cfg = default_model_config(f"model.tiny.tokenizer={kind}", f"model.tiny.vocab_size={vocab}").model
    cfg.lora.enabled = False  # the warm start trains the whole model
    corpus = [f"w{i} x{i}y {i}" for i in range(vocab)]  # enough distinct words to fill the vocabulary
    model, tok = load_base(cfg, lambda: corpus)
    net = Policy(cfg, model, tok).nets["target"].to(device)
    V = len(tok)
    rng = random.Random(0)
    samples = [
        ([rng.randrange(3, V) for _ in range(rng.randint(lo, hi))], [rng.randrange(3, V) for _ in range(24)])
        for _ in range(batch)
    ]

    def step(loss_fn):
        def run():
            loss_fn(net, samples, tok.pad_token_id, device)[0].backward()
            net.zero_grad(set_to_none=True)

        return run

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t_all = timed(step(all_positions_loss), repeats, sync)
    t_resp = timed(step(sft_loss), repeats, sync)
    print(
        f"{kind:5s} vocab {V:5d}: every position {t_all * 1e3:7.1f} ms, response positions "
        f"{t_resp * 1e3:7.1f} ms per batch: x{t_all / t_resp:.2f} faster"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    batch, lo, hi, repeats = (4, 100, 200, 1) if args.quick else (16, 300, 700, args.repeats)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device={device} threads={torch.get_num_threads()} batch={batch} prompt tokens {lo}-{hi}")
    for kind, vocab in (("bpe", 1024), ("words", 8192)):
        time_both(kind, vocab, batch, lo, hi, repeats, device)


if __name__ == "__main__":
    main()
