"""Fixtures of the policy server's integration tests: the tiny model each module builds once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from consumers.tiny_model import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def tokenizer(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)
