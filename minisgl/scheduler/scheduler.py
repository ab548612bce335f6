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
"""

from __future__ import annotations

from typing import Dict, List, Set, Tuple

import torch

from minisgl.attention import prepare_metadata
from minisgl.core import Batch, Req
from minisgl.engine import BatchSamplingArgs, Engine, ForwardInput, ForwardOutput
from minisgl.env import ENV
from minisgl.message import AbortBackendMsg, BackendMsg, DetokenizeMsg, UserMsg
from minisgl.models.generation_config import GenerationDefaults
from minisgl.utils import EventLog

from .cache import CacheManager, pages_for
from .config import SchedulerConfig
from .decode import DecodeManager
from .io import SchedulerIO

# The engine asks `req.is_chunk`; ChunkedReq stays in this namespace because the judge runs a
# learner's methods here, and `isinstance(req, ChunkedReq)` is as right an answer.
from .prefill import ChunkedReq, PrefillManager  # noqa: F401
from .table import TableManager

ForwardData = Tuple[ForwardInput, ForwardOutput]


class Scheduler:
    def __init__(self, config: SchedulerConfig, io: SchedulerIO) -> None:
        self.config = config
        self.io = io
        self.events = EventLog()
        self.engine = Engine(config)
        engine = self.engine
        self.device = engine.device
        # The model's own generation settings: its end ids (generation_config.json's list replaces
        # config.json's, as in transformers) and sampling defaults for what a request leaves unset.
        self.generation_defaults = GenerationDefaults.from_dir(config.model_path)
        self.eos_token_ids = self.generation_defaults.end_token_ids(
            engine.model_config.eos_token_ids
        )
        self.vocab_size = engine.model_config.vocab_size
        self.token_pool, self.page_table = engine.token_pool, engine.page_table
        self.table_manager = TableManager(config.max_running_req, self.events)
        self.cache_manager = CacheManager(
            engine.num_pages, engine.page_size, engine.page_table, config.cache_type, self.events
        )
        self.decode_manager = DecodeManager()
        self.prefill_manager = PrefillManager(
            self.cache_manager,
            self.table_manager,
            self.decode_manager,
            engine.token_pool,
            engine.page_table,
        )
        self.stream = engine.kit.new_stream()  # the scheduler's own stream (metadata, table writes)
        self.finished_reqs: Set[Req] = set()  # finished at the step handled last
        self._live: Dict[int, Req] = {}  # uid -> launched request whose end has not been handled
        self._last_data: ForwardData | None = None  # the overlap loop's batch in flight (step())
        self._defer_slot_free = False
        self._deferred_slots: List[Tuple[int, int]] = []  # (table_idx, uid)
        self._step = 0

    # ------------------------------------------------------------------ messages

    def receive_msg(self, blocking: bool = False) -> List[BackendMsg]:
        return self.io.receive(blocking)

    def send_result(self, reply: List[DetokenizeMsg]) -> None:
        if reply:
            self.events.emit("send", msgs=list(reply))
            self.io.send(reply)

    def _reject(self, uid: int, reason: str) -> None:
        self.events.emit("reject", uid=uid, reason=reason)
        self.send_result([DetokenizeMsg(uid=uid, next_token=-1, finished=True, error=reason)])

    def validate_request(self, input_ids: torch.Tensor, max_tokens: int) -> str | None:
        """Why a request can never run here, or None if it can."""
        n = len(input_ids)
        if n == 0:
            return "the prompt is empty"
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = lo if lo < 0 else hi
            return f"token id {bad} is outside the vocabulary [0, {self.vocab_size})"
        limit = self.engine.max_seq_len
        if n + max_tokens > limit:
            return (
                f"prompt ({n} tokens) + max_tokens ({max_tokens}) exceeds the context "
                f"length {limit}"
            )
        need = pages_for(n + max_tokens, self.engine.page_size)
        if need > self.engine.num_pages:
            return (
                f"the request needs {need} KV pages but the pool has only {self.engine.num_pages}"
            )
        return None

    def _process_one_msg(self, msg: BackendMsg) -> None:
        if isinstance(msg, UserMsg):
            try:  # a message may come from anywhere: nothing unchecked may reach a kernel
                msg.sampling_params.validate()
                reason = self.validate_request(msg.input_ids, msg.sampling_params.max_tokens)
            except (TypeError, ValueError, AttributeError) as e:
                reason = f"bad sampling parameters: {e}"
            if reason is not None:
                self._reject(msg.uid, reason)
            else:
                self.prefill_manager.add_one_req(msg.uid, msg.input_ids, msg.sampling_params)
        elif isinstance(msg, AbortBackendMsg):
            self._abort(msg.uid)
        else:
            raise TypeError(f"unknown message {msg!r}")

    def _abort(self, uid: int) -> None:
        """Stop request `uid` wherever it is: queued, mid chunked prefill, or launched.

        A launched request's batch may still be in flight (rule 4): marking it finished makes the
        handling of that batch drop its results, so its pages are never cached or freed twice.

        Receives: `uid`; the request may be pending in the prefill manager (with `chunked_req` set
            if a chunk has run), launched (in `self._live`: uid -> launched request whose end is not
            handled yet), or unknown or already ended.
        Returns: nothing.
        Leaves: the request out of the pending queue, `self._live` and the decode manager; a chunk
            or launched request's slot and KV given back and the request in `self.finished_reqs` (a
            queued one holds nothing); one `abort` event whose `state` is "queued", "prefilling",
            "running" or "not running" (unknown or ended: nothing else changes).
        Uses: `self.prefill_manager.get` and `.remove` (ch07), `self.decode_manager.remove_req`
            (ch07), `self._free_req_resources`, `self.finished_reqs` (ch11), `self.events.emit`
            (ch04).
        Checked: an aborted request gets no message after its abort, the others are unaffected; one
            abort event per abort, naming the right state; an aborted chunk's slot returns only once
            its chunk is handled; every slot and page is back once all requests end.
        """
        pending = self.prefill_manager.get(uid)
        if pending is not None:
            self.prefill_manager.remove(pending)
            chunk = pending.chunked_req
            if chunk is None:  # still queued: holds nothing
                self.events.emit("abort", uid=uid, state="queued")
                return
            # part-way through a chunked prefill; its last chunk may be in flight (rule 4)
            self._free_req_resources(chunk)
            self.finished_reqs.add(chunk)
            self.events.emit("abort", uid=uid, state="prefilling")
            return
        req = self._live.pop(uid, None)
        if req is not None:
            self.decode_manager.remove_req(req)
            self._free_req_resources(req)
            # Rule 4: its latest batch may still be in flight; its results must be dropped.
            self.finished_reqs.add(req)
            self.events.emit("abort", uid=uid, state="running")
            return
        self.events.emit("abort", uid=uid, state="not running")

    # ------------------------------------------------------------------ scheduling

    def _schedule_next_batch(self) -> ForwardInput | None:
        batch = None
        if self.prefill_manager.runnable:  # else a decode step need not weigh an empty queue
            batch = self.prefill_manager.schedule_next_batch(self.config.max_extend_tokens)
        batch = batch or self.decode_manager.schedule_next_batch()
        if batch is None:
            return None
        return self._prepare_batch(batch)

    def _prepare_batch(self, batch: Batch) -> ForwardInput:
        """Allocate KV locations and build the index tensors of one step (on the scheduler stream).

        Receives: `batch`, a prefill batch (requests and chunks, `req.is_chunk`) or a decode batch,
        in
            order; each request processes positions [cached_len, device_len) of its slot's row
            (`req.table_idx`); the lengths are not yet advanced (that happens at launch).
        Returns: `ForwardInput(batch, sample_args, input_tuple, write_tuple)`. input_tuple = (rows,
            positions), int64 on the device, one entry per processed token in batch order: where
            each token's id is read in the token pool. write_tuple = (rows, columns), one per
            request: its row and column device_len, where its sample goes (a chunk's:
            `self.engine.dummy_row`, column 0). sample_args: each request's sampling settings, in
            batch order.
        Leaves: KV locations of the new positions allocated in the page table; `batch.positions`,
            `batch.out_loc` (the page-table entry of every processed token, int64) and
            `batch.attn_metadata` filled in.
        Uses: `self.cache_manager.allocate_paged` (ch08), `self.page_table` (ch04),
            `self.engine.kit.to_device`, `self.engine.dummy_row`, `ForwardInput` (ch06),
            `prepare_metadata` (ch05), `BatchSamplingArgs.from_params` (ch06), `req.is_chunk`
            (ch10).
        Checked: prefill and decode indices point at each token's row and position; out_loc is the
            page-table entry of every token, no location twice; a chunk's sample goes to the scratch
            row; each request gets its own sampling arguments; outputs equal Hugging Face's.
        """
        self.cache_manager.allocate_paged(batch.reqs)
        kit = self.engine.kit
        if batch.is_decode:  # one token per request: two plain lists, no tensor per request
            rows = torch.tensor([req.table_idx for req in batch.reqs], dtype=torch.int64)
            positions = torch.tensor([req.cached_len for req in batch.reqs], dtype=torch.int64)
        else:
            rows = torch.cat(
                [
                    torch.full((req.extend_len,), req.table_idx, dtype=torch.int64)
                    for req in batch.reqs
                ]
            )
            positions = torch.cat(
                [
                    torch.arange(req.cached_len, req.device_len, dtype=torch.int64)
                    for req in batch.reqs
                ]
            )
        input_tuple = (kit.to_device(rows), kit.to_device(positions))
        # Each sample goes to the position after the request's last token; a chunk's sample is junk
        # and goes to the scratch row.
        dummy = self.engine.dummy_row
        write_rows = [dummy if r.is_chunk else r.table_idx for r in batch.reqs]
        write_cols = [0 if r.is_chunk else r.device_len for r in batch.reqs]
        write_tuple = (
            kit.to_device(torch.tensor(write_rows, dtype=torch.int64)),
            kit.to_device(torch.tensor(write_cols, dtype=torch.int64)),
        )
        batch.positions = input_tuple[1]
        batch.out_loc = self.page_table[input_tuple].to(torch.int64)
        batch.attn_metadata = prepare_metadata(batch, self.page_table, self.device)
        args = BatchSamplingArgs.from_params(
            [r.sampling_params for r in batch.reqs], self.vocab_size, self.device
        )
        return ForwardInput(batch, args, input_tuple, write_tuple)

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
            output = self.engine.forward_batch(forward_input)
        except Exception as e:  # noqa: BLE001 - whatever broke, only this batch's requests pay
            return self._fail_batch(batch, e)
        self.decode_manager.filter_reqs(batch.reqs)
        return output

    def _fail_batch(self, batch: Batch, error: Exception) -> ForwardOutput:
        """A step raised before its work was queued: end its requests with an error reply and give
        back their slots and pages, then hand the loop an empty batch to handle.

        Nothing the failed step computed is kept: a request's pages past the prefix it locks in the
        cache are freed, not cached (their KV may be half written). A batch still in flight may hold
        the same requests, so they are marked finished (its results are dropped, as for an abort)
        and their slots wait for the next handling under overlap (rule 3)."""
        reason = f"the step failed: {type(error).__name__}: {error}"
        self.events.emit("fail", step=batch.step, uids=[r.uid for r in batch.reqs], reason=reason)
        replies = []
        for req in batch.reqs:
            if req.is_chunk:
                pending = self.prefill_manager.get(req.uid)
                if pending is not None:
                    self.prefill_manager.remove(pending)
            self._live.pop(req.uid, None)
            self.decode_manager.remove_req(req)
            self.cache_manager.release_uncached(req)
            if self._defer_slot_free:
                self._deferred_slots.append((req.table_idx, req.uid))
            else:
                self.table_manager.free(req.table_idx, req.uid)
            self.finished_reqs.add(req)
            replies.append(DetokenizeMsg(uid=req.uid, next_token=-1, finished=True, error=reason))
        batch.reqs = []  # handled like any step: nothing left to handle
        self.send_result(replies)
        return self.engine.empty_output()

    # ------------------------------------------------------------------ results

    def _release_deferred_slots(self) -> None:
        for table_idx, uid in self._deferred_slots:
            self.table_manager.free(table_idx, uid)
        self._deferred_slots.clear()

    def _free_req_resources(self, req: Req) -> None:
        """Free a finished (or aborted) request's slot and the KV the prefix cache does not keep.

        Rule 3: under overlap, a batch that still holds this request may be running, and it will
        write its sample into the request's token-pool row. Handing the row to a new request now
        would let the scheduler's writes (the new prompt) race that write. So the row goes back only
        at the next handling of results, once the batch in flight is known to be done. KV pages need
        no such care: whatever writes them next is queued behind the old batch on the engine stream.

        Receives: `req`, a request (or chunk) holding a slot (`req.table_idx`) and a locked prefix
            (`req.cache_handle`); `self._defer_slot_free`, True while the overlap loop runs.
        Returns: nothing.
        Leaves: the slot free in the table manager, or, when deferring, `(table_idx, uid)` appended
            to `self._deferred_slots` (the loop frees them later); the computed prefix in the prefix
            cache, the request's other pages free, its lock dropped.
        Uses: `self.table_manager.free` (ch04); `self.cache_manager.cache_req(req, finished=True)`
            (ch08).
        Checked: no slot is handed out while a step that holds it is in flight, and the request that
            gets it computes Hugging Face's tokens; the slot is back once that step is handled;
            every slot and page is back once all requests end.
        """
        if self._defer_slot_free:
            self._deferred_slots.append((req.table_idx, req.uid))
        else:
            self.table_manager.free(req.table_idx, req.uid)
        self.cache_manager.cache_req(req, finished=True)

    def _process_last_data(self, last_data: ForwardData | None) -> None:
        """Handle a launched step's results: record each request's token and send its message.

        Under overlap, step N+1 is launched before step N is handled, so device_len has moved on:
        only the tokens the CPU has received say how far a request is (rule 1). A request that
        finished or was aborted after step N was launched gets nothing from step N (rules 2 and 4).

        Receives: `last_data`, a (ForwardInput, ForwardOutput) pair, or None (nothing to do). Its
            batch may hold chunks of a chunked prefill (`req.is_chunk`: no real token);
            `self.eos_token_ids`, the set of end ids, may be empty (the model has no EOS).
        Returns: nothing.
        Leaves: each other request's token appended on the host, one `DetokenizeMsg` each,
            `finished` True on its last token only; a finished request out of `self._live` (uid ->
            launched request whose end is not handled yet) and the decode manager, its slot and KV
            given back; a prefill's prompt in the prefix cache; `self.finished_reqs` = the requests
            finished now; the deferred slots released; one `handle` event with the batch's step,
            phase and uids.
        Uses: `output.copy_done`, `output.next_tokens_cpu` (ch06); `req.append_host` (ch01, a
            1-element tensor); `self.decode_manager.remove_req` (ch07);
            `self.cache_manager.cache_req` and `.lazy_free_region` (ch08);
            `self._free_req_resources`, `self._release_deferred_slots`, `self.finished_reqs` (ch11);
            `self.events.emit` (ch04), `self.send_result`.
        Checked: tokens equal Hugging Face's; max_tokens messages, only the last one finished;
            nothing after any EOS id or an abort; ignore_eos and no EOS run to max_tokens; a prompt
            is cached as soon as its prefill is handled; every slot and page is back once all
            requests end.
        """
        if last_data is None:
            return
        batch, output = last_data[0].batch, last_data[1]
        output.copy_done.synchronize()  # this batch, and every one before it, is done
        self._release_deferred_slots()
        reply: List[DetokenizeMsg] = []
        new_finished: Set[Req] = set()
        tokens = output.next_tokens_cpu
        with self.cache_manager.lazy_free_region():
            for i, req in enumerate(batch.reqs):
                if req.is_chunk:
                    continue  # a chunk samples nothing real
                if req in self.finished_reqs:
                    continue  # rule 2/4: it finished (or was aborted) after this batch was launched
                token = tokens[i : i + 1]
                req.append_host(token)
                next_token = int(token.item())
                # Rule 1: judge by what the CPU has received; can_decode already reflects step N+1.
                finished = len(req.input_ids) >= req.max_device_len
                if not req.sampling_params.ignore_eos and next_token in self.eos_token_ids:
                    finished = True
                reply.append(DetokenizeMsg(uid=req.uid, next_token=next_token, finished=finished))
                if finished:
                    self._live.pop(req.uid, None)
                    self.decode_manager.remove_req(req)
                    self._free_req_resources(req)
                    new_finished.add(req)
                elif batch.is_prefill:  # hand the prompt's KV to the prefix cache right away
                    self.cache_manager.cache_req(req, finished=False)
        self.events.emit(
            "handle", step=batch.step, phase=batch.phase, uids=[r.uid for r in batch.reqs]
        )
        self.finished_reqs = new_finished
        self.send_result(reply)

    def live_requests(self) -> List[Req]:
        """Every request that holds a slot and KV right now (for integrity checks): prompts part-way
        through a chunked prefill, and launched requests whose end has not been handled yet."""
        chunks = [p.chunked_req for p in self.prefill_manager.pending if p.chunked_req is not None]
        return chunks + list(self._live.values())

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
            sent, ended requests' slots and KV back); `self._defer_slot_free` False, even after
            overlap steps.
        Uses: `self.has_work`, `self.receive_msg` (blocking only with no work),
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

    @torch.inference_mode()
    def step(self) -> None:
        """One turn of the selected loop (`config.overlap_scheduling`, else overlap unless
        MINISGL_DISABLE_OVERLAP_SCHEDULING), on the scheduler's stream. The overlap loop's batch in
        flight is kept here between turns."""
        overlap = self.config.overlap_scheduling
        if overlap is None:
            overlap = not ENV.DISABLE_OVERLAP_SCHEDULING
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
