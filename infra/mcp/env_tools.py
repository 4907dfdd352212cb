"""Tools over the environments: `list_environments`, `sandbox_run` (an isolated sandbox) and `rollout`
(episodes against a policy server, recorded through the SDK like `agentstream rollout`).

`sandbox_run` always uses an isolated sandbox (`make_sandbox("auto")`: bubblewrap, else the Docker
sandbox, else a refusal; never the host): a fresh private workspace per call, removed after it,
commands under its limits and without network (what is enforced comes back as `isolation`).

`rollout` calls only the policy endpoints configured for the stack: the `policy_urls` of
`McpConfig` and the stack's own policy server (the address `agentstream up --policy` writes to
`<data dir>/run/policy.ready`); any other URL (the chDB endpoint, a metadata service, a web site)
is refused before a single request is sent. It then checks that something answers at the policy URL
(not following redirects), so a missing policy server is one clear error rather than a client's
retry loop.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from infra.mcp.config import McpConfig, policy_endpoint
from infra.mcp.errors import McpToolError
from infra.mcp.values import jsonable

MAX_SANDBOX_TIMEOUT_S = 120.0
MAX_ROLLOUT_EPISODES = 32
STACK_POLICY_READY = "run/policy.ready"  # written by `agentstream up --policy` (infra/stack.py)


def list_environments(config: McpConfig, env: str | None = None) -> dict[str, Any]:
    """Every registered environment (id, domain, description, terminal tools, built-in task ids);
    with `env`, only that one."""
    import producers.envs as envs

    ids = envs.list_envs()
    if env:
        if env not in ids:
            raise McpToolError(f"env {env!r}: unknown environment; registered: {', '.join(ids)}")
        ids = [env]
    return {"environments": [_describe(envs, name) for name in ids]}


def _describe(envs, name: str) -> dict[str, Any]:
    spec = envs.spec(name)
    try:
        tasks = [t.task_id for t in envs.builtin_tasks(name)]
    except envs.EnvError:
        tasks = []
    try:
        terminal = sorted(spec.make().terminal_tools)
    except Exception:  # a factory that needs arguments the registry lacks (e.g. a task file)
        terminal = []
    return {
        "id": name,
        "domain": spec.domain,
        "description": spec.description,
        "terminal_tools": terminal,
        "builtin_tasks": tasks,
    }


def sandbox_run(
    config: McpConfig,
    command: str | list[str],
    files: dict[str, str] | None = None,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    """Run `command` (a shell script string, or an argv list) in a fresh isolated sandbox
    (`make_sandbox("auto")`) after writing `files` (relative path -> text) into its workspace."""
    from producers.sandbox.choice import make_sandbox
    from producers.sandbox.local import Limits

    if not 0 < timeout_s <= MAX_SANDBOX_TIMEOUT_S:
        raise McpToolError(f"timeout_s: must be in (0, {MAX_SANDBOX_TIMEOUT_S:g}], got {timeout_s!r}")
    limits = Limits(timeout_s=timeout_s, cpu_s=max(1, int(timeout_s)))
    with make_sandbox("auto", limits=limits) as box:  # isolated or refused: never on the host
        for path, content in (files or {}).items():
            written = box.run("file_write", {"path": path, "content": content})
            if not written.ok:
                raise McpToolError(f"files[{path!r}]: {written.error}")
        result = box.run("shell", {"command": command, "timeout_s": timeout_s})
        return jsonable(
            {
                "output": result.output,
                "exit_code": result.exit_code,
                "error": result.error,
                "timed_out": result.timed_out,
                "duration_ms": round(result.duration_ms, 1),
                "isolation": box.isolation,
                "limits": vars(limits),
            }
        )


def stack_policy_url(data_dir: Path) -> str | None:
    """The OpenAI base URL of the stack's policy server, from the `host:port` its ready file holds
    (None when the stack runs none)."""
    try:
        address = (Path(data_dir) / STACK_POLICY_READY).read_text().strip()
    except OSError:
        return None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # bound everywhere: call loopback
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"


def allowed_policy_urls(config: McpConfig) -> list[str]:
    """The policy endpoints `rollout` may call, normalised, the stack's own first."""
    stack = stack_policy_url(config.data_dir)
    urls = [stack] if stack else []
    return list(dict.fromkeys(policy_endpoint(u, "policy_urls") for u in [*urls, *config.policy_urls]))


def chosen_policy_url(config: McpConfig, policy_url: str | None) -> str:
    """`policy_url`'s normalised form when it is one of the configured endpoints (default: the
    first of them); anything else is refused here, before any request is sent to it. The checked
    form is what is called: the caller's text may hold what the check's parser drops but an HTTP
    client reads otherwise (`urlsplit` deletes tabs and newlines anywhere in a URL)."""
    allowed = allowed_policy_urls(config)
    if not policy_url:
        if not allowed:
            raise McpToolError("policy_url: none given and no policy endpoint is configured")
        return allowed[0]
    if policy_endpoint(policy_url) not in allowed:
        raise McpToolError(
            f"policy_url={policy_url!r}: not a policy endpoint configured for this stack "
            f"(allowed: {', '.join(allowed) or 'none'}); add it with --policy-urls or "
            "AGENTSTREAM_MCP_POLICY_URLS"
        )
    return policy_endpoint(policy_url)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, never a second request (it could lead anywhere)."""

    def redirect_request(self, *args, **kwargs):
        return None


def check_policy_answers(policy_url: str, timeout_s: float = 3.0) -> None:
    """Raise McpToolError unless an HTTP server answers at `policy_url` (any status counts)."""
    opener = urllib.request.build_opener(_NoRedirects)
    try:
        with opener.open(policy_url.rstrip("/") + "/models", timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return  # it answered, if not with a model list
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise McpToolError(
            f"policy_url {policy_url!r}: no policy server answers there ({reason}); start one with "
            "`agentstream policy` (or `agentstream up --policy`) or pass the URL of an "
            "OpenAI-compatible endpoint"
        ) from None


def rollout(
    config: McpConfig,
    policy_url: str | None = None,
    env: str = "calc",
    task_ids: list[str] | None = None,
    group_size: int = 1,
    max_turns: int = 4,
    model: str = "policy",
    max_tasks: int = 1,
) -> dict[str, Any]:
    """Episodes of `env`'s first `max_tasks` built-in tasks (or of `task_ids` among them) against
    the configured policy at `policy_url`, recorded to the broker; returns one result per episode."""
    from producers.rollout.driver import RolloutConfig

    policy_url = chosen_policy_url(config, policy_url)
    tasks = _tasks(env, task_ids)[: max(0, max_tasks)] if not task_ids else _tasks(env, task_ids)
    if not 1 <= len(tasks) * group_size <= MAX_ROLLOUT_EPISODES:
        raise McpToolError(
            f"group_size={group_size!r} x {len(tasks)} task(s): "
            f"from 1 to {MAX_ROLLOUT_EPISODES} episodes per call"
        )
    check_policy_answers(policy_url)
    rollout_config = RolloutConfig(
        env=env, policy_url=policy_url, model=model, group_size=group_size, concurrency=1, max_turns=max_turns
    )
    results = _run_recorded(config, rollout_config, tasks)
    episodes = [vars(r) for r in results]
    return jsonable({"env": env, "episodes": episodes, "solved": sum(r.success for r in results)})


def _tasks(env: str, task_ids: list[str] | None):
    import producers.envs as envs

    if env not in envs.list_envs():
        raise McpToolError(f"env {env!r}: unknown environment; registered: {', '.join(envs.list_envs())}")
    try:
        tasks = [t for t in envs.builtin_tasks(env) if t.env == env]
    except envs.EnvError as exc:
        raise McpToolError(f"env {env!r}: {exc}") from None
    if task_ids:
        known = {t.task_id for t in tasks}
        unknown = [t for t in task_ids if t not in known]
        if unknown:
            raise McpToolError(
                f"task_ids: {unknown} are not built-in tasks of {env!r}; known: {sorted(known)}"
            )
        tasks = [t for t in tasks if t.task_id in task_ids]
    return tasks


def _run_recorded(config: McpConfig, rollout_config, tasks) -> list:
    from producers.rollout.driver import run_recorded

    return run_recorded(
        rollout_config, tasks, config.bootstrap_servers, str(config.data_dir), close_timeout_s=30
    )
