"""`agentstream up --policy`: the stack serves the policy over the OpenAI API and what it samples
lands, with its token bookkeeping, in ClickHouse."""

from __future__ import annotations

import json

import openai

from infra.stack import StackConfig
from tests.support.processes import AGENTSTREAM, Proc, free_port, wait_for


def test_up_with_policy_serves_and_records_into_clickhouse(tmp_path):
    data_dir, port = tmp_path / "stack", free_port()
    args = [*AGENTSTREAM, "up", "--no-batch", "--policy", "--policy-port", str(port),
            "--data-dir", str(data_dir), "--broker-port", str(free_port()), "--no-console"]  # fmt: skip
    up = Proc(args, tmp_path / "up.log")
    try:
        wait_for(lambda: "[up] running:" in up.log_text() or not up.alive(), timeout_s=180, what="the stack")
        assert up.alive(), up.log_text()[-3000:]
        state = json.loads((data_dir / "run" / "stack.json").read_text())
        assert "policy" in state["components"]
        api = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1/episodes/t-up", api_key="none", max_retries=0
        )
        messages = [{"role": "user", "content": "hello"}]
        first = api.chat.completions.create(model="policy", messages=messages, max_tokens=6, seed=3)
        messages.append({"role": "assistant", "content": first.choices[0].message.content or ""})
        messages.append({"role": "user", "content": "and then?"})
        api.chat.completions.create(model="policy", messages=messages, max_tokens=6, seed=4)

        config = StackConfig(data_dir, state["bootstrap_servers"], f"chdb://{data_dir / 'clickhouse'}")
        sql = (
            "SELECT step_index, token_continuity, token_rl_eligible, policy_version, sampled_tokens > 0 "
            "FROM agentstream.steps FINAL WHERE trajectory_id = 't-up' ORDER BY step_index"
        )
        rows = wait_for(
            lambda: (r := config.query(sql)) and len(r) == 2 and r, timeout_s=60, what="the steps in SQL"
        )
        assert rows == [(0, "first", 1, "base", True), (1, "ok", 1, "base", True)]
    finally:
        up.stop()
