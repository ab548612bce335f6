"""The server when things go wrong around it (its own server: these tests end it): a model without a
chat template; the scheduler process crashing mid-stream (500s, /health 503, no hanging client); the
API server killed outright (its workers must not outlive it)."""

from __future__ import annotations

import json
import os
import signal

import httpx
import openai
import pytest

from helpers import MODEL
from minisgl.server.background import BackgroundServer, wait_gone
from server_fixtures import SERVER_ARGS, SERVER_ENV

NAME = "no-template"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The test model in a directory whose tokenizer_config.json has no chat template."""
    model = tmp_path_factory.mktemp("model") / NAME
    model.mkdir()
    for f in MODEL.iterdir():
        if f.name != "tokenizer_config.json":
            (model / f.name).symlink_to(f)
    config_path = MODEL / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    srv = BackgroundServer("--model", str(model), *SERVER_ARGS, env=SERVER_ENV)
    srv.start()
    yield srv
    srv.stop()
    if srv.proc.poll() is None:
        os.killpg(srv.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=20)


def workers(server):
    return httpx.get(server.url + "/health").json()["workers"]


def test_chat_without_a_template_is_a_400(client):
    if not (MODEL / "tokenizer.json").is_file():
        pytest.skip("the test model has no tokenizer")
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    body = err.value.body
    assert isinstance(body, dict) and "chat template" in body.get("message", ""), (
        f"expected an OpenAI error naming the missing chat template, got {body}"
    )
    assert (
        client.completions.create(model=NAME, prompt="ROMEO:", max_tokens=2).usage.completion_tokens
        >= 1
    ), "completions should still work"


def test_a_scheduler_crash_answers_in_flight_requests_and_turns_health_red(server, client):
    stream = client.completions.create(
        model=NAME, prompt="ROMEO:", max_tokens=200, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = iter(stream)
    next(chunks)
    os.kill(workers(server)["scheduler"], signal.SIGKILL)
    with pytest.raises(
        openai.APIError
    ) as err:  # an error event, not a hang (the client's timeout is 20 s)
        for _ in chunks:
            pass
    assert "scheduler" in str(err.value), (
        f"the stream's error should say the scheduler died, said {err.value}"
    )
    health = httpx.get(server.url + "/health")
    assert health.status_code == 503, (
        f"/health should turn 503 after the scheduler died, got {health.status_code}"
    )
    with pytest.raises(openai.InternalServerError) as err:
        client.completions.create(model=NAME, prompt="ROMEO:", max_tokens=2)
    assert err.value.status_code == 500 and "scheduler" in str(err.value), (
        "a new request should get a 500 naming the dead scheduler, got "
        f"{err.value.status_code}: {err.value}"
    )


def test_killing_the_api_server_leaves_no_worker_behind(server):
    alive = [pid for pid in workers(server).values()]
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    left = wait_gone(alive, 10)
    assert not left, f"the API server was killed, but worker process(es) {left} still run"
