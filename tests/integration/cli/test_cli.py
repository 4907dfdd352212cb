"""`agentstream schema export` and the CLI skeleton, run as a user would (subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import jsonschema
import pytest

from schemas import EVENT_MODELS, StepRecorded, encode, utc_now
from tests.support.processes import AGENTSTREAM, REPO


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*AGENTSTREAM, *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=60
    )


def test_schema_export_validates_a_real_event(tmp_path):
    result = _run("schema", "export", str(tmp_path / "schemas"))
    assert result.returncode == 0, result.stderr
    files = {p.name for p in (tmp_path / "schemas").iterdir()}
    assert files == {f"{t}.json" for t in EVENT_MODELS}

    schema = json.loads((tmp_path / "schemas" / "step.recorded.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    event = StepRecorded(
        event_id="e1",
        trajectory_id="t1",
        occurred_at=utc_now(),
        producer="test",
        step_index=0,
        tool="bash",
        params={"command": "ls"},
        observation="README.md",
    )
    validator.validate(json.loads(encode(event)))

    bad = json.loads(encode(event)) | {"step_index": -1}
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(bad)
    missing = {k: v for k, v in json.loads(encode(event)).items() if k != "trajectory_id"}
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(missing)


def test_help_lists_subcommands_quickly_without_heavy_imports():
    start = time.perf_counter()
    result = _run("--help")
    elapsed = time.perf_counter() - start
    assert result.returncode == 0
    for command in ("schema", "bench"):
        assert command in result.stdout
    # Well under a second even on a loaded 2-core box (interpreter start included).
    assert elapsed < 3.0, f"--help took {elapsed:.2f}s"
    probe = (
        "import sys, infra.cli.main; infra.cli.main.build_parser(); "
        "names = ('torch', 'transformers', 'faust', 'chdb', 'anthropic', 'peft'); "
        "heavy = [m for m in names if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "", f"heavy modules imported by --help: {imported.stdout}"


def test_options_fall_back_to_environment_and_say_so(tmp_path):
    import os

    help_text = _run("schema", "export", "--help").stdout
    assert "AGENTSTREAM_DATA_DIR" in help_text and "AGENTSTREAM_BOOTSTRAP_SERVERS" in help_text

    from infra.cli.main import build_parser
    from infra.options.env import apply_env_defaults

    parser = build_parser()
    os.environ["AGENTSTREAM_DATA_DIR"] = str(tmp_path / "from-env")
    try:
        args = parser.parse_args(["schema", "export", "out"])
        apply_env_defaults(parser, args)
        assert args.data_dir == str(tmp_path / "from-env")
        args = parser.parse_args(["schema", "export", "out", "--data-dir", "explicit"])
        apply_env_defaults(parser, args)
        assert args.data_dir == "explicit"
    finally:
        del os.environ["AGENTSTREAM_DATA_DIR"]


def test_settings_default_clickhouse_url_is_chdb_under_data_dir(tmp_path, monkeypatch):
    from schemas.settings import DEFAULT_BOOTSTRAP, Settings

    monkeypatch.delenv("AGENTSTREAM_CLICKHOUSE_URL", raising=False)
    monkeypatch.delenv("AGENTSTREAM_BOOTSTRAP_SERVERS", raising=False)
    settings = Settings(data_dir=tmp_path)
    assert settings.bootstrap_servers == DEFAULT_BOOTSTRAP
    assert settings.resolved_clickhouse_url == f"chdb://{tmp_path / 'clickhouse'}"
    monkeypatch.setenv("AGENTSTREAM_CLICKHOUSE_URL", "http://127.0.0.1:8123")
    assert Settings(data_dir=tmp_path).resolved_clickhouse_url == "http://127.0.0.1:8123"


def test_env_fallback_works_under_python_dash_m(tmp_path):
    """Package-registered options fall back to the environment also under `python -m infra.cli`."""
    import os

    out = tmp_path / "codec.json"
    env = {**os.environ, "AGENTSTREAM_REPEATS": "2"}
    result = _run("bench", "codec", "--events", "50", "--output", str(out), env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["repeats"] == 2
