"""`stream: true` on chat completions: server-sent events in OpenAI's `chat.completion.chunk` format.

The completion runs exactly as a non-streamed one (`PolicyService.complete` in a worker thread, the
same prompt, sampling, tool-call parsing and one `step.recorded`); the engine calls `on_token` from
its thread as each token is sampled, and the tokens are bridged to the event loop through a queue
(`loop.call_soon_threadsafe`), decoded incrementally and sent as content deltas. Per choice:

- a first chunk with `{"role": "assistant", "content": ""}`;
- content deltas as tokens are sampled, holding back text that may still change: the end that may
  be the start of a stop string (a stop string is never sent), the end that may be the start of a
  tool call's opening tag and everything from a tool call on (calls are sent as `tool_calls`), and
  trailing whitespace (the returned text loses it before a call). With `tool_choice` required or a
  named function the whole answer is a call: nothing is sent before it ends;
- when sampling ends: the rest of the content (so the deltas join to the content a non-streamed
  request gets), then the `tool_calls` (one delta with every call, each with its `index`), then a
  chunk with `finish_reason` and the choice's `logprobs` (all its tokens, with `logprobs: true`).

Then, with `stream_options.include_usage`, a chunk with no choices and the `usage` (every other
chunk has `usage: null`, OpenAI's rule), and `data: [DONE]`. With `X-Agentstream-Record: client`
the last chunk carries the `agentstream` object. Every chunk has `policy_version`: the version
serving when the response started (the header's), and on the last chunks the version that sampled.
An error before the first token is an ordinary JSON error response; after it, an
`data: {"error": {...}}` event then `data: [DONE]`.

A client that disconnects before its completion is sampled in full gets nothing recorded (see
`service.Stream`), and its sampling stops at the next token: the connection is watched while the
completion runs (`_watch`), and once it is closed `on_token` raises `service.StreamAbandoned`, which
ends that request in the engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import orjson

from producers.policy.api_errors import ApiError
from producers.policy.engine.sampling import cut_at_stop
from producers.policy.requests import ChatRequest
from producers.policy.service import Stream, StreamAbandoned
from producers.policy.tool_calls import OPEN

log = logging.getLogger(__name__)

VERSION_HEADER = "x-agentstream-policy-version"
WATCH_S = 0.2  # how often a stream's connection is checked while no token comes
HEAD = 16  # _partial looks for a needle's first HEAD characters (a C search) before comparing more


def held_back(text: str, stops: tuple[str, ...], calls: bool) -> str:
    """The part of `text` (sampled so far) that may be sent now: before any stop string and any
    tool call, without an end that may still become one, and (when calls are parsed) without
    trailing whitespace.

    >>> held_back("Hello wor", ("world",), False), held_back("Hi. <tool", (), True)
    ('Hello ', 'Hi.')
    >>> held_back("a\\n<tool_call>{", (), True), held_back("a\\n<tool_call>{", (), False)
    ('a', 'a\\n<tool_call>{')
    """
    text = cut_at_stop(text, stops)[0]
    text = text[: len(text) - _partial(text, stops)]
    if calls:
        at = text.find(OPEN)
        text = text[:at] if at >= 0 else text[: len(text) - _partial(text, (OPEN,))]
        text = text.rstrip()
    return text


def _partial(text: str, needles: tuple[str, ...]) -> int:
    """The length of the longest end of `text` that is the start of one of `needles`. Per needle
    only the last len(needle) - 1 characters are looked at, and an end of HEAD characters or more
    is compared only where the needle's first HEAD characters occur (found by `str.find`): a token
    costs about one search of the tail, not one comparison per possible length (issue #36).

    >>> _partial("say STO", ("STOP",)), _partial("abab", ("ababx",)), _partial("x", ("yz",))
    (3, 4, 0)
    """
    return max((_partial_one(text, needle) for needle in needles), default=0)


def _partial_one(text: str, needle: str) -> int:
    most = min(len(needle) - 1, len(text))
    if most <= 0:
        return 0
    tail, head = text[len(text) - most :], needle[:HEAD]
    at = tail.find(head) if len(head) == HEAD else -1
    while at >= 0:  # the first match that holds is the longest
        if needle.startswith(tail[at:]):
            return most - at
        at = tail.find(head, at + 1)
    for size in range(min(HEAD - 1, most), 0, -1):
        if tail.endswith(needle[:size]):
            return size
    return 0


class ChoiceText:
    """One choice's text as its tokens come (incremental decoding: a token that ends inside a UTF-8
    character waits for the next), and how much of it has been sent."""

    def __init__(self, decode, stops: tuple[str, ...], calls: bool, hold_all: bool):
        self._decode, self._stops, self._calls, self._hold_all = decode, stops, calls, hold_all
        self._tokens: list[int] = []
        self._start = self._read = 0  # decode from _start; text up to _read is already in `text`
        self.text = ""
        self.sent = ""

    def add(self, token_id: int) -> str:
        """The text that may be sent now that `token_id` was sampled ("" when none)."""
        self._tokens.append(token_id)
        before = self._decode(self._tokens[self._start : self._read])
        after = self._decode(self._tokens[self._start :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self._start, self._read = self._read, len(self._tokens)
        if self._hold_all:
            return ""
        ready = held_back(self.text, self._stops, self._calls)
        if len(ready) <= len(self.sent):
            return ""
        delta, self.sent = ready[len(self.sent) :], ready
        return delta

    def rest(self, content: str) -> str:
        """What is left to send of the choice's final `content` (the non-streamed answer's)."""
        if content.startswith(self.sent):
            return content[len(self.sent) :]
        log.warning(
            "policy stream: sent %r is not the start of the final content %r", self.sent[:80], content[:80]
        )
        return ""


class ChunkWriter:
    """Writes one response's events; starts the response (headers) on the first of them."""

    def __init__(self, request, engine, chat: ChatRequest):
        self.request, self.chat = request, chat
        self.head = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": chat.model,
            "system_fingerprint": engine.tokenizer_hash,
            "policy_version": engine.version,
        }
        self.version = engine.version
        self.response = None
        self.gone = False

    def client_gone(self) -> bool:
        transport = self.request.transport
        self.gone = self.gone or transport is None or transport.is_closing()
        return self.gone

    async def start(self) -> None:
        from aiohttp import web

        if self.response is not None:
            return
        headers = {
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            VERSION_HEADER: self.version,
        }
        self.response = web.StreamResponse(headers=headers)
        try:
            await self.response.prepare(self.request)
        except ConnectionError:
            self.gone = True
        for index in range(self.chat.sampling.n):
            await self.choice(index, {"role": "assistant", "content": ""})

    async def choice(self, index: int, delta: dict, finish_reason=None, logprobs=None, **extra) -> None:
        entry = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        await self.chunk([entry], **extra)

    async def chunk(self, choices: list[dict], **extra) -> None:
        body = {**self.head, "choices": choices}
        if self.chat.include_usage:
            body["usage"] = None
        await self.send(orjson.dumps({**body, **extra}))

    async def send(self, data: bytes) -> None:
        if self.gone:
            return
        try:
            await self.response.write(b"data: " + data + b"\n\n")
        except ConnectionError:  # aiohttp's ClientConnectionResetError is one
            self.gone = True


async def stream_chat(request, service, chat: ChatRequest, trajectory_id, step_index, client_records: bool):
    """The streamed response to `chat` (see the module docstring)."""
    from aiohttp import web

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    engine = service.engine  # the response's version from its first byte on

    def put(item) -> None:  # from the generating thread
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is stopping
            pass

    stream = Stream(engine, lambda choice, token: put((choice, token)))

    def work():
        try:
            return service.complete(chat, trajectory_id, step_index, client_records, stream)
        finally:
            put(None)

    future = loop.run_in_executor(request.app["pool"], work)
    writer = ChunkWriter(request, engine, chat)
    forced = chat.tool_choice in ("required", "function")
    texts = [
        ChoiceText(engine.decode, chat.sampling.stop, chat.tool_choice != "none", forced)
        for _ in range(chat.sampling.n)
    ]
    watch = asyncio.ensure_future(_watch(writer, stream))
    try:
        await _relay(queue, writer, texts, stream)
        result = await future
    except asyncio.CancelledError:
        stream.abandoned.set()
        raise
    except StreamAbandoned:  # the client left: nothing to answer, nothing recorded
        return writer.response or web.Response(status=499)
    except Exception as exc:
        if not future.done():  # the failure is ours, not the completion's: it must not be recorded
            stream.abandoned.set()
        return await _failed(writer, exc)
    finally:
        watch.cancel()
    if writer.client_gone():
        return writer.response or web.Response(status=499)
    await writer.start()
    await _finish(writer, texts, result)
    return writer.response


async def _relay(queue: asyncio.Queue, writer: ChunkWriter, texts: list[ChoiceText], stream: Stream) -> None:
    """Send each sampled token's text as it may be sent, until the completion ends (None); once the
    client is gone, only mark the completion abandoned."""
    while (item := await queue.get()) is not None:
        if writer.client_gone():
            stream.abandoned.set()
            continue
        choice, token = item
        delta = texts[choice].add(token) if 0 <= choice < len(texts) else ""
        if delta:
            await writer.start()
            await writer.choice(choice, {"content": delta})


async def _watch(writer: ChunkWriter, stream: Stream) -> None:
    """Mark the completion abandoned as soon as its connection closes, even while no token comes (a
    long prompt's prefill, a proxy's upstream call, text held back)."""
    while not writer.client_gone():
        await asyncio.sleep(WATCH_S)
    stream.abandoned.set()


async def _failed(writer: ChunkWriter, exc: Exception):
    """An error before the first byte is the middleware's (an ordinary error response); after it, an
    `error` event and the end of the stream."""
    if writer.response is None:
        raise exc
    if not isinstance(exc, ApiError):
        log.error("policy stream: the completion failed after the response started", exc_info=exc)
        exc = ApiError(500, "internal server error", None, "server_error")
    await writer.send(orjson.dumps(exc.body()))
    await writer.send(b"[DONE]")
    return writer.response


async def _finish(writer: ChunkWriter, texts: list[ChoiceText], result) -> None:
    """Per choice the rest of its content, its tool calls and its finish; then usage and [DONE]."""
    body = result.body
    writer.head["policy_version"] = result.policy_version
    last = {"agentstream": body["agentstream"]} if "agentstream" in body else {}
    choices = body["choices"]
    for index, (choice, text) in enumerate(zip(choices, texts, strict=True)):
        message = choice["message"]
        rest = text.rest(message["content"] or "")
        if rest:
            await writer.choice(index, {"content": rest})
        calls = message.get("tool_calls")
        if calls:
            await writer.choice(index, {"tool_calls": [{"index": k, **call} for k, call in enumerate(calls)]})
        finish = {"tool_call_malformed": True} if message.get("tool_call_malformed") else {}
        extra = last if index == len(choices) - 1 and not writer.chat.include_usage else {}
        await writer.choice(index, finish, choice["finish_reason"], choice["logprobs"], **extra)
    if writer.chat.include_usage:
        await writer.send(orjson.dumps({**writer.head, "choices": [], "usage": body["usage"], **last}))
    await writer.send(b"[DONE]")
