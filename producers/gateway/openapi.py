"""The gateway's OpenAPI 3.1 document, built from the event JSON Schemas (`schemas/export.py`).

It says what the gateway enforces: unknown fields are refused (`additionalProperties: false`), and
the contract's bounds (`schemas.limits`) are in the schemas (`maximum`, `maxLength`, `maxItems`) and,
for what JSON Schema cannot say (nesting depth, encoded size), in the descriptions and in
`x-agentstream-limits`.
"""

from __future__ import annotations

from typing import Any

from producers.gateway.requests import ACCEPTED_TYPES, POLICY, GatewayConfig
from schemas.events import SCHEMA_MAJOR, SCHEMA_VERSION
from schemas.export import json_schema
from schemas.limits import LIMITS, MAX_EVENT_BYTES, MAX_JSON_DEPTH


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _error_schemas() -> dict[str, Any]:
    """The JSON Schemas of the gateway's response bodies.

    Long: one literal per response body; split, the document would be read in pieces."""
    field_error = {
        "type": "object",
        "required": ["index", "field", "value", "message"],
        "properties": {
            "index": {"type": ["integer", "null"], "description": "position of the event in the array"},
            "field": {"type": "string", "description": "dotted path of the field ('$' = the whole body)"},
            "value": {"description": "the value received (shortened when large)"},
            "message": {"type": "string"},
        },
    }
    rejected = {
        "type": "object",
        "required": ["error", "accepted", "errors"],
        "properties": {
            "error": {"type": "string"},
            "accepted": {"const": 0, "description": "nothing of a rejected request is written"},
            "errors": {"type": "array", "items": _ref("FieldError")},
            "rejected": {"type": "integer"},
            "valid_not_written": {"type": "integer"},
            "policy": {"type": "string"},
            "dead_lettered": {"type": "boolean"},
            "request_id": {"type": "string"},
        },
    }
    accepted = {
        "type": "object",
        "required": ["accepted", "event_ids"],
        "properties": {
            "accepted": {"type": "integer"},
            "event_ids": {"type": "array", "items": {"type": "string"}},
            "request_id": {"type": "string"},
        },
    }
    unavailable = {
        "type": "object",
        "properties": {
            "error": {"type": "string"},
            "partial": {"type": "boolean", "description": "some events were acknowledged"},
            "acknowledged_event_ids": {"type": "array", "items": {"type": "string"}},
            "unacknowledged_event_ids": {"type": "array", "items": {"type": "string"}},
            "message": {"type": "string"},
        },
    }
    timeout = {"type": "object", "properties": {"error": {"type": "string"}, "message": {"type": "string"}}}
    return {
        "FieldError": field_error,
        "Rejected": rejected,
        "Accepted": accepted,
        "Unavailable": unavailable,
        "Timeout": timeout,
    }


def _response(description: str, schema: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


def openapi_document(config: GatewayConfig) -> dict[str, Any]:
    """The OpenAPI 3.1 document the gateway serves at `/openapi.json`."""
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": "agentstream ingestion gateway",
            "version": SCHEMA_VERSION,
            "description": "Publish agent events over HTTP into Kafka topics keyed by trajectory id.",
        },
        "paths": {
            "/v1/events": {"post": _publish_operation(config)},
            "/v1/traces": {"post": _traces_operation(config)},
            "/healthz": {"get": _get("Broker reachability", "healthz", _HEALTH_RESPONSES)},
            "/openapi.json": {"get": _get("This document", "openapi", {"200": {"description": "ok"}})},
        },
        "components": {
            "schemas": {**{t: strict_schema(t) for t in ACCEPTED_TYPES}, **_error_schemas()},
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "API key as a bearer token"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
        },
        "x-agentstream-policy": POLICY,
        "x-agentstream-limits": {**LIMITS, "max_body_bytes": config.max_body_bytes,
                                 "max_events": config.max_events},
    }  # fmt: skip


LIMITS_TEXT = (
    f"Limits: an event encodes to at most {MAX_EVENT_BYTES} bytes and nests at most {MAX_JSON_DEPTH} "
    "levels (objects and arrays, the event itself counting as 1); step indexes, step counts, string "
    "lengths and token lists are bounded in the schemas (see x-agentstream-limits). An event over a "
    "limit is refused with 400 naming the field, the value and the limit, and dead-lettered."
)


def strict_schema(event_type: str) -> dict[str, Any]:
    """The event's JSON Schema as the gateway checks it: unknown fields are refused."""
    schema = json_schema(event_type)
    schema["additionalProperties"] = False
    # the gateway writes the current major version only (a newer one is refused by the codec)
    schema["properties"]["schema_version"]["pattern"] = rf"^{SCHEMA_MAJOR}\.\d+$"
    schema["description"] = f"{schema.get('description', '')}\n\n{LIMITS_TEXT}".strip()
    return schema


_HEALTH_RESPONSES = {"200": {"description": "broker reachable"}, "503": {"description": "unreachable"}}


def _get(summary: str, operation_id: str, responses: dict) -> dict:
    return {"summary": summary, "operationId": operation_id, "responses": responses}


def _publish_operation(config: GatewayConfig) -> dict[str, Any]:
    """`POST /v1/events`: its limits come from the running gateway's config."""
    request_schema = {
        "type": "array",
        "minItems": 1,
        "maxItems": config.max_events,
        "items": {"oneOf": [_ref(t) for t in ACCEPTED_TYPES], "discriminator": {"propertyName": "type"}},
    }
    return {
        "summary": "Publish events",
        "description": (
            f"Validates every event strictly (unknown fields are errors). {LIMITS_TEXT} Policy: {POLICY}. "
            "202 only after the broker acknowledged every event (acks=all). Invalid events also go "
            "to the dead-letter topic. Bodies over "
            f"{config.max_body_bytes} bytes get 413."
        ),
        "operationId": "publishEvents",
        "security": [{"bearer": []}, {"apiKey": []}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": request_schema}}},
        "responses": {
            "202": _response("every event acknowledged by the broker", "Accepted"),
            "400": _response("malformed JSON or invalid events; nothing written", "Rejected"),
            "401": _response("missing or wrong API key", "Rejected"),
            "408": _response("the body did not arrive in time", "Timeout"),
            "413": _response("body or event count over the limit; nothing written", "Rejected"),
            "415": _response(
                "content type is not application/json, or an encoding other than gzip", "Rejected"
            ),
            "503": _response("broker did not acknowledge; says which events were", "Unavailable"),
        },
    }


def _traces_operation(config: GatewayConfig) -> dict[str, Any]:
    """`POST /v1/traces`: OTLP/HTTP (docs/otlp.md)."""
    otlp = {"type": "object", "description": "an OTLP ExportTraceServiceRequest (OTLP JSON: hex ids)"}
    binary = {"type": "string", "contentMediaType": "application/x-protobuf"}
    return {
        "summary": "Publish OpenTelemetry traces (OTLP/HTTP) as episodes and steps",
        "description": (
            "GenAI / OpenInference spans become episode.started, step.recorded and episode.ended events. "
            f"{LIMITS_TEXT} A span that cannot be mapped is counted in partial_success.rejected_spans "
            f"and dead-lettered. Bodies over {config.max_body_bytes} bytes (after gzip) or over "
            f"{config.max_events} spans get 413; Content-Encoding gzip or none, others 415."
        ),
        "operationId": "exportTraces",
        "security": [{"bearer": []}, {"apiKey": []}],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": otlp}, "application/x-protobuf": {"schema": binary}},
        },
        "responses": {
            "200": {
                "description": "ExportTraceServiceResponse, after the broker acknowledged every event",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "application/x-protobuf": {"schema": binary},
                },
            },
            "400": _response("malformed payload (not OTLP, bad JSON or gzip, a non-hex id)", "Rejected"),
            "401": _response("missing or wrong API key", "Rejected"),
            "408": _response("the body did not arrive in time", "Timeout"),
            "413": _response("body or span count over the limit", "Rejected"),
            "415": _response("content type or content encoding not taken", "Rejected"),
            "503": _response("broker did not acknowledge; resend", "Unavailable"),
        },
    }
