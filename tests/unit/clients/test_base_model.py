"""`clients.base_model`: the base weights' id and the tokenizer's hash, from files only."""

from __future__ import annotations

import re
from types import SimpleNamespace

from clients.base_model import base_model_id, tokenizer_hash


def _base(path, weights=b"w" * 10, config=b'{"hidden_size": 8}'):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_bytes(config)
    if weights is not None:
        (path / "model.safetensors").write_bytes(weights)
    (path / "tokenizer.json").write_text('{"vocab": 1}')
    return path


def test_same_files_same_id_in_another_directory(tmp_path):
    one, two = base_model_id(_base(tmp_path / "a")), base_model_id(_base(tmp_path / "b"))
    assert re.fullmatch("[0-9a-f]{16}", one) and one == two


def test_weights_and_config_change_the_id(tmp_path):
    reference = base_model_id(_base(tmp_path / "a"))
    assert base_model_id(_base(tmp_path / "w", weights=b"w" * 9 + b"x")) != reference
    assert base_model_id(_base(tmp_path / "c", config=b'{"hidden_size": 16}')) != reference


def test_every_weight_file_counts_in_name_order(tmp_path):
    base = _base(tmp_path / "a")
    one = base_model_id(base)
    (base / "pytorch_model-00002.bin").write_bytes(b"more")
    two = base_model_id(base)
    (base / "pytorch_model-00002.bin").write_bytes(b"mora")
    assert len({one, two, base_model_id(base)}) == 3


def test_file_boundaries_are_part_of_the_id(tmp_path):
    a = _base(tmp_path / "a", weights=b"ab")
    (a / "z.bin").write_bytes(b"c")
    b = _base(tmp_path / "b", weights=b"a")
    (b / "z.bin").write_bytes(b"bc")
    assert base_model_id(a) != base_model_id(b)


def test_other_files_do_not_count(tmp_path):
    base = _base(tmp_path / "a")
    before = base_model_id(base)
    (base / "README.md").write_text("notes")
    (base / "tokenizer.json").write_text('{"vocab": 2}')
    assert base_model_id(base) == before


def test_no_weights_is_unknown(tmp_path):
    assert base_model_id(_base(tmp_path / "tok", weights=None)) == ""
    assert base_model_id(tmp_path / "missing") == ""


def _tokenizer(template="{{ messages }}", vocab=None):
    return SimpleNamespace(chat_template=template, get_vocab=lambda: vocab or {"a": 0, "b": 1})


def test_tokenizer_hash_reads_tokenizer_json_and_template(tmp_path):
    base = _base(tmp_path / "a")
    one = tokenizer_hash(_tokenizer(), base)
    assert len(one) == 16 and one == tokenizer_hash(_tokenizer(), str(base))
    assert tokenizer_hash(_tokenizer(template="other"), base) != one
    (base / "tokenizer.json").write_text('{"vocab": 2}')
    assert tokenizer_hash(_tokenizer(), base) != one


def test_tokenizer_hash_without_tokenizer_json_uses_the_vocabulary(tmp_path):
    one = tokenizer_hash(_tokenizer(vocab={"a": 0}), tmp_path)
    assert one != tokenizer_hash(_tokenizer(vocab={"a": 1}), tmp_path)
    assert tokenizer_hash(_tokenizer(template={"default": "x"}), tmp_path) != tokenizer_hash(
        _tokenizer(), tmp_path
    )
