"""The MCP tools stay in their lanes (issue 34, items 7 and 8), tried as an attacker would.

`export_dataset` writes only under `<data dir>/exports/` (absolute paths, `..` and links that lead
out are refused, and nothing is written outside) and deletes only what an export wrote (a directory
with a planted `export.json` beside other files is refused, and every file survives). `rollout`
calls only the configured policy endpoints: any other URL is refused before a single request is
sent (a local server counts them: zero), a redirect is not followed, and the stack's own policy
server (its ready file) still runs an episode through the real broker.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from consumers.batching.batch_writer import BatchStore
from consumers.batching.builders.sft import SFTBuilder
from infra.export.errors import ExportError
from infra.export.run import export_dataset
from infra.mcp import data_tools, env_tools
from infra.mcp.config import McpConfig
from infra.mcp.errors import McpToolError
from tests.support.counting_server import CountingHandler, counting_server
from tests.support.trainer_data import synthetic

pytestmark = pytest.mark.integration


# --- export_dataset -------------------------------------------------------------------------------


def batches(data_dir: Path) -> None:
    """SFT batch files under `data_dir` (the source `export_dataset` reads without ClickHouse)."""
    trajectories = synthetic(40)
    meta = {
        "trajectory_ids": [t.trajectory_id for t in trajectories], "content_hashes": [],
        "source_offsets": {}, "reward_versions": [], "calibration_versions": [], "policy_versions": [],
        "builder_config": {},
    }  # fmt: skip
    BatchStore(data_dir).write("sft", SFTBuilder().build(trajectories), meta)


@pytest.fixture
def lanes(tmp_path) -> tuple[McpConfig, Path]:
    """A config whose data dir holds batch files, and a directory outside it that must stay empty."""
    data = tmp_path / "data"
    batches(data)
    outside = tmp_path / "outside"
    outside.mkdir()
    return McpConfig(data_dir=data), outside


def mcp_export(config: McpConfig, out_dir: str | None) -> dict:
    return data_tools.export_dataset(config, kind="sft", out_dir=out_dir, source="batches")


def tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_export_refuses_paths_that_leave_the_exports_directory(lanes, tmp_path):
    config, outside = lanes
    (config.data_dir / "exports").mkdir()
    (config.data_dir / "exports" / "link").symlink_to(outside, target_is_directory=True)
    attempts = {
        str(outside / "sft"): "must be relative",  # absolute
        "../../outside/sft": "no '..'",
        "sft/../../../outside": "no '..'",
        "link/sft": "outside the exports directory",  # a link that leads out
        "link": "outside the exports directory",
        ".": "outside the exports directory",  # the exports directory itself
    }
    for given, reason in attempts.items():
        with pytest.raises(McpToolError) as refused:
            mcp_export(config, given)
        assert f"out_dir={given!r}" in str(refused.value) and reason in str(refused.value)
    assert list(outside.iterdir()) == []  # nothing written outside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "outside"]


def test_export_writes_under_exports_and_replaces_only_its_own_export(lanes):
    config, _ = lanes
    first = mcp_export(config, "sft/run-1")
    target = config.data_dir.resolve() / "exports" / "sft" / "run-1"
    assert Path(first["out_dir"]) == target and first["rows"] > 0 and first["problems"] == []
    listed = json.loads((target / "export.json").read_text())["files"]
    assert sorted(listed) == sorted(tree(target))  # the manifest lists every file it wrote
    again = mcp_export(config, "sft/run-1")  # its own earlier export: replaced
    assert again["splits"] == first["splits"]
    (target / "notes.txt").write_text("mine")  # a file no export wrote: the next one is refused
    with pytest.raises(McpToolError, match=r"holds entries its export.json does not list \(notes.txt\)"):
        mcp_export(config, "sft/run-1")
    assert (target / "notes.txt").read_text() == "mine" and (target / "train.jsonl").exists()


def test_a_planted_export_json_deletes_nothing(lanes, tmp_path):
    """Old code: any directory holding a file named export.json was removed with everything in it."""
    config, _ = lanes
    project = config.data_dir / "exports" / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('keep me')")
    (project / "README.md").write_text("# my project")
    (project / "export.json").write_text(json.dumps({"files": ["README.md", "src/main.py", "../victim"]}))
    before = tree(project)
    with pytest.raises(McpToolError, match=r"out_dir: .* does not list \(src, src/main.py\)"):
        mcp_export(config, "project")
    assert tree(project) == before
    # the CLI's API writes where it is told, but replaces no directory it did not write either
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "keep").mkdir(parents=True)
    (elsewhere / "keep" / "data.bin").write_bytes(b"\x00\x01")
    (elsewhere / "export.json").write_text("{}")
    with pytest.raises(ExportError, match=r"--out: .* does not list \(keep, keep/data.bin\)"):
        export_dataset(None, "sft", "batches", "jsonl", elsewhere, data_dir=config.data_dir)
    assert (elsewhere / "keep" / "data.bin").read_bytes() == b"\x00\x01"


def test_a_manifest_naming_files_outside_its_directory_removes_only_its_own(lanes, tmp_path):
    config, _ = lanes
    victim = config.data_dir / "exports" / "victim.jsonl"
    victim.parent.mkdir(parents=True)
    victim.write_text("keep")
    planted = config.data_dir / "exports" / "planted"
    planted.mkdir()
    (planted / "export.json").write_text(json.dumps({"files": ["../victim.jsonl", "/etc/hostname"]}))
    done = mcp_export(config, "planted")  # only export.json was there, and it is an export's file
    assert done["rows"] > 0 and victim.read_text() == "keep"
    assert not [p for p in victim.parent.iterdir() if p.name.startswith(".")]  # no staging left behind


# --- rollout ----------------------------------------------------------------------------------------


class OpenAIAnswers(CountingHandler):
    """Answers like a tiny OpenAI-compatible policy: a model list, and a completion that submits 7."""

    def body(self) -> tuple[str, bytes]:
        if self.command != "POST":
            return _json(
                {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "tests"}]}
            )
        submit = {"name": "submit", "arguments": '{"answer": "7"}'}
        message = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": submit}],
        }
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        completion = {"id": "r1", "object": "chat.completion", "created": 0, "model": "policy"}
        return _json({**completion, "choices": [choice], "usage": usage})


def _json(body: dict) -> tuple[str, bytes]:
    return "application/json", json.dumps(body).encode()


def test_rollout_refuses_every_url_not_configured_without_a_request(tmp_path):
    config = McpConfig(data_dir=tmp_path, policy_urls=("http://127.0.0.1:8000/v1",))
    with counting_server(OpenAIAnswers) as (base, hits):
        port = base.rsplit(":", 1)[1]
        for url in (
            f"{base}/v1",  # e.g. the chDB endpoint: any URL nobody configured
            f"{base}/",
            f"http://localhost:{port}/v1",
            f"http://127.0.0.1:8000@127.0.0.1:{port}/v1",  # userinfo that reads like the allowed one
            f"http://127.0.0.1:8000/v1/../../?x=http://127.0.0.1:{port}",
            f"file:///etc/passwd#{port}",
            f"http://0x7f.1:{port}/v1",  # other spellings of loopback, IPv6 forms, a trailing dot
            f"http://2130706433:{port}/v1",
            f"http://[::ffff:127.0.0.1]:{port}/v1",
            f"http://[::1]:{port}/v1",
            f"http://127.0.0.1.:{port}/v1",
            f"HTTP://127.0.0.1:{port}/V1",
        ):
            with pytest.raises(McpToolError, match="policy_url="):
                env_tools.rollout(config, url)
        assert hits == []  # not one request reached it


def test_rollout_calls_the_checked_form_of_the_url(tmp_path):
    """Found: the check compared `urlsplit`'s reading (which deletes tabs and newlines anywhere)
    but handed the caller's own text to the HTTP clients; now the checked form is what is called."""
    config = McpConfig(data_dir=tmp_path, policy_urls=("http://127.0.0.1:8000/v1",))
    for given in ("http://127.0.0.1:80\t00/v1", " http://127.0.0.1:8000/v1/\n", "http://LOCALHOST:8000/v1"):
        try:
            chosen = env_tools.chosen_policy_url(config, given)
        except McpToolError:
            continue  # refused outright is as good
        assert chosen == "http://127.0.0.1:8000/v1", given


def test_rollout_check_does_not_follow_a_redirect(tmp_path):
    with (
        counting_server(OpenAIAnswers) as (target, target_hits),
        counting_server(OpenAIAnswers, redirect_to=target) as (policy, hits),
    ):
        config = McpConfig(data_dir=tmp_path, policy_urls=(f"{policy}/v1",))
        env_tools.check_policy_answers(env_tools.chosen_policy_url(config, f"{policy}/v1/"))
        assert hits == ["GET /v1/models"] and target_hits == []


def test_rollout_runs_on_the_stacks_own_policy_server(tmp_path, broker):
    with counting_server(OpenAIAnswers) as (base, hits):
        config = McpConfig(bootstrap_servers=broker.bootstrap, data_dir=tmp_path, policy_urls=())
        with pytest.raises(McpToolError, match="no policy endpoint is configured"):
            env_tools.rollout(config, task_ids=["calc-add-small"])
        assert hits == []
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "policy.ready").write_text(base.removeprefix("http://"))  # as `up --policy` does
        assert env_tools.allowed_policy_urls(config) == [f"{base}/v1"]
        done = env_tools.rollout(config, task_ids=["calc-add-small"])  # no URL: the stack's own
        assert [(e["task_id"], e["success"]) for e in done["episodes"]] == [("calc-add-small", True)]
        again = env_tools.rollout(dataclasses.replace(config), f"{base}/v1", task_ids=["calc-add-small"])
        assert again["solved"] == 1 and "POST /v1/chat/completions" in hits
