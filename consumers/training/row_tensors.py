"""Batch rows as model inputs: a row (pre-tokenized, `messages`, or `prompt` + a completion) as
token ids, labels (-100 off the assistant's tokens), step ids and behaviour logprobs; encoded rows
padded into tensors. torch is imported inside functions only.

No silent truncation: a row longer than `--max-length` is never cut. `fit_rows` sorts the rows of
a batch into those that fit and those left out (counted); `collate` refuses a row that does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from consumers.batching.chat import Message
from consumers.batching.tokenize import Encoded, encode_messages
from consumers.errors import TrainerError
from consumers.training.losses import IGNORE_INDEX


def _prompt_length(messages: list[Message]) -> int:
    return next((i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))


def _clean(messages: list[Message]) -> list[Message]:
    """Drop keys that datasets/parquet filled with None, so templates see what producers wrote."""
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def encode_row(tokenizer, row: dict[str, Any], completion_key: str | None = None) -> Encoded:
    """A row (pre-tokenized, `messages`, or `prompt` + completion) as ids, labels and step ids."""
    if "input_ids" in row:
        ids = list(row["input_ids"])
        steps = list(row.get("step_ids") or [-1] * len(ids))
        return Encoded(
            ids, list(row["labels"]), steps, list(row.get("behaviour_logprobs") or [None] * len(ids))
        )
    tools = row.get("tools") or None
    if "messages" in row:
        messages = _clean(row["messages"])
        return encode_messages(tokenizer, messages, tools, train_from=_prompt_length(messages))
    prompt = _clean(row["prompt"])
    completion = _clean(row[completion_key or "completion"])
    kw = {}
    if completion_key is None and row.get("step_token_ids") and row.get("step_logprobs"):
        kw = {"step_tokens": row["step_token_ids"], "step_logprobs": row["step_logprobs"]}
    return encode_messages(tokenizer, prompt + completion, tools, train_from=len(prompt), **kw)


@dataclass(frozen=True)
class Fit:
    """Which rows of a batch fit in `max_length` (their indices), and what was left out: rows,
    their tokens (every side of a DPO pair), and the longest row's length."""

    kept: list[int] = field(default_factory=list)
    rows_over: int = 0
    tokens_over: int = 0
    longest: int = 0


def fit_rows(lengths: list[tuple[int, ...]], max_length: int) -> Fit:
    """Sort rows by length: one tuple of token counts per row (two for a DPO pair: chosen and
    rejected); a row with any side over `max_length` is left out whole and counted.

    >>> fit_rows([(3,), (5,), (4,)], 4)
    Fit(kept=[0, 2], rows_over=1, tokens_over=5, longest=5)
    >>> fit_rows([(3, 9), (2, 2)], 4)
    Fit(kept=[1], rows_over=1, tokens_over=12, longest=9)
    """
    kept, over, tokens = [], 0, 0
    for i, sides in enumerate(lengths):
        if max(sides) > max_length:
            over += 1
            tokens += sum(sides)
        else:
            kept.append(i)
    return Fit(kept, over, tokens, max((max(s) for s in lengths), default=0))


def collate(
    encoded: list[Encoded],
    *extras: list[list[float]],
    pad_id: int,
    max_length: int,
    device,
):
    """(ids, labels, attention, [one float tensor per extra]) on `device`, padded; extras pad with 0.
    A row longer than `max_length` is a TrainerError (`fit_rows` leaves such rows out first)."""
    import torch

    for i, e in enumerate(encoded):
        if len(e.input_ids) > max_length:
            raise TrainerError(
                f"--max-length: row {i} has {len(e.input_ids)} tokens, over --max-length {max_length} "
                "(rows are left out, never cut: see fit_rows)"
            )
    rows = [(e.input_ids, e.labels) for e in encoded]
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    values = [torch.zeros((len(rows), width)) for _ in extras]
    for i, (row_ids, row_labels) in enumerate(rows):
        ids[i, : len(row_ids)] = torch.tensor(row_ids)
        labels[i, : len(row_ids)] = torch.tensor(row_labels)
        attention[i, : len(row_ids)] = 1
        for tensor, extra in zip(values, extras, strict=True):
            tensor[i, : len(row_ids)] = torch.tensor(extra[i], dtype=torch.float32)
    return ids.to(device), labels.to(device), attention.to(device), [v.to(device) for v in values]
