"""A tiny causal LM built locally: a byte-level BPE tokenizer trained on the spot and a 2-layer
Qwen2 model from a config. No downloads. Used by tests, benchmarks and `--base-model tiny`.

Two chat templates, both ChatML with `{% generation %}` markers (so TRL's assistant-only loss works):

- `CHAT_TEMPLATE` (the default, `chat_template="chatml"`): the project's own minimal one; tools as one
  JSON list in a system turn, tool calls as `<tool_call>{...}</tool_call>`, tool results as `tool` turns.
- `TOOLS_CHAT_TEMPLATE` (`chat_template="tools"`): written by the team with the structure of the
  common open-weight tool-calling templates (Hermes / Qwen2.5 style): a system block that lists each
  tool as JSON inside `<tools></tools>` with an instruction on how to call one, assistant tool calls
  re-rendered from the parsed message as `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
  (the arguments as an object through `tojson`, so spacing and key order are the template's, not the
  model's), and tool results as their own user turns wrapping `<tool_response></tool_response>`.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

CHAT_TEMPLATE = (
    # transformers renders with trim_blocks: a newline right after a block tag is dropped, so
    # newlines that follow tags are written as {{ '\n' }} (a jinja string).
    "{% if tools %}<|im_start|>system\n# Tools\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% generation %}{{ message['content'] or '' }}"
    "{% if message.get('tool_calls') %}{% for call in message['tool_calls'] %}"
    "{{ '\\n' }}<tool_call>{\"name\": \"{{ call['function']['name'] }}\", \"arguments\": "
    "{% if call['function']['arguments'] is string %}{{ call['function']['arguments'] }}"
    "{% else %}{{ call['function']['arguments'] | tojson }}{% endif %}}</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>{% endgeneration %}{{ '\\n' }}"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] or '' }}<|im_end|>{{ '\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{% endif %}"
)

TOOLS_CHAT_TEMPLATE = (
    # Newlines right after a block tag are dropped (trim_blocks), so those are written {{ '\n' }}.
    "{% set system = messages[0]['content'] if messages and messages[0]['role'] == 'system' else none %}"
    "{% if tools %}<|im_start|>system\n{{ system if system is not none else 'You are a helpful assistant.' }}"
    "\n\n# Tools\n\nYou may call one or more of the functions below. Their signatures, as JSON, are "
    "listed inside <tools></tools>:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools>\n\nTo call a function, answer with a JSON object holding its name and its "
    "arguments inside <tool_call></tool_call> tags, one tag per call:\n<tool_call>\n"
    '{"name": <function name>, "arguments": <the arguments as a JSON object>}\n</tool_call><|im_end|>'
    "{{ '\\n' }}"
    "{% elif system is not none %}<|im_start|>system\n{{ system }}<|im_end|>{{ '\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] == 'system' %}"  # rendered above
    "{% elif message['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% generation %}{{ message['content'] or '' }}"
    "{% for call in message.get('tool_calls') or [] %}"
    "{% set function = call['function'] if call['function'] is defined else call %}"
    "{% if message['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    '<tool_call>\n{"name": {{ function[\'name\'] | tojson }}, "arguments": '
    "{% if function['arguments'] is string %}{{ function['arguments'] }}"
    "{% else %}{{ function['arguments'] | tojson }}{% endif %}}\n</tool_call>"
    "{% endfor %}<|im_end|>{% endgeneration %}{{ '\\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{{ message['content'] or '' }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>{{ '\\n' }}{% endif %}"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] or '' }}<|im_end|>{{ '\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{% endif %}"
)
"""The tool-calling template (see the module docstring). A string `arguments` is rendered as it is:
the policy server parses JSON arguments into objects before rendering, as vLLM does."""

CHAT_TEMPLATES = {"chatml": CHAT_TEMPLATE, "tools": TOOLS_CHAT_TEMPLATE}
"""The built-in templates by the name `tiny_model_dir(chat_template=...)` takes."""

BASE_CORPUS = [
    "You are an agent. Think, then call one tool per turn; observations come back as tool turns.",
    "Solve the task. List the files, read the file, run the tests, fix the bug, write the answer.",
    '<tool_call>{"name": "bash", "arguments": {"cmd": "ls -la"}}</tool_call>',
    "Traceback (most recent call last): File main.py, line 3, in <module> AssertionError exit code 1",
    "def add(a, b):\n    return a + b\n\nassert add(1, 2) == 3\nprint('ok')",
    "The quick brown fox jumps over the lazy dog. 0123456789 {}[]()<>:;,.!?'\"/\\|-_=+*&^%$#@~`",
]


QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
"""Qwen2's pre-tokenizer split (one digit per piece). transformers loads any tokenizer saved beside a
Qwen2 config as `Qwen2Tokenizer`, which puts this split and NFC in front of the saved vocabulary;
training with the same pieces keeps the tokenizer in memory and the one loaded from disk identical."""


def train_tokenizer(
    corpus: list[str] | None = None, vocab_size: int = 512, chat_template: str = "chatml"
) -> Any:
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `corpus` (+ a small built-in corpus),
    with Qwen2's normalizer and pre-tokenizer, so it encodes the same before and after a save.
    `chat_template`: a name in `CHAT_TEMPLATES` (the vocabulary does not depend on it)."""
    if chat_template not in CHAT_TEMPLATES:
        raise ValueError(f"chat_template: expected one of {sorted(CHAT_TEMPLATES)}, got {chat_template!r}")
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([*BASE_CORPUS, *(corpus or [])] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
    )
    fast.chat_template = CHAT_TEMPLATES[chat_template]
    return fast


def build_model(
    tokenizer: Any,
    hidden_size: int = 64,
    layers: int = 2,
    seed: int = 0,
    intermediate_size: int | None = None,
    heads: int = 4,
    kv_heads: int = 2,
    tie_word_embeddings: bool = False,
) -> Any:
    """A randomly initialised Qwen2 causal LM sized for `tokenizer` (fp32).

    Qwen2.5-0.5B's shape is hidden 896, intermediate 4864, 24 layers, 14 heads, 2 KV heads.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return Qwen2ForCausalLM(config)


def tiny_model_dir(
    data_dir: Path, corpus: list[str] | None = None, chat_template: str = "chatml", **model_kw: Any
) -> Path:
    """Build (once) and save the tiny model + tokenizer under `data_dir/models/tiny` (`tiny-tools`
    with `chat_template="tools"`: the same weights and vocabulary, the other template); returns the path."""
    name = "tiny" if chat_template == "chatml" else f"tiny-{chat_template}"
    path = Path(data_dir) / "models" / name
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    tokenizer = train_tokenizer(corpus, chat_template=chat_template)
    model = build_model(tokenizer, **model_kw)
    # build beside it and rename: the consumer and the executor may both build it at first start
    tmp = path.with_name(f"{name}.tmp-{os.getpid()}")
    tokenizer.save_pretrained(tmp)
    model.save_pretrained(tmp)
    try:
        os.rename(tmp, path)
        log.info("built tiny model at %s (vocab %d)", path, len(tokenizer))
    except OSError:  # another process won the race; its model is identical (same corpus and seed)
        shutil.rmtree(tmp, ignore_errors=True)
    return path
