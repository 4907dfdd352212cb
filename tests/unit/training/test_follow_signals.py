"""`follow()` installs its own SIGTERM handler while it runs and gives the caller's back when it
ends, also when it fails (a test session's handler, for one, must survive it)."""

from __future__ import annotations

import signal

import pytest

from consumers.training import follow as follow_module


def test_follow_gives_the_callers_sigterm_handler_back_even_when_it_fails(monkeypatch):
    seen = []

    def broker_down(bootstrap_servers):
        seen.append(signal.getsignal(signal.SIGTERM))
        raise ConnectionError("no broker")

    def callers_handler(signum, frame):
        pass

    monkeypatch.setattr(follow_module, "ensure_topics", broker_down)
    previous = signal.signal(signal.SIGTERM, callers_handler)
    try:
        with pytest.raises(ConnectionError):
            follow_module.follow(follow_module.TrainRunConfig(bootstrap_servers="127.0.0.1:1", follow=True))
        assert seen and seen[0] is not callers_handler  # its own was installed while it ran
        assert signal.getsignal(signal.SIGTERM) is callers_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
