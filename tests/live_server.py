"""Part 3 live: the real three-process server (`python -m minisgl serve`, spawning the scheduler and
the tokenizer worker), talked to with the official `openai` client, as each of chapters 12 to 15
checks its code at the end.

Under the judge, the server runs the learner's code in all three processes (judge/serving.py
puts it there through MINISGL_SERVER_INIT): what fails in a worker shows up here as a refused,
wrong or missing answer. So that the failure names the cause, the server's log is searched for the
exception a learner's function (or its stub) raised, and that is raised here.
"""

from __future__ import annotations

import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from helpers import MODEL, build_llm, test_device
from minisgl import SamplingParams
from minisgl.server.background import BackgroundServer
from server_fixtures import (
    SERVER_ARGS,
    SERVER_ENV,
    assert_all_back,
    idle,
    scheduler_stats,
    wait_for,
)

NAME = MODEL.name
TOP_1 = {"top_k": 1}  # a sampling option that is not a default: it must reach the scheduler
PROMPT = "ROMEO:\nBut soft, what light"
LEARNER_ERROR = re.compile(r"(NotImplementedError|LearnerCodeError): (ch\d\d\.\w+: .*)")
# /health needs nothing but the API server's event loop: one that does not answer in this long is
# held (a blocking call in a coroutine), and every request behind it would wait out its timeout
HEALTH_S = 5.0
STOP_S = 5.0  # a failed server's SIGTERM, before it is killed
# Each request here is a few tokens: the reference answers it in well under a second on a laptop's
# CPU, a wrong step that sleeps 200 ms in a few seconds. One not answered in this long never will
# be (a lost reply, a request never finished), and the check says where it is stuck instead of
# waiting out the judge's minute. A GPU's first request also compiles its kernels: it gets longer.
REPLY_S = 15.0
GPU_FIRST_REPLY_S = 120.0


def check_live_server(what: str) -> None:
    """Start the server, check it answers as the offline engine does, stop it. `what`: the
    chapter's part in it, said in a failure."""
    server = BackgroundServer(*SERVER_ARGS, env=SERVER_ENV, timeout=120)
    try:
        try:
            server.start()
            _answers_health(server.url)
            _check(server.url)
        except Exception as e:
            # A 500 reaches the client before uvicorn logs the exception behind it: stop the
            # server (every process writes what it has) and let the reader drain, then search.
            try:  # a held event loop never sees the signal: no use waiting for it
                server.stop(0.5 if isinstance(e, EventLoopHeld) else STOP_S)
            except subprocess.TimeoutExpired:
                pass  # killed
            _drain(server)
            log = "".join(server.log)
            found = LEARNER_ERROR.findall(log)
            if found:  # the learner's function (or its stub) raised in one of the processes
                raise NotImplementedError(f"{found[0][1]} (in the live server)") from e
            if isinstance(e, AssertionError):
                raise
            tail = " | ".join(line.strip() for line in server.log[-4:] if line.strip())
            raise AssertionError(
                f"the live server ({what}) failed: {type(e).__name__}: {e}; its log ends: {tail}"
            ) from e
    finally:
        code = server.stop()
    assert code == 0, f"the server did not stop cleanly on SIGTERM (exit code {code})"


def _drain(server: BackgroundServer, seconds: float = 2.0) -> None:
    """Wait (a little) until the reader has taken the exited server's last lines."""
    deadline = time.monotonic() + seconds
    while server.proc is not None and not server.proc.stdout.closed and time.monotonic() < deadline:
        n = len(server.log)
        time.sleep(0.1)
        if len(server.log) == n and server.proc.poll() is not None:
            break


class EventLoopHeld(AssertionError):
    pass


def _answers_health(url: str) -> None:
    try:
        httpx.get(url + "/health", timeout=HEALTH_S)
    except httpx.TimeoutException:
        raise EventLoopHeld(
            f"the live server took the connection but did not answer /health in {HEALTH_S:g} s: "
            "nothing on its event loop runs (a blocking call in a coroutine, time.sleep say, "
            "holds every request)"
        ) from None


@contextmanager
def _answered(url: str, request: str):
    """Turn a request's timeout into a failure that says whether the scheduler still holds it."""
    try:
        yield
    except (openai.APITimeoutError, httpx.TimeoutException):
        raise AssertionError(f"{request} got no answer in time: {_where_stuck(url)}") from None


def _where_stuck(url: str) -> str:
    try:
        stats = httpx.get(url + "/debug/scheduler", timeout=HEALTH_S).json()
    except (httpx.HTTPError, ValueError) as e:
        return f"and the scheduler's state could not be read either ({type(e).__name__}: {e})"
    if not idle(stats):
        return (
            f"the scheduler still holds it ({stats['running']} running, {stats['queued']} "
            "queued): it never finished"
        )
    tokens = _generated_tokens(url)
    return (
        "the scheduler holds no request: it never got this one, or it finished it and the "
        "reply was lost on its way back (the tokenizer worker or the API server never passed on "
        "a finished reply)"
        + ("" if tokens is None else f"; {tokens:g} generated tokens reached the API server in all")
    )


def _generated_tokens(url: str) -> float | None:
    """The server's minisgl_generation_tokens_total: what the API server has received."""
    try:
        text = httpx.get(url + "/metrics", timeout=HEALTH_S).text
        families = {f.name: f for f in text_string_to_metric_families(text)}
        return families["minisgl_generation_tokens"].samples[0].value
    except Exception:  # a wrong server's metrics: the failure is said without them
        return None


def _check(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=REPLY_S)
    first_s = REPLY_S if test_device() == "cpu" else GPU_FIRST_REPLY_S
    want = build_llm().generate([PROMPT], SamplingParams(max_tokens=10))[0]
    ids = {"return_token_ids": True}
    # one whole completion: the offline engine's tokens and text
    with _answered(url, "a completion of 10 tokens"):
        got = (
            client.with_options(timeout=first_s)
            .completions.create(
                model=NAME, prompt=PROMPT, max_tokens=10, temperature=0, extra_body=ids
            )
            .choices[0]
        )
    assert got.model_extra["token_ids"] == want["token_ids"], (
        f"the server's tokens {got.model_extra['token_ids']} are not the offline engine's "
        f"{want['token_ids']}"
    )
    assert got.text == want["text"], f"expected text {want['text']!r}, got {got.text!r}"
    reason = "stop" if len(want["token_ids"]) < 10 else "length"
    assert got.finish_reason == reason, (
        f"expected finish_reason {reason!r}, got {got.finish_reason!r}"
    )
    # the same streamed, with usage: the chunks join to the same text
    with _answered(url, "a streamed completion of 10 tokens"):
        stream = client.completions.create(
            model=NAME,
            prompt=PROMPT,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == want["text"], f"the streamed chunks join to {text!r}, not {want['text']!r}"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 10, f"the usage chunk says {usage}"
    # three at once, with sampling options that must travel to the scheduler intact
    with ThreadPoolExecutor(3) as pool, _answered(url, "one of three completions at once"):
        answers = list(
            pool.map(
                lambda n: client.completions.create(
                    model=NAME,
                    prompt=PROMPT,
                    max_tokens=n,
                    temperature=0.7,
                    extra_body={"top_k": 1},
                ),
                (4, 6, 8),
            )
        )
    assert [a.usage.completion_tokens for a in answers] == [4, 6, 8], (
        f"three requests at once got {[a.usage.completion_tokens for a in answers]} tokens"
    )
    # a chat, streamed
    with _answered(url, "a streamed chat of 6 tokens"):
        chat = client.chat.completions.create(
            model=NAME,
            messages=[{"role": "user", "content": "Good morrow."}],
            max_tokens=6,
            temperature=0,
            stream=True,
        )
        pieces = [c.choices[0].delta.content or "" for c in chat if c.choices]
    assert "".join(pieces), "the streamed chat said nothing"
    # a request that cannot run is a 400, and the server goes on
    try:
        with _answered(url, "a prompt longer than the context"):
            client.completions.create(model=NAME, prompt="x" * 4000, max_tokens=4)
    except openai.BadRequestError:
        pass
    else:
        raise AssertionError("a prompt longer than the context was accepted, not a 400")
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    assert_all_back(wait_for("the server going idle", lambda: scheduler_stats(url), idle))
