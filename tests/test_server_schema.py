"""/openapi.json says what `python -m minisgl serve` does: a bounded schemathesis run against a live
server (loopback, a fixed seed, a bounded number of examples per operation) finds no failing
check: no 5xx, every status and content type declared, every body as declared, every request the
schema calls invalid refused. Schemathesis is in the [dev] extra; its CLI is run, not its pytest
plugin (pyproject.toml turns that off: it costs every pytest start seconds)."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest

from extras import needs_extra

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
    ]
)
SEED = 44
EXAMPLES = 10  # per operation and phase: about 900 requests, a minute or two on a CPU


@needs_extra("dev", "schemathesis")
def test_a_bounded_schemathesis_run_finds_nothing(server, tmp_path):
    cli = shutil.which("schemathesis") or shutil.which("st")
    assert cli is not None, "schemathesis is importable but its command is not on PATH"
    run = subprocess.run(
        [
            cli,
            "run",
            f"{server.url}/openapi.json",
            "--checks",
            CHECKS,
            "--max-examples",
            str(EXAMPLES),
            "--seed",
            str(SEED),
            "--request-timeout",
            "120",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # its reports and cassettes, if any, stay out of the tree
        timeout=900,
    )
    assert run.returncode == 0, f"schemathesis failed:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"


def _events(text: str):
    """The events of a text/event-stream body, parsed as a client does: blank lines end an event,
    its data lines are joined with newlines, its type defaults to "message"."""
    for block in text.replace("\r\n", "\n").split("\n\n"):
        event = {"event": "message"}
        data = [ln[5:].removeprefix(" ") for ln in block.split("\n") if ln.startswith("data:")]
        if data:
            yield dict(event, data="\n".join(data))


@needs_extra("dev", "jsonschema")
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_every_streamed_event_is_what_the_schema_says(server, path):
    # schemathesis reads a text/event-stream schema as each event's: a stream must validate event
    # by event (the schema once said {"type": "string"}, which no parsed event is)
    import jsonschema

    spec = httpx.get(server.url + "/openapi.json").json()
    schema = spec["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]
    model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
    body = {"model": model, "max_tokens": 4, "stream": True}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "ROMEO:"}]
    else:
        body["prompt"] = "ROMEO:"
    answer = httpx.post(server.url + path, json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    events = list(_events(answer.text))
    assert len(events) >= 2 and events[-1]["data"] == "[DONE]", events
    for event in events:
        jsonschema.validate(event, schema["schema"])
