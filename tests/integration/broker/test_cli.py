"""`agentstream topics create|list|describe` against the embedded broker, as real subprocesses."""

from __future__ import annotations

import subprocess

import pytest

from schemas.topics import TOPICS
from tests.support.processes import AGENTSTREAM, REPO

pytestmark = pytest.mark.integration


def agentstream(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*AGENTSTREAM, *args], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )


def test_topics_create_list_describe(shared_broker):
    bs = ["--bootstrap-servers", shared_broker.bootstrap]
    created = agentstream(
        "topics", "create", "cli-demo", "--partitions", "3", "--config", "retention.ms=60000", *bs
    )
    assert created.returncode == 0, created.stderr
    assert "created cli-demo (3 partition(s))" in created.stdout
    again = agentstream("topics", "create", "cli-demo", *bs)
    assert again.returncode == 0 and "exists  cli-demo" in again.stdout

    registry = agentstream("topics", "create", *bs)
    assert registry.returncode == 0, registry.stderr

    listed = agentstream("topics", "list", *bs)
    assert listed.returncode == 0, listed.stderr
    names = set(listed.stdout.split())
    assert {"cli-demo", *TOPICS} <= names

    described = agentstream("topics", "describe", "cli-demo", *bs)
    assert described.returncode == 0, described.stderr
    assert "cli-demo  partitions=3" in described.stdout
    assert "retention.ms=60000  (override)" in described.stdout
    assert "segment.bytes=" in described.stdout


def test_topics_describe_unknown_topic_is_a_one_line_error(shared_broker):
    result = agentstream(
        "topics", "describe", "no-such-topic", "--bootstrap-servers", shared_broker.bootstrap
    )
    assert result.returncode == 1
    assert "no-such-topic" in result.stderr
