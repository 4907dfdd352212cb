"""`agentstream gateway`: HTTP ingestion for agents in any language.

`requests` is the pure core (configuration, API keys, request body -> events or errors),
`publishers` sends accepted events to Kafka, `server` is the aiohttp shell, `openapi` describes
the API, and `otlp/` is `POST /v1/traces` (OpenTelemetry spans -> agent events).
"""
