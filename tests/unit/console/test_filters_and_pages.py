"""The console's pure parts: filter parsing, the SQL it binds, merging layers, charts, config rules."""

from __future__ import annotations

import base64

import pytest

from infra.clickhouse.analytics import episode_rewards_sql, trajectory_sql
from infra.clickhouse.browse.filters import MAX_PAGE_SIZE, TrajectoryFilter, parse_filter
from infra.clickhouse.browse.trajectory_detail import merge_header, merge_steps, trajectory_detail_sql
from infra.clickhouse.browse.trajectory_list import trajectory_count_sql, trajectory_list_sql
from infra.console.app import presented_key
from infra.console.charts import line_chart
from infra.console.config import ConsoleConfig
from infra.console.rendering import fmt_number
from infra.errors import ConsoleError, FilterError
from producers.gateway.requests import hash_key

INJECTIONS = [
    "x' OR 1=1 --",
    "'); DROP TABLE agentstream.steps; --",
    "{x:String}",
    "\\' UNION SELECT * FROM system.tables --",
    "coding\x00",
]


def test_every_filter_is_parsed_and_empty_values_are_unset():
    f = parse_filter(
        {
            "domain": "coding",
            "agent": " a1 ",
            "model": "",
            "policy_version": "v3",
            "success": "false",
            "reward_min": "0.25",
            "reward_max": "1",
            "since": "2026-11-01",
            "until": "2026-11-25T14:30:00Z",
            "search": "module_3",
            "page": "2",
            "unknown": "ignored",
        }
    )
    assert f.domain == "coding" and f.agent == "a1" and f.model is None and f.policy_version == "v3"
    assert f.success is False and (f.reward_min, f.reward_max) == (0.25, 1.0)
    assert f.since.isoformat() == "2026-11-01T00:00:00" and f.until.isoformat() == "2026-11-25T14:30:00"
    assert f.search == "module_3" and f.page == 2 and f.offset == 50


def test_a_filter_survives_the_round_trip_through_its_url():
    f = parse_filter(
        {"domain": "web", "success": "true", "reward_min": "0.5", "since": "2026-11-02T03:04:05"}
    )
    assert parse_filter(f.to_query()) == f
    assert f.to_query(page=3)["page"] == "3" and "page" not in f.to_query()
    assert "page_size" not in parse_filter({"domain": "web"}, page_size=4).to_query(page=2)
    assert parse_filter({"page_size": "7"}, page_size=4).to_query()["page_size"] == "7"


@pytest.mark.parametrize(
    ("query", "field", "value"),
    [
        ({"page": "0"}, "page", "0"),
        ({"page": "-1"}, "page", "-1"),
        ({"page_size": str(MAX_PAGE_SIZE + 1)}, "page_size", str(MAX_PAGE_SIZE + 1)),
        ({"reward_min": "abc"}, "reward_min", "abc"),
        ({"reward_max": "nan"}, "reward_max", "nan"),
        ({"success": "maybe"}, "success", "maybe"),
        ({"since": "yesterday"}, "since", "yesterday"),
        ({"until": "2026-13-01"}, "until", "2026-13-01"),
        ({"reward_min": "0.9", "reward_max": "0.1"}, "reward_min", 0.9),
        ({"since": "2026-11-25", "until": "2026-11-24"}, "since", "2026-11-25T00:00:00"),
    ],
)
def test_a_malformed_filter_names_its_field_and_value(query, field, value):
    with pytest.raises(FilterError) as caught:
        parse_filter(query)
    assert caught.value.field == field and caught.value.value == value
    assert str(caught.value).startswith(f"{field}={value!r}: ")


def test_text_filters_are_bounded():
    with pytest.raises(FilterError, match=r"search=.*at most 200 characters"):
        parse_filter({"search": "x" * 201})


@pytest.mark.parametrize("payload", INJECTIONS)
def test_no_filter_value_reaches_the_sql_text(payload):
    names = ("domain", "agent", "model", "policy_version", "search", "reward_version")
    f = TrajectoryFilter(**dict.fromkeys(names, payload))
    for sql in (trajectory_list_sql(f), trajectory_count_sql(f)):
        assert payload not in sql.text
        assert {sql.params[k] for k in names} == {payload}
    for sql in trajectory_detail_sql(payload, reward_version=payload).values():
        assert payload not in sql.text and sql.params["tid"] == payload
        assert set(sql.params.values()) == {payload}
    for sql in trajectory_sql(payload, reward_version=payload).values():
        assert payload not in sql.text and sql.params["tid"] == payload
    assert episode_rewards_sql("model", reward_version=payload).params == {"reward_version": payload}


def test_the_header_and_the_steps_carry_every_field_absent_as_none():
    header = merge_header("t1", [{"task": "do it", "success": None}], [{"success": 0, "unknown": 1}], [])
    assert header["task"] == "do it" and header["success"] == 0 and header["error"] is None
    assert "unknown" not in header
    steps = merge_steps(
        [{"step": 1, "rule": 0.5, "judge": None}],
        [{"step_index": 0, "tool": "bash"}, {"step_index": 0, "tool": "second copy"}],
        [{"step_index": 1, "kind": "failed"}],
        [],
    )
    assert [s["index"] for s in steps] == [0, 1]
    assert steps[0]["text"]["tool"] == "bash" and steps[0]["scores"]["rule"] is None
    assert steps[1]["text"]["thought"] is None and steps[1]["judgements"] == [
        {"step_index": 1, "kind": "failed"}
    ]


def test_numbers_for_people_never_invent_a_zero():
    assert fmt_number(None) == "—" and fmt_number(float("nan")) == "—" and fmt_number(0.0) == "0.000"


def test_charts_escape_what_they_draw():
    svg = line_chart(["<b>x</b>"], {"<script>alert(1)</script>": [1.0]}, "a & b")
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "a &amp; b" in svg
    assert "no data yet" in line_chart([], {}, "empty")


def test_the_console_keeps_to_loopback_unless_keys_or_a_deliberate_choice():
    assert ConsoleConfig("chdb:///x", "b:1").host == "127.0.0.1"
    with pytest.raises(ConsoleError, match=r"host='0\.0\.0\.0'.*API keys"):
        ConsoleConfig("chdb:///x", "b:1", host="0.0.0.0")
    assert ConsoleConfig("chdb:///x", "b:1", host="0.0.0.0", api_key_hashes=(hash_key("k"),)).keys_required
    assert not ConsoleConfig("chdb:///x", "b:1", host="0.0.0.0", allow_anonymous=True).keys_required
    with pytest.raises(ConsoleError, match="page_size=0"):
        ConsoleConfig("chdb:///x", "b:1", page_size=0)


def test_a_browser_presents_the_key_as_the_basic_password():
    basic = "Basic " + base64.b64encode(b"anyone:s3cret").decode()
    assert presented_key({"Authorization": basic}) == "s3cret"
    assert presented_key({"Authorization": "Bearer tok"}) == "tok"
    assert presented_key({"X-API-Key": "k"}) == "k"
    assert presented_key({"Authorization": "Basic !!!"}) is None
