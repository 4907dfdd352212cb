"""The LLM judge (reward layer 2) and human calibration (layer 3).

Pure core: `selection` (which trajectories, which mode, deterministic sampling), `rubrics`,
`prompt` (versioned, untrusted data delimited), `parse` (strict JSON with repair), `scoring`
(requests and events), `budget`, `cache`, `pricing`, `calibration` and `annotations`.
I/O shells: `client` (anthropic SDK, retries, circuit breaker), `processor` (state + concurrent
calls; the role's batch logic), `role` (the faust wiring on the one batch shell, `register`).
The `annotate` and `calibrate` commands live in infra/commands/judge.py.
`messages_server` is a local Messages-API stand-in for tests and the benchmark.
"""
