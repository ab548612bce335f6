"""The offline interface: `LLM(...).generate(prompts, sampling_params)`.

LLM *is* a Scheduler whose messages travel through an in-process queue. A new request meets the
scheduler's intake (`admit`: its checks and the model's defaults, minisgl/scheduler/intake.py) at
the call that brings it, so a bad one fails that call and nothing is queued. Besides `generate`, it
exposes the pieces a test or a notebook needs to drive the engine step by step: `add_request`,
`abort`, `step`, and the `results` collected so far.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Sequence

import torch

from minisgl.core import SamplingParams
from minisgl.message import AbortBackendMsg, DetokenizeMsg, UserMsg
from minisgl.models import BUNDLED_MODEL
from minisgl.models.tokenizer import load_tokenizer
from minisgl.scheduler import QueueIO, Scheduler, SchedulerConfig

from . import inputs, recover, stops
from .progress_bar import generation_progress

Prompt = str | Sequence[int]


@dataclass
class RequestResult:
    uid: int
    token_ids: List[int] = field(default_factory=list)
    finished: bool = False
    aborted: bool = False
    error: str | None = None
    logprobs: List = field(default_factory=list)  # [logprob, top] per token, when asked
    prompt_logprobs: List | None = None  # [logprob, top] per prompt token after the first
    prompt_ids: List[int] = field(default_factory=list)


def _logprob_entry(token_id: int, entry: List) -> Dict:
    """{"token_id", "logprob", "top_logprobs": [[id, logprob], ...]} from a message's entry."""
    return {"token_id": token_id, "logprob": entry[0], "top_logprobs": entry[1]}


def model_directory(model: object) -> Path:
    if not isinstance(model, (str, Path)):
        raise TypeError(
            f"model must be a directory path (str or Path), got {type(model).__name__} {model!r}"
        )
    model_dir = Path(model)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory not found: {model_dir}")
    return model_dir


class LLM(Scheduler):
    tensor_parallel_class: type  # TensorParallelLLM (parallel.py), which LLM(tp_size=N>1) builds

    def __new__(cls, model: str | Path = BUNDLED_MODEL, **options):
        # LLM(model, tp_size=N) with N > 1 is the tensor-parallel engine: N processes, one per rank
        # (minisgl/llm/parallel.py); tp_size=1 stays this one-process engine.
        if cls is LLM and options.get("tp_size", 1) != 1:
            cls = LLM.tensor_parallel_class  # set by minisgl/llm/__init__.py
        return super().__new__(cls)

    def __init__(self, model: str | Path = BUNDLED_MODEL, **options) -> None:
        model_dir = model_directory(model)
        self._queue = QueueIO(self._on_reply)
        super().__init__(SchedulerConfig(model_path=model_dir, **options), self._queue)
        self.tokenizer = load_tokenizer(model_dir)
        self.results: Dict[int, RequestResult] = {}
        self._next_uid = 0
        # One caller at a time: generate (and the step-by-step methods) from several threads wait
        # for each other; a web app's thread pool gets every answer right. Re-entrant, so generate
        # may call step; `_generating` refuses a generate nested in a running one.
        self._lock = threading.RLock()
        self._generating = False
        self._shut_down = False  # after shutdown(), every call that would run a request raises

    # ------------------------------------------------------------------ requests

    def encode(self, prompt: Prompt) -> torch.Tensor:
        """A prompt (text, token ids, or a 1-D integer array: minisgl/llm/inputs.py) as int32
        ids."""
        return inputs.token_ids(prompt, self.tokenizer)

    def decode(self, token_ids: List[int]) -> str:
        return self.tokenizer.decode(token_ids) if self.tokenizer is not None else ""

    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, **sampling: Any
    ) -> int:
        """Queue one request; returns its uid. Raises TypeError or ValueError (and queues nothing)
        if it can never run. Sampling settings as for `generate`."""
        self._refuse_if_shut_down("add_request")
        ids, params = self._admitted(prompt, inputs.sampling_list(params, 1, sampling)[0])
        with self._lock:
            return self._enqueue(ids, params)

    def _admitted(self, prompt: Prompt, params: SamplingParams):
        """The prompt's ids and its settings with the model's defaults, through the scheduler's
        intake (minisgl/scheduler/intake.py), the one place every request is checked."""
        ids = self.encode(prompt)
        return ids, self.admit(ids, params)

    def _enqueue(self, ids: torch.Tensor, params: SamplingParams) -> int:
        """Queue an admitted request as the message a server's would be (the scheduler's intake
        takes it in again: cheap, and the same for every message whatever it came from)."""
        uid = self._next_uid
        self._next_uid += 1
        self.results[uid] = RequestResult(uid, prompt_ids=ids.tolist())
        self._queue.put(UserMsg(uid=uid, input_ids=ids, sampling_params=params))
        return uid

    def abort(self, uid: int) -> None:
        """Stop request `uid`. It receives no further tokens."""
        with self._lock:
            if uid not in self.results:
                raise ValueError(f"unknown request uid {uid}")
            result = self.results[uid]
            if not result.finished:
                result.aborted = result.finished = True
                self._queue.put(AbortBackendMsg(uid=uid))

    def _on_reply(self, msgs: List[DetokenizeMsg]) -> None:
        for msg in msgs:
            result = self.results.get(msg.uid)
            if result is None or result.aborted:
                continue
            if msg.error is not None:
                result.error, result.finished = msg.error, True
                continue
            result.token_ids.append(msg.next_token)
            result.finished = msg.finished
            if msg.logprobs is not None:
                if "token" in msg.logprobs:
                    result.logprobs.append(msg.logprobs["token"])
                if "prompt" in msg.logprobs:
                    result.prompt_logprobs = msg.logprobs["prompt"]

    # ------------------------------------------------------------------ running

    @property
    def busy(self) -> bool:
        """Work remains: queued messages, unfinished requests, or a batch in flight."""
        return self.in_flight or self.has_work or self._queue.pending > 0

    def step(self) -> None:
        self._refuse_if_shut_down("step")
        with self._lock:
            super().step()

    def _refuse_if_shut_down(self, call: str) -> None:
        """A shut-down engine answers nothing: saying so beats an empty text (issue 44)."""
        if getattr(self, "_shut_down", False):
            raise RuntimeError(
                f"LLM.{call}: this LLM was shut down (LLM.shutdown()) and runs no more requests; "
                "make a new LLM"
            )

    def run_until_idle(self, max_idle_steps: int = 3) -> None:
        idle = 0
        while self.busy:
            launched = self.steps_launched
            self.step()
            idle = idle + 1 if self.steps_launched == launched and not self.in_flight else 0
            if idle > max_idle_steps:
                raise RuntimeError(
                    "the scheduler made no progress: requests are stuck waiting "
                    f"({len(self.prefill_manager.pending)} queued)"
                )

    def generate(
        self,
        prompts: Prompt | List[Prompt],
        sampling_params: SamplingParams | List[SamplingParams] | None = None,
        progress: bool | None = None,
        **sampling: Any,
    ) -> List[Dict]:
        """Run every prompt to completion; returns [{"text", "token_ids", "finish_reason"}] in
        prompt order (plus "error" for a request the scheduler refused or whose step failed; the
        text ends before a stop string, finish_reason is "stop" or "length").

        Sampling: either `sampling_params` (one for all prompts, or one each), taken as they are,
        or SamplingParams' fields as keywords (`generate(prompts, max_tokens=30)`): the fields not
        named take the model's generation_config.json defaults where it has some, else
        SamplingParams' own (minisgl/scheduler/intake.py). `progress`: a bar
        counting tokens, True to show it, False never; None (default) shows it for runs longer than
        two seconds in a notebook or a terminal, never under pytest or CI
        (minisgl/llm/progress_bar.py, MINISGL_PROGRESS).

        Calls from several threads run one after another, each with its own right answer. A call
        made from inside a running one (an event subscriber's) is refused with RuntimeError. An
        exception inside the call (Ctrl-C, a subscriber's error) leaves the engine as it was before
        the call (minisgl/llm/recover.py) and propagates."""
        self._refuse_if_shut_down("generate")
        with self._lock:
            if self._generating:
                raise RuntimeError(
                    "LLM.generate was called from inside a running generate (from an event "
                    "subscriber or a progress hook?): the engine runs one call at a time; call it "
                    "after the running one returns"
                )
            self._generating = True
            try:
                return self._generate(prompts, sampling_params, progress, sampling)
            finally:
                self._generating = False

    def _generate(self, prompts, sampling_params, progress, sampling) -> List[Dict]:
        prompts = inputs.prompt_list(prompts)
        params = inputs.sampling_list(sampling_params, len(prompts), sampling)
        # Check every prompt before queueing any, so a bad one loses nothing.
        admitted = []
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            try:
                admitted.append(self._admitted(prompt, p))
            except (TypeError, ValueError) as e:
                raise type(e)(f"prompt {i}: {e}") from None
        params = [p for _, p in admitted]
        uids: List[int] = []
        try:
            uids.extend(self._enqueue(ids, p) for ids, p in admitted)
            with generation_progress(self, uids, [p.max_tokens for p in params], progress):
                self.run_until_idle()
        except BaseException as e:  # Ctrl-C too: the engine must not keep half of this call
            self._reset_to_idle(uids, e)
            raise
        outputs = []
        for uid, p in zip(uids, params):
            r = self.results.pop(uid)
            out = self._output(r, p)
            if r.error is not None:
                out["error"] = r.error
            outputs.append(out)
        return outputs

    def _output(self, r: RequestResult, params: SamplingParams) -> Dict:
        """{"text", "token_ids", "finish_reason"}: the text ends before the first stop string, and
        shows no stop token id; max_tokens 0 returns no token."""
        ids = [] if params.max_tokens == 0 else r.token_ids
        text = self.decode(stops.visible_ids(ids, params))
        cut = stops.first_stop(text, params.stop)
        if cut is not None:
            text = text[:cut]
        reason = stops.finish_reason(ids, params, self.eos_token_ids, cut is not None)
        out = {"text": text, "token_ids": ids, "finish_reason": reason}
        if params.logprobs is not None:  # one entry per returned token
            out["logprobs"] = [_logprob_entry(t, e) for t, e in zip(ids, r.logprobs)]
        if params.prompt_logprobs and r.prompt_logprobs is not None:
            prompt = r.prompt_ids
            out["prompt_logprobs"] = [None] + [
                _logprob_entry(t, e) for t, e in zip(prompt[1:], r.prompt_logprobs)
            ]
        return out

    def _reset_to_idle(self, uids: List[int], error: BaseException) -> None:
        recover.reset_to_idle(self, self._queue, self.results, uids, error)

    def shutdown(self) -> None:
        """Handle the batch still in flight (overlap loop) and wait for the engine stream."""
        while self.in_flight:
            self.step()
        self.engine.synchronize()
        self._shut_down = True
