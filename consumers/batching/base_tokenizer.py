"""The training base's tokenizer hash, against which the GRPO builder checks recorded steps.

The policy server records on every step the hash of the tokenizer and chat template it sampled with
(`clients.base_model.tokenizer_hash`). Token ids mean something only to the tokenizer that made them,
so a trajectory with a step recorded under another hash than the training base's gives no GRPO row
(builders/grpo.py: left out, counted in the batch, logged). The base is `--base-model`
(AGENTSTREAM_BASE_MODEL), the one setting the policy server and the executor read too.

The directory is checked at start; its tokenizer is loaded (transformers, and for `tiny` the model
is built under the data directory as the executor builds it) the first time a recorded hash has to
be compared, so a batch builder that never sees one never loads it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from clients.base_model import tokenizer_hash
from consumers.errors import ConsumerConfigError

log = logging.getLogger(__name__)


class BaseTokenizerHash:
    """`hash()` of the base named by `base_model` ('tiny' or a local directory), computed once."""

    def __init__(self, base_model: str, data_dir: str | Path):
        if base_model != "tiny" and not Path(base_model).is_dir():
            raise ConsumerConfigError(f"--base-model: {base_model!r} is not a local directory (or 'tiny')")
        self.base_model, self.data_dir = base_model, Path(data_dir)
        self._hash: str | None = None

    def __call__(self) -> str:
        if self._hash is None:
            from transformers import AutoTokenizer

            from consumers.tiny_model import tiny_model_dir

            path = tiny_model_dir(self.data_dir) if self.base_model == "tiny" else Path(self.base_model)
            self._hash = tokenizer_hash(AutoTokenizer.from_pretrained(path), path)
            log.info("batch: the training base %s has tokenizer hash %s", path, self._hash)
        return self._hash
