"""SGLang's own router (`sglang-router`, the `[router]` extra) in front of two `python -m minisgl
serve` workers on its cache_aware policy: the openai client gets a worker's answers through it."""

from __future__ import annotations

import pytest

from extras import module_needs_extra

pytestmark = module_needs_extra("router", "sglang_router")


from minisgl.router.launch import sglang_router  # noqa: E402
from router_fixtures import GREEDY, MODEL, client, worker_urls  # noqa: E402


@pytest.fixture(scope="module")
def workers():
    with worker_urls(2) as urls:
        yield urls


def test_openai_client_through_sglang_router(workers):
    direct = client(workers[0])
    system = "You are the prologue of a play in Verona; speak in verse. " * 3
    with sglang_router(workers, "--policy", "cache_aware") as url:
        routed = client(url)
        assert [m.id for m in routed.models.list().data] == [MODEL]  # from /server_info
        for q in ("Who are you?", "Where are we?", "Who are you?"):
            want = direct.completions.create(model=MODEL, prompt=system + q, **GREEDY)
            got = routed.completions.create(model=MODEL, prompt=system + q, **GREEDY)
            assert got.choices[0].text == want.choices[0].text
        chat = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]
        want = direct.chat.completions.create(model=MODEL, messages=chat, **GREEDY)
        got = routed.chat.completions.create(model=MODEL, messages=chat, **GREEDY)
        assert got.choices[0].message.content == want.choices[0].message.content
        stream = routed.chat.completions.create(
            model=MODEL,
            messages=chat,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == want.choices[0].message.content
        assert chunks[-1].usage.completion_tokens == want.usage.completion_tokens
