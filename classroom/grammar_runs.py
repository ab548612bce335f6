"""Chapter 22's runs of the engine under grammars, for its try-outs: hand-made logits and bitmasks
for the sampler, and constrained generations of the bundled model read back as JSON.

Every run takes the LLM class to run (ours, or a subclass carrying the learner's method) and goes
through `add_request` / `generate` / `abort`; what it returns is what a check needs to say what it
saw: the texts, the `grammar_reject` events, the matchers left behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List

import jsonschema
import torch

from minisgl.core import SamplingParams
from minisgl.llm import LLM

from .overlap_problems import OPTIONS

VOCAB = 64  # columns of the hand-made logits: two int32 words of bitmask

NAME = {"type": "string", "maxLength": 8}
SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "speaker": {
        "type": "object",
        "properties": {
            "speaker": {
                "type": "object",
                "properties": {"name": NAME, "house": {"enum": ["Montague", "Capulet"]}},
                "required": ["name", "house"],
                "additionalProperties": False,
            },
            "line": {"type": "integer", "minimum": 1, "maximum": 999},
        },
        "required": ["speaker", "line"],
        "additionalProperties": False,
    },
    "words": {
        "type": "array",
        "minItems": 1,
        "maxItems": 2,
        "items": {
            "type": "object",
            "properties": {
                "word": {"type": "string", "maxLength": 6},
                "n": {"type": "integer", "minimum": 0, "maximum": 50},
            },
            "required": ["word", "n"],
            "additionalProperties": False,
        },
    },
    "id": {
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
        "required": ["id"],
        "additionalProperties": False,
    },
}
PROMPTS = [
    "ROMEO:\nBut soft, what light through yonder window breaks?",
    "KING HENRY:\nOnce more unto the breach, dear friends,",
    "To be, or not to be",
]


def bitmask_of(*allowed_rows: List[int]) -> torch.Tensor:
    """[C, VOCAB // 32] int32: row i allows the tokens of allowed_rows[i] (bit t % 32 of word
    t // 32; bit 31 is the int32's sign)."""
    mask = torch.zeros(len(allowed_rows), VOCAB // 32, dtype=torch.int64)
    for i, allowed in enumerate(allowed_rows):
        for t in allowed:
            mask[i, t // 32] |= 1 << (t % 32)
    return torch.where(mask >= 1 << 31, mask - (1 << 32), mask).to(torch.int32)


def ramp_logits(rows: int) -> torch.Tensor:
    """[rows, VOCAB]: every row prefers the highest token id, then the next one down."""
    return torch.linspace(0.0, 12.0, VOCAB).repeat(rows, 1)


def json_problem(schema_name: str, out: Dict) -> str | None:
    """What is wrong with a constrained output, in words, or None: JSON, valid under its schema,
    ended by the grammar (finish_reason "stop")."""
    text = out["text"]
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return f"{schema_name}: {text!r} is not JSON"
    try:
        jsonschema.validate(value, SCHEMAS[schema_name])
    except jsonschema.ValidationError as e:
        return f"{schema_name}: {text!r} breaks the schema ({e.message})"
    if out["finish_reason"] != "stop":
        return f"{schema_name}: {text!r} ended with finish_reason {out['finish_reason']!r}"
    return None


@dataclass
class GrammarRun:
    outputs: List[Dict]  # the constrained requests' outputs, in SCHEMAS order
    free: List[List[int]]  # the free requests' tokens
    rejects: List[Dict] = field(default_factory=list)  # grammar_reject events' fields
    matchers_left: List[int] = field(default_factory=list)  # uids whose matcher outlived them

    def problems(self) -> List[str]:
        return [p for n, o in zip(SCHEMAS, self.outputs) if (p := json_problem(n, o))]


def watch_rejects(llm) -> List[Dict]:
    rejects: List[Dict] = []
    llm.events.subscribe(
        lambda ev: rejects.append(dict(ev.fields)) if ev.kind == "grammar_reject" else None
    )
    return rejects


def constrained_run(llm_class=LLM, overlap: bool = True, **options) -> GrammarRun:
    """One request per schema of SCHEMAS and two free greedy ones, on deferred CPU streams (the
    engine runs behind the scheduler every time, as a busy GPU does)."""
    llm = llm_class(**{**OPTIONS, **options}, cpu_streams="deferred", overlap_scheduling=overlap)
    try:
        rejects = watch_rejects(llm)
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(SCHEMAS))] + PROMPTS[:2]
        params = [
            SamplingParams(max_tokens=64, constraint={"json_schema": s}) for s in SCHEMAS.values()
        ] + [SamplingParams(max_tokens=10)] * 2
        outs = llm.generate(prompts, params)
        return GrammarRun(
            outputs=outs[: len(SCHEMAS)],
            free=[o["token_ids"] for o in outs[len(SCHEMAS) :]],
            rejects=rejects,
            matchers_left=sorted(llm._matchers),
        )
    finally:
        llm.shutdown()


def free_tokens() -> List[List[int]]:
    """The two free requests of `constrained_run`, alone."""
    llm = LLM(**OPTIONS, cpu_streams="deferred")
    try:
        return [o["token_ids"] for o in llm.generate(PROMPTS[:2], SamplingParams(max_tokens=10))]
    finally:
        llm.shutdown()


@dataclass
class AbortRun:
    queued_kept: bool  # the request waiting for a slot still had its matcher
    left: List[int]  # matchers left once every request ended
    queued_problem: str | None  # what is wrong with the queued request's output


def abort_run(llm_class=LLM, overlap: bool = True) -> AbortRun:
    """One slot, two constrained requests: the first runs three turns and is aborted, the second
    waits in the queue, then runs to its end."""
    llm = llm_class(
        **{**OPTIONS, "max_running_req": 1}, cpu_streams="deferred", overlap_scheduling=overlap
    )
    try:
        params = SamplingParams(max_tokens=64, constraint={"json_schema": SCHEMAS["speaker"]})
        first = llm.add_request(PROMPTS[0], params)
        queued = llm.add_request(PROMPTS[1], params)
        for _ in range(3):
            llm.step()
        kept = queued in llm._matchers
        llm.abort(first)
        llm.run_until_idle()
        problem = json_problem("speaker", llm._output(llm.results[queued], params))
        return AbortRun(kept, sorted(llm._matchers), problem)
    finally:
        llm.shutdown()


class _StandIn:
    def __init__(self, **fields) -> None:
        self.__dict__.update(fields)


def refused_token_events(llm_class=LLM, finished: bool = False) -> tuple:
    """A regex "a+" request after its prefill, handed a step whose token is "b" (which its
    grammar refuses): (the grammar_reject events, the uid, the token, what `handle` was given).
    `finished`: the request is in `finished_reqs` (as an abort or a retraction leaves it), so the
    handling drops its token and no event may come."""
    llm = llm_class(**OPTIONS, overlap_scheduling=False)
    try:
        rejects = watch_rejects(llm)
        uid = llm.add_request(PROMPTS[2], SamplingParams(max_tokens=8, constraint={"regex": "a+"}))
        llm.step()
        token = llm.encode("b").tolist()[-1]
        req = _StandIn(uid=uid, is_chunk=False)
        if finished:
            llm.finished_reqs.add(req)
        step = _StandIn(batch=_StandIn(reqs=[req]))
        out = _StandIn(
            copy_done=_StandIn(synchronize=lambda: None), next_tokens_cpu=torch.tensor([token])
        )
        handled: List = []

        def handle(data) -> None:  # as chapter 11's: finished_reqs becomes this step's ended
            handled.append(data)
            llm.finished_reqs = set()

        llm._handle_with_matchers((step, out), handle)
        return rejects, uid, token, handled == [(step, out)]
    finally:
        llm.shutdown()
