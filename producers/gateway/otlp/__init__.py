"""The gateway's OTLP endpoint (docs/otlp.md): `mapping` turns spans into agent events (pure),
`step_cursor` remembers which step index each span was given, `endpoint` is the aiohttp handler.
"""
