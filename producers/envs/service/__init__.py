"""Environments as services: any registered environment served over HTTP (`agentstream env serve`),
one session per episode, and `RemoteEnv`, the `AgentEnv` that steps a served one, so the recorder and
the rollout driver work on it unchanged. The protocol is docs/environment-protocol.md.

- `wire`: the contract: request bodies checked, `TimeStep` as exact JSON, the error body.
- `config`: `EnvServiceConfig` (the command's options), which keyword arguments a session may set,
  which tasks a reset may name.
- `sessions`: the session table (limit, idle sessions, one request at a time per session).
- `server`: the aiohttp shell; `client`: `RemoteEnv`.
"""
