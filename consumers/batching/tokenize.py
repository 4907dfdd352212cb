"""Pre-tokenized rows with observation masking, and step-boundary chunking of long trajectories.

The conversation is rendered with the tokenizer's chat template and cut into segments by prefix
differences: for each assistant message, the header (what `add_generation_prompt` adds) is context
and the body up to the end-of-turn token is trainable; every other message (system, task, tool
observations) is context. Segments are tokenized one by one, so a label boundary is a token boundary
by construction. Labels are the token id on trainable tokens and -100 elsewhere.

Each token also records the step position it belongs to (-1 for the prompt), which chunking, step
weights and step advantages use. No torch here: plain lists.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from consumers.batching.builders.sft import SFTBuilder, SFTBuilderConfig, lineage
from consumers.batching.chat import Message, ordered_steps, tool_schemas, trajectory_messages
from consumers.errors import TrainerError
from schemas.events import TrajectoryScored

log = logging.getLogger(__name__)

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Segment:
    text: str
    trainable: bool
    step: int  # step position (-1: prompt)


@dataclass
class Encoded:
    input_ids: list[int] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)

    def extend(self, ids: list[int], trainable: bool, step: int, logprobs: list[float] | None = None) -> None:
        self.input_ids += ids
        self.labels += ids if trainable else [IGNORE_INDEX] * len(ids)
        self.steps += [step] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [None] * len(ids)


def _render(tokenizer: Any, messages: list[Message], tools, generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
    )


def _suffix(longer: str, prefix: str, index: int) -> str:
    if not longer.startswith(prefix):
        raise TrainerError(
            f"messages[{index}]: the chat template is not prefix-preserving (rendering the first "
            f"{index + 1} messages does not extend the rendering of the first {index}); use a "
            "template that renders earlier turns unchanged"
        )
    return longer[len(prefix) :]


def render_segments(
    tokenizer: Any, messages: list[Message], tools: list | None = None, train_from: int = 0
) -> list[Segment]:
    """Segments of the rendered conversation; assistant bodies at index >= `train_from` are trainable."""
    segments: list[Segment] = []
    before = ""  # templates refuse an empty conversation; the first message is always context
    step = -1
    for k, message in enumerate(messages):
        after = _render(tokenizer, messages[: k + 1], tools)
        if k >= max(1, train_from) and message["role"] == "assistant":
            step += 1
            with_header = _render(tokenizer, messages[:k], tools, generation_prompt=True)
            segments.append(Segment(_suffix(with_header, before, k), False, step))
            body = _suffix(after, with_header, k)
            trimmed = body.rstrip("\n")  # the newline between turns is layout, not the model's output
            segments.append(Segment(trimmed, True, step))
            if len(trimmed) < len(body):
                segments.append(Segment(body[len(trimmed) :], False, step))
        else:
            segments.append(Segment(_suffix(after, before, k), False, step if k >= train_from else -1))
        before = after
    return [s for s in segments if s.text]


def encode_segments(
    tokenizer: Any,
    segments: list[Segment],
    step_tokens: list[list[int]] | None = None,
    step_logprobs: list[list[float]] | None = None,
) -> Encoded:
    """Tokenize segment by segment. With `step_tokens`, the trainable body of step s is replaced by
    the ids the policy actually sampled (token fidelity), with their logprobs."""
    out = Encoded()
    for seg in segments:
        if seg.trainable and step_tokens is not None and 0 <= seg.step < len(step_tokens):
            lps = step_logprobs[seg.step] if step_logprobs is not None else None
            out.extend(list(step_tokens[seg.step]), True, seg.step, lps)
            continue
        ids = tokenizer(seg.text, add_special_tokens=False)["input_ids"]
        out.extend(ids, seg.trainable, seg.step)
    return out


def encode_messages(
    tokenizer: Any, messages: list[Message], tools: list | None = None, train_from: int = 0, **kw: Any
) -> Encoded:
    """Render and tokenize a conversation with observation masking."""
    return encode_segments(tokenizer, render_segments(tokenizer, messages, tools, train_from), **kw)


def _prompt_length(messages: list[Message]) -> int:
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            return i
    return len(messages)


def step_chunks(step_lengths: list[int], prompt_length: int, max_length: int, context_steps: int = 0):
    """Greedy packing of whole steps: [(context_start, first, end)] per chunk (steps [first, end) are
    trained; [context_start, first) are repeated as masked context). A step is never split; a step
    longer than the budget gets a chunk of its own.

    >>> step_chunks([4, 4, 4], prompt_length=2, max_length=10)
    [(0, 0, 2), (2, 2, 3)]
    """
    chunks, first, n = [], 0, len(step_lengths)
    while first < n:
        ctx = max(0, first - context_steps)
        while ctx < first and prompt_length + sum(step_lengths[ctx : first + 1]) > max_length:
            ctx += 1  # drop context before a step would overflow
        used, end = prompt_length + sum(step_lengths[ctx : first + 1]), first + 1
        while end < n and used + step_lengths[end] <= max_length:
            used += step_lengths[end]
            end += 1
        chunks.append((ctx, first, end))
        first = end
    return chunks


class SFTTokenizedBuilder:
    """Pre-tokenized SFT rows (`input_ids`, `attention_mask`, `labels`), chunked at step boundaries."""

    def __init__(self, tokenizer: Any, config: SFTBuilderConfig | None = None):
        self.tokenizer = tokenizer
        self.config = config or SFTBuilderConfig()
        self.selector = SFTBuilder(self.config)

    def build(self, trajectories: list[TrajectoryScored]) -> list[dict[str, Any]]:
        return [row for t in self.selector.build_trajectories(trajectories) for row in self.rows(t)]

    def rows(self, trajectory: TrajectoryScored) -> list[dict[str, Any]]:
        messages = trajectory_messages(trajectory, self.config.system_prompt)
        tools = tool_schemas([trajectory]) if self.config.include_tools else None
        enc = encode_messages(self.tokenizer, messages, tools, train_from=_prompt_length(messages))
        prompt_len = enc.steps.count(-1)
        n_steps = max(enc.steps) + 1
        step_lengths = [enc.steps.count(s) for s in range(n_steps)]
        plan = step_chunks(step_lengths, prompt_len, self.config.max_length, self.config.chunk_context_steps)
        rewards = [s.process_score for s in ordered_steps(trajectory)]
        return [
            self._row(trajectory, enc, prompt_len, step_lengths, c, i, len(plan), rewards)
            for i, c in enumerate(plan)
        ]

    def _row(self, trajectory, enc: Encoded, prompt_len, step_lengths, chunk, index, total, rewards) -> dict:
        ctx, first, end = chunk
        lo, hi = prompt_len + sum(step_lengths[:ctx]), prompt_len + sum(step_lengths[:end])
        train_lo = prompt_len + sum(step_lengths[:first])
        ids = enc.input_ids[:prompt_len] + enc.input_ids[lo:hi]
        labels = [IGNORE_INDEX] * prompt_len + [
            IGNORE_INDEX if lo + j < train_lo else label for j, label in enumerate(enc.labels[lo:hi])
        ]
        steps = enc.steps[:prompt_len] + enc.steps[lo:hi]
        if len(ids) > self.config.max_length:
            log.warning(
                "trajectory %s: step %d alone is %d tokens (max_length %d); kept whole, not split",
                trajectory.trajectory_id, first, len(ids), self.config.max_length,
            )  # fmt: skip
        return {
            "input_ids": ids,
            "attention_mask": [1] * len(ids),
            "labels": labels,
            "step_ids": steps,
            "step_rewards": rewards,
            "chunk_index": index,
            "num_chunks": total,
            "first_step": first,
            "end_step": end,
        } | lineage(trajectory)
