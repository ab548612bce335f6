"""One intake path (minisgl/scheduler/intake.py): a request from the offline LLM and one from the
server (an OpenAI request, through the tokenizer worker and the wire) are checked and given the
model's generation_config.json defaults in the same place, and the fields the caller set win."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import MODEL, build_llm
from minisgl import SamplingParams
from minisgl.message import UserMsg
from minisgl.message.wire import decode_batch, encode_batch
from minisgl.models.limits import ModelLimits
from minisgl.scheduler.intake import RequestRefused
from minisgl.server import openai_api as api
from minisgl.server import request_sampling
from minisgl.server.tokenizer_worker import TokenizerWorker

pytest.importorskip("pydantic")

MODEL_MAX = 3  # generation_config.json's max_new_tokens in the model below


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """The test model with a generation_config.json that asks for greedy, 3 tokens at most."""
    path = tmp_path_factory.mktemp("intake") / "model"
    shutil.copytree(MODEL, path)
    raw = json.loads((path / "generation_config.json").read_text())
    raw.update(do_sample=False, max_new_tokens=MODEL_MAX)
    (path / "generation_config.json").write_text(json.dumps(raw))
    return path


def served(llm, model: Path, body: dict) -> list:
    """The tokens the scheduler sends for `body`, an OpenAI completion request, taken the server's
    way: the API's SamplingParams, the tokenizer worker, the wire, then the scheduler's messages."""
    req = api.CompletionRequest(model="m", prompt="ROMEO:", **body)
    params = request_sampling.sampling_params(req, 16 if req.max_tokens is None else req.max_tokens)
    limits = ModelLimits.from_dir(model)
    worker = TokenizerWorker(llm.tokenizer, None, limits.end_token_ids, limits.context_len)
    from minisgl.message import TokenizeMsg

    msg = worker.tokenize(TokenizeMsg(uid=900, sampling_params=params, text=req.prompt))
    (msg,) = decode_batch(encode_batch([msg]))
    assert isinstance(msg, UserMsg), f"the tokenizer worker refused the prompt: {msg}"
    sent = []
    llm.results.pop(900, None)
    llm._queue._on_reply = lambda msgs: sent.extend(m for m in msgs if m.uid == 900)
    llm._queue.put(msg)
    llm.run_until_idle()
    assert all(m.error is None for m in sent), f"the scheduler refused it: {sent[-1].error}"
    return [m.next_token for m in sent]


def test_the_server_applies_the_models_generation_defaults(model):
    llm = build_llm(model)
    offline = llm.generate(["ROMEO:"], ignore_eos=True)[0]["token_ids"]
    assert len(offline) == MODEL_MAX, (
        f"offline: max_tokens unset should take max_new_tokens={MODEL_MAX} from "
        f"generation_config.json, got {len(offline)} tokens"
    )
    got = served(llm, model, {"ignore_eos": True})
    assert len(got) == MODEL_MAX, (
        f"a completion that sets no max_tokens should take the model's max_new_tokens "
        f"({MODEL_MAX}) rather than the API's 16, got {len(got)} tokens"
    )
    assert got == offline, (
        "a completion that sets no temperature should be greedy as the model's do_sample=false "
        f"says (not the API's temperature 1.0), as offline: expected {offline}, got {got}"
    )


def test_what_the_client_sets_wins_over_the_models_defaults(model):
    llm = build_llm(model)
    got = served(llm, model, {"ignore_eos": True, "max_tokens": 5})
    assert len(got) == 5, f"max_tokens=5 sent by the client should win, got {len(got)} tokens"


def test_one_place_refuses_for_both_paths(model):
    llm = build_llm(model)
    too_long = SamplingParams(max_tokens=llm.limits.context_len)
    with pytest.raises(ValueError, match="exceeds the context length"):
        llm.generate(["ROMEO:"], too_long)
    with pytest.raises(RequestRefused, match="exceeds the context length"):
        llm.admit(llm.encode("ROMEO:"), too_long)
    sent = []
    llm._queue._on_reply = sent.extend
    llm._queue.put(UserMsg(uid=901, input_ids=llm.encode("ROMEO:"), sampling_params=too_long))
    llm.run_until_idle()
    assert [m.error for m in sent if m.uid == 901] and "exceeds the context length" in (
        sent[-1].error or ""
    ), f"a message from the server should be refused with the same reason, got {sent}"
