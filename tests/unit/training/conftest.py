"""Fixtures of the executor's unit tests: the tiny model built once per module, and a data dir that
links to it (building it trains a tokenizer)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A data dir with the tiny model built once (building it trains a tokenizer)."""
    from consumers.tiny_model import tiny_model_dir

    root = tmp_path_factory.mktemp("tiny")
    tiny_model_dir(root)
    return root


@pytest.fixture
def data_dir(model_dir, tmp_path):
    (tmp_path / "models").symlink_to(model_dir / "models")
    return tmp_path
