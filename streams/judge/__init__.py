"""The LLM judge (reward layer 2) and human calibration (layer 3).

Pure core: `selection` (which trajectories, which mode, deterministic sampling), `rubrics`,
`prompt` (versioned, untrusted data delimited), `parse` (strict JSON with repair), `scoring`
(requests and events), `budget`, `cache`, `pricing`, `calibration` and `annotations`.
I/O shells: `client` (retries and circuit breaker over `providers/`: anthropic, openai), `calls`
(cache -> reserve -> call -> settle), `ledger` (the budget and reply cache shared through the log),
`processor` (state + concurrent calls; the role's batch logic), `role` (the faust wiring on the one
batch shell, `register`). The `annotate` and `calibrate` commands live in infra/commands/judge.py.
The local stand-ins for a judge model (Messages API, chat completions) are test doubles in
tests/support/judge_servers/.
"""
