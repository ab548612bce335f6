"""Structured output on the OpenAI API: `response_format` and forced tool calls, turned into the
engine's constraint (SamplingParams.constraint, minisgl/structured/), and the answer of a forced
tool call reshaped into `tool_calls`.

response_format (chat and completions):
    {"type": "text"}                                   no constraint
    {"type": "json_object"}                            any JSON object
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}
                                                       JSON valid under "schema" (strict or not:
                                                       the grammar always holds the output to it)
tools (chat), each {"type": "function", "function": {"name", "description", "parameters"}}, with
tool_choice:
    "none"                                             the tools are not used: a text answer
    "required"                                         one call of one of the tools: the output is
                                                       held to {"name": <a tool>, "arguments":
                                                       <its parameters>}
    {"type": "function", "function": {"name": N}}      one call of tool N: the output is held to
                                                       N's parameters
    "auto" (the default when tools are given)          refused, naming tool_choice: deciding whether
                                                       to call a tool is the model's judgement, and
                                                       a model not trained to call tools (the
                                                       bundled one) has none; send "required" or
                                                       a named function
An object schema that lists `properties` and says nothing of others gets `additionalProperties:
false` (in response_format and in tool parameters), as SGLang's and vLLM's default grammar
backend (xgrammar's strict mode) reads it: clients build such schemas from their classes
(LangChain's function calling does, without strict), and a model left free to add keys may add
them until max_tokens.
A forced call is answered as the OpenAI API answers one: `message.tool_calls` with one call whose
`arguments` is the JSON text, `content` null, finish_reason "tool_calls" (with `n`, each choice its
own call). The tools are not rendered into the prompt (the chat template is the model's own); the
grammar alone makes the call. Streaming a forced call is refused (its chunks would need the call's
deltas); streaming a response_format answer is served like any text.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from typing import Any, Dict, List

from fastapi.responses import JSONResponse

from minisgl.core import SamplingParams

from .openai_api import ErrorInfo


@dataclass
class Structure:
    """What a request's response_format / tools ask: the engine's constraint, and for a forced
    tool call the tool's name (None with "required": the output names it)."""

    constraint: Dict[str, Any]
    tool_call: bool = False
    tool_name: str | None = None


def structure_of(req) -> Structure | None:
    """The request's structure, None for a plain one, or ErrorInfo (400) naming the field that is
    wrong or cannot be honoured."""
    fmt = getattr(req, "response_format", None)
    tools = getattr(req, "tools", None) or []
    choice = getattr(req, "tool_choice", None)
    calls = _tool_structure(tools, choice)
    form = _format_structure(fmt)
    if calls is not None and form is not None:
        raise ErrorInfo(
            400, "response_format cannot go with a forced tool call", param="response_format"
        )
    return calls or form


def _format_structure(fmt: Any) -> Structure | None:
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text" and len(fmt) == 1:
        return None
    if kind == "json_object" and len(fmt) == 1:
        return Structure({"json_object": True})
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or set(fmt) != {"type", "json_schema"}:
            raise ErrorInfo(
                400,
                'response_format json_schema needs {"type": "json_schema", "json_schema": '
                '{"name": ..., "schema": {...}}}',
                param="response_format",
            )
        unknown = set(spec) - {"name", "description", "schema", "strict"}
        if unknown:
            raise ErrorInfo(
                400,
                f"response_format.json_schema: unknown field {sorted(unknown)[0]!r}",
                param="response_format.json_schema",
            )
        if not isinstance(spec.get("name"), str):
            raise ErrorInfo(
                400, "response_format.json_schema.name must be a string", param="response_format"
            )
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise ErrorInfo(
                400, "response_format.json_schema.schema must be an object", param="response_format"
            )
        return Structure({"json_schema": closed(schema)})
    raise ErrorInfo(
        400,
        f"response_format: type must be 'text', 'json_object' or 'json_schema', got {fmt!r}",
        param="response_format",
    )


def _tool_structure(tools: List[Any], choice: Any) -> Structure | None:
    if choice == "none":
        return None
    if not tools:
        if choice is None:
            return None
        raise ErrorInfo(400, "tool_choice needs tools", param="tool_choice")
    schemas = _tool_schemas(tools)
    if choice is None or choice == "auto":
        raise ErrorInfo(
            400,
            "tool_choice: 'auto' (the default with tools) is not supported by this server: the "
            "model was not trained to decide when to call a tool; send tool_choice 'required' "
            'or {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    if choice == "required":
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for name, params in schemas.items()
        ]
        schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
        return Structure({"json_schema": schema}, tool_call=True)
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if name not in schemas:
            raise ErrorInfo(
                400,
                f"tool_choice names function {name!r}, which is not among the tools "
                f"{sorted(schemas)}",
                param="tool_choice",
            )
        return Structure({"json_schema": schemas[name]}, tool_call=True, tool_name=name)
    raise ErrorInfo(
        400,
        "tool_choice must be 'none', 'auto', 'required' or "
        f'{{"type": "function", "function": {{"name": ...}}}}, got {choice!r}',
        param="tool_choice",
    )


def _tool_schemas(tools: List[Any]) -> Dict[str, Dict[str, Any]]:
    """name -> parameters schema of each function tool (no parameters: an empty object)."""
    out: Dict[str, Dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise ErrorInfo(
                400,
                f'tools[{i}] must be {{"type": "function", "function": {{"name": ...}}}}',
                param=f"tools[{i}]",
            )
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ErrorInfo(400, f"tools[{i}].function.name must be a string", param="tools")
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise ErrorInfo(
                400, f"tools[{i}].function.parameters must be a JSON schema", param="tools"
            )
        out[name] = closed(params)
    return out


def closed(schema: Any) -> Any:
    """A copy of `schema` in which every object schema with `properties` and no word on other keys
    (additionalProperties, patternProperties, unevaluatedProperties) allows no other keys."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: Dict[str, Any] = {}
    for key, value in schema.items():
        if key in _NAMED_SCHEMAS and isinstance(value, dict):  # name -> schema: each one closed
            out[key] = {name: closed(sub) for name, sub in value.items()}
        elif key in _VALUES:  # data, not schemas
            out[key] = value
        else:
            out[key] = closed(value)
    others = ("additionalProperties", "patternProperties", "unevaluatedProperties")
    if "properties" in out and not any(k in out for k in others):
        out["additionalProperties"] = False
    return out


_NAMED_SCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_VALUES = ("const", "enum", "default", "examples", "required")


def constrained(params: SamplingParams, structure: Structure | None) -> SamplingParams:
    """`params` with the structure's constraint (checked as any SamplingParams is: a 400 names
    what is wrong)."""
    if structure is None:
        return params
    try:
        return dataclasses.replace(params, constraint=structure.constraint)
    except (TypeError, ValueError) as e:
        raise ErrorInfo(400, str(e), param="response_format") from None


def refuse_stream(req, structure: Structure | None) -> None:
    if structure is not None and structure.tool_call and req.streams:
        raise ErrorInfo(
            400, "stream: not supported by this server with a forced tool call", param="stream"
        )


def as_tool_calls(response: JSONResponse, structure: Structure | None) -> JSONResponse:
    """A chat answer whose choices hold a forced call's JSON, as `tool_calls` (a choice whose JSON
    is cut short by max_tokens keeps its text and finish_reason "length")."""
    if structure is None or not structure.tool_call or response.status_code != 200:
        return response
    body = json.loads(response.body)
    for choice in body["choices"]:
        message = choice["message"]
        try:
            value = json.loads(message["content"])
        except (json.JSONDecodeError, TypeError):
            continue  # cut short: the text as it is, finish_reason "length"
        if structure.tool_name is not None:
            name, arguments = structure.tool_name, value
        else:
            name, arguments = value["name"], value["arguments"]
        message["content"] = None
        message["tool_calls"] = [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ]
        choice["finish_reason"] = "tool_calls"
    return JSONResponse(body)
