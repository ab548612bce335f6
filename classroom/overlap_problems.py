"""The four problems of overlap scheduling that upstream mini-sglang has, each run for real.

Every function here takes the LLM class to run (ours, or a subclass carrying upstream's version of
a method: see `subclass_from_file`) and returns a `ProblemRun`: what happened in each iteration of
the scheduler's loop, read from the engine's event log, and a verdict. Nothing is patched: the
requests go in through `add_request` / `abort`, the loop turns through `step`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

from minisgl.core import SamplingParams
from minisgl.env import ENV
from minisgl.llm import LLM

# A small engine on the CPU; every problem shows up with one or two requests.
OPTIONS = dict(
    device="cpu",
    dtype=torch.float32,
    max_running_req=4,
    num_page_override=512,
    max_seq_len_override=256,
)
PROMPT = "ROMEO:\nBut soft, what light"
LONG_PROMPT = (
    "KING HENRY:\nOnce more unto the breach, dear friends, once more;\nOr close the wall up"
)


@dataclass
class Frame:
    """One turn of the scheduler's loop (one `llm.step()`): what it did, in order."""

    lines: List[str]


@dataclass
class ProblemRun:
    problem: str
    variant: str  # the LLM class's name
    frames: List[Frame]
    verdict: List[str]  # what the run shows, a few lines
    ok: bool  # the behaviour is right
    # uid -> (token, finished)
    sent: Dict[int, List[Tuple[int, bool]]] = field(default_factory=dict)


def subclass_from_file(path: str | Path, base: type = LLM) -> type:
    """A subclass of `base` whose methods are the top-level functions of the file at `path`,
    compiled where the scheduler's own methods live (so they see the same names). A known-wrong
    variant of judge/variants/ that is an edit (`.diff`) is first applied to the reference."""
    from minisgl.scheduler import batch_inputs, intake, lifecycle, scheduler

    path = Path(path)
    if path.suffix == ".diff":
        from judge.variant_edits import variant_source

        source = variant_source(path)
    else:
        source = path.read_text(encoding="utf-8")
    names = [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]
    namespace = {}  # the scheduler's modules together: a variant may replace any of its methods
    for module in (intake, lifecycle, batch_inputs, scheduler):
        namespace.update(vars(module))
    exec(compile(source, str(path), "exec"), namespace)
    return type(f"{base.__name__}_{path.stem}", (base,), {n: namespace[n] for n in names})


# ---------------------------------------------------------------- running and recording


class Recorder:
    """Collects the event log of each loop turn as readable lines, and every message sent."""

    def __init__(self, llm, pages: bool = False) -> None:
        self.llm, self.pages = llm, pages
        self.frames: List[Frame] = []
        self.sent: Dict[int, List[Tuple[int, bool]]] = {}
        self.in_flight: Dict[int, set] = {}  # step -> rows its batch writes
        self.reused_in_flight = 0  # rows handed out while a batch in flight still writes them
        self._lines: List[str] = []
        llm.events.subscribe(self._on_event)

    def _on_event(self, ev) -> None:
        k, f, llm = ev.kind, ev.fields, self.llm
        if k == "launch":
            self.in_flight[f["step"]] = set(f["table_idxs"])
            self._lines.append(
                f"launch {f['step']} {f['phase']}: req {f['uids']} row {f['table_idxs']}"
            )
        elif k == "handle":
            self.in_flight.pop(f["step"], None)
            self._lines.append(f"handle {f['step']}")
        elif k == "send":
            for m in f["msgs"]:
                self.sent.setdefault(m.uid, []).append((m.next_token, m.finished))
                word = llm.decode([m.next_token]) if m.next_token >= 0 else ""
                self._lines.append(
                    f"  send to req {m.uid}: {m.next_token} {word!r} finished={m.finished}"
                )
        elif k == "slot_alloc":
            busy = [s for s, rows in self.in_flight.items() if f["table_idx"] in rows]
            warn = f"  !! step {busy[0]} in flight writes it" if busy else ""
            self.reused_in_flight += bool(busy)
            self._lines.append(f"row {f['table_idx']} -> req {f['uid']}{warn}")
        elif k == "slot_free":
            self._lines.append(f"row {f['table_idx']} freed (req {f['uid']})")
        elif k == "abort":
            self._lines.append(f"abort req {f['uid']} ({f['state']})")
        elif k in ("pages_alloc", "pages_free") and self.pages:
            who = f" -> req {f['uid']}" if "uid" in f else " freed"
            self._lines.append(f"{f['pages']} KV page(s){who}")

    def step(self) -> None:
        self.llm.step()
        self.frames.append(Frame(self._lines))
        self._lines = []

    def run_until_idle(self, limit: int = 200) -> None:
        for _ in range(limit):
            if not self.llm.busy:
                return
            self.step()
        raise RuntimeError("the loop did not go idle")


def _new(llm_class: type, overlap: bool = True, **options):
    ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
    return llm_class(**{**OPTIONS, **options})


def reference_tokens(prompt: str, max_tokens: int) -> List[int]:
    """Greedy tokens of `prompt` from our engine's normal loop, alone: the right answer."""
    key = (prompt, max_tokens)
    if key not in _REFERENCE:
        saved = ENV.DISABLE_OVERLAP_SCHEDULING.value
        llm = _new(LLM, overlap=False)
        _REFERENCE[key] = llm.generate(
            [prompt], SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        )[0]["token_ids"]
        ENV.DISABLE_OVERLAP_SCHEDULING.value = saved
    return list(_REFERENCE[key])


_REFERENCE: Dict[Tuple[str, int], List[int]] = {}


def first_new_token(tokens: List[int], start: int) -> Tuple[int, int]:
    """(k, tokens[k]) for the first k >= start whose token did not appear before k: used as a
    stand-in EOS, so that the request stops exactly there."""
    for k in range(start, len(tokens)):
        if tokens[k] not in tokens[:k]:
            return k, tokens[k]
    raise ValueError("no token usable as EOS")


# ---------------------------------------------------------------- the four problems


def finished_flag(llm_class: type = LLM) -> ProblemRun:
    """Problem 1: one request, max_tokens=3. Only the third message may say finished."""
    llm = _new(llm_class)
    rec = Recorder(llm)
    uid = llm.add_request(PROMPT, SamplingParams(max_tokens=3, ignore_eos=True))
    rec.run_until_idle()
    got = rec.sent.get(uid, [])
    flags = [f for _, f in got]
    ok = flags == [False, False, True]
    return ProblemRun(
        "finished flag",
        llm_class.__name__,
        rec.frames,
        [
            f"(token, finished) sent: {got}",
            "a streaming client stops at the first finished=True: it gets "
            f"{flags.index(True) + 1 if True in flags else len(flags)} of 3 tokens",
        ],
        ok,
        rec.sent,
    )


def message_after_eos(llm_class: type = LLM) -> ProblemRun:
    """Problem 2: the request samples EOS (a stand-in: its third token) and rides along one more
    step; that step's result must produce no message."""
    ref = reference_tokens(PROMPT, 8)
    k, eos = first_new_token(ref, 2)
    llm = _new(llm_class)
    llm.eos_token_ids = {eos}  # pretend this token is the model's end of sequence
    rec = Recorder(llm)
    uid = llm.add_request(PROMPT, SamplingParams(max_tokens=8))
    rec.run_until_idle()
    got = rec.sent.get(uid, [])
    want = [(t, False) for t in ref[:k]] + [(eos, True)]
    extra = got[len(want) :]
    return ProblemRun(
        "message after EOS",
        llm_class.__name__,
        rec.frames,
        [
            f"EOS stand-in: token {eos} (output token {k})",
            f"(token, finished) sent: {got}",
            f"messages after the finished one: {extra}",
        ],
        got == want,
        rec.sent,
    )


def slot_reuse(llm_class: type = LLM, streams: str = "deferred") -> ProblemRun:
    """Problem 3: one request slot. Request 0 ends by EOS at step N; step N+1, in flight, still
    writes into its row. Request 1 waits for that row: it must not get it while step N+1 is in
    flight, or (with deferred CPU streams, as on a GPU) its prompt is overwritten."""
    ref_short = reference_tokens(PROMPT, 6)
    k, eos = first_new_token(ref_short, 1)
    want_long = reference_tokens(LONG_PROMPT, 6)
    # naive cache: request 1's prompt is read from the token pool in full, never from the prefix
    # cache
    llm = _new(llm_class, max_running_req=1, cpu_streams=streams, cache_type="naive")
    llm.eos_token_ids = {eos}
    rec = Recorder(llm)
    a = llm.add_request(PROMPT, SamplingParams(max_tokens=6))
    b = llm.add_request(LONG_PROMPT, SamplingParams(max_tokens=6, ignore_eos=True))
    rec.run_until_idle()
    got_long = llm.results[b].token_ids
    ok = (
        got_long == want_long
        and llm.results[a].token_ids == ref_short[: k + 1]
        and not rec.reused_in_flight
    )
    return ProblemRun(
        "slot reuse",
        llm_class.__name__,
        rec.frames,
        [
            f"{streams} CPU streams; rows reused while still written by a batch in flight: "
            f"{rec.reused_in_flight}",
            f"request 1 alone gives {want_long} {llm.decode(want_long)!r}",
            f"request 1 here gets  {got_long} {llm.decode(got_long)!r}",
        ],
        ok,
        rec.sent,
    )


def abort_in_flight(llm_class: type = LLM) -> ProblemRun:
    """Problem 4: the request is aborted right after its prefill is launched, before its results
    are handled. Nothing may be sent for it, and every KV page must end up free or cached, once."""
    llm = _new(llm_class, cache_type="radix")
    rec = Recorder(llm, pages=True)
    uid = llm.add_request(PROMPT, SamplingParams(max_tokens=8, ignore_eos=True))
    rec.step()  # launches the prefill (step 1); overlap: its results are handled next turn
    llm.abort(uid)
    rec.run_until_idle()
    try:
        llm.cache_manager.check_integrity()
        integrity = "holds"
    except AssertionError as e:
        integrity = f"BROKEN: {e}"
    sent = rec.sent.get(uid, [])
    return ProblemRun(
        "abort in flight",
        llm_class.__name__,
        rec.frames,
        [f"messages sent to the aborted request: {sent}", f"KV page integrity {integrity}"],
        not sent and integrity == "holds",
        rec.sent,
    )


PROBLEMS: Dict[str, Callable[[type], ProblemRun]] = {
    "1. finished flag": finished_flag,
    "2. message after EOS": message_after_eos,
    "3. slot reuse": slot_reuse,
    "4. abort in flight": abort_in_flight,
}
