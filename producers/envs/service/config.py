"""What `agentstream env serve` is told (`EnvServiceConfig`) and the two choices it makes for every
request from that: which keyword arguments a session may set (`session_kwargs`), and which tasks a
reset may name (`TaskGate`).

Keyword arguments given with `--env-args` are the operator's: fixed for every session, never
overridden by a client (serve `sandbox` with `{"backend": "docker"}` and no client gets another
backend). Some an env declares the operator's alone (`operator_kwargs` on its class: a sandbox's
backend, limits, `unisolated`, Docker engine and image), so a client can neither switch isolation
off nor aim the server at another engine, whether or not the operator set them. A client may set the
factory's other parameters.

Tasks: a reset's task comes from the client, and some envs act on what a task names on the host
(a sandbox task's `snapshot_dir` is copied into the workspace). So by default an env that ships
built-in tasks (`producers/envs/tasks/<id>.jsonl`) is served for those tasks only, plus resets with no
task (the env draws one from the seed); `--tasks FILE` serves the tasks of a file instead, and
`--tasks any` whatever a client sends.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

from producers.envs.errors import EnvError, EnvServiceError
from producers.envs.registry import EnvSpec
from producers.envs.service.wire import bad_request, parse_env_args, preview
from producers.envs.tasks import BUILTIN_DIR, builtin_tasks, load_tasks
from producers.gateway.requests import check_key_hashes, parse_key_hashes
from producers.policy.requests import LOOPBACK_HOSTS
from schemas.config_fields import check_bounds, option


@dataclass(frozen=True)
class EnvServiceConfig:
    """How `agentstream env serve` serves an environment. Documented fields are its options."""

    env_args: str = option(
        "",
        'JSON object of env keyword arguments fixed for every session, e.g. \'{"backend": "docker"}\' '
        "(a session may set only the factory's other parameters)",
        env="AGENTSTREAM_ENV_ARGS",
    )
    tasks: str = option(
        "",
        "tasks a reset may name: a JSONL task file, `builtin` (the env's own task file) or `any`; "
        "default: builtin when the env ships a task file, else any. A reset without a task is always allowed",
        env="AGENTSTREAM_ENV_TASKS",
    )
    max_sessions: int = option(
        64, "sessions open at once (429 above)", env="AGENTSTREAM_ENV_MAX_SESSIONS", ge=1
    )
    idle_timeout_s: float = option(
        600.0,
        "close a session (and its env) no request has used for this long; a running step is not idle",
        env="AGENTSTREAM_ENV_IDLE_TIMEOUT_S",
        gt=0,
    )
    max_body_bytes: int = option(
        4 * 1024 * 1024, "request size limit (413 above)", env="AGENTSTREAM_ENV_MAX_BODY_BYTES", ge=1024
    )
    api_key_hashes: frozenset[str] | tuple[str, ...] = option(
        (),
        "comma-separated sha256 hex digests of accepted API keys (`agentstream gateway-key KEY`); "
        "none: no key needed (loopback only)",
        env="AGENTSTREAM_ENV_API_KEY_HASHES",
    )
    allowed_hosts: tuple[str, ...] = option(
        (),
        "comma-separated Host header values accepted besides the loopback names with the bound port; "
        "others get 421",
        env="AGENTSTREAM_ENV_ALLOWED_HOSTS",
    )

    def __post_init__(self):
        object.__setattr__(self, "api_key_hashes", parse_key_hashes(self.api_key_hashes))
        check_key_hashes(self.api_key_hashes)
        check_bounds(self, EnvError)
        parse_env_args(self.env_args, "--env-args")
        hosts = self.allowed_hosts
        hosts = hosts.split(",") if isinstance(hosts, str) else hosts
        object.__setattr__(self, "allowed_hosts", tuple(h.strip().lower() for h in hosts if h.strip()))

    @property
    def fixed_kwargs(self) -> dict[str, Any]:
        """The operator's keyword arguments (`--env-args`)."""
        return parse_env_args(self.env_args, "--env-args")

    def check_exposure(self, host: str) -> None:
        """Refuse to serve a non-loopback address without API keys: anyone who reaches the port could
        run the env's tools (EnvError naming the address)."""
        if host not in LOOPBACK_HOSTS and not self.api_key_hashes:
            raise EnvError(
                f"--host {host!r}: an env server reachable beyond this machine needs API keys "
                "(--api-key-hashes or AGENTSTREAM_ENV_API_KEY_HASHES, comma-separated sha256 hex from "
                "`agentstream gateway-key KEY`); refusing to start without one"
            )


def factory_parameters(spec: EnvSpec) -> set[str] | None:
    """The keyword names the env's factory takes (None: any, it has `**kwargs`)."""
    try:
        signature = inspect.signature(spec.factory)
    except (TypeError, ValueError):
        return None
    names = set()
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if param.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            names.add(param.name)
    return names


def operator_kwargs(spec: EnvSpec) -> frozenset[str]:
    """The keyword arguments of `spec`'s env that only the operator sets (`--env-args`): the
    `operator_kwargs` its factory declares (a class attribute; a `functools.partial` is looked
    through), none when it declares none. A declaration that is not a set of parameter names of the
    factory is refused (EnvError naming it): a misspelt name would protect nothing."""
    factory = spec.factory
    while isinstance(factory, functools.partial):
        factory = factory.func
    declared = getattr(factory, "operator_kwargs", frozenset())
    if not isinstance(declared, frozenset | set) or not all(isinstance(n, str) for n in declared):
        raise EnvError(
            f"{spec.id!r}: operator_kwargs must be a frozenset of parameter names, got {declared!r}"
        )
    known = factory_parameters(spec)
    if known is not None and not declared <= known:
        raise EnvError(
            f"{spec.id!r}: operator_kwargs names {sorted(declared - known)}, which its factory does not "
            f"take (it takes {sorted(known)})"
        )
    return frozenset(declared)


def check_fixed_kwargs(spec: EnvSpec, fixed: dict[str, Any]) -> None:
    """The operator's `--env-args` must all be parameters of the env's factory, with values it takes:
    one env is made from them (and closed) before serving, so a bad value fails the command rather
    than every session (EnvError naming it). A factory that needs more than them is left to sessions."""
    known = factory_parameters(spec)
    for name in fixed:
        if known is not None and name not in known:
            raise EnvError(f"--env-args: {spec.id!r} takes no argument {name!r}; it takes {sorted(known)}")
    try:
        spec.make(**fixed).close()
    except TypeError:  # a parameter without a default, which each session gives
        return
    except (EnvError, ValueError) as exc:
        raise EnvError(f"--env-args: {spec.id!r} refuses {fixed}: {exc}") from None


def session_kwargs(spec: EnvSpec, fixed: dict[str, Any], asked: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments a session's env is made with: the operator's `fixed` ones and what the
    client `asked` for, which may name none of the operator's own (`operator_kwargs`, 400
    `operator_kwarg`), no fixed one (400 `fixed_kwarg`) and none the factory does not take (400)."""
    known, operator = factory_parameters(spec), operator_kwargs(spec)
    for name, value in asked.items():
        field = f"kwargs.{name}"
        if name in operator:
            example = f"--env-args '{{\"{name}\": ...}}'"
            raise EnvServiceError(
                400, "operator_kwarg",
                f"{field}: only the server's operator sets it (`agentstream env serve {spec.id} "
                f"{example}`), not a client; got {preview(value)!r}",
                field, preview(value),
            )  # fmt: skip
        if name in fixed:
            raise EnvServiceError(
                400, "fixed_kwarg", f"{field}: fixed by the server (--env-args), got {preview(value)!r}",
                field, preview(value),
            )  # fmt: skip
        if known is not None and name not in known:
            raise bad_request(field, value, f"{spec.id!r} takes no such argument (it takes {sorted(known)})")
    return {**fixed, **asked}


class TaskGate:
    """Which tasks a reset may name (see the module docstring). A listed task is matched by its
    `task_id` and must equal the listed one exactly (`Task.reset_task`)."""

    def __init__(self, env: str, choice: str):
        self.env = env
        self.tasks: dict[str, dict[str, Any]] | None
        if choice == "any" or (not choice and not (BUILTIN_DIR / f"{env}.jsonl").is_file()):
            self.source, self.tasks = "any", None
            return
        listed = builtin_tasks(env) if choice in ("", "builtin") else load_tasks(choice)
        self.source = "builtin" if choice in ("", "builtin") else choice
        self.tasks = {t.task_id: t.reset_task for t in listed if t.env == env}

    def check(self, task: Any) -> None:
        """Nothing when a reset may name `task`; a 400 naming the field otherwise."""
        if self.tasks is None or task is None:
            return
        task_id = task.get("task_id") if isinstance(task, dict) else None
        if not isinstance(task_id, str) or task_id not in self.tasks:
            served = sorted(self.tasks)[:20]
            raise bad_request(
                "task.task_id",
                task_id,
                f"not a task this server serves (--tasks {self.source}: {served}); "
                "or send task null and a seed",
                code="task_not_served",
            )
        if task != self.tasks[task_id]:
            raise bad_request(
                "task", task_id, "differs from the served task of that id (--tasks " + self.source + ")",
                code="task_not_served",
            )  # fmt: skip
