"""`agentstream train --nproc N`'s launcher (infra.training_group) with fake ranks: small Python
children that record their environment and then exit, fail, kill themselves or ignore SIGTERM, as
the test plans for each rank and attempt."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from consumers.training.config import TrainConfig, TrainRunConfig
from infra.training_group import (
    GROUP_ENV,
    GroupError,
    RankExit,
    TrainingGroup,
    check_launch,
    check_nproc,
    check_restarts,
    nproc_limit,
)
from tests.support.processes import hard_kill, pid_gone, wait_for

# argv: OUT_DIR then one plan per rank, "action,action,..." per attempt (the last one repeats)
FAKE_RANK = """
import os, signal, sys, time
from pathlib import Path
out, rank = Path(sys.argv[1]), int(os.environ["RANK"])
plan = sys.argv[2 + rank].split(",")
attempt = len(list(out.glob(f"rank{rank}-*")))
values = [os.environ.get(k, "") for k in GROUP_ENV_KEYS] + [str(os.getpid())]
(out / f"rank{rank}-{attempt}").write_text(" ".join(values))
action = plan[min(attempt, len(plan) - 1)]
if action == "ok":
    sys.exit(0)
if action == "fail3":
    time.sleep(0.2)
    sys.exit(3)
if action == "usage":
    sys.exit(2)
if action == "kill9":
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGKILL)
if action == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if action == "wait":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(0.05)
""".replace("GROUP_ENV_KEYS", repr(GROUP_ENV))


def _group(
    tmp_path: Path, *plans: str, max_restarts: int = 3, grace_s: float = 5.0, healthy_s: float = 600.0
) -> TrainingGroup:
    argv = [sys.executable, "-c", FAKE_RANK, str(tmp_path), *plans]
    return TrainingGroup(
        argv, len(plans), max_restarts, grace_s=grace_s, restart_delay_s=0.05, interval_s=0.05,
        healthy_s=healthy_s,
    )  # fmt: skip


def _records(tmp_path: Path, rank: int) -> list[list[str]]:
    files = sorted(tmp_path.glob(f"rank{rank}-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    return [p.read_text().split() for p in files]


def test_a_failing_rank_restarts_the_whole_group_on_a_new_port(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="infra.training_group")
    group = _group(tmp_path, "hang,ok", "fail3,ok")
    assert group.run() == 0
    assert group.exits == [RankExit(attempt=0, rank=1, code=3)]  # rank 0 was stopped, not failed
    assert len(group.ports) == 2 and group.ports[0] != group.ports[1]
    for rank in (0, 1):
        first, second = _records(tmp_path, rank)
        # RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT as torchrun sets them
        assert first[:5] == [str(rank), "2", str(rank), "127.0.0.1", str(group.ports[0])]
        assert second[:5] == [str(rank), "2", str(rank), "127.0.0.1", str(group.ports[1])]
    assert pid_gone(int(_records(tmp_path, 0)[0][5]))  # the hanging rank 0 of attempt 1 was stopped
    assert "rank 1 exited with code 3" in caplog.text
    assert "restart 1 of 3" in caplog.text


def test_a_rank_killed_every_time_gives_up_after_max_restarts(tmp_path, caplog):
    group = _group(tmp_path, "hang", "kill9", max_restarts=2)
    assert group.run() == 1
    assert group.exits == [RankExit(n, 1, -signal.SIGKILL) for n in range(3)]
    assert len(_records(tmp_path, 0)) == 3 and len(set(group.ports)) == 3
    assert "rank 1 was killed by SIGKILL" in caplog.text and "giving up" in caplog.text
    assert all(pid_gone(int(r[5])) for rank in (0, 1) for r in _records(tmp_path, rank))


def test_a_rank_ignoring_sigterm_is_killed_after_the_grace(tmp_path):
    group = _group(tmp_path, "fail3", "stubborn", max_restarts=0, grace_s=0.5)
    assert group.run() == 1
    (stubborn,) = _records(tmp_path, 1)
    assert pid_gone(int(stubborn[5]))


def test_a_stop_request_stops_every_rank_and_returns_0(tmp_path):
    group = _group(tmp_path, "wait", "wait")
    started = threading.Event()

    def stop_when_running():
        wait_for(lambda: len(list(tmp_path.glob("rank*"))) == 2, timeout_s=20, what="both ranks")
        started.set()
        group.request_stop()

    threading.Thread(target=stop_when_running, daemon=True).start()
    assert group.run() == 0
    assert started.is_set() and group.exits == []  # both exited 0 on SIGTERM: no failure, no restart
    assert len(group.ports) == 1
    assert all(pid_gone(int(_records(tmp_path, rank)[0][5])) for rank in (0, 1))


def test_nproc_inside_a_launched_rank_is_refused():
    check_launch(2, {})
    check_launch(1, {"WORLD_SIZE": "2", "RANK": "0"})  # torchrun's rank with the default --nproc
    with pytest.raises(GroupError, match=r"--nproc: 2 asked.*rank '1' of WORLD_SIZE='2'"):
        check_launch(2, {"WORLD_SIZE": "2", "RANK": "1"})


def test_each_rank_runs_the_same_train_command_with_nproc_1():
    from infra.cli.main import build_parser
    from infra.commands.batch_train import _config, rank_argv

    run = TrainRunConfig(
        bootstrap_servers="127.0.0.1:9999", data_dir=Path("/tmp/d"), follow=True, kinds=("grpo",),
        idle_exit_s=3.0, nproc=2, max_restarts=1, train=TrainConfig(lora=False, micro_batch_size=2),
    )  # fmt: skip
    argv = rank_argv(run, "DEBUG")
    assert argv[:4] == [sys.executable, "-m", "infra.cli", "train"]
    args = build_parser().parse_args(argv[3:])
    assert args.log_level == "DEBUG"
    assert _config(TrainRunConfig, args) == replace(run, nproc=1)


@pytest.mark.parametrize(("field", "value"), [("nproc", 0), ("max_restarts", -1)])
def test_bad_group_options_are_refused_naming_them(field, value):
    with pytest.raises(Exception, match=f"--{field.replace('_', '-')} must be .* got {value}"):
        TrainRunConfig(follow=True, **{field: value})


def test_the_ranks_die_with_a_killed_launcher(tmp_path):
    import os
    import subprocess

    launcher_code = (
        "import sys; from infra.training_group import TrainingGroup; "
        "sys.exit(TrainingGroup(sys.argv[1:], 2, 0).run())"
    )
    fake = [sys.executable, "-c", FAKE_RANK, str(tmp_path), "hang", "hang"]
    launcher = subprocess.Popen([sys.executable, "-c", launcher_code, *fake], cwd=Path(__file__).parents[3])
    pids: list[int] = []
    try:
        wait_for(lambda: len(list(tmp_path.glob("rank*"))) == 2, timeout_s=30, what="both ranks")
        pids = [int(_records(tmp_path, rank)[0][5]) for rank in (0, 1)]
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        wait_for(lambda: all(pid_gone(pid) for pid in pids), timeout_s=10, what="the orphaned ranks to die")
    finally:
        launcher.kill()
        launcher.wait(timeout=10)
        hard_kill(pids)  # only if the test failed: they should be gone


@pytest.mark.parametrize(("healthy_s", "outcome"), [(0.1, 0), (600.0, 1)])
def test_an_attempt_that_ran_healthily_resets_the_restart_count(tmp_path, caplog, healthy_s, outcome):
    caplog.set_level(logging.INFO, logger="infra.training_group")
    # rank 1 fails 0.2 s into each of 3 attempts, then finishes: 3 failures, --max-restarts 1
    group = _group(tmp_path, "hang,hang,hang,ok", "fail3,fail3,fail3,ok", max_restarts=1, healthy_s=healthy_s)
    assert group.run() == outcome
    if outcome == 0:  # each attempt ran >= healthy_s: every failure is the first in a row
        assert len(group.exits) == 3 and "the restart count starts again" in caplog.text
    else:
        assert len(group.exits) == 2 and "giving up" in caplog.text


def test_a_usage_error_in_a_rank_stops_the_group_without_restarting(tmp_path, caplog):
    group = _group(tmp_path, "hang", "usage", max_restarts=3)
    assert group.run() == 2
    assert group.exits == [RankExit(0, 1, 2)] and len(group.ports) == 1
    assert "a usage error" in caplog.text and "not restarting" in caplog.text
    assert pid_gone(int(_records(tmp_path, 0)[0][5]))


def test_nproc_is_bounded_by_the_cpus_or_gpus():
    check_nproc(2, 2, "CPUs")
    with pytest.raises(GroupError, match=r"^--nproc: 3 ranks asked, but there are 2 CPUs here"):
        check_nproc(3, 2, "CPUs")
    with pytest.raises(
        GroupError, match=r"^--nproc: 2 ranks asked, but there are 0 CUDA devices.*--device cpu"
    ):
        check_nproc(2, 0, "CUDA devices")
    limit, what = nproc_limit("cpu")
    assert what == "CPUs" and limit >= 1


def test_max_restarts_with_one_process_is_refused_outside_a_launcher():
    check_restarts(1, 3, 3, {})  # the default: nothing asked
    check_restarts(2, 5, 3, {})  # a group: restarted
    check_restarts(1, 5, 3, {"WORLD_SIZE": "2", "RANK": "1"})  # a rank of a launched group
    with pytest.raises(GroupError, match=r"^--max-restarts: 5 given with --nproc 1"):
        check_restarts(1, 5, 3, {})


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--nproc", "64"], "--nproc: 64 ranks asked"),
        (["--nproc", "2", "--gate", "--gate-tasks", "/nonexistent/tasks.jsonl"], "--gate-tasks"),
        (["--nproc", "2", "--base-model", "/nonexistent/model"], "--base-model: '/nonexistent/model'"),
        (["--max-restarts", "5"], "--max-restarts: 5 given with --nproc 1"),
    ],
)
def test_the_launcher_checks_options_before_spawning_any_rank(tmp_path, monkeypatch, capsys, extra, message):
    from infra.cli.main import main
    from infra.commands import batch_train

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(batch_train, "rank_argv", lambda *a: pytest.fail("a rank was about to start"))
    argv = ["train", "--follow", "--device", "cpu", "--data-dir", str(tmp_path), *extra]
    assert main(argv) == 1
    assert message in capsys.readouterr().err


def test_a_rank_exits_2_on_a_usage_error_so_the_launcher_does_not_restart_it(tmp_path, monkeypatch, capsys):
    from infra.cli.main import main

    argv = ["train", "--follow", "--gate", "--data-dir", str(tmp_path)]  # --gate without --gate-tasks
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(argv) == 1  # one process: an error, as before
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(argv) == 2  # a rank: a usage error
    assert "--gate-tasks" in capsys.readouterr().err
