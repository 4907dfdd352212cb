"""The judge role of `agentstream worker` (a real faust worker) with provider openai: the real openai
SDK against the local chat-completions server, over the embedded broker; no rules file, so the
default rule judges every trajectory as a whole."""

from __future__ import annotations

import time

import pytest

from clients.kafka import ensure_topics
from schemas.topics import REWARD_JUDGE
from tests.support.judge_events import trajectory
from tests.support.judge_servers.chat import ChatServer, Reply
from tests.support.judge_worker import TopicReader, judge_worker, produce
from tests.support.processes import wait_for

pytestmark = pytest.mark.integration

MODEL = "Qwen/Qwen2.5-7B-Instruct"


def _env(server: ChatServer) -> dict[str, str]:
    return {
        "AGENTSTREAM_JUDGE_PROVIDER": "openai",
        "OPENAI_API_KEY": "sk-local",
        "AGENTSTREAM_JUDGE_BASE_URL": server.base_url,
        "AGENTSTREAM_JUDGE_MODEL": MODEL,
        "AGENTSTREAM_JUDGE_PRICES": f'{{"{MODEL}": {{"input_per_mtok": 0.5, "output_per_mtok": 1.5}}}}',
    }


def test_worker_judges_every_trajectory_over_chat_completions_without_a_rules_file(broker, tmp_path):
    ensure_topics(broker.bootstrap)
    domains = {"t-coding": "coding", "t-ops": "ops", "t-web": "web", "t-other": "no-such-domain"}
    events = [e for tid, d in domains.items() for e in trajectory(tid, n=2, domain=d, task=f"task {tid}")]
    with ChatServer() as server:
        server.script = [Reply(429, headers={"retry-after": "0.2"}), Reply(503)]  # retried by the worker
        reader = TopicReader(broker.bootstrap, REWARD_JUDGE)
        produce(broker.bootstrap, events)
        worker = judge_worker(broker.bootstrap, tmp_path, _env(server))
        try:
            wait_for(
                lambda: len(reader.poll()) >= len(domains),
                90,
                what=f"{len(domains)} judge scores\n{worker.log_text()[-3000:]}",
            )
            time.sleep(1.0)
            scored = reader.poll()
        finally:
            worker.stop()
            reader.close()
    log = worker.log_text()
    assert "default rule 'all-trajectories'" in log
    assert sorted(e.trajectory_id for e in scored) == sorted(domains)  # each judged once, none failed
    for e in scored:
        assert e.type == "reward.judge.trajectory" and e.mode == "trajectory" and e.scores
        assert e.judge_model == MODEL and e.score is not None and e.rationale
        assert e.input_tokens > 0 and e.output_tokens > 0
        assert e.cost_usd == pytest.approx((e.input_tokens * 0.5 + e.output_tokens * 1.5) / 1e6)
    assert server.statuses[:2] == [429, 503] and server.ok_count == len(domains)
    assert {h.get("authorization") for h in server.headers} == {"Bearer sk-local"}
    assert {r["model"] for r in server.requests} == {MODEL}


def test_worker_with_a_missing_rules_file_exits_naming_it(broker, tmp_path):
    ensure_topics(broker.bootstrap)
    missing = tmp_path / "no-such-rules.yaml"
    with ChatServer() as server:
        worker = judge_worker(broker.bootstrap, tmp_path, _env(server), "--judge-rules", str(missing))
        try:
            wait_for(lambda: not worker.alive(), 60, what=f"the worker's exit\n{worker.log_text()[-3000:]}")
        finally:
            code = worker.stop()
        assert server.requests == []
    assert code != 0
    assert f"judge rules file {missing} does not exist" in worker.log_text()
