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

from infra.learn.tasks import TOOLS, warm_start_episodes


@dataclass(frozen=True)
class WarmStartConfig:
    hidden_size: int = 128
    layers: int = 2
    vocab_size: int = 1024
    steps: int = 3000
    batch_size: int = 16
    learning_rate: float = 1e-3
    guesses: int = 1
    """careless episodes (a guessed answer, no calculator) per training expression beside its
    demonstration: the warm start reaches for the calculator about half the time, and the online
    rewards have to teach it the rest"""
    tie_embeddings: bool = True
    """input and output embeddings shared: copying a token is then an attention move, nothing more"""
    seed: int = 0


def build_warm_model(
    out: Path, train: tuple[str, ...], config: WarmStartConfig, say: Callable[[str], None] = print
) -> Path:
    """Train the tokenizer, build the model, run the SFT, save to `out`; returns `out`."""
    import torch

    from consumers.tiny_model import build_model, train_tokenizer

    torch.manual_seed(config.seed)
    base_tokenizer = train_tokenizer([], vocab_size=512)
    episodes = warm_start_episodes(train, config.guesses, config.seed)
    corpus = [base_tokenizer.apply_chat_template(e, tools=TOOLS, tokenize=False) for e in episodes]
    tokenizer = train_tokenizer(corpus, vocab_size=config.vocab_size)
    model = build_model(
        tokenizer,
        hidden_size=config.hidden_size,
        layers=config.layers,
        seed=config.seed,
        tie_word_embeddings=config.tie_embeddings,
    )
    encoded = [turn for e in episodes for turn in served_turns(tokenizer, e, TOOLS)]
    _sft(model, tokenizer.pad_token_id, encoded, config, say)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@dataclass(frozen=True)
class Turn:
    input_ids: list[int]
    labels: list[int]


def served_turns(tokenizer, messages: list[dict], tools: list[dict]) -> list[Turn]:
    """One SFT example per assistant turn, tokenized as the policy server sees it: the prompt is the
    conversation so far rendered and tokenized at once (as `LocalEngine.render` does), the labels
    the turn's own text tokenized alone (as the model generates it).

    A conversation tokenized message by message puts tokens in the history the server never shows
    (`\\n` `\\n` where the server's prompt has `\\n\\n`), which shifts every position the model
    learns to copy from (the expression, the calculator's value).
    """
    turns = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        head = tokenizer.apply_chat_template(
            messages[:k], tools=tools, add_generation_prompt=True, tokenize=False
        )
        full = tokenizer.apply_chat_template(messages[: k + 1], tools=tools, tokenize=False)
        end = full.index(tokenizer.eos_token, len(head)) + len(tokenizer.eos_token)
        prompt = tokenizer(head, add_special_tokens=False)["input_ids"]
        completion = tokenizer(full[len(head) : end], add_special_tokens=False)["input_ids"]
        turns.append(Turn([*prompt, *completion], [-100] * len(prompt) + completion))
    return turns


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
