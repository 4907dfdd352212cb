"""The client side of `agentstream bench policy`: the chat completion bodies (`PROMPTS`,
temperature 1, seed = request number), `--requests` completions sent with `--concurrency` in
flight by an aiohttp client, each on a new episode so that it is recorded, and the CPU of this
process per call (flushed to the broker's acknowledgement when recording).
"""

from __future__ import annotations

import asyncio
import time
import uuid

from infra.bench.report import percentile

PROMPTS = [
    [{"role": "system", "content": "You are an agent. Call one tool per turn."},
     {"role": "user", "content": "List the files, then read main.py."}],
    [{"role": "user", "content": "The tests fail with an AssertionError in add(). Fix the bug."}],
    [{"role": "system", "content": "You are a careful coding agent."},
     {"role": "user", "content": "Run the tests and say which one failed and why."}],
]  # fmt: skip


def chat_body(number: int, max_tokens: int) -> dict:
    messages = PROMPTS[number % len(PROMPTS)]
    return {"model": "policy", "messages": messages, "max_tokens": max_tokens, "temperature": 1.0,
            "seed": number}  # fmt: skip


async def post_completion(session, url: str, episode: str, body: dict) -> dict:
    async with session.post(f"{url}/v1/episodes/{episode}/chat/completions", json=body) as response:
        answer = await response.json()
        if response.status != 200:
            raise RuntimeError(f"policy server answered {response.status}: {str(answer)[:300]}")
        return answer


async def send_completions(url: str, requests: int, concurrency: int, max_tokens: int) -> dict:
    """`requests` completions with `concurrency` in flight; each on a new episode."""
    import aiohttp

    tag = uuid.uuid4().hex[:12]
    todo = list(range(requests))[::-1]
    latencies: list[float] = []
    tokens = 0

    async def client(session) -> None:
        nonlocal tokens
        while todo:
            number = todo.pop()
            started = time.perf_counter()
            answer = await post_completion(
                session, url, f"bench-{tag}-{number}", chat_body(number, max_tokens)
            )
            latencies.append(time.perf_counter() - started)
            tokens += answer["usage"]["completion_tokens"]

    async with aiohttp.ClientSession() as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "latencies": latencies, "tokens": tokens, "requests": requests}


def flush_recorder(recorder) -> None:
    if not recorder.flush(120):
        raise RuntimeError(f"recorder: {recorder.pending} steps not acknowledged by the broker after 120 s")


def timed_load(url: str, concurrency: int, args, recorder) -> dict:
    cpu = time.process_time()
    result = asyncio.run(send_completions(url, args.requests, concurrency, args.max_tokens))
    if recorder is not None:
        flush_recorder(recorder)
    result["cpu_ms"] = (time.process_time() - cpu) / result["requests"] * 1000
    result["p50_ms"] = percentile(result["latencies"], 50) * 1000
    return result
