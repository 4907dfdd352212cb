"""`agentstream bench policy`: the policy server's tokens/s and requests/s at several concurrencies,
what recording each completion costs, and the pause a hot reload causes.

Setup: the tiny model on CPU; one `LocalEngine` shared by two `PolicyService`s, one recording
each completion through an `AgentRecorder` (as `runner.build_service` does) into an embedded broker
(a child process stopped by PID), the other not. Each is served by the real aiohttp app on
127.0.0.1:0 in a background event loop of this process, so `time.process_time()` covers client,
server, engine and recorder. An aiohttp client sends `--requests` chat completions per level
(`--concurrency` in flight) to one server then the other (order alternating per repeat), the same
bodies to both (temperature 1, seed = request number), each on a new episode so that it is recorded.

- serve rows: tokens/s and requests/s (medians over repeats), latency p50/p99/max (pooled), CPU
  ms of this process per call (recording: up to the broker's acknowledgement; flushed first).
- engine only rows: `LocalEngine.generate` called from N threads, no server (engine_load.py).
- batching: the serve rows' tokens/s per concurrency (recording off) as ratios to the lowest level,
  and the engine-only rows' likewise; target: at 8 at least 4x the rate at 1 (the engine decodes
  concurrent requests together; the server runs `--workers` generation threads, by default as many
  as the highest concurrency).
- overhead rows: recording on - off, paired per repeat; target < 2 ms per call at the lowest
  concurrency. "recording only" times `step_event` + `recorder.publish` alone, burst and paced.
- reload rows: while clients run, `PolicyReloader.apply(PolicyUpdated)` switches between LoRA
  checkpoints: load and pause as the reloader records them, and the gap a client saw between its
  responses across a switch (beside the gap within one version).
- `--gpu`: `LocalEngine.generate` (1 and 8 requests in flight) vs `model.generate` (batches of 1
  and 8) on a Qwen2-0.5B-shaped model built from a config, same prompts, when CUDA is available;
  otherwise one line saying why not.

Parts: client_load.py (the requests), servers.py (the servers under test), serving.py (serve and
overhead rows, recording alone, the batching summary), engine_load.py (the engine alone), reload.py
(reloads under load), gpu.py (`--gpu`), proxy.py (`--proxy-vllm`), table.py (the row every part
writes) and benchmark.py (the options and the run, what `infra.commands.bench` calls).
"""
