"""Structured output through `python -m minisgl serve` (issue 45), with the real clients:
`response_format` json_object and json_schema on chat and completions, the openai client's
`parse` with a pydantic model, forced tool calls ("required", a named function) answered as
`tool_calls`, LangChain's `with_structured_output` (json_schema and function_calling) and litellm;
tool_choice "auto" and a schema that does not compile are refused by name."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import pydantic
import pytest

from extras import needs_extra
from helpers import MODEL
from structured_cases import SCHEMAS

NAME = MODEL.name
CHAT = [{"role": "user", "content": "Who speaks?"}]


class Speaker(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=8)
    house: Literal["Montague", "Capulet"]
    line: int = pydantic.Field(ge=1, le=999)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


def post(server, path, body):
    return httpx.post(f"{server.url}/v1/{path}", json=body, timeout=60)


def _schema_format(schema, name="answer"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.mark.parametrize("path", ["chat/completions", "completions"])
@pytest.mark.parametrize("case", ["nested_object", "array_of_objects", "pydantic_like"])
def test_response_format_json_schema_answers_validate(server, path, case):
    schema = SCHEMAS[case]
    body = {"model": NAME, "max_tokens": 64, "temperature": 0, "n": 2, "seed": 1}
    body["response_format"] = _schema_format(schema)
    body.update({"messages": CHAT} if path.startswith("chat") else {"prompt": "ROMEO:"})
    r = post(server, path, body)
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        text = choice["message"]["content"] if path.startswith("chat") else choice["text"]
        jsonschema.validate(json.loads(text), schema)
        assert choice["finish_reason"] == "stop", choice


def test_response_format_json_object_streams_an_object(client):
    stream = client.chat.completions.create(
        model=NAME,
        messages=CHAT,
        max_tokens=12,
        response_format={"type": "json_object"},
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.startswith("{"), text


def test_the_openai_clients_parse_fills_a_pydantic_model(client):
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    completion = parse(model=NAME, messages=CHAT, response_format=Speaker, max_tokens=64)
    speaker = completion.choices[0].message.parsed
    assert isinstance(speaker, Speaker), completion


def test_a_named_tool_choice_is_answered_as_a_tool_call(client):
    r = client.chat.completions.create(
        model=NAME,
        messages=CHAT,
        max_tokens=64,
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_tool_choice_required_calls_one_of_the_tools(client):
    r = client.chat.completions.create(
        model=NAME,
        messages=CHAT,
        max_tokens=64,
        tools=[WEATHER, CLOCK],
        tool_choice="required",
        n=3,
        temperature=1.0,
        seed=3,
    )
    for choice in r.choices:
        (call,) = choice.message.tool_calls
        tool = {"get_weather": WEATHER, "get_time": CLOCK}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


@pytest.mark.parametrize(
    "extra, param, words",
    [
        ({"tools": [WEATHER]}, "tool_choice", "'auto'"),
        ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice", "'auto'"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
            "not among the tools",
        ),
        ({"response_format": {"type": "xml"}}, "response_format", "type must be"),
        (
            {"response_format": _schema_format({"type": "integer", "minimum": 3, "maximum": 1})},
            None,
            "does not compile",
        ),
        ({"tools": [WEATHER], "tool_choice": "required", "stream": True}, "stream", "stream"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(server, extra, param, words):
    r = post(server, "chat/completions", {"model": NAME, "messages": CHAT, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert words in error["message"], error
    if param is not None:
        assert error["param"] == param, error


@needs_extra("dev", "langchain_openai")
def test_langchain_with_structured_output_both_methods(server):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model=NAME,
        base_url=server.url + "/v1",
        api_key="none",
        max_tokens=64,
        temperature=0,
        max_retries=0,
    )
    for method in ("json_schema", "function_calling"):
        speaker = chat.with_structured_output(Speaker, method=method).invoke("Who speaks?")
        assert isinstance(speaker, Speaker), (method, speaker)


@needs_extra("dev", "litellm")
def test_litellm_gets_a_json_schema_answer(server, monkeypatch):
    # litellm fetches a model price list from the network at import unless told to use its own
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    r = litellm.completion(
        model=f"openai/{NAME}",
        api_base=server.url + "/v1",
        api_key="none",
        messages=CHAT,
        max_tokens=64,
        temperature=0,
        response_format=Speaker,
    )
    Speaker.model_validate_json(r.choices[0].message.content)
