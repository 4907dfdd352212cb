"""Shared fixtures: a real embedded broker over TCP, a chDB URL, a scratch data directory."""

from __future__ import annotations

import pytest

from tests.support.broker import BrokerHandle, start_broker


@pytest.fixture
def data_dir(tmp_path):
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def broker(tmp_path) -> BrokerHandle:
    """A fresh embedded broker process for this test (stopped by PID afterwards)."""
    handle = start_broker(tmp_path / "broker")
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def shared_broker(tmp_path_factory) -> BrokerHandle:
    """One broker for tests that only need *a* broker and use their own topic names."""
    handle = start_broker(tmp_path_factory.mktemp("shared-broker"))
    yield handle
    handle.stop()


@pytest.fixture
def clickhouse_url(tmp_path) -> str:
    """An embedded ClickHouse (chDB) location for this test."""
    return f"chdb://{tmp_path / 'clickhouse'}"
