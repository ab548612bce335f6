"""What /openapi.json says the server answers: every route's errors with the OpenAI error body
(400 a request that is wrong, 401 without the API key, 404 an unknown model or path, 413 a body
over the limit, 500 and 503 the server failing or stopping), streams as text/event-stream beside
JSON, /metrics as Prometheus text; and not FastAPI's 422, which this server never sends (its
validation errors are 400s: app.py's `bad_request`). Checked by a schemathesis run against a live
server (tests/test_server_schema.py)."""

from __future__ import annotations

from typing import Any, Dict

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """The OpenAI API's error body."""

    error: ErrorDetail


def errors(*statuses: int) -> Dict[int | str, Dict[str, Any]]:
    said = {
        400: "the request is wrong (the message says how; the body is the OpenAI error body)",
        401: "no API key, or another (`serve --api-key`); with WWW-Authenticate: Bearer",
        404: "an unknown model",
        413: "the body is larger than `serve --max-request-bytes`",
        500: "the server failed",
        503: "the server cannot serve (a worker died) or is stopping",
    }
    return {s: {"model": ErrorBody, "description": said[s]} for s in statuses}


# the routes that read a JSON body; every one may be refused before its body is read
BODY_ERRORS = errors(400, 401, 404, 413, 500, 503)
# One server-sent event, as a client parses it (OpenAPI 3.0/3.1 tools such as schemathesis read a
# text/event-stream schema as the schema of each event, not of the whole body): its data is a JSON
# chunk of the completion, or "[DONE]" last.
SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {"type": "string", "description": "a JSON chunk of the answer, or [DONE] last"},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
}
STREAMED = {  # a completion with "stream": true answers server-sent events
    200: {
        "description": "the completion: JSON, or with stream: true server-sent events",
        "content": {"application/json": {}, "text/event-stream": {"schema": SSE_EVENT}},
    }
}
METRICS_TEXT = {
    200: {
        "description": "Prometheus metrics, in its text format",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


def install(app: FastAPI, model_name: str) -> None:
    """Make `app.openapi()` leave out the 422 answers FastAPI declares for every route with
    parameters, and the schemas only they use; and say that a request's `model` is the one
    served (another is a 404)."""

    def openapi() -> Dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            schemas = schema.get("components", {}).get("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            for name in ("CompletionRequest", "ChatRequest"):
                if name in schemas:
                    schemas[name]["properties"]["model"] = {"type": "string", "enum": [model_name]}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
