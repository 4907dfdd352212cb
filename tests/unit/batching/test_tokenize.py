"""Observation masking and step-boundary chunking of pre-tokenized rows (tiny local tokenizer)."""

from __future__ import annotations

import pytest

from consumers.batching.builders.sft import SFTBuilderConfig
from consumers.batching.chat import assistant_message, ordered_steps, tool_schemas, trajectory_messages
from consumers.batching.tokenize import IGNORE_INDEX, SFTTokenizedBuilder, encode_messages, step_chunks
from tests.support.trainer_data import golden_group, scored, step


@pytest.fixture(scope="module")
def tokenizer():
    from consumers.tiny_model import train_tokenizer

    return train_tokenizer()


def _assistant_text(tokenizer, message) -> str:
    """What the template renders for one assistant message's body (up to its end-of-turn)."""
    prompt = [{"role": "user", "content": "x"}]
    head = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template([*prompt, message], tokenize=False)
    return full[len(head) :].rstrip("\n")


def test_every_assistant_token_is_labelled_and_nothing_else(tokenizer):
    t = golden_group()[0]
    messages = trajectory_messages(t)
    enc = encode_messages(tokenizer, messages, tool_schemas([t]), train_from=2)
    labelled = [i for i, lab in zip(enc.input_ids, enc.labels, strict=True) if lab != IGNORE_INDEX]
    masked = [i for i, lab in zip(enc.input_ids, enc.labels, strict=True) if lab == IGNORE_INDEX]
    assert all(lab in (IGNORE_INDEX, i) for i, lab in zip(enc.input_ids, enc.labels, strict=True))
    expected = "".join(_assistant_text(tokenizer, assistant_message(s)) for s in ordered_steps(t))
    assert tokenizer.decode(labelled) == expected  # exactly the assistant turns, end-of-turn included
    masked_text = tokenizer.decode(masked)
    for s in t.steps:  # every observation and the task are in the context only
        assert s.observation in masked_text and s.observation not in tokenizer.decode(labelled)
    assert t.task in masked_text and "<|im_start|>assistant" in masked_text
    # the row is the whole rendered conversation, token for token segment-wise
    full = tokenizer.apply_chat_template(messages, tools=tool_schemas([t]), tokenize=False)
    assert tokenizer.decode(enc.input_ids) == full


def test_sampled_token_ids_replace_rendered_assistant_tokens(tokenizer):
    group = golden_group()
    messages = trajectory_messages(group[3])
    enc = encode_messages(
        tokenizer,
        messages,
        None,
        train_from=2,
        step_tokens=[[7, 8, 9], [10]],
        step_logprobs=[[-1.0] * 3, [-2.0]],
    )
    assert [i for i, lab in zip(enc.input_ids, enc.labels, strict=True) if lab != IGNORE_INDEX] == [
        7,
        8,
        9,
        10,
    ]
    assert [lp for lp in enc.logprobs if lp is not None] == [-1.0, -1.0, -1.0, -2.0]


def test_step_chunks_pack_whole_steps():
    assert step_chunks([5, 5, 5, 5], prompt_length=3, max_length=13) == [(0, 0, 2), (2, 2, 4)]
    assert step_chunks([20, 2], prompt_length=3, max_length=10) == [(0, 0, 1), (1, 1, 2)]  # never split
    assert step_chunks([4, 4, 4], prompt_length=2, max_length=10, context_steps=1) == [(0, 0, 2), (1, 2, 3)]


def test_chunked_rows_keep_the_task_and_never_split_a_step(tokenizer):
    long = scored(
        "long",
        "k",
        1.0,
        [step(f"step {i} thinking", "bash", f"observation {i} " * 8, cmd=f"c{i}") for i in range(8)],
    )
    whole = SFTTokenizedBuilder(tokenizer, SFTBuilderConfig(max_length=100_000)).rows(long)[0]
    step_len = {s: whole["step_ids"].count(s) for s in range(8)}
    prompt_len = whole["step_ids"].count(-1)
    builder = SFTTokenizedBuilder(
        tokenizer, SFTBuilderConfig(max_length=prompt_len + 2 * max(step_len.values()))
    )
    rows = builder.rows(long)
    assert len(rows) > 2 and all(r["num_chunks"] == len(rows) for r in rows)
    trained_steps = []
    for r in rows:
        assert r["input_ids"][:prompt_len] == whole["input_ids"][:prompt_len]  # system + task in every chunk
        assert all(lab == IGNORE_INDEX for lab in r["labels"][:prompt_len])
        steps_here = sorted(set(r["step_ids"]) - {-1})
        for s in steps_here:  # each step appears whole
            assert r["step_ids"].count(s) == step_len[s]
        trained_steps += steps_here
        assert len(r["input_ids"]) <= builder.config.max_length
        assert len(r["input_ids"]) == len(r["labels"]) == len(r["attention_mask"])
    assert trained_steps == list(range(8))  # every step trained exactly once, in order


def test_context_steps_are_masked(tokenizer):
    long = scored("long", "k", 1.0, [step(f"s{i}", "bash", "o" * 30, cmd=str(i)) for i in range(4)])
    whole = SFTTokenizedBuilder(tokenizer, SFTBuilderConfig(max_length=100_000)).rows(long)[0]
    prompt_len = whole["step_ids"].count(-1)
    per_step = whole["step_ids"].count(0)
    config = SFTBuilderConfig(max_length=prompt_len + 2 * per_step + 2, chunk_context_steps=1)
    rows = SFTTokenizedBuilder(tokenizer, config).rows(long)
    second = rows[1]
    assert second["first_step"] == 2
    context = [lab for s, lab in zip(second["step_ids"], second["labels"], strict=True) if s == 1]
    assert context and all(lab == IGNORE_INDEX for lab in context)


def test_planner_builds_pretokenized_batches(tokenizer):
    from consumers.batching.config import PlannerConfig
    from consumers.batching.planner import Planner
    from schemas.records import Record

    planner = Planner(
        PlannerConfig(kinds=("sft", "sft_tokenized"), batch_trajectories=3), tokenizer=tokenizer
    )
    for i, t in enumerate(golden_group()):
        planner.offer(t, Record("trajectory.scored", 0, i), now=0)
    batches = {b.kind: b for b in planner.due(now=0)}
    rows = batches["sft_tokenized"].rows
    assert [r["trajectory_id"] for r in rows] == [r["trajectory_id"] for r in batches["sft"].rows]
    assert all(len(r["input_ids"]) == len(r["labels"]) and IGNORE_INDEX in r["labels"] for r in rows)


def test_the_tiny_tokenizer_encodes_the_same_after_a_save_beside_its_model(tmp_path):
    """What the warm start trains on is what the policy server serves: transformers loads a
    tokenizer saved beside a Qwen2 config as Qwen2Tokenizer, with Qwen2's pre-tokenizer."""
    from transformers import AutoTokenizer

    from consumers.tiny_model import build_model, train_tokenizer

    text = 'Compute the value of "6 - 3" and 12 + 407; {"expression": "6 - 3"}\n\tcafe\u0301  done'
    tokenizer = train_tokenizer([text] * 3, vocab_size=600)
    build_model(tokenizer, hidden_size=16, layers=1).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": "= 3"}]
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded.apply_chat_template(messages) == tokenizer.apply_chat_template(messages)
