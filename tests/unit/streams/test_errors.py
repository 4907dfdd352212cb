"""One exception root for streams: every exception class defined under streams/ derives from
`StreamsError`, which derives from the project root, and the moved classes keep their old homes."""

from __future__ import annotations

import ast
import builtins
import importlib
from pathlib import Path

import pytest

import streams
from schemas.errors import AgentstreamError
from streams import errors
from streams.errors import JudgeCallError, StreamsError

STREAMS = Path(streams.__file__).parent
BUILTIN_EXCEPTIONS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}
# Exception roots above StreamsError that a streams class may name as a base.
OUTSIDE_ROOTS = {"AgentstreamError", "SchemaError", "DecodeError", *BUILTIN_EXCEPTIONS}


def _class_defs() -> dict[str, list[tuple[str, list[str]]]]:
    """Every class under streams/: name -> [(where, the last name of each base)] per definition."""
    found: dict[str, list[tuple[str, list[str]]]] = {}
    for path in sorted(STREAMS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
                where = f"{path.relative_to(STREAMS.parent)}:{node.lineno}"
                found.setdefault(node.name, []).append((where, bases))
    return found


def _ancestry(bases: list[str], classes: dict, seen: frozenset = frozenset()) -> set[str]:
    """The bases and, for bases defined under streams/, their ancestors (by name)."""
    out = set(bases)
    for base in set(bases) - seen:
        for _, grand in classes.get(base, []):
            out |= _ancestry(grand, classes, seen | {base})
    return out


def test_every_exception_class_under_streams_derives_from_streams_error():
    classes = _class_defs()
    exceptions = [
        (name, where, bases)
        for name, defs in classes.items()
        for where, bases in defs
        if _ancestry(bases, classes) & OUTSIDE_ROOTS
    ]
    assert {"StreamsError", "JudgeCallError", "BatchFailed", "WorkerConfigError"} <= {
        n for n, _, _ in exceptions
    }
    stray = sorted(
        f"{where} {name}({', '.join(bases)})"
        for name, where, bases in exceptions
        if name != "StreamsError" and "StreamsError" not in _ancestry(bases, classes)
    )
    assert not stray, "exceptions under streams/ that do not derive from StreamsError:\n" + "\n".join(stray)


MOVED = [
    ("streams.config", "WorkerConfigError"),
    ("streams.rules.profiles", "ProfileError"),
    ("streams.judge.parse", "ParseError"),
    ("streams.judge.client", "JudgeCallError"),
    ("streams.judge.calibration", "CalibrationError"),
    ("streams.judge.selection", "JudgeRulesError"),
    ("streams.judge.rubrics", "RubricsError"),
    ("streams.judge.annotations", "AnnotationError"),
]


@pytest.mark.parametrize(("module", "name"), MOVED)
def test_moved_errors_are_still_importable_from_their_modules(module, name):
    cls = getattr(importlib.import_module(module), name)
    assert cls is getattr(errors, name)
    assert issubclass(cls, StreamsError) and issubclass(StreamsError, AgentstreamError)
    assert name in errors.__doc__  # drawn in the tree


def test_the_tree_is_drawn_in_the_module_docstring():
    tree = errors.__doc__
    defined = [n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, StreamsError)]
    assert "BatchFailed" in defined and "StreamsError" in defined
    assert not [n for n in defined if n not in tree], "classes missing from the drawn tree"


def test_judge_call_error_keeps_its_attributes():
    error = JudgeCallError("429 after 5 attempts", kind="rate_limited", attempts=5, status=429)
    assert (str(error), error.reason, error.kind, error.attempts, error.status) == (
        "429 after 5 attempts",
        "429 after 5 attempts",
        "rate_limited",
        5,
        429,
    )
