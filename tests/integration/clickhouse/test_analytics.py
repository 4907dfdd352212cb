"""Leaderboard maths, migrations parsing, endpoint request parsing and URL handling (no I/O)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from clients.clickhouse import ClickHouseError
from clients.clickhouse.client import chdb_path
from clients.clickhouse.endpoint import parse_request
from clients.clickhouse.migrate import load_migrations, split_statements
from infra.clickhouse.analytics import bootstrap_ci, episode_rewards_sql, holm, leaderboard, trajectory_steps


def test_bootstrap_ci_brackets_the_mean_and_is_reproducible():
    values = list(np.random.default_rng(1).normal(0.6, 0.1, 200))
    low, high = bootstrap_ci(values)
    assert low < float(np.mean(values)) < high
    assert (low, high) == bootstrap_ci(values)
    sem = float(np.std(values, ddof=1) / math.sqrt(len(values)))
    assert abs((high - low) - 2 * 1.96 * sem) < 0.3 * (2 * 1.96 * sem)  # ~ the normal-theory width


def test_holm_matches_the_textbook_definition():
    p = [0.01, 0.02, 0.03, 0.5]
    m = len(p)
    expected = np.maximum.accumulate([min(1, (m - i) * q) for i, q in enumerate(sorted(p))])
    assert holm(p) == pytest.approx(list(expected))
    assert math.isnan(holm([math.nan, 0.2])[0]) and holm([math.nan, 0.2])[1] == pytest.approx(0.2)


def test_leaderboard_ranks_best_first_and_tests_against_it():
    rng = np.random.default_rng(7)
    good, bad = rng.normal(0.8, 0.05, 40), rng.normal(0.5, 0.05, 40)
    rows = [("code", "good", 1, float(x)) for x in good] + [
        ("code", "bad", i % 2, float(x)) for i, x in enumerate(bad)
    ]
    rows += [("web", "only", 1, None)]
    board = leaderboard(rows, by="model")
    assert [(r["domain"], r["model"]) for r in board] == [("code", "good"), ("code", "bad"), ("web", "only")]
    best, other, unscored = board
    assert best["significant"] == "best" and best["success_rate"] == 1.0
    assert other["success_rate"] == 0.5 and other["mean_reward"] == pytest.approx(float(np.mean(bad)))
    assert other["p_vs_best_welch"] == pytest.approx(stats.ttest_ind(bad, good, equal_var=False).pvalue)
    assert other["significant"] == "yes"
    assert unscored["scored"] == 0 and math.isnan(unscored["mean_reward"])


def test_episode_rewards_sql_binds_values_and_validates_the_column():
    sql = episode_rewards_sql("agent", domain="it's", since="2026-01-01")
    assert "domain = {domain:String}" in sql.text and "it's" not in sql.text and ", agent," in sql.text
    assert sql.params == {"domain": "it's", "since": "2026-01-01"}
    with pytest.raises(ClickHouseError, match="by='nope'"):
        episode_rewards_sql("nope")


def test_trajectory_steps_joins_layers_and_keeps_absent_as_none():
    results = {
        "steps": [(0, "bash", 0, None, "ok"), (1, "edit", 1, "boom", "err")],
        "rule": [(0, 0.5, 1.0, None, 0.0)],
        "judge": [(1, 0.9)],
        "human": [],
        "process": [([0.4, None],)],
    }
    rows = trajectory_steps(results)
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["rule"] == 0.5 and rows[0]["judge"] is None and rows[0]["process"] == 0.4
    assert rows[1]["rule"] is None and rows[1]["judge"] == 0.9 and rows[1]["error"] == "boom"


def test_migrations_are_numbered_and_split_into_statements():
    migrations = load_migrations()
    assert [m.version for m in migrations] == sorted(m.version for m in migrations)
    statements = [s for m in migrations for s in m.statements()]
    for table in (
        "events",
        "episodes",
        "steps",
        "rule_rewards",
        "judge_scores",
        "trajectories",
        "annotations",
        "batches",
        "dead_letters",
        "leaderboard",
    ):
        assert any(f"agentstream.{table}\n" in s or f"agentstream.{table} " in s for s in statements), table
    # a type or a setting set twice is the same type or setting; CREATE OR REPLACE builds the same
    # object again (0009 copies `trajectories` into a table of the same definition;
    # test_reward_versions.py re-runs it)
    idempotent = ("IF NOT EXISTS", "MODIFY COLUMN IF EXISTS", "MODIFY SETTING ", "CREATE OR REPLACE ")
    assert all(any(m in s for m in idempotent) for s in statements if not s.startswith("SET "))
    assert split_statements("SELECT 1;\n-- c;\nSELECT 2") == ["SELECT 1", "SELECT 2"]


def test_endpoint_splits_inserts_from_queries():
    insert = parse_request("INSERT INTO t (a) FORMAT Native", b"\x01\x02")
    assert (insert.sql, insert.fmt, insert.insert_data) == ("INSERT INTO t (a)", "Native", b"\x01\x02")
    query = parse_request("", b"SELECT 1", default_format="JSON")
    assert (query.sql, query.fmt, query.insert_data) == ("SELECT 1", "JSON", None)


def test_chdb_path_parsing():
    assert chdb_path("chdb:///data/ch") == "/data/ch"
    assert chdb_path("https://ch.example:8443") is None
    with pytest.raises(ClickHouseError, match="on-disk path"):
        chdb_path("chdb://memory")


def test_the_endpoint_answers_without_waiting_for_delayed_acks():
    """Small replies went out 40 ms late (Nagle + the client's delayed ACK); socketserver sets
    TCP_NODELAY on each accepted connection when the handler asks for it."""
    from clients.clickhouse.endpoint import _Handler

    assert _Handler.disable_nagle_algorithm is True
