"""The Scheduler: receives requests, decides what runs each step, launches it, and handles results.

Two loops drive it:

* `normal_loop`: receive, schedule, launch step N, wait for step N's tokens, handle them.
* `overlap_loop`: receive, schedule, launch step N, *then* handle step N-1 while step N runs.

With overlap, the CPU's state is one step ahead of the results it handles. Four rules keep the
results right (each fixes a bug of upstream mini-sglang; see chapter 11):

1. finished is decided from the tokens the CPU has received, not from `can_decode`;
2. a request that finished at step N but rode along in step N+1 gets no message at N+1;
3. a freed request slot is reused only once no batch in flight can still write to it;
4. an abort that arrives while the request's batch is in flight marks it finished, so that batch's
   results are dropped and its pages are not cached or freed twice.

A step that raises (a forward or sampling error, out of memory) fails only the requests of its
batch: each gets an error reply and gives back its slot and pages, and the loop goes on
(`_forward`).

Scheduler is put together from one module per job: this one holds its state, the policy (what
runs next) and the two loops; intake.py takes requests in (checks, model defaults); lifecycle.py
handles results, aborts, failed steps and freeing; batch_inputs.py builds a batch's device inputs;
extras.py (with stops.py) adds what single requests ask beyond the workbook's engine: stops, seeds,
logprobs; grammar_steps.py adds structured output (a constrained batch samples after its mask).
"""

from __future__ import annotations

from typing import Dict, List, Set, Tuple

import torch

from minisgl.core import Req
from minisgl.engine import Engine, ForwardInput, ForwardOutput
from minisgl.env import ENV
from minisgl.models.tokenizer import load_tokenizer
from minisgl.utils import EventLog

from .batch_inputs import BatchInputs
from .cache import CacheManager
from .config import SchedulerConfig
from .decode import DecodeManager
from .extras import RequestExtras, plan_extras
from .grammar_steps import GrammarSteps
from .intake import Intake
from .io import SchedulerIO
from .lifecycle import RequestLifecycle
from .load import LoadPrefillManager, RetractingDecodeManager
from .retract import Retraction
from .speculative import SpeculativeSteps
from .stops import StopChecker
from .table import TableManager

ForwardData = Tuple[ForwardInput, ForwardOutput]


class Scheduler(
    SpeculativeSteps, GrammarSteps, RequestExtras, Intake, Retraction, RequestLifecycle, BatchInputs
):
    def __init__(self, config: SchedulerConfig, io: SchedulerIO) -> None:
        self.config = config
        self.io = io
        self.events = EventLog()
        self.engine = Engine(config)
        engine = self.engine
        self.device = engine.device
        # The model's limits, resolved once by the engine: context length, vocabulary, end ids
        # (generation_config.json's list replaces config.json's) and sampling defaults.
        self.limits = engine.limits
        self.eos_token_ids = self.limits.end_token_ids
        self.vocab_size = self.limits.vocab_size
        # stop strings are text: the scheduler decodes each stopping request's last tokens
        self.stops = StopChecker(load_tokenizer(config.model_path))
        self._init_grammars()  # structured output: the compile check, matchers (grammar_steps.py)
        self.token_pool, self.page_table = engine.token_pool, engine.page_table
        self.table_manager = TableManager(config.max_running_req, self.events)
        self.cache_manager = CacheManager(
            engine.num_pages, engine.page_size, engine.page_table, config.cache_type, self.events
        )
        # the chapters' managers, with the queue's order, the admission plan and retraction on top
        # (load.py, policy.py, retract.py)
        self._init_retraction()
        self.decode_manager: DecodeManager = RetractingDecodeManager(self)
        self.prefill_manager = LoadPrefillManager(
            self.cache_manager,
            self.table_manager,
            self.decode_manager,
            engine.token_pool,
            engine.page_table,
            load=self,
        )
        self.stream = engine.kit.new_stream()  # the scheduler's own stream (metadata, table writes)
        self.finished_reqs: Set[Req] = set()  # finished at the step handled last
        self._live: Dict[int, Req] = {}  # uid -> launched request whose end has not been handled
        self._last_data: ForwardData | None = None  # the overlap loop's batch in flight (step())
        self._defer_slot_free = False
        self._deferred_slots: List[Tuple[int, int]] = []  # (table_idx, uid)
        self._step = 0
        self._prompt_parts: Dict[int, list] = {}  # uid -> prompt logprobs of its chunks so far
        self._init_speculative()  # drafts and verify steps, when config.speculative asks

    # ------------------------------------------------------------------ scheduling

    def _schedule_next_batch(self) -> ForwardInput | None:
        batch = None
        if self.prefill_manager.runnable:  # else a decode step need not weigh an empty queue
            batch = self.prefill_manager.schedule_next_batch(self.config.max_extend_tokens)
        batch = batch or self.decode_manager.schedule_next_batch()
        if batch is None:
            return None
        forward_input = self._prepare_batch(batch)
        self._check_prepared(forward_input, batch)
        plan_extras(self, forward_input)  # seeds and logprobs, for requests that ask (extras.py)
        return forward_input

    def _forward(self, forward_input: ForwardInput) -> ForwardOutput:
        batch = forward_input.batch
        self._step += 1
        batch.step = self._step
        self.events.emit(
            "launch",
            step=batch.step,
            phase=batch.phase,
            uids=[r.uid for r in batch.reqs],
            table_idxs=[r.table_idx for r in batch.reqs],
            extend_lens=[r.extend_len for r in batch.reqs],
        )
        for req in batch.reqs:
            if not req.is_chunk:
                self._live[req.uid] = req
        try:
            if self._needs_mask(forward_input):  # sampling waits for the grammar (grammar_steps.py)
                output = self._launch_forward_only(forward_input)
            else:
                output = self.engine.forward_batch(forward_input)
        except Exception as e:  # noqa: BLE001 - whatever broke, only this batch's requests pay
            return self._fail_batch(batch, e)
        self.decode_manager.filter_reqs(batch.reqs)
        return output

    # ------------------------------------------------------------------ loops

    @property
    def has_work(self) -> bool:
        return self.prefill_manager.runnable or self.decode_manager.runnable

    def normal_loop(self) -> None:
        """Run one step of the server: take in messages, launch one batch, then handle its results.

        Without overlap nothing is in flight between steps: step N's results are handled before step
        N+1 is launched, so a slot freed during a step may be handed out again at once.

        Receives: nothing but the scheduler's state: messages waiting in `self.io`, the queued and
            running requests.
        Returns: nothing.
        Leaves: every message that arrived processed (new requests queued, aborts done, bad input
            refused); at most one batch launched, and its results handled before returning (tokens
            sent, ended requests' slots and KV back). `self._defer_slot_free` is False wherever
            this turn may free a slot, even after overlap steps (what it is left as after the step
            does not matter: the next loop sets its own before any slot is freed). A message
            `_process_one_msg` raises on stops the turn with that error.
        Uses: `self.has_work`, `self.receive_msg` (once a turn, blocking only with no work),
            `self._process_one_msg`, `self._schedule_next_batch`, `self._forward`,
            `self.engine.stream.wait_stream(self.stream)` before a launch (ch07);
            `self._process_last_data` (given here; ch11 writes it).
        Checked: requests join and leave the running batch as continuous batching says, with Hugging
            Face's tokens; each step is handled before the next is launched; one call processes the
            messages and runs one batch, and an idle one is harmless; receive blocks only with no
            work; a freed slot is reused at once; more prompts than slots queue up; bad input is
            refused.
        """
        self._defer_slot_free = False
        for msg in self.receive_msg(blocking=not self.has_work):
            self._process_one_msg(msg)
        forward_input = self._schedule_next_batch()
        ongoing = None
        if forward_input is not None:
            self.engine.stream.wait_stream(self.stream)  # this step's metadata must be ready first
            ongoing = (forward_input, self._forward(forward_input))
        self._process_last_data(ongoing)

    def overlap_loop(self, last_data: ForwardData | None) -> ForwardData | None:
        """Launch this step, then handle the previous one's results while this one runs.

        The device computes step N while the CPU prepares step N+1; step N's results are handled
        only once step N+1 is launched, so the loop never waits for the step it just launched.

        Receives: `last_data`, the (ForwardInput, ForwardOutput) the previous call launched, or None
            when nothing is in flight.
        Returns: this call's (ForwardInput, ForwardOutput), or None when nothing was launched.
        Leaves: `self._defer_slot_free` set, so slots freed now wait in `self._deferred_slots`;
            those slots back in the table manager whenever nothing is in flight (at the start when
            `last_data` is None, at the end when nothing was launched); `last_data` handled.
        Uses: `self.receive_msg`, `self._process_one_msg`, `self.has_work`,
            `self._schedule_next_batch`, `self._forward`,
            `self.engine.stream.wait_stream(self.stream)` before a launch (ch07);
            `self._process_last_data`, `self._release_deferred_slots` (ch11).
        Checked: tokens equal Hugging Face's and the normal loop's (deferred CPU streams too);
            launch N+1 comes before handle N; the step just launched is never waited for; receive
            blocks only with nothing in flight and nothing to run; every slot and page is back once
            all requests end.
        """
        self._defer_slot_free = True
        if last_data is None:  # nothing in flight: slots whose release was deferred are safe now
            self._release_deferred_slots()
        blocking = not (last_data is not None or self.has_work)
        for msg in self.receive_msg(blocking=blocking):
            self._process_one_msg(msg)
        forward_input = self._schedule_next_batch()
        ongoing = None
        if forward_input is not None:
            self.engine.stream.wait_stream(self.stream)
            ongoing = (forward_input, self._forward(forward_input))
        self._process_last_data(last_data)
        if ongoing is None:  # nothing is in flight any more
            self._release_deferred_slots()
        return ongoing

    @property
    def in_flight(self) -> bool:
        """A launched batch whose results have not been handled yet (overlap loop)."""
        return self._last_data is not None

    @property
    def steps_launched(self) -> int:
        return self._step

    def overlap_now(self) -> bool:
        """Whether this turn runs the overlap loop: `config.overlap_scheduling`, else the
        environment's switch (read at every turn: tests and notebooks flip it mid-run)."""
        if self.drafter is not None:
            return False  # a draft needs the last step's tokens on the host (speculative.py)
        overlap = self.config.overlap_scheduling
        return not ENV.DISABLE_OVERLAP_SCHEDULING if overlap is None else overlap

    @torch.inference_mode()
    def step(self) -> None:
        """One turn of the selected loop (`config.overlap_scheduling`, else overlap unless
        MINISGL_DISABLE_OVERLAP_SCHEDULING), on the scheduler's stream. The overlap loop's batch in
        flight is kept here between turns."""
        overlap = self.overlap_now()
        with self.stream.context():
            if not overlap:
                if (
                    self._last_data is not None
                ):  # switched loops mid-run: finish the batch in flight
                    self._process_last_data(self._last_data)
                    self._last_data = None
                    # Slots freed while handling it were deferred (rule 3). Nothing is in flight
                    # now, and the normal loop would release them only when it handles its next
                    # step, after scheduling that step without them: release them here.
                    self._release_deferred_slots()
                self.normal_loop()
            else:
                self._last_data = self.overlap_loop(self._last_data)
            if not self.in_flight and not self.has_work:
                # Idle: let the scheduler stream's last work (caching the prefixes just finished)
                # land before anyone on the host looks at the pools. On CUDA the streams are
                # non-blocking, so reading a pool from the default stream would not wait for it.
                self.stream.synchronize()

    def run_forever(self) -> None:
        """The online server's loop (the offline LLM calls `step` itself)."""
        while True:
            self.step()
