"""The warm start: a tiny model built from a config, its tokenizer trained on the spot on the
demonstrations, then a short SFT on scripted calc episodes, saved as a full model directory that
the policy server and the executor both take as `--base-model`. Deterministic for a seed.
torch / transformers are imported inside the functions.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.learn.tasks import TOOLS, demonstration


@dataclass(frozen=True)
class WarmStartConfig:
    hidden_size: int = 128
    layers: int = 2
    vocab_size: int = 1024
    steps: int = 1000
    batch_size: int = 16
    learning_rate: float = 3e-3
    tie_embeddings: bool = True
    """input and output embeddings shared: copying a token is then an attention move, nothing more"""
    seed: int = 0


def build_warm_model(
    out: Path, train: tuple[str, ...], config: WarmStartConfig, say: Callable[[str], None] = print
) -> Path:
    """Train the tokenizer, build the model, run the SFT, save to `out`; returns `out`."""
    import torch

    from consumers.trainer.tiny import build_model, train_tokenizer
    from consumers.trainer.tokenize import encode_messages

    torch.manual_seed(config.seed)
    base_tokenizer = train_tokenizer([], vocab_size=512)
    corpus = [
        base_tokenizer.apply_chat_template(demonstration(e), tools=TOOLS, tokenize=False) for e in train
    ]
    tokenizer = train_tokenizer(corpus, vocab_size=config.vocab_size)
    model = build_model(
        tokenizer,
        hidden_size=config.hidden_size,
        layers=config.layers,
        seed=config.seed,
        tie_word_embeddings=config.tie_embeddings,
    )
    encoded = [encode_messages(tokenizer, demonstration(e), TOOLS, train_from=2) for e in train]
    _sft(model, tokenizer.pad_token_id, encoded, config, say)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _sft(model, pad_id: int, encoded: list, config: WarmStartConfig, say: Callable[[str], None]) -> None:
    import torch

    rng = random.Random(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    model.train()
    started = time.monotonic()
    for step in range(config.steps):
        batch = rng.sample(encoded, min(config.batch_size, len(encoded)))
        ids, labels = _collate(batch, pad_id)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == config.steps - 1:
            elapsed = time.monotonic() - started
            say(f"warm start: step {step + 1}/{config.steps}, loss {loss.item():.3f}, {elapsed:.0f}s")
    model.eval()


def _collate(batch: list, pad_id: int):
    import torch

    width = max(len(e.input_ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for i, e in enumerate(batch):
        ids[i, : len(e.input_ids)] = torch.tensor(e.input_ids)
        labels[i, : len(e.labels)] = torch.tensor(e.labels)
    return ids, labels
