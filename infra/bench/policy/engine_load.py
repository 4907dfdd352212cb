"""The engine alone, without the server: `LocalEngine.generate` called from N threads at once (as the
server's generation threads call it), so its scheduler batches them; tokens/s per concurrency. Beside
the serve rows it shows how much of a level's rate is the engine's and how much the HTTP server's.
"""

from __future__ import annotations

import logging
import threading
import time

from infra.bench.policy.client_load import PROMPTS
from infra.bench.policy.table import table_row
from infra.bench.report import median

log = logging.getLogger(__name__)

CASE = "engine only (generate from threads)"


def engine_tokens(engine, inputs: list[list[int]], concurrency: int, max_tokens: int) -> int:
    """Tokens generated for `inputs` (seed = position) by `concurrency` threads calling `generate`."""
    from producers.policy.engine.sampling import SamplingParams

    todo = list(enumerate(inputs))[::-1]
    counts: list[int] = []
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                number, ids = todo.pop()
            samples = engine.generate(ids, SamplingParams(max_tokens=max_tokens, seed=number))
            with lock:
                counts.append(len(samples[0].token_ids))

    threads = [threading.Thread(target=client, name=f"bench-engine-{k}") for k in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts)


def engine_rows(engine, levels: list[int], args) -> list[dict]:
    """One row per level: the median tokens/s over repeats of `args.requests` completions of the
    bench's prompts, temperature 1."""
    inputs = [engine.render(PROMPTS[k % len(PROMPTS)]) for k in range(args.requests)]
    engine_tokens(engine, inputs[: max(levels)], max(levels), args.max_tokens)  # warm-up
    rows = []
    for level in levels:
        rates = []
        for _ in range(max(1, args.repeats)):
            started = time.perf_counter()
            tokens = engine_tokens(engine, inputs, level, args.max_tokens)
            rates.append(tokens / (time.perf_counter() - started))
        log.info("bench policy: engine only, concurrency %d: %.0f tokens/s", level, median(rates))
        rows.append(table_row(CASE, concurrency=level, requests=len(inputs), tokens_per_s=median(rates)))
    return rows
