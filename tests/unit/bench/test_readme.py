"""The README's performance table is generated from `bench e2e` JSON (infra/bench/readme.py), and
`bench e2e`'s CPU rows are per process per 1,000 steps (infra/bench/cpu.py), medians over its runs
(`combine_runs`)."""

from __future__ import annotations

import json
import os

import pytest

from infra.bench import cpu
from infra.bench import readme as generator
from infra.bench.e2e import combine_runs
from infra.bench.readme import (
    END,
    START,
    SUMMARY_END,
    SUMMARY_START,
    ReadmeError,
    regenerate,
    replace_section,
    section,
    summary,
)

E2E = {
    "benchmark": "e2e",
    "machine": {"when": "2026-11-25T19:00:00Z", "cpus": 2, "python": "3.11.7"},
    "rows": [
        {"offered steps/s": 100.0, "achieved steps/s": 100.0, "all in CH": True, "rule p50 ms": 205.0,
         "rule p99 ms": 856.0, "trajectory p50 ms": 285.0, "trajectory p99 ms": 767.0, "sustained": True},
        {"offered steps/s": 5000.0, "achieved steps/s": 4938.3, "all in CH": True, "rule p50 ms": 32006.0,
         "rule p99 ms": 55107.0, "trajectory p50 ms": 33406.0, "trajectory p99 ms": 55280.0,
         "sustained": False},
    ],
    "cpu_s_per_1k_steps": [
        {"offered steps/s": 100.0, "broker": 1.5, "rules": 0.9, "assembler": 1.2, "sink": 3.3,
         "trainer": 0.24, "stack": 7.14, "agents (SDK)": 1.2},
        {"offered steps/s": 5000.0, "broker": 0.08, "rules": 0.25, "assembler": 0.35, "sink": 0.33,
         "trainer": 0.04, "stack": 1.05, "agents (SDK)": 0.18},
    ],
}  # fmt: skip


def test_the_table_has_a_row_per_rate_with_each_process_cpu():
    text = section(E2E)
    assert "| offered steps/s | achieved | all in CH |" in text
    assert "| 5,000 | 4,938 | yes | 32,006 / 55,107 | 33,406 / 55,280 | 1.050 | 0.080 | 0.250 |" in text
    assert "2026-11-25T19:00:00Z" in text


def test_each_target_says_reached_or_not_from_the_figures():
    text = section(E2E, {"rows": [{"path": "sdk", "cpu_us_per_event": 86.0}]})
    assert "- 5,000 steps/s sustained with rule p99 under 2 s: not reached (rule p99 55,107 ms)" in text
    assert "- rule p50 under 300 ms at 100 steps/s: reached (205 ms)" in text
    assert "- SDK CPU at most 50 µs per step (`bench produce`, flat out): not reached (86 µs)" in text
    assert "at 1,000 steps/s: not measured in this run" in text  # no 1,000 steps/s row


def test_only_the_marked_section_is_rewritten():
    readme = f"# title\nbefore\n{START}\nold table\n{END}\nafter\n"
    out = replace_section(readme, "new table")
    assert out == f"# title\nbefore\n{START}\nnew table\n{END}\nafter\n"
    assert replace_section(out, "new table") == out  # idempotent


def test_a_readme_without_markers_or_a_foreign_json_is_a_clear_error():
    with pytest.raises(ReadmeError, match="bench:e2e"):
        replace_section("# no markers\n", "x")
    with pytest.raises(ReadmeError, match="not a `bench e2e` result"):
        section({"benchmark": "sink", "rows": []})


@pytest.mark.parametrize("name", ["README.md", "docs/benchmarks.md"])
def test_the_committed_tables_are_generated_from_the_committed_json(name):
    """README.md's short table and docs/benchmarks.md's full one are exactly what `agentstream bench
    readme` makes of docs/bench/*.json."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    e2e = json.loads((root / "docs/bench/e2e.json").read_text())
    produce, baseline = (
        json.loads(path.read_text()) if path.exists() else None
        for path in (root / "docs/bench/produce.json", root / "docs/bench/e2e-before.json")
    )
    text = (root / name).read_text()
    assert (SUMMARY_START if name == "README.md" else START) in text
    assert regenerate(text, e2e, produce, baseline) == text


def test_the_summary_is_one_short_row_per_rate_linking_the_full_table():
    text = summary({**E2E, "repeats": 3})
    assert "| 5,000 | 4,938 | 32,006 / 55,107 | 1.050 |" in text
    assert "medians of 3 runs" in text and "docs/benchmarks.md#e2e-the-whole-stack-generated" in text
    assert len(text.splitlines()) == 2 + len(E2E["rows"]) + 2


def test_regenerate_rewrites_each_marked_section_and_refuses_a_file_with_none():
    both = f"{SUMMARY_START}\n{SUMMARY_END}\nmiddle\n{START}\n{END}\n"
    out = regenerate(both, E2E)
    assert out.count("| 5,000 |") == 2 and "middle" in out and "all in CH" in out.split("middle")[1]
    assert "all in CH" not in out.split("middle")[0]
    assert regenerate(out, E2E) == out
    with pytest.raises(ReadmeError, match="bench:e2e-summary"):
        regenerate("# no markers\n", E2E)


def test_a_baseline_run_is_shown_beside_each_target():
    slower = {**E2E, "machine": {"when": "2026-11-24T10:00:00Z"}}
    slower["rows"] = [{**E2E["rows"][0], "rule p50 ms": 347.0}, E2E["rows"][1]]
    text = section(E2E, None, slower)
    assert "the baseline run of 2026-11-24T10:00:00Z" in text
    assert "- rule p50 under 300 ms at 100 steps/s: reached (205 ms; was 347 ms)" in text


def test_cpu_per_thousand_counts_only_processes_seen_at_both_ends_with_one_pid():
    before = {"sink": (10, 1.0), "rules": (11, 2.0), "broker": (12, 0.5)}
    after = {"sink": (10, 3.0), "rules": (99, 2.5), "trainer": (13, 1.0)}  # rules restarted
    assert cpu.per_thousand(before, after, 2000) == {
        "broker": None, "rules": None, "sink": 1.0, "trainer": None,
    }  # fmt: skip


def test_process_cpu_reads_this_process():
    spent = cpu.process_cpu_s(os.getpid())
    assert spent is not None and spent > 0
    assert cpu.process_cpu_s(2**22 + 12345) is None  # no such process


def _run(achieved, stack, drained=True, rule=(100.0, 200.0)):
    load = {"achieved": achieved, "steps": 1000, "episodes": 250, "drain_s": 1.0, "drained": drained}
    cpu_row = {"offered steps/s": 1000.0, "broker": stack / 4, "sink": stack / 2, "stack": stack}
    return load, cpu_row, {"rule": list(rule), "trajectory": [300.0], "batch": []}


def test_runs_of_a_rate_combine_into_medians_and_pooled_latencies():
    row, cpu_row, samples = combine_runs(1000.0, [_run(990.0, 0.8), _run(1000.0, 0.6), _run(995.0, 1.0)])
    assert cpu_row["stack"] == 0.8 and cpu_row["sink"] == 0.4 and cpu_row["stack per run"] == [0.8, 0.6, 1.0]
    assert row["achieved steps/s"] == 995.0 and row["steps"] == 3000 and row["runs"] == 3
    assert samples["rule"] == [100.0, 200.0] * 3 and row["rule p50 ms"] == 150.0
    assert row["sustained"] is True
    undrained = combine_runs(1000.0, [_run(990.0, 0.8), _run(1000.0, 0.6, drained=False)])[0]
    assert undrained["all in CH"] is False and undrained["sustained"] is False
    single_row, single_cpu, _ = combine_runs(1000.0, [_run(990.0, 0.8)])
    assert "runs" not in single_row and "stack per run" not in single_cpu


def test_the_generator_says_what_a_cell_is_when_rates_ran_several_times():
    cpu_rows = [{**E2E["cpu_s_per_1k_steps"][1], "stack per run": [1.0, 1.05, 1.2]}]
    text = section({**E2E, "repeats": 3, "cpu_s_per_1k_steps": cpu_rows})
    assert "a CPU cell is the median of 3 runs" in text and "5,000 steps/s 1.000, 1.050, 1.200." in text
    assert "median of" not in section(E2E)


def test_the_generator_doctests_hold():
    import doctest

    result = doctest.testmod(generator)
    assert result.attempted >= 5 and result.failed == 0


def test_an_earlier_runs_trainer_column_is_shown_as_batch_like_a_new_runs():
    """The batch builder's component was "trainer" until issue #35: older JSON still renders, under
    today's name, the same as a run that wrote "batch"."""
    idle = {"seconds": 10.0, "broker": 7.0, "sink": 10.0, "stack": 24.0}
    old = {**E2E, "idle_cpu_ms_per_s": {**idle, "trainer": 7.0}}
    rows = [
        {("batch" if k == "trainer" else k): v for k, v in row.items()} for row in E2E["cpu_s_per_1k_steps"]
    ]
    new = {**E2E, "cpu_s_per_1k_steps": rows, "idle_cpu_ms_per_s": {**idle, "batch": 7.0}}
    text = section(old)
    assert text == section(new)
    assert "| sink | batch | agents (SDK) |" in text and "trainer" not in text
    assert "| 5,000 | 4,938 | yes | 32,006 / 55,107 | 33,406 / 55,280 | 1.050 | 0.080 | 0.250 |" in text
    assert "| 0.330 | 0.040 | 0.180 |" in text  # sink, batch (was trainer), agents
    assert "sink 10.0, batch 7.0." in text
