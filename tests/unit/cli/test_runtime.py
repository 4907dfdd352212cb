"""Every `agentstream` process raises the garbage collector's thresholds (infra/runtime.py);
`AGENTSTREAM_GC_THRESHOLDS` overrides them, and a bad value is a one-line error naming it."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest

from infra.errors import InfraError
from infra.runtime import ENV, GC_THRESHOLDS, default_gc, gc_thresholds, stop_child, tune_gc


@pytest.fixture
def restored_gc():
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_tuning_freezes_the_loaded_objects_and_raises_the_thresholds(restored_gc):
    assert tune_gc({}) == GC_THRESHOLDS
    assert gc.get_threshold() == GC_THRESHOLDS and gc.get_freeze_count() > 0
    assert tune_gc({ENV: "700,10,10"}) == (700, 10, 10) and gc.get_threshold() == (700, 10, 10)


def test_bad_thresholds_name_the_variable_and_the_value():
    for bad in ("fast", "1,2,3,4", "-1", "1,,2"):
        with pytest.raises(InfraError, match=f"{ENV}: '{bad}'"):
            gc_thresholds(bad)


def test_a_real_process_runs_with_the_thresholds_and_refuses_a_bad_one(tmp_path):
    code = f"import gc; from infra.cli.main import main; main(['schema', 'export', {str(tmp_path)!r}]); "
    code += "print(gc.get_threshold())"
    ok = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env("1234,5,6"))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip().splitlines()[-1] == "(1234, 5, 6)"
    bad = subprocess.run(
        [sys.executable, "-m", "infra.cli", "schema", "export", str(tmp_path)],
        capture_output=True,
        text=True,
        env=_env("fast"),
    )
    assert bad.returncode == 1 and f"{ENV}: 'fast'" in bad.stderr


def _env(thresholds: str) -> dict[str, str]:
    return {**os.environ, ENV: thresholds}


def test_a_benchmark_of_user_code_runs_under_cpython_defaults(restored_gc):
    tune_gc({})
    with default_gc():
        assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_threshold() == GC_THRESHOLDS


def test_stop_child_kills_a_child_that_ignores_sigterm_after_the_grace():
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
    script += "time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"1\n"  # the handler is installed
    assert stop_child(child, grace_s=0.5) == -9 and child.poll() == -9
    child.stdout.close()
