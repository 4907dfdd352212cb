"""`agentstream policy`: the current policy behind an OpenAI-compatible API (aiohttp shell).

Endpoints:
- `POST /v1/chat/completions`: OpenAI chat completions (`tools`, `n`, `temperature`, `top_p`,
  `top_k`, `max_tokens`, `seed`, `logprobs`). Recorded when the request names its episode.
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
  `prompt_token_ids` and logprobs per choice, as vLLM returns them); what a recording proxy in
  front of this server calls. Not recorded.
- `GET /v1/models`, `GET /healthz`.

Every response carries the header `x-agentstream-policy-version` (and `policy_version` in the
body). Errors are OpenAI-style JSON: 400 naming the field and the value, 401 (a key is configured
and the request has none or a wrong one; same key handling as the gateway), 404 unknown model,
413 over the size limit. Binds 127.0.0.1 by default. The pure parts are `requests.py` (config,
request checks), `turns.py` (token-in prompts), `service.py` (one completion, recording).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import orjson

from producers.gateway_requests import key_allowed, presented_key
from producers.http import serve_app
from producers.policy.requests import ApiError, PolicyConfig, parse_chat, parse_completion

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
    app["pool"] = ThreadPoolExecutor(config.workers, thread_name_prefix="agentstream-policy")
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
            _check_key(request)
            return await handler(request)
        except ApiError as exc:
            return _json(exc.status, exc.body())
        except web.HTTPRequestEntityTooLarge:
            message = f"body: over the size limit of {request.app['config'].max_body_bytes} bytes"
            return _json(413, ApiError(413, message, "body").body())
        except web.HTTPException as exc:
            return _json(exc.status, ApiError(exc.status, exc.reason or "error", None).body())

    return errors


def _check_key(request) -> None:
    hashes = request.app["config"].api_key_hashes
    if hashes and request.path != "/healthz" and not key_allowed(presented_key(request.headers), hashes):
        raise ApiError(
            401, "missing or wrong API key (Authorization: Bearer KEY)", None, "authentication_error"
        )


async def _chat(request):
    service = request.app["service"]
    body = await _body(request)
    chat = parse_chat(body, service.models())
    trajectory_id = request.match_info.get("trajectory_id") or request.headers.get(TRAJECTORY_HEADER)
    step_index = _step_index(request.headers.get(STEP_HEADER))
    client_records = _client_records(request.headers.get(RECORD_HEADER))
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(
        request.app["pool"], service.complete, chat, trajectory_id, step_index, client_records
    )
    return _json(200, result.body, result.policy_version)


def _step_index(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.isdigit():
        raise ApiError(400, f"{STEP_HEADER}: expected a step index (0, 1, ...), got {value!r}", STEP_HEADER)
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
    return _json(200, {"status": "ok", "policy_version": service.engine.version}, service.engine.version)


async def serve(config: PolicyConfig, service, host: str, port: int, ready_file: str | None = None) -> None:
    """Run the server until SIGTERM/SIGINT; writes "host:port" to `ready_file` once listening."""
    await serve_app(create_app(config, service), host, port, ready_file, "policy server", "/v1")
