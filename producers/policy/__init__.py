"""The policy server: the current policy behind an OpenAI-compatible API, recording what it samples
(token-in/token-out) as `step.recorded` events. See docs/operations.md, "Policy server"."""
