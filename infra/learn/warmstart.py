"""The warm start: a tiny model built from a config, its tokenizer trained on the spot on the
demonstrations, then a short SFT on scripted calc episodes, saved as a full model directory that
the policy server and the executor both take as `--base-model`. Deterministic for a seed.
torch / transformers are imported inside the functions.

`cached_warm_model` keeps built models in a cache directory keyed by `warm_start_key`: a hash of the
WarmStartConfig (its seed included), the warm-start episodes (the training expressions rendered as
the rollout driver talks, so a changed prompt or tool spec is a new key), the source of the
tokenizer/model-building code and the torch / transformers / tokenizers versions. An entry is built in
a temporary directory and renamed into place with a manifest of its files' sha256; an entry whose
manifest is missing or whose files do not match is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
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


MANIFEST = "warmstart.json"
_CODE = ("consumers/tiny_model.py", "infra/learn/warmstart.py")  # the code that builds the model
_PACKAGES = ("torch", "transformers", "tokenizers")


def warm_start_key(train: tuple[str, ...], config: WarmStartConfig) -> str:
    """The cache key of a warm start: sha256 (hex, 24 characters) of everything that decides it.

    >>> key = lambda seed: warm_start_key(("1 + 2",), WarmStartConfig(seed=seed))
    >>> key(0) == key(0), key(0) == key(1), len(key(0))
    (True, False, 24)
    """
    from importlib.metadata import PackageNotFoundError, version

    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for part in (asdict(config), warm_start_episodes(train, config.guesses, config.seed)):
        digest.update(json.dumps(part, sort_keys=True).encode())
    for name in _CODE:
        digest.update((root / name).read_bytes())
    for package in _PACKAGES:
        try:
            digest.update(f"{package}=={version(package)}".encode())
        except PackageNotFoundError:
            digest.update(f"{package} absent".encode())
    return digest.hexdigest()[:24]


def cached_warm_model(
    cache: Path, train: tuple[str, ...], config: WarmStartConfig, say: Callable[[str], None] = print
) -> Path:
    """The warm start of (`train`, `config`) from `cache/<key>`, built there first when absent or
    damaged; returns the model directory. A hit logs one line."""
    key = warm_start_key(train, config)
    entry = cache / key
    problem = entry_problem(entry, key)
    if problem is None:
        say(f"warm start: cache hit {entry}")
        return entry
    if entry.exists():
        say(f"warm start: cache entry {entry} is {problem}: rebuilding it")
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    cache.mkdir(parents=True, exist_ok=True)
    building = cache / f".{key}.{os.getpid()}.partial"
    shutil.rmtree(building, ignore_errors=True)
    build_warm_model(building, train, config, say)
    files = {p.name: _sha256(p) for p in sorted(building.iterdir()) if p.is_file()}
    manifest = {"key": key, "config": asdict(config), "training_expressions": len(train), "files": files}
    (building / MANIFEST).write_text(json.dumps(manifest, indent=2))
    try:
        building.rename(entry)  # atomic: readers see no entry or a whole one
    except OSError:  # another process put a whole entry there first
        if entry_problem(entry, key) is not None:
            raise
        shutil.rmtree(building, ignore_errors=True)
    say(f"warm start: cached as {entry}")
    return entry


def entry_problem(entry: Path, key: str) -> str | None:
    """None when `entry` is a whole cache entry for `key`, else what is wrong with it."""
    manifest_path = entry / MANIFEST
    if not manifest_path.is_file():
        return "missing" if not entry.exists() else f"partial (no {MANIFEST})"
    try:
        manifest = json.loads(manifest_path.read_text())
        files = dict(manifest["files"])
    except (ValueError, KeyError, TypeError) as exc:
        return f"corrupt ({MANIFEST}: {exc})"
    if manifest.get("key") != key or not files:
        return f"corrupt ({MANIFEST} key {manifest.get('key')!r})"
    for name, digest in files.items():
        path = entry / name
        if not path.is_file() or _sha256(path) != digest:
            return f"corrupt ({name} missing or changed)"
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
