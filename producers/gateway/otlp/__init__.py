"""The gateway's OTLP endpoint (docs/otlp.md): `spans` decodes a request into `Span`s,
`conventions` reads what GenAI / OpenInference attributes mean, `events` makes a span's agent
events, `mapping` groups spans by trace into episodes and steps (pure), `step_cursor` remembers
which step index each span was given, `endpoint` is the aiohttp handler.
"""
