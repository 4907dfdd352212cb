"""The served environment's wire contract: request bodies checked field by field, `TimeStep` as JSON
that comes back exactly as it left, and the error body. Pure: no HTTP, no env.

A `TimeStep` on the wire is `{"observation": str, "reward": number, "terminated": bool,
"truncated": bool, "info": object}`. JSON cannot carry everything Python can, so a value that would
not come back equal (a tuple, a non-string key, NaN, an int beyond 64 bits, an object) is refused
with the path to it rather than altered: what a client reads is what the env answered, or an error.

Every refusal is an `EnvServiceError` naming the field and the value; a field not in the contract is
refused, never dropped (docs/environment-protocol.md has the status codes).
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from producers.envs.errors import EnvServiceError
from producers.envs.protocol import TimeStep
from schemas.limits import MAX_ID_CHARS, MAX_JSON_DEPTH

API = "/v1"
TIMESTEP_FIELDS = ("observation", "reward", "terminated", "truncated", "info")
ACTION_FIELDS = ("tool", "params", "thought")
INT_RANGE = (-(2**63), 2**64 - 1)  # what orjson writes and reads back
MAX_STEP_TIMEOUT_S = 24 * 3600.0


def preview(value: Any, limit: int = 200) -> Any:
    """A bounded copy of a refused value for an error body: short scalars as they are, else text.

    >>> preview(3), preview("x" * 300)[-3:], preview({"a": 1})
    (3, '...', "{'a': 1}")
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and INT_RANGE[0] <= value <= INT_RANGE[1]:
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def bad_request(field: str, value: Any, message: str, code: str = "invalid_field") -> EnvServiceError:
    """A 400 naming `field` and `value`: `message` says what was expected."""
    return EnvServiceError(400, code, f"{field}: {message}, got {preview(value)!r}", field, preview(value))


def json_problem(value: Any, path: str, depth: int = 1) -> tuple[str, Any, str] | None:
    """The first place in `value` that JSON would not carry back exactly, as (path, value, why);
    None when it round-trips.

    >>> json_problem({"a": [1, 2.5, None, "x", True]}, "info")
    >>> json_problem({"a": (1, 2)}, "info")[0], json_problem({1: 2}, "info")[2]
    ('info.a', 'a key that is not a string')
    >>> json_problem({"r": float("nan")}, "info")[2]
    'a float that is not finite'
    """
    if depth > MAX_JSON_DEPTH:
        return path, "...", f"nested deeper than {MAX_JSON_DEPTH} levels"
    if value is None or isinstance(value, bool | str):
        return None
    if isinstance(value, int):
        ok = INT_RANGE[0] <= value <= INT_RANGE[1]
        return None if ok else (path, value, "an integer beyond 64 bits")
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, value, "a float that is not finite")
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = json_problem(item, f"{path}[{index}]", depth + 1)
            if found:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return path, key, "a key that is not a string"
            found = json_problem(item, f"{path}.{key}", depth + 1)
            if found:
                return found
        return None
    return path, value, f"a {type(value).__name__}, which JSON does not carry back as such"


def checked_json(value: Any, field: str) -> Any:
    """`value` when it is JSON that round-trips, else a 400 naming where it is not."""
    found = json_problem(value, field)
    if found:
        raise bad_request(found[0], found[1], f"expected JSON ({found[2]})")
    return value


def timestep_to_wire(ts: TimeStep) -> dict[str, Any]:
    """`ts` as the wire carries it; an env answer JSON would alter is a 500 (`env_output`) naming
    the path, since it is the env's fault, not the client's."""
    if not isinstance(ts, TimeStep):
        raise EnvServiceError(500, "env_output", f"the env answered {preview(ts)!r}, not a TimeStep")
    body = {name: getattr(ts, name) for name in TIMESTEP_FIELDS}
    kinds = {
        "observation": (str, "a string"),
        "reward": (int | float, "a number"),
        "terminated": (bool, "a bool"),
        "truncated": (bool, "a bool"),
        "info": (dict, "a dict"),
    }
    for name, (kind, label) in kinds.items():
        value = body[name]
        if not isinstance(value, kind) or (name == "reward" and isinstance(value, bool)):
            message = f"timestep.{name}: the env answered {preview(value)!r}, expected {label}"
            raise EnvServiceError(500, "env_output", message, f"timestep.{name}", preview(value))
    found = json_problem(body, "timestep")
    if found:
        path, value, why = found
        message = f"{path}: the env answered {why} ({preview(value)!r}); the wire carries JSON only"
        raise EnvServiceError(500, "env_output", message, path, preview(value))
    return body


def timestep_from_wire(body: Any, where: str = "timestep") -> TimeStep:
    """The `TimeStep` a server answered; anything off the contract raises `EnvServiceError` (502)."""

    def wrong(field: str, value: Any, expected: str) -> EnvServiceError:
        message = f"{where}: field {field!r}: expected {expected}, got {preview(value)!r}"
        return EnvServiceError(502, "bad_response", message, field, preview(value))

    if not isinstance(body, dict):
        raise wrong(where, body, "an object")
    unknown = sorted(set(body) - set(TIMESTEP_FIELDS))
    if unknown:
        raise wrong(unknown[0], body[unknown[0]], f"only the fields {list(TIMESTEP_FIELDS)}")
    observation, reward = body.get("observation"), body.get("reward")
    if not isinstance(observation, str):
        raise wrong("observation", observation, "a string")
    if not isinstance(reward, int | float) or isinstance(reward, bool):
        raise wrong("reward", reward, "a number")
    for name in ("terminated", "truncated"):
        if not isinstance(body.get(name), bool):
            raise wrong(name, body.get(name), "true or false")
    if not isinstance(body.get("info"), dict):
        raise wrong("info", body.get("info"), "an object")
    return TimeStep(observation, reward, body["terminated"], body["truncated"], body["info"])


def request_object(raw: bytes, allowed: tuple[str, ...]) -> dict[str, Any]:
    """A request body as a JSON object with only `allowed` fields (an empty body is `{}`)."""
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise EnvServiceError(400, "invalid_json", f"body: not valid JSON ({exc})", "body") from None
    if not isinstance(body, dict):
        raise bad_request("body", body, "expected a JSON object")
    refuse_unknown(body, allowed, "")
    return body


def refuse_unknown(body: dict[str, Any], allowed: tuple[str, ...], prefix: str) -> None:
    """A 400 naming the first field of `body` that is not in `allowed` (`prefix`: its parent)."""
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        field = prefix + unknown[0]
        message = f"unknown field (accepted: {', '.join(allowed) or 'none'})"
        raise EnvServiceError(
            400, "unknown_field", f"{field}: {message}; unknown: {unknown}", field, preview(body[unknown[0]])
        )


def parse_create(body: dict[str, Any], served: str) -> dict[str, Any]:
    """The keyword arguments a create request asks for; `env`, when given, must be the served id.
    Which names a session may set is the server's to check (`config.session_kwargs`)."""
    env = body.get("env", served)
    if env != served:
        raise bad_request("env", env, f"this server serves {served!r}", code="wrong_env")
    kwargs = body.get("kwargs") or {}
    if not isinstance(kwargs, dict):
        raise bad_request("kwargs", kwargs, "expected an object of keyword arguments")
    return checked_json(kwargs, "kwargs")


def parse_reset(body: dict[str, Any]) -> tuple[Any, int | None]:
    """(task, seed) of a reset request: any JSON task (null: the env draws one), an integer seed."""
    seed = body.get("seed")
    if seed is not None and (
        not isinstance(seed, int) or isinstance(seed, bool) or not -(2**63) <= seed < 2**63
    ):
        raise bad_request("seed", seed, "expected an integer from -2**63 to 2**63-1 or null")
    return checked_json(body.get("task"), "task"), seed


def parse_step(body: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
    """(action, timeout_s) of a step request. The action is `{"tool": str, "params"?, "thought"?}`;
    `params` is passed on whatever JSON it is (the env answers a non-object as a tool error, as
    in-process); `timeout_s` is what is left of the caller's step deadline."""
    if "action" not in body:
        raise bad_request("action", None, "required: an object {tool, params, thought}")
    action = body["action"]
    if not isinstance(action, dict):
        raise bad_request("action", action, "expected an object {tool, params, thought}")
    refuse_unknown(action, ACTION_FIELDS, "action.")
    tool = action.get("tool")
    if not isinstance(tool, str) or not 0 < len(tool) <= MAX_ID_CHARS:
        raise bad_request("action.tool", tool, f"expected a tool name of 1 to {MAX_ID_CHARS} characters")
    thought = action.get("thought")
    if thought is not None and not isinstance(thought, str):
        raise bad_request("action.thought", thought, "expected a string or null")
    checked_json(action.get("params"), "action.params")
    timeout_s = body.get("timeout_s")
    if timeout_s is not None and (
        not isinstance(timeout_s, int | float)
        or isinstance(timeout_s, bool)
        or not 0 <= timeout_s <= MAX_STEP_TIMEOUT_S
    ):
        raise bad_request(
            "timeout_s", timeout_s, f"expected seconds from 0 to {MAX_STEP_TIMEOUT_S:g} or null"
        )
    return action, None if timeout_s is None else float(timeout_s)


def parse_env_args(text: str, flag: str) -> dict[str, Any]:
    """A command line's JSON object of env keyword arguments (`{}` when empty); `EnvServiceError`
    naming the flag otherwise.

    >>> parse_env_args('{"backend": "local"}', "--env-args"), parse_env_args("", "--env-args")
    ({'backend': 'local'}, {})
    """
    if not text or not text.strip():
        return {}
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise EnvServiceError(
            400, "invalid_json", f"{flag}: not valid JSON ({exc}): {text[:200]!r}", flag
        ) from None
    if not isinstance(value, dict):
        raise bad_request(flag, value, "expected a JSON object of keyword arguments")
    return checked_json(value, flag)
