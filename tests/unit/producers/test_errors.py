"""One exception root for the producers package: every error it raises on purpose is a
`ProducerError` (so the CLI shows it as one line), and the tree in `producers/errors.py` names them."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import producers
from producers import errors
from producers.errors import ProducerError
from schemas.errors import AgentstreamError

# Runs inside the sandbox's namespace with the standard library only (it never imports the project),
# so its own two exceptions cannot derive from ProducerError; they never leave that program.
STDLIB_ONLY = {"producers.sandbox.inside"}


def _producer_exceptions() -> dict[str, type]:
    found = {}
    for info in pkgutil.walk_packages(producers.__path__, "producers."):
        if info.name in STDLIB_ONLY:
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__.startswith("producers")
            ):
                found[name] = obj
    return found


def test_every_producers_error_derives_from_the_one_root():
    found = _producer_exceptions()
    assert {"AdapterError", "SpoolLocked", "DeliveryFailed", "RequestRejected"} <= set(found)
    assert issubclass(ProducerError, AgentstreamError)
    outside = sorted(name for name, cls in found.items() if not issubclass(cls, ProducerError))
    assert not outside, f"not under ProducerError: {outside}"


def test_the_tree_in_the_docstring_names_every_error():
    missing = sorted(name for name in _producer_exceptions() if name not in errors.__doc__)
    assert not missing, f"producers/errors.py docstring does not draw {missing}"
