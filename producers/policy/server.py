"""`agentstream policy`: the current policy behind an OpenAI-compatible API (aiohttp shell).

Endpoints:
- `POST /v1/chat/completions`: OpenAI chat completions. Every field is honoured or refused
  (openai_fields.py has the lists): honoured `model`, `messages`, `tools`, `tool_choice` (`none`:
  the model still sees the tools and any call comes back as text; `auto`; `required` and a named
  function: the template's call opening is appended to the prompt as tokens, see
  `service.force_call`), `n`, `temperature`, `top_p`, `top_k`, `max_tokens` /
  `max_completion_tokens`, `seed`, `logprobs`, `top_logprobs` (real alternatives), `stop` (up to 4
  strings, never in the returned text), `stream` (server-sent events, chat_stream.py) with
  `stream_options.include_usage`, `response_format` `{"type": "text"}` (JSON modes are a 400);
  some others only at their default (`frequency_penalty` 0, `parallel_tool_calls` true, ...); any
  other field is a 400 naming it in `param`. Recorded when the request names its episode (a
  streamed completion exactly once, as a plain one).
- `POST /v1/episodes/{trajectory_id}/chat/completions`: the same, recorded as the next
  `step.recorded` of that episode (or name it with the header `X-Agentstream-Trajectory`); the
  server counts the episode's steps, or the client gives the index (`X-Agentstream-Step-Index`,
  which also survives a server restart). With the header `X-Agentstream-Record: client` the
  server keeps the episode's token context but does not publish the step: the body gets an
  `agentstream` object with the fields it would have recorded (`token_ids`, `logprobs`,
  `prompt_token_ids`, `prompt_delta_start`, `token_continuity`, `token_continuity_break`,
  `token_rl_eligible`, `sampling`, `tokenizer_hash`, `policy_version`, `finish_reason`,
  `tool_call_malformed`, `input_tokens`, `output_tokens`, `latency_ms`, `step_index`), and the client
  records them with the observation in one `step.recorded` (the rollout driver does).
- `POST /v1/completions` with `prompt` as a list of token ids: token in, token out (`token_ids`,
  `prompt_token_ids` and logprobs per choice, as vLLM returns them, `logprobs` alternatives keyed
  `token_id:N` with vLLM's `return_tokens_as_token_ids`, `stop`, `skip_special_tokens`); what a
  recording proxy in front of this server calls. Not recorded. Its fields are checked the same way.
- `GET /v1/models`, `GET /healthz`.

Every response carries the header `x-agentstream-policy-version` (and `policy_version` in the
body). Errors are OpenAI-style JSON: 400 naming the field and the value (`context_length_exceeded`
as its code when the prompt and `max_tokens` do not fit the model), 401 (a key is configured and
the request has none or a wrong one; same key handling as the gateway), 404 unknown model, 413 over
the size limit, 415 a POST whose Content-Type is not application/json, 421 a Host header that is
not this server's, 500 (OpenAI-style too) for what the server did not expect.

What a web page can send is refused (issue #34): a page can POST `text/plain` or a form to
127.0.0.1 without a preflight (415), and a DNS-rebinding page reaches it under its own host name
(421: accepted are `localhost`, `127.0.0.1` and `[::1]` with the port the request came in on, the
address the request came in on, and `--allowed-hosts`). Binds 127.0.0.1 by default, and refuses to
start on another address without API keys. The agentstream headers are bounded: the step index is
ASCII digits up to `MAX_STEP_INDEX`, a trajectory id at most `MAX_ID_CHARS` characters. `/healthz`
answers whatever the Host, without a key. The pure parts are `requests.py` (config, request
checks), `turns.py` (token-in prompts), `service.py` (one completion, recording).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import orjson

from producers.gateway.requests import key_allowed, presented_key
from producers.http import serve_app
from producers.policy.api_errors import ApiError
from producers.policy.chat_stream import stream_chat
from producers.policy.requests import (
    LOOPBACK_HOSTS,
    PolicyConfig,
    check_context,
    parse_chat,
    parse_completion,
)
from schemas.limits import MAX_ID_CHARS, MAX_STEP_INDEX

log = logging.getLogger(__name__)

VERSION_HEADER = "x-agentstream-policy-version"
TRAJECTORY_HEADER = "X-Agentstream-Trajectory"
STEP_HEADER = "X-Agentstream-Step-Index"
RECORD_HEADER = "X-Agentstream-Record"


def create_app(config: PolicyConfig, service):
    """The aiohttp application serving `service` (a `PolicyService`)."""
    from aiohttp import web

    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[_middleware()])
    app["config"], app["service"] = config, service
    app["pool"] = ThreadPoolExecutor(config.generation_threads(), thread_name_prefix="agentstream-policy")
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/episodes/{trajectory_id}/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/healthz", _healthz)

    async def _close(app_):
        app_["pool"].shutdown(wait=True)

    app.on_cleanup.append(_close)
    return app


def _json(status: int, body: dict, version: str | None = None):
    from aiohttp import web

    headers = {VERSION_HEADER: version} if version else None
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers=headers
    )


def _middleware():
    from aiohttp import web

    @web.middleware
    async def errors(request, handler):
        try:
            if request.path != "/healthz":
                _check_host(request)
                _check_key(request)
                _check_content_type(request)
            return await handler(request)
        except ApiError as exc:
            return _json(exc.status, exc.body())
        except web.HTTPRequestEntityTooLarge:
            message = f"body: over the size limit of {request.app['config'].max_body_bytes} bytes"
            return _json(413, ApiError(413, message, "body").body())
        except web.HTTPException as exc:
            return _json(exc.status, ApiError(exc.status, exc.reason or "error", None).body())
        except Exception:  # a bug: the client still gets OpenAI's error shape, the log the traceback
            log.exception("policy server: %s %s failed", request.method, request.path)
            return _json(500, ApiError(500, "internal server error", None, "server_error").body())

    return errors


def _check_host(request) -> None:
    """421 unless the Host header names this server (see the module docstring)."""
    host = request.headers.get("Host", "")
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    local = sockname[:2] if sockname else ("", 0)
    if not host_allowed(host, local[0], local[1], request.app["config"].allowed_hosts):
        raise ApiError(
            421,
            f"Host: {host[:MAX_ID_CHARS]!r} is not this server's (localhost, 127.0.0.1 or [::1] with "
            f"port {local[1]}, or --allowed-hosts)",
            "Host",
        )


def host_allowed(host: str, local_address: str, port: int, allowed: tuple[str, ...]) -> bool:
    """Whether a Host header names this server.

    >>> host_allowed("localhost:8000", "127.0.0.1", 8000, ())
    True
    >>> host_allowed("evil.example:8000", "127.0.0.1", 8000, ())
    False
    >>> host_allowed("localhost:9", "127.0.0.1", 8000, ())
    False
    >>> host_allowed("policy.internal:8000", "10.0.0.5", 8000, ("policy.internal",))
    True
    """
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        given = rest[1:] if rest.startswith(":") else ""
    else:
        name, _, given = host.partition(":")
    if not name:
        return False
    same_port = given == str(port) or (not given and port == 80)
    if same_port and (name in LOOPBACK_HOSTS or name == local_address.lower()):
        return True
    return host in allowed or name in allowed


def _check_content_type(request) -> None:
    """415 for a POST that is not JSON: `text/plain` and form bodies are what a web page can send
    cross-origin without a preflight."""
    if request.method == "POST" and request.content_type != "application/json":
        raise ApiError(
            415,
            f"Content-Type: expected application/json, got {request.headers.get('Content-Type', '')[:100]!r}",
            "Content-Type",
        )


def _check_key(request) -> None:
    hashes = request.app["config"].api_key_hashes
    if hashes and request.path != "/healthz" and not key_allowed(presented_key(request.headers), hashes):
        raise ApiError(
            401, "missing or wrong API key (Authorization: Bearer KEY)", None, "authentication_error"
        )


async def _chat(request):
    service = request.app["service"]
    trajectory_id = _trajectory_id(request)
    step_index = _step_index(request.headers.get(STEP_HEADER))
    client_records = _client_records(request.headers.get(RECORD_HEADER))
    body = await _body(request)
    chat = parse_chat(body, service.models())
    service.precheck(chat)  # a prompt surely too long is refused here, never tokenised
    if chat.stream:
        return await stream_chat(request, service, chat, trajectory_id, step_index, client_records)
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(
        request.app["pool"], service.complete, chat, trajectory_id, step_index, client_records
    )
    return _json(200, result.body, result.policy_version)


def _trajectory_id(request) -> str | None:
    if "trajectory_id" in request.match_info:
        value, param = request.match_info["trajectory_id"], "trajectory_id"
    else:
        value, param = request.headers.get(TRAJECTORY_HEADER), TRAJECTORY_HEADER
    if value is None:
        return None
    if not 0 < len(value) <= MAX_ID_CHARS or not value.isprintable():
        raise ApiError(
            400,
            f"{param}: expected a trajectory id of 1 to {MAX_ID_CHARS} printable characters, "
            f"got {value[:MAX_ID_CHARS]!r} ({len(value)} characters)",
            param,
        )
    return value


def _step_index(value: str | None) -> int | None:
    """The header as a step index: ASCII digits (`isdigit` alone takes `²`), at most MAX_STEP_INDEX."""
    if value is None:
        return None
    digits = len(str(MAX_STEP_INDEX))
    if not (value.isascii() and value.isdigit() and len(value) <= digits and int(value) <= MAX_STEP_INDEX):
        raise ApiError(
            400,
            f"{STEP_HEADER}: expected a step index from 0 to {MAX_STEP_INDEX} (ASCII digits), "
            f"got {value[:40]!r}",
            STEP_HEADER,
        )
    return int(value)


def _client_records(value: str | None) -> bool:
    if value is None or value == "server":
        return False
    if value != "client":
        raise ApiError(400, f"{RECORD_HEADER}: expected client or server, got {value!r}", RECORD_HEADER)
    return True


async def _completions(request):
    service = request.app["service"]
    body = await _body(request)
    tokens = parse_completion(body, service.models(), len(service.engine.tokenizer))
    limit = getattr(service.engine, "context_length", None)
    check_context(limit, len(tokens.prompt_ids), tokens.sampling.max_tokens, "prompt")
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(request.app["pool"], service.complete_tokens, tokens)
    return _json(200, result.body, result.policy_version)


async def _body(request):
    if request.content_length is not None and request.content_length > request.app["config"].max_body_bytes:
        limit = request.app["config"].max_body_bytes
        raise ApiError(413, f"body: {request.content_length} bytes is over the size limit of {limit}", "body")
    raw = await request.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"body: not valid JSON ({exc})", "body") from None


async def _models(request):
    service = request.app["service"]
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "agentstream"}
        for name in sorted(service.models())
    ]
    return _json(200, {"object": "list", "data": data}, service.engine.version)


async def _healthz(request):
    service = request.app["service"]
    body = {
        "status": "ok",
        "policy_version": service.engine.version,
        "steps_tokens_withheld": service.tokens_withheld,
        "episode_context_tokens": service.episodes.tokens,
    }
    return _json(200, body, service.engine.version)


async def serve(config: PolicyConfig, service, host: str, port: int, ready_file: str | None = None) -> None:
    """Run the server until SIGTERM/SIGINT; writes "host:port" to `ready_file` once listening."""
    await serve_app(create_app(config, service), host, port, ready_file, "policy server", "/v1")
