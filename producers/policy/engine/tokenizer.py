"""What the engine needs to know of a tokenizer: its stop ids, context length and longest token.
Used by the local engine and by the upstream proxy alike (its hash: `clients.base_model`).
"""

from __future__ import annotations

from typing import Any

# transformers' `model_max_length` when a tokenizer does not say (int(1e30)): not a limit.
_NO_LIMIT = 10**12


def find_stop_ids(tokenizer: Any, model: Any) -> list[int]:
    """Token ids that end a completion: the tokenizer's eos, the generation config's, `<|im_end|>`."""
    found = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    found |= set(configured) if isinstance(configured, list) else {configured}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if im_end is not None and im_end != tokenizer.unk_token_id:
        found.add(im_end)
    return sorted(i for i in found if isinstance(i, int) and i >= 0)


def context_length(tokenizer: Any, config: Any = None) -> int | None:
    """The longest sequence (prompt + completion) the model takes: the smaller of the model config's
    `max_position_embeddings` and the tokenizer's `model_max_length` (transformers puts 1e30 there
    when the tokenizer does not say); None when neither says."""
    limits = [getattr(config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    known = [int(n) for n in limits if isinstance(n, int | float) and 0 < n < _NO_LIMIT]
    return min(known) if known else None


def longest_token_bytes(tokenizer: Any) -> int:
    """An upper bound of the input bytes one token stands for: the longest vocabulary entry (special
    tokens included) in UTF-8. A byte-level entry spells one byte per character, a SentencePiece one
    spells `▁` (3 bytes) for a space and `<0x0A>` for one byte, so the entry's own UTF-8 length is
    never less than what it encodes."""
    return max((len(token.encode()) for token in tokenizer.get_vocab()), default=1)
