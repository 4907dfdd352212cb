"""Scripted stand-ins for a judge model on 127.0.0.1 that the real SDKs talk to: `messages`
(Anthropic Messages API), `chat` (OpenAI-compatible chat completions), `scripted` (what both share:
latency, scripted replies and failures, the prompt-scoring default, request recording).

Test doubles, kept out of the product packages. `messages` takes the Messages API's wire format from
the product's fixed-latency endpoint of `agentstream bench judge` (infra/bench/judge_endpoint.py).
"""
