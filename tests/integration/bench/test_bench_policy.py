"""`agentstream bench policy` with tiny settings: it runs end to end (embedded broker, the real
server, recording on and off, hot reloads) and writes every figure the issue asks for. The figures
themselves are not asserted (the machines are noisy); that they exist and add up is."""

from __future__ import annotations

import argparse
import json

import pytest

from infra.cli.main import main

pytestmark = pytest.mark.integration

TINY = ["--repeats", "1", "--concurrency", "1,2", "--requests", "4", "--max-tokens", "4"]
TINY += ["--reloads", "2", "--reload-interval", "0.2", "--checkpoints", "2"]


def test_the_policy_benchmark_writes_throughput_overhead_and_reload_figures(tmp_path, capsys):
    out = tmp_path / "policy.json"
    assert main(["bench", "policy", *TINY, "--output", str(out)]) == 0
    document = json.loads(out.read_text())
    serve = [row for row in document["rows"] if row["case"] == "serve"]
    assert {(r["concurrency"], r["recording"]) for r in serve} == {
        (c, m) for c in (1, 2) for m in ("off", "on")
    }
    assert all(r["tokens_per_s"] > 0 and r["requests_per_s"] > 0 and r["cpu_ms_per_call"] > 0 for r in serve)
    assert all(r["requests"] == 4 for r in serve)

    batching = document["batching"]  # tokens/s by concurrency; the 4x target needs levels 1 and 8
    assert set(batching["tokens_per_s"]) == {"1", "2"} and batching["ratio_to_lowest"]["1"] == 1.0
    assert set(batching["engine_only_tokens_per_s"]) == {"1", "2"} and "target_met" not in batching
    alone = [row for row in document["rows"] if row["case"].startswith("engine only")]
    assert [row["concurrency"] for row in alone] == [1, 2] and all(row["tokens_per_s"] > 0 for row in alone)

    overhead = document["recording_overhead"]
    assert overhead["concurrency"] == 1 and overhead["target_ms"] == 2.0
    assert isinstance(overhead["target_met"], bool)
    assert set(overhead["per_repeat_by_concurrency"]) == {"1", "2"}  # paired on - off figures per level
    for key in ("latency_p50_ms", "cpu_ms_per_call", "recording_alone_paced_cpu_ms"):
        assert isinstance(overhead[key], float), key

    reload = document["reload"]
    assert reload["switches_tried"] == 2
    loaded = len(reload["load_times_ms"])
    assert loaded >= 1  # at least the switch from the base model
    assert loaded + len(reload["failures"]) == 2 and len(reload["reload_pauses_ms"]) == loaded
    for key in ("load_p50_ms", "load_p99_ms", "pause_p50_ms", "pause_p99_ms", "switch_gap_max_ms"):
        assert key in reload, key
    assert reload["switches_seen_by_clients"] >= 1

    assert document["gpu"] == {"skipped": "GPU comparison not requested (--gpu)"}
    table = capsys.readouterr().out
    for case in (
        "| serve",
        "| recording overhead",
        "| recording only, paced",
        "| reload: pause",
        f"JSON: {out}",
    ):
        assert case in table, case


def test_without_cuda_the_gpu_comparison_says_why_it_was_skipped(tmp_path, monkeypatch):
    import torch

    from infra.bench.policy.gpu import gpu_comparison

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    skipped = gpu_comparison(argparse.Namespace(gpu=True, max_tokens=4, repeats=1), tmp_path)
    assert skipped["skipped"].startswith("GPU comparison skipped: no CUDA device")


def test_the_gpu_comparison_runs_on_cpu_with_a_small_shape(tmp_path):
    """The same code path as `--gpu`, on a model small enough for CPU: both engines generate, alone
    and 8 at a time."""
    from infra.bench.policy.gpu import compare_generate

    result = compare_generate(tmp_path / "model", "cpu", {"hidden_size": 64, "layers": 2}, 8, 1, prompts=2)
    for level in (1, 8):
        assert result["tokens_per_s"]["ours"][level] > 0 and result["tokens_per_s"]["theirs"][level] > 0
        ours, theirs = result["tokens_per_s"]["ours"][level], result["tokens_per_s"]["theirs"][level]
        assert result["ratio"][level] == pytest.approx(ours / theirs)
    assert [(row["case"], row["concurrency"]) for row in result["rows"]] == [
        ("cpu: LocalEngine.generate", 1),
        ("cpu: transformers model.generate", 1),
        ("cpu: LocalEngine.generate", 8),
        ("cpu: transformers model.generate", 8),
    ]
