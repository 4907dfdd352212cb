"""One answer to "which policy is current", from every component that asks (issue #35).

Versions are published out of order, on both partitions of a two-partition `policy.updates`, with a
malformed record and a foreign event among them; then more versions arrive (an older one last) while
some components keep running and others start afresh. Each component is asked through its own
lookup: the reader (`clients.current_policy`), the SDK's `PolicyFollower`, the rollout's horizon
(`PolicyProgress`) and backpressure (`TopicBacklog`: batches trained = the current version's number),
the trainer consumer's planner, learn's `version_to_evaluate`, and the policy server's `/models`
header (its reloader loads the current policy, including at start, and never an older one published
late). All must agree with `schemas.policy_versions.current_policy` over what was published.
"""

from __future__ import annotations

import dataclasses
import time

import httpx

from clients.current_policy import CurrentPolicyReader, read_current_policy
from clients.kafka import ensure_topics
from consumers.batching.config import BatchBuilderConfig
from consumers.batching.consumer import BatchBuilder
from infra.learn.loop import learn_policy_reader, version_to_evaluate
from producers.policy.server import VERSION_HEADER
from producers.rollout.backpressure import TopicBacklog
from producers.rollout.horizon import PolicyProgress
from producers.sdk.policy_follower import PolicyFollower
from schemas.codec import encode
from schemas.events import BatchBuilt, utc_now
from schemas.policy_versions import current_policy, version_number
from schemas.topics import POLICY_UPDATES, TOPICS
from tests.support.policy import make_checkpoint, policy_server
from tests.support.policy_updates import policy_update, publish_raw, publish_updates
from tests.support.processes import wait_for


def fresh_answers(bootstrap: str, data_dir) -> dict[str, str | None]:
    """The current version by each component, each a new instance (as after a restart)."""
    answers = {"reader": _version(read_current_policy(bootstrap))}
    answers["sdk follower"] = PolicyFollower(bootstrap, ttl_s=60).latest()
    progress = PolicyProgress(bootstrap, poll_s=60)
    try:
        answers["rollout horizon"] = progress.version()
    finally:
        progress.close()
    with learn_policy_reader(bootstrap) as reader:
        answers["learn"] = _version(version_to_evaluate(reader, set()))
    answers["trainer"] = trainer_answer(bootstrap, data_dir)
    return answers


def trainer_answer(bootstrap: str, data_dir) -> str | None:
    """Run the trainer consumer until idle (it reads `policy.updates` from the beginning at start)."""
    config = BatchBuilderConfig(
        bootstrap_servers=bootstrap,
        data_dir=data_dir,
        idle_exit_s=1.0,
        fetch_min_bytes=1,
        fetch_max_wait_ms=50,
    )
    trainer = BatchBuilder(config)
    assert trainer.run() == 0
    return trainer.planner.current_policy


def trained_batches(bootstrap: str) -> int:
    backlog = TopicBacklog(bootstrap)
    try:
        return backlog.read().updates
    finally:
        backlog.close()


def served(url: str) -> str:
    return httpx.get(f"{url}/v1/models", timeout=30).headers[VERSION_HEADER]


def _version(event) -> str | None:
    return event.policy_version if event is not None else None


def test_every_component_reports_the_same_current_policy(tmp_path, broker, tiny):
    bootstrap = broker.bootstrap
    two_partitions = dataclasses.replace(TOPICS[POLICY_UPDATES], partitions=2)
    ensure_topics(bootstrap, [two_partitions])
    checkpoints = tmp_path / "checkpoints"
    v4 = make_checkpoint(tiny, checkpoints, "v4", seed=4)
    published = [
        policy_update("v2", step=20),
        policy_update("v4", step=40, checkpoint_path=str(v4)),
        policy_update("v10-draft", step=99),  # unknown format: never above a numbered version
        policy_update("v1", step=10),
        policy_update("v3", step=30, checkpoint_path="/nonexistent/v3"),  # older, published last
    ]
    publish_updates(bootstrap, published, partitions=[0, 1, 0, 0, 1])
    publish_raw(bootstrap, b"{not json", partition=0)
    foreign = BatchBuilt(event_id="b", trajectory_id="b", occurred_at=utc_now(), producer="tests",
                         batch_id="b", kind="sft", path="/b.jsonl", row_count=1)  # fmt: skip
    publish_raw(bootstrap, encode(foreign), partition=1)
    assert current_policy(published).policy_version == "v4"

    kept_reader = CurrentPolicyReader(bootstrap)
    kept_progress = PolicyProgress(bootstrap, poll_s=0)
    try:
        assert _version(kept_reader.current()) == kept_progress.version() == "v4"
        assert set(fresh_answers(bootstrap, tmp_path / "trainer").values()) == {"v4"}
        assert trained_batches(bootstrap) == 4

        with policy_server(tmp_path / "s1", bootstrap, tiny) as (url, _):  # started after the updates
            assert served(url) == "v4"  # loaded before its first answer

            # more versions while everything runs: v6, then the older v5 (a real checkpoint) last
            v5, v6 = (make_checkpoint(tiny, checkpoints, v, seed=n) for n, v in ((5, "v5"), (6, "v6")))
            later = [policy_update("v6", step=60, checkpoint_path=str(v6)),
                     policy_update("v5", step=50, checkpoint_path=str(v5))]  # fmt: skip
            publish_updates(bootstrap, later, partitions=[1, 0])
            wait_for(lambda: served(url) == "v6", timeout_s=60, what="the server to load v6")
            time.sleep(3)  # several reload polls after v5 arrived: it must not be loaded
            assert served(url) == "v6"
            assert _version(kept_reader.current()) == kept_progress.version() == "v6"
            assert kept_progress.step() == 60

        answers = fresh_answers(bootstrap, tmp_path / "trainer")  # restarts: new processes, instances
        assert answers == dict.fromkeys(answers, "v6")
        assert trained_batches(bootstrap) == version_number("v6")
        with policy_server(tmp_path / "s2", bootstrap, tiny) as (url, _):  # the server restarted
            assert served(url) == "v6"
    finally:
        kept_reader.close()
        kept_progress.close()
    assert current_policy(published + later).policy_version == "v6"
