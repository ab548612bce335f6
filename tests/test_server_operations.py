"""Running `python -m minisgl serve` for real clients (one live server with an API key for the
module, and one more for the shutdown test): the key on /v1/*, model lookup, HEAD /health,
/tokenize and /detokenize against the offline tokenizer and the chat template, Prometheus
/metrics counting what was served, and a stream cut by Ctrl-C ending with one error event."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import MODEL, PROMPT_TEXTS, build_llm
from minisgl.server.background import BackgroundServer
from server_fixtures import SERVER_ARGS, SERVER_ENV, wait_for

NAME = MODEL.name
KEY = "test-key-0123"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = [{"role": "user", "content": "Who is there?"}]


@pytest.fixture(scope="module")
def server():
    srv = BackgroundServer(*SERVER_ARGS, env={**SERVER_ENV, "MINISGL_API_KEY": KEY})
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


# ------------------------------------------------------------------ the API key


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}])
def test_v1_needs_the_key(server, headers):
    for method, path, body in [
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", {"model": NAME, "prompt": "hi", "max_tokens": 1}),
        ("POST", "/tokenize", {"prompt": "hi"}),
        ("GET", "/server_info", None),  # shows the model's directory on disk
        ("GET", "/get_model_info", None),
    ]:
        r = httpx.request(method, server.url + path, json=body, headers=headers, timeout=30)
        assert r.status_code == 401, f"{path} without the key: expected 401, got {r.status_code}"
        error = r.json()["error"]
        assert error["code"] == "invalid_api_key" and "Authorization: Bearer" in error["message"]
        assert r.headers.get("www-authenticate") == "Bearer", (
            f"{path}: a 401 names its scheme (RFC 6750), got {r.headers.get('www-authenticate')!r}"
        )
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_the_key_opens_v1_and_health_and_metrics_stay_open(server, client):
    assert [m.id for m in client.models.list().data] == [NAME]
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/metrics").status_code == 200


def test_serve_help_names_the_api_key_option():
    """The key may come from --api-key or from the environment."""
    out = subprocess.run(
        [sys.executable, "-m", "minisgl", "serve", "--help"], capture_output=True, text=True
    ).stdout
    assert "--api-key" in out and "MINISGL_API_KEY" in out, out


# ------------------------------------------------------------------ models, health


def test_a_model_is_looked_up_by_id(server, client):
    assert client.models.retrieve(NAME).id == NAME
    r = httpx.get(f"{server.url}/v1/models/gpt-4", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_head_health(server):
    r = httpx.head(server.url + "/health")
    assert r.status_code == 200 and r.content == b"", (r.status_code, r.content)


# ------------------------------------------------------------------ tokenize, detokenize


def test_tokenize_gives_the_offline_tokenizers_ids_and_the_prompt_tokens_of_usage(server, client):
    llm = build_llm()
    want = llm.tokenizer.encode(PROMPT_TEXTS[1]).ids
    r = httpx.post(server.url + "/tokenize", json={"prompt": PROMPT_TEXTS[1]}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == list(want) and r.json()["count"] == len(want), r.json()
    assert r.json()["max_model_len"] == 256, "the context length the server was started with"
    chat = httpx.post(server.url + "/tokenize", json={"messages": CHAT}, headers=AUTH).json()
    used = client.chat.completions.create(model=NAME, messages=CHAT, max_tokens=1)
    assert chat["count"] == used.usage.prompt_tokens, (
        f"/tokenize counts a chat as its request's prompt: {chat['count']} vs {used.usage}"
    )
    text = httpx.post(server.url + "/detokenize", json={"tokens": want}, headers=AUTH).json()
    assert text == {"prompt": PROMPT_TEXTS[1]}, text


BAD_TOKENIZE = [
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": CHAT}, "prompt"),
    ("/tokenize", {"prompt": "a", "extra": 1}, "extra"),
    ("/tokenize", {"prompt": "a", "model": "gpt-4"}, "model"),
    ("/detokenize", {"tokens": [1, -1]}, "tokens"),
    ("/detokenize", {"tokens": ["1"]}, "tokens"),
]


@pytest.mark.parametrize("path,body,param", BAD_TOKENIZE)
def test_bad_tokenize_requests_are_refused_naming_the_field(server, path, body, param):
    r = httpx.post(server.url + path, json=body, headers=AUTH)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param, r.json()


# ------------------------------------------------------------------ metrics


def scrape(server):
    text = httpx.get(server.url + "/metrics").text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_requests_tokens_and_latencies(server, client):
    before = scrape(server)
    r = client.completions.create(
        model=NAME,
        prompt=PROMPT_TEXTS[0],
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    httpx.get(server.url + "/v1/models/nope", headers=AUTH)
    httpx.get(server.url + "/v1/models")  # no key
    after = scrape(server)

    def grew(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("minisgl_requests_total", endpoint="/v1/completions", status="200") == 1
    assert grew("minisgl_requests_total", endpoint="/v1/models/{model_id:path}", status="404") == 1
    assert grew("minisgl_requests_total", endpoint="/v1/models", status="401") == 1, (
        "a request refused before routing counts under its route"
    )
    httpx.get(server.url + "/no/such/path")
    assert value(scrape(server), "minisgl_requests_total", endpoint="other", status="404") >= 1
    assert grew("minisgl_prompt_tokens_total") == r.usage.prompt_tokens
    assert grew("minisgl_generation_tokens_total") == 6
    assert grew("minisgl_time_to_first_token_seconds_count") == 1
    assert grew("minisgl_inter_token_latency_seconds_count") == 5, "6 tokens, 5 gaps"
    assert value(after, "minisgl_kv_pages_total") == 4096
    assert value(after, "minisgl_requests_running") == 0
    assert 0 < value(after, "minisgl_kv_pages_used") <= 4096, "the radix cache keeps the prompt"


# ------------------------------------------------------------------ shutdown


def test_a_stream_cut_by_ctrl_c_ends_with_one_error_event_and_one_log_line():
    srv = BackgroundServer(*SERVER_ARGS, env=SERVER_ENV)
    srv.start()
    try:
        body = {"model": NAME, "prompt": "ROMEO:", "max_tokens": 240, "ignore_eos": True}
        events = []
        with httpx.stream(
            "POST", srv.url + "/v1/completions", json={**body, "stream": True}, timeout=30
        ) as r:
            lines = r.iter_lines()
            events.append(next(line for line in lines if line))
            srv.proc.send_signal(signal.SIGINT)
            events += [line for line in lines if line]
        assert srv.proc.wait(30) == 0, "Ctrl-C should stop the server cleanly"
    finally:
        srv.stop()
    last = json.loads(events[-1].removeprefix("data: "))
    assert "error" in last and "shutting down" in last["error"]["message"], events[-3:]
    assert "data: [DONE]" not in events, "a cut answer is not a whole one: no [DONE]"
    assert sum("error" in e for e in events) == 1, "one error event"
    log = "".join(srv.log)
    assert log.count("cut by the server's shutdown") == 1, log
    assert "Traceback" not in log and "CancelledError" not in log, log


def test_a_plain_request_cut_by_ctrl_c_is_a_503_not_a_traceback():
    srv = BackgroundServer(*SERVER_ARGS, env=SERVER_ENV)
    srv.start()
    answer = {}

    def ask():
        body = {"model": NAME, "prompt": "ROMEO:", "max_tokens": 240, "ignore_eos": True}
        answer["r"] = httpx.post(srv.url + "/v1/completions", json=body, timeout=30)

    try:
        asking = threading.Thread(target=ask)
        asking.start()
        wait_for(  # the request is running in the scheduler
            "the request starting",
            lambda: httpx.get(srv.url + "/debug/scheduler").json(),
            lambda s: s["running"] == 1,
        )
        srv.proc.send_signal(signal.SIGINT)
        asking.join(30)
        assert srv.proc.wait(30) == 0, "Ctrl-C should stop the server cleanly"
    finally:
        srv.stop()
    r = answer["r"]
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"], r.text
    log = "".join(srv.log)
    assert log.count("cut by the server's shutdown") == 1, log
    assert "Traceback" not in log and "CancelledError" not in log, log


def test_the_live_server_check_names_an_event_loop_that_does_not_answer(monkeypatch):
    """A server that takes the connection and never answers (its event loop held by a blocking
    call) is named at once, not after every request's own timeout (a minute and a half, where the
    judge answers in seconds)."""
    import socket

    import live_server

    monkeypatch.setattr(live_server, "HEALTH_S", 0.3)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = "http://127.0.0.1:%d" % listener.getsockname()[1]
        with pytest.raises(live_server.EventLoopHeld, match="did not answer /health in 0.3 s"):
            live_server._answers_health(url)


@pytest.mark.parametrize(
    "stats,said",
    [
        ({"running": 0, "queued": 0, "in_flight": False}, "the scheduler holds no request"),
        ({"running": 1, "queued": 0, "in_flight": True}, "still holds it (1 running, 0 queued)"),
    ],
)
def test_the_live_server_check_says_where_an_unanswered_request_is(monkeypatch, stats, said):
    """A request never answered (a finished reply lost by the tokenizer worker, a request the
    scheduler never finishes) fails in seconds, saying which of the two, not after the judge's
    minute as a timeout 'an endless loop, or far too slow'."""
    import http.server

    import live_server

    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(stats if self.path == "/debug/scheduler" else {}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # takes the request, never answers it
            release.wait(30)

        def log_message(self, *args):
            pass

    monkeypatch.setattr(live_server, "REPLY_S", 0.5)
    monkeypatch.setattr(live_server, "GPU_FIRST_REPLY_S", 0.5)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(AssertionError) as failure:
            live_server._check("http://127.0.0.1:%d" % srv.server_address[1])
    finally:
        release.set()
        srv.shutdown()
        srv.server_close()
    assert str(failure.value).startswith("a completion of 10 tokens got no answer in time: ")
    assert said in str(failure.value)
