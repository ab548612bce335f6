"""A request's life in the scheduler once it is queued: its results handled step by step until it
finishes, or its end by abort or by a failed step, and in every case its slot and KV given back.

The rules of chapter 11 that keep the overlap loop right live here (the loops are in
scheduler.py): finished is decided from the tokens the CPU has received (rule 1); a request that
finished, or was aborted, after a batch was launched gets nothing from that batch (rules 2 and 4);
a freed slot is reused only once no batch in flight can still write it (rule 3).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Set, Tuple

from minisgl.core import Batch, Req
from minisgl.engine import ForwardInput, ForwardOutput
from minisgl.message import DetokenizeMsg

if TYPE_CHECKING:
    ForwardData = Tuple[ForwardInput, ForwardOutput]


class RequestLifecycle:
    """Abort, failure, freeing and the handling of results (a mixin of Scheduler: `self` is the
    scheduler)."""

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
        Leaves: the slot out of reach of any new request until no batch in flight can write it:
            while `self._defer_slot_free`, parked in `self._deferred_slots` as `(table_idx, uid)`
            for the loop to give back later (`_release_deferred_slots`); otherwise free in the table
            manager at once. The request's KV settled as for any finished request (ch08): its
            computed prefix kept by the prefix cache, its other pages free, its lock dropped.
        Uses: `self.table_manager.free` (ch04); `self.cache_manager.cache_req` (ch08, as it is
            called for any finished request).
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
