"""One loaded model shared by engines: their adapters loaded side by side, one active per forward
pass, and the model's decode loop (`batching.Scheduler`)."""

from __future__ import annotations

import contextlib
import itertools
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from producers.policy.engine.batching import Scheduler
from producers.policy.engine.errors import EngineError, one_line
from producers.policy.engine.loading import read_adapter


class SharedModel:
    """One loaded model and the adapters loaded into it side by side, one name per engine.

    `use(name)` holds the lock for one forward pass with that adapter active (None: adapters off);
    the scheduler takes it per decode step and per prefill, `score` per call. Dropped adapters are
    only queued by `drop` (a finalizer may run in any thread, even one that holds the lock) and
    deleted at the next `use` or `add`; an engine, and so its adapter, lives while a request of it
    runs.
    """

    def __init__(self, model: Any, device: str):
        self.model = model
        self.device = device
        self.lock = threading.Lock()
        self.tokenizer_lock = threading.Lock()  # fast tokenizers can fail when used concurrently
        self._names = itertools.count(1)
        self._dropped: list[str] = []
        self._active: str | None = None  # the adapter set active last; None: unknown
        self.scheduler = Scheduler(self)

    def add(self, path: Path) -> str:
        """Load the adapter in `path` under a new name; on failure the model is as it was."""
        config, weights = read_adapter(path, self.device)
        with self.lock:
            self._purge()
            name = f"adapter{next(self._names)}"
            self._active = None  # adding an adapter may change which one peft has active
            try:
                self._inject(name, config, weights)
            except Exception as exc:
                self._remove(name)
                raise EngineError(f"adapter {path}: cannot load: {one_line(exc)}") from exc
        return name

    def _inject(self, name: str, config: Any, weights: dict) -> None:
        from peft import PeftModel
        from peft.utils import set_peft_model_state_dict

        if isinstance(self.model, PeftModel):
            self.model.add_adapter(name, config)
        else:
            self.model = PeftModel(self.model, config, adapter_name=name)
        result = set_peft_model_state_dict(self.model, weights, adapter_name=name)
        missing = [k for k in result.missing_keys if f".{name}." in k]  # this adapter's own weights only
        if result.unexpected_keys or missing:
            raise ValueError(f"weights do not fit the base: {(result.unexpected_keys or missing)[:3]}")
        self.model.eval()

    def _remove(self, name: str) -> None:
        from peft import PeftModel

        if not isinstance(self.model, PeftModel) or name not in self.model.peft_config:
            return
        self._active = None
        with warnings.catch_warnings():  # peft says which adapter it activates instead: we pick per call
            warnings.simplefilter("ignore", UserWarning)
            self.model.delete_adapter(name)
        if not self.model.peft_config:  # the last adapter: back to the plain base model
            self.model = self.model.unload()

    def _purge(self) -> None:
        while self._dropped:
            self._remove(self._dropped.pop())

    def drop(self, name: str) -> None:
        self._dropped.append(name)

    @contextlib.contextmanager
    def use(self, name: str | None) -> Iterator[Any]:
        from peft import PeftModel

        with self.lock:
            self._purge()
            if not isinstance(self.model, PeftModel):
                yield self.model
            elif name is None:
                with self.model.disable_adapter():
                    yield self.model
            else:
                if self._active != name:  # set_adapter walks every module: only on a change
                    self.model.set_adapter(name)
                    self._active = name
                yield self.model
