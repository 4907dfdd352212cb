"""The LLM judge (reward layer 2) and human calibration (layer 3).

Pure core: `selection` (which trajectories, which mode, deterministic sampling), `rubrics`,
`prompt` (versioned, untrusted data delimited), `parse` (strict JSON with repair), `scoring`
(requests and events), `budget`, `cache`, `pricing`, `calibration` and `annotations`.
I/O shells: `client` (anthropic SDK, retries, circuit breaker), `processor` (state + concurrent
calls), `agent` (the faust wiring, `register_judge_agents`), `cli` (`annotate`, `calibrate`).
`messages_server` is a local Messages-API stand-in for tests and the benchmark.
"""
