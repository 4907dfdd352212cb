"""`agentstream env serve`: the real command serves calc so that a `RemoteEnv` episode answers exactly
what the in-process env answers; sessions run side by side (a step blocked for seconds holds up no
other session); hostile and mistaken requests are refused naming the field and the value; idle,
deleted and left-open sessions get their env closed."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import pytest

import producers.envs  # noqa: F401  (registers the built-in envs)
from infra.runtime import agentstream_argv
from producers.envs.errors import EnvError, EnvServiceError
from producers.envs.protocol import AgentEnv, TimeStep, checked_action
from producers.envs.registry import make, register, unregister
from producers.envs.service.client import RemoteEnv
from producers.envs.service.config import EnvServiceConfig
from producers.envs.service.server import create_app
from producers.envs.wrappers import TimeoutWrapper
from producers.gateway.requests import hash_key
from producers.sandbox.local import Limits
from tests.support.processes import Proc, wait_for

PROBE = "service-probe"


class ProbeEnv(AgentEnv):
    """A test env: `echo` answers its text, `wait` blocks until the test opens `gate`, `odd` answers
    an info JSON cannot carry back, `done` ends the episode. Closes are counted."""

    domain = "probe"
    terminal_tools = frozenset({"done"})
    gate = threading.Event()
    closed: list[int] = []

    def __init__(self, label: str = "x"):
        self.label, self.started, self.over = label, False, False

    @property
    def available_tools(self) -> list[str]:
        return ["echo", "wait", "odd", "done"]

    def reset(self, *, task=None, seed=None) -> TimeStep:
        self.started, self.over = True, False
        return TimeStep(f"probe {self.label} task={task!r} seed={seed}", info={"seed": seed})

    def step(self, action) -> TimeStep:
        tool, params = checked_action(action, self.started, self.over)
        if tool == "wait":
            assert self.gate.wait(30), "the test never opened the gate"
        if tool == "odd":
            return TimeStep("odd", info={"pair": (1, 2)})
        if tool == "deadline":  # what is left of the step deadline the server's env was given
            left = None if self.step_deadline is None else round(self.step_deadline - time.monotonic())
            return TimeStep("deadline", info={"left": left})
        self.over = tool == "done"
        info = {"params": params, "nested": {"none": None, "f": 0.1 + 0.2, "neg": -0.0, "big": 2**62}}
        return TimeStep(str(params.get("text", tool)), reward=0.5, terminated=self.over, info=info)

    def verify(self) -> bool | None:
        return self.over or None

    def close(self) -> None:
        ProbeEnv.closed.append(id(self))


@pytest.fixture
def probe():
    register(PROBE, ProbeEnv, domain="probe")
    ProbeEnv.gate.clear()
    ProbeEnv.closed.clear()
    yield ProbeEnv
    ProbeEnv.gate.set()
    unregister(PROBE)


@contextmanager
def app_in_thread(name: str, **options):
    """The server's app on 127.0.0.1 (a free port) in a thread of its own, cleaned up after: yields
    (its URL, the app, whose `sessions` table holds the server-side envs)."""
    from aiohttp import web

    loop = asyncio.new_event_loop()
    app = create_app(name, EnvServiceConfig(**options))
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    thread = threading.Thread(target=loop.run_forever, name="env-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", app
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@contextmanager
def served_in_thread(name: str, **options):
    """The URL of `app_in_thread`."""
    with app_in_thread(name, **options) as (url, _app):
        yield url


@contextmanager
def served_by_the_command(tmp_path: Path, name: str, *options: str):
    """`agentstream env serve NAME` as a child process (stopped by PID, hard kill after a grace)."""
    ready = tmp_path / f"{name}.ready"
    proc = Proc(
        agentstream_argv("env", "serve", name, "--ready-file", str(ready), *options), tmp_path / f"{name}.log"
    )
    try:
        wait_for(lambda: ready.exists() or not proc.alive(), timeout_s=60, what=f"env serve {name}")
        assert proc.alive(), proc.log_text()[-3000:]
        yield f"http://{ready.read_text()}", proc
    finally:
        proc.stop()


def call(url: str, method: str, path: str, body=None, **headers) -> tuple[int, dict]:
    """One raw request (JSON body unless bytes), the status and the JSON answer."""
    content = body if isinstance(body, bytes | None) else orjson.dumps(body)
    if content is not None:
        headers.setdefault("Content-Type", "application/json")
    reply = httpx.request(method, url + path, content=content, headers=headers, timeout=30)
    return reply.status_code, reply.json()


def session(url: str, **kwargs) -> str:
    status, body = call(url, "POST", "/v1/sessions", {"kwargs": kwargs})
    assert status == 201, body
    return body["session_id"]


CALC_ACTIONS = [
    {"tool": "calculator", "params": {"expression": "(12 + 7) * 3 / 4"}, "thought": "use the tool"},
    {"tool": "calculator", "params": {"expression": "1 +"}},
    {"tool": "bash", "params": {"cmd": "ls"}},
    {"tool": "calculator", "params": "not an object"},
    {"tool": "submit", "params": {"answer": "14.25"}},
]


def test_the_real_command_serves_calc_with_the_same_answers_as_in_process(tmp_path):
    with served_by_the_command(tmp_path, "calc", "--tasks", "any") as (url, proc):
        assert "[env] serving calc at http://127.0.0.1:" in proc.log_text()
        for seed in (3, 11):
            local, remote = make("calc", difficulty=3), RemoteEnv(url, "calc", kwargs={"difficulty": 3})
            try:
                assert remote.reset(seed=seed) == local.reset(seed=seed)
                task = {"expression": "(12 + 7) * 3 / 4", "task_id": "t"}
                assert remote.reset(task=task) == local.reset(task=task)
                for action in CALC_ACTIONS:
                    assert remote.step(action) == local.step(action), action
                assert remote.verify() is local.verify() is True
                assert remote.last_timestep().observation.startswith("submitted 14.25")
                with pytest.raises(EnvError, match="episode ended"):
                    remote.step(CALC_ACTIONS[0])
                assert (remote.domain, remote.terminal_tools, remote.available_tools) == (
                    local.domain, local.terminal_tools, local.available_tools,
                )  # fmt: skip
            finally:
                remote.close()
                remote.close()  # closing twice is fine
        left_open = RemoteEnv(url, "calc")
        left_open.reset(seed=1)
        assert proc.stop() == 0
        assert "closed at shutdown" in proc.log_text() and left_open.session_id in proc.log_text()


def test_sessions_run_side_by_side_and_a_blocked_step_holds_up_no_other(probe):
    with served_in_thread(PROBE, max_sessions=16) as url:
        probe.closed.clear()  # the server made and closed one env to check its arguments
        slow = RemoteEnv(url, PROBE, kwargs={"label": "slow"})
        slow.reset(seed=1)
        with ThreadPoolExecutor(8) as pool:
            blocked = pool.submit(slow.step, {"tool": "wait", "params": {}})
            verify = f"/v1/sessions/{slow.session_id}/verify"
            wait_for(lambda: call(url, "POST", verify, {})[0] == 409, what="the slow step to be running")

            def episode(n: int) -> tuple[str, bool | None]:
                with RemoteEnv(url, PROBE, kwargs={"label": f"p{n}"}) as env:
                    first = env.reset(task={"n": n}, seed=n)
                    env.step({"tool": "echo", "params": {"text": f"hi {n}"}})
                    env.step({"tool": "done", "params": {}})
                    return first.observation, env.verify()

            others = [pool.submit(episode, n) for n in range(12)]
            results = [f.result(timeout=20) for f in others]
            assert results == [(f"probe p{n} task={{'n': {n}}} seed={n}", True) for n in range(12)]
            assert not blocked.done()  # still waiting: it held up none of the twelve
            status, busy = call(
                url, "POST", f"/v1/sessions/{slow.session_id}/step", {"action": {"tool": "echo"}}
            )
            assert status == 409 and busy["error"]["code"] == "session_busy", busy
            probe.gate.set()
            assert blocked.result(timeout=10).observation == "wait"
        slow.close()
        assert len(probe.closed) == 13


def test_timesteps_round_trip_exactly_and_what_json_would_alter_is_refused(probe):
    with served_in_thread(PROBE) as url, RemoteEnv(url, PROBE) as env:
        env.reset(task={"deep": [1, {"x": None}]}, seed=-5)
        ts = env.step({"tool": "echo", "params": {"text": "é\u2028\x00", "k": [1.5, None, True]}})
        local = ProbeEnv()
        local.reset()
        assert ts == local.step({"tool": "echo", "params": {"text": "é\u2028\x00", "k": [1.5, None, True]}})
        assert ts.info["nested"]["f"] == 0.30000000000000004 and str(ts.info["nested"]["neg"]) == "-0.0"
        with pytest.raises(EnvServiceError) as odd:
            env.step({"tool": "odd", "params": {}})
        assert (odd.value.code, odd.value.field) == ("env_output", "timestep.info.pair")
        assert odd.value.status == 500
        assert env.step({"tool": "deadline"}).info == {"left": None}
        timed = TimeoutWrapper(env, 100, threaded=False)  # its deadline reaches the server's env
        timed.reset(seed=1)
        assert timed.step({"tool": "deadline"}).info == {"left": 100}


def test_requests_are_refused_naming_the_field_and_the_value(probe):
    with served_in_thread(PROBE, max_sessions=2, max_body_bytes=2048, env_args='{"label": "fixed"}') as url:
        assert len(probe.closed) == 1  # --env-args were tried on one env, closed again
        sid = session(url)
        cases = [
            ("POST", "/v1/sessions/nope/reset", {}, 404, "session_id", "nope"),
            ("DELETE", "/v1/sessions/" + "a" * 32, None, 404, "session_id", "a" * 32),
            ("POST", f"/v1/sessions/{sid}/step", {"action": {"tool": "echo"}}, 409, "session_id", sid),
            ("POST", f"/v1/sessions/{sid}/reset", {"seed": 1, "sed": 2}, 400, "sed", 2),
            ("POST", f"/v1/sessions/{sid}/reset", {"seed": "7"}, 400, "seed", "7"),
            ("POST", f"/v1/sessions/{sid}/reset", {"seed": True}, 400, "seed", True),
            ("POST", f"/v1/sessions/{sid}/step", {"action": "ls"}, 400, "action", "ls"),
            ("POST", f"/v1/sessions/{sid}/step", {"action": {"tool": 7}}, 400, "action.tool", 7),
            (
                "POST",
                f"/v1/sessions/{sid}/step",
                {"action": {"tool": "echo", "cmd": "x"}},
                400,
                "action.cmd",
                "x",
            ),
            ("POST", f"/v1/sessions/{sid}/step", {}, 400, "action", None),
            (
                "POST",
                f"/v1/sessions/{sid}/step",
                {"action": {"tool": "echo"}, "timeout_s": -1},
                400,
                "timeout_s",
                -1,
            ),
            ("POST", "/v1/sessions", {"kwargs": {"label": "mine"}}, 400, "kwargs.label", "mine"),
            ("POST", "/v1/sessions", {"kwargs": {"backend": "local"}}, 400, "kwargs.backend", "local"),
            ("POST", "/v1/sessions", {"env": "calc"}, 400, "env", "calc"),
            ("POST", "/v1/sessions", {"kwargs": [1]}, 400, "kwargs", "[1]"),
            ("POST", "/v1/sessions", b'{"env": ', 400, "body", None),
            ("POST", "/v1/sessions", b"[]", 400, "body", "[]"),
        ]
        for method, path, body, status, field, value in cases:
            got, answer = call(url, method, path, body)
            assert (got, answer["error"]["field"], answer["error"]["value"]) == (status, field, value), answer
            assert field in answer["error"]["message"]
        assert call(url, "POST", "/v1/sessions", {}, **{"Content-Type": "text/plain"})[0] == 415
        assert call(url, "POST", "/v1/sessions", {}, Host="evil.example")[0] == 421
        assert call(url, "POST", "/v1/sessions", {"kwargs": {"x": "y" * 4096}})[0] == 413
        assert call(url, "GET", "/v1/sessions/x/observation", b"{}")[0] == 400
        session(url)
        full, answer = call(url, "POST", "/v1/sessions", {})
        assert full == 429 and answer["error"]["code"] == "too_many_sessions"


def test_tasks_are_limited_to_the_served_ones_unless_any(tmp_path):
    with served_in_thread("calc") as url:  # calc ships a task file: those tasks, or none
        sid = session(url)
        served = {"expression": "3 + 4", "task_id": "calc-add-small"}
        assert call(url, "POST", f"/v1/sessions/{sid}/reset", {"task": served})[0] == 200
        assert call(url, "POST", f"/v1/sessions/{sid}/reset", {"seed": 5})[0] == 200
        status, answer = call(
            url, "POST", f"/v1/sessions/{sid}/reset", {"task": {**served, "expression": "1+1"}}
        )
        assert (status, answer["error"]["field"], answer["error"]["code"]) == (400, "task", "task_not_served")
        status, answer = call(url, "POST", f"/v1/sessions/{sid}/reset", {"task": {"expression": "1+1"}})
        assert (status, answer["error"]["field"]) == (400, "task.task_id")
    with served_in_thread("calc", tasks="any") as url:
        sid = session(url)
        assert call(url, "POST", f"/v1/sessions/{sid}/reset", {"task": {"expression": "1+1"}})[0] == 200


def test_idle_deleted_and_left_open_sessions_have_their_env_closed(probe):
    with served_in_thread(PROBE, idle_timeout_s=0.3) as url:
        probe.closed.clear()  # the server made and closed one env to check its arguments
        idle = RemoteEnv(url, PROBE)
        idle.reset()
        wait_for(lambda: len(probe.closed) == 1, timeout_s=10, what="the idle session's env closed")
        with pytest.raises(EnvServiceError) as gone:
            idle.step({"tool": "echo", "params": {}})
        assert gone.value.status == 404 and gone.value.field == "session_id"
        idle.close()  # the server closed it already: fine
    with served_in_thread(PROBE) as url:
        probe.closed.clear()
        deleted, left_open = RemoteEnv(url, PROBE), RemoteEnv(url, PROBE)
        deleted.close()
        assert len(probe.closed) == 1 and left_open.session_id is not None
    assert len(probe.closed) == 2  # the server's shutdown closed the one left open


def test_keys_are_required_off_loopback_and_checked(probe):
    with pytest.raises(EnvError, match=r"--host '0\.0\.0\.0'"):
        EnvServiceConfig().check_exposure("0.0.0.0")
    with served_in_thread(PROBE, api_key_hashes=hash_key("s3cret")) as url:
        with pytest.raises(EnvServiceError) as refused:
            RemoteEnv(url, PROBE, api_key="wrong")
        assert refused.value.status == 401
        with RemoteEnv(url, PROBE, api_key="s3cret") as env:
            assert env.reset(seed=2).observation == "probe x task=None seed=2"


# What a client must never choose for a served sandbox: the backend, its limits, running unisolated,
# the Docker engine and the image. Values a hostile client would send.
OPERATOR_ONLY = {
    "backend": "local",
    "limits": {"network": True, "cpu_s": 100000},
    "unisolated": True,
    "docker_host": "tcp://10.1.2.3:2375",
    "image": "attacker/image:latest",
}
# What an operator may set with --env-args (two servers: the local and the Docker backend's own).
OPERATOR_SET = [
    {"backend": "local", "limits": {"cpu_s": 5}, "unisolated": True},
    {"backend": "docker", "docker_host": "unix:///nonexistent/docker.sock", "image": "agentstream-sandbox:x"},
]


def refuses_operator_kwargs(url: str) -> None:
    for name, value in OPERATOR_ONLY.items():
        status, answer = call(url, "POST", "/v1/sessions", {"kwargs": {"max_steps": 3, name: value}})
        error = answer.get("error") or {}
        shown = value if isinstance(value, str | bool) else repr(value)
        assert (status, error.get("code"), error.get("field"), error.get("value")) == (
            400, "operator_kwarg", f"kwargs.{name}", shown,
        ), answer  # fmt: skip
        assert f"--env-args '{{\"{name}\": ...}}'" in error["message"], error


def test_a_client_may_not_set_what_only_the_operator_sets(tmp_path):
    with app_in_thread("sandbox") as (url, app):
        refuses_operator_kwargs(url)
        assert len(app["sessions"]) == 0  # nothing was made for a refused request
        sid = session(url, max_steps=3)  # what is the client's to choose still is
        assert app["sessions"].get(sid).env.max_steps == 3
    for env_args in OPERATOR_SET:
        with app_in_thread("sandbox", env_args=orjson.dumps(env_args).decode()) as (url, app):
            refuses_operator_kwargs(url)  # set by the operator or not, never by a client
            env = app["sessions"].get(session(url, max_steps=4)).env
            expected = dict(env_args)
            if "limits" in expected:  # a JSON object of `Limits` fields becomes a checked `Limits`
                expected["limits"] = Limits(**expected["limits"])
            assert {name: getattr(env, name) for name in env_args} == expected
            assert env.max_steps == 4


def test_a_served_sandbox_session_runs_isolated():
    with app_in_thread("sandbox") as (url, app), RemoteEnv(url, "sandbox") as env:
        env.reset(seed=0)
        whoami = env.step({"tool": "shell", "params": {"command": "id -u"}})
        box = app["sessions"].get(env.session_id).env.sandbox
        assert box is not None and box.isolation["missing"] == [], box.isolation
        assert all(box.isolation[k] for k in ("filesystem", "network", "processes")), box.isolation
        if box.isolation["backend"] == "local":  # the agent is the sandbox's own nobody, not our root
            assert whoami.observation.split()[0] == str(box.isolation["user"]) != "0", whoami


def test_the_rollout_command_runs_its_episodes_on_a_served_env(tmp_path, broker):
    from producers.envs.tasks import BUILTIN_DIR
    from schemas.topics import AGENT_EVENTS
    from tests.support.openai_stub import scripted_openai
    from tests.support.readback import read_topic

    tasks = tmp_path / "tasks.jsonl"  # three of the built-in tasks, which the server serves
    tasks.write_text("\n".join((BUILTIN_DIR / "calc.jsonl").read_text().splitlines()[:3]) + "\n")
    with served_by_the_command(tmp_path, "calc") as (url, server), scripted_openai() as (policy, asked):
        argv = ["rollout", "--env", "calc", "--env-url", url, "--tasks", str(tasks), "--group-size", "2",
                "--concurrency", "3", "--policy-url", policy, "--bootstrap-servers", broker.bootstrap,
                "--data-dir", str(tmp_path / "rollout")]  # fmt: skip
        rollout = Proc(agentstream_argv(*argv), tmp_path / "rollout.log")
        try:
            code = rollout.popen.wait(timeout=60)
        finally:
            rollout.stop()
        out = rollout.log_text()
        assert code == 0 and "[rollout] 6 episodes, 6 solved" in out, out[-3000:]
        log = server.log_text()
        assert log.count(" opened (") == 6 and log.count(" closed by the client (") == 6, log[-3000:]
    assert len(asked) == 12  # two turns an episode: the calculator, then the answer
    records = read_topic(broker.bootstrap, AGENT_EVENTS, min_records=6 * 4, timeout_s=30)
    episodes: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
        episodes.setdefault(r["value"]["trajectory_id"], []).append(r["value"])
    assert len(episodes) == 6
    for events in episodes.values():
        assert [e["type"] for e in events] == ["episode.started", *["step.recorded"] * 2, "episode.ended"]
        assert [e["tool"] for e in events[1:3]] == ["calculator", "submit"]
        assert events[2]["observation"].endswith(": correct"), events[2]
        assert events[-1]["success"] is True and events[-1]["outcome_source"] == "env.verify"
