"""The PrefillManager: requests waiting for their prompt to be processed, and the rules that decide
which of them join the next prefill batch.

Two limits apply each step:
* a token budget (`max_extend_tokens`): a prompt that does not fit is split, and its remainder is
  prefilled in later steps (chunked prefill);
* memory: a request is admitted only if the KV pages it could ever need (prompt + max_tokens) fit
  beside what the running requests could still need. Requests that do not fit wait in the queue;
  the engine never runs out of pages in the middle of a request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from minisgl.core import Batch, Req, SamplingParams

from .cache import CacheManager, pages_for
from .decode import DecodeManager
from .table import TableManager


class ChunkedReq(Req):
    """One piece of a prompt that is prefilled in parts. It produces no token: its sample is thrown
    away, and the next piece continues from where it stopped."""

    is_chunk = True

    @property
    def can_decode(self) -> bool:
        return False

    def complete_one(self) -> None:
        self.cached_len = self.device_len  # the piece is cached; nothing new is sampled

    def append_host(self, next_token: torch.Tensor) -> None:
        raise RuntimeError("a chunked prefill produces no token")


@dataclass(eq=False)
class PendingReq:
    uid: int
    input_ids: torch.Tensor
    sampling_params: SamplingParams
    chunked_req: ChunkedReq | None = None  # set while the prompt is part-way through prefill

    @property
    def total_len(self) -> int:
        return len(self.input_ids) + self.sampling_params.max_tokens


class PrefillAdder:
    """Builds one prefill batch: adds requests in arrival order while budget and memory allow."""

    def __init__(
        self,
        token_budget: int,
        reserved_pages: int,
        cache_manager: CacheManager,
        table_manager: TableManager,
        token_pool: torch.Tensor,
        page_table: torch.Tensor,
    ) -> None:
        self.token_budget = token_budget
        self.reserved_pages = reserved_pages
        self.cache_manager = cache_manager
        self.table_manager = table_manager
        self.token_pool = token_pool
        self.page_table = page_table

    def try_add_one(self, pending: PendingReq) -> Req | None:
        """Admit `pending` (or its next chunk) into the batch; None if it has to wait.

        Two limits: the step's token budget (a prompt that does not fit is split into chunks), and
        memory: a new request is admitted only if the pages of its whole life (prompt + max_tokens)
        past its cached prefix fit beside those already promised, so no request runs out mid-way.

        Receives: `pending`, a queued request (uid, prompt `input_ids`, sampling params), with
            `chunked_req` set when earlier chunks of it have run (it was admitted then);
            `self.token_budget`, the tokens left in this step; `self.reserved_pages`, the pages
            already promised to running requests and to those added so far.
        Returns: a `Req` when the rest of the prompt fits in the budget, a `ChunkedReq` over
            `input_ids[:cached_len + chunk]` when it does not, or None (budget spent, no free slot,
            or too little memory).
        Leaves: the budget lowered by the tokens taken and the pages it may still need reserved; a
            new request holds a slot with its whole prompt in the token-pool row, its cached
            prefix's locations in its page-table row and that prefix locked (its `cache_handle`); a
            continued chunk keeps its slot and handle; `pending.chunked_req` = the new chunk, or
            None for the last piece. On None nothing is taken: no slot, no lock.
        Uses: `self.cache_manager.match_req`, `.lock`, `.unlock`, `.available_pages`, `pages_for`
            (ch08); `self.table_manager.allocate` (ch04); `self.token_pool`, `self.page_table`
            (ch04); `ChunkedReq` (ch10).
        Checked: chunked prefill gives Hugging Face's tokens; no batch exceeds the budget and every
            prompt token is computed once; a request that waits holds no slot or lock; memory admits
            only what it can finish, and a continued chunk keeps its reservation; a cached prefix is
            used and locked.
        """
        if self.token_budget <= 0:
            return None
        page_size = self.cache_manager.page_size
        prev = pending.chunked_req
        if prev is not None:  # admitted in an earlier step: its memory was checked then
            table_idx, handle, cached_len = prev.table_idx, prev.cache_handle, prev.cached_len
            self.reserved_pages += pages_for(pending.total_len, page_size) - pages_for(
                cached_len, page_size
            )
        else:
            if self.table_manager.available_size == 0:
                return None
            handle, indices = self.cache_manager.match_req(pending.input_ids)
            cached_len = handle.cached_len
            self.cache_manager.lock(handle)  # lock first: locked pages are not evictable
            need = pages_for(pending.total_len, page_size) - pages_for(cached_len, page_size)
            if need + self.reserved_pages > self.cache_manager.available_pages:
                self.cache_manager.unlock(handle)
                return None
            self.reserved_pages += need
            table_idx = self.table_manager.allocate(pending.uid)
            n = len(pending.input_ids)
            self.token_pool[table_idx, :n] = pending.input_ids.to(
                self.token_pool.device, non_blocking=True
            )
            if cached_len:
                self.page_table[table_idx, :cached_len] = indices
        extend = len(pending.input_ids) - cached_len
        chunk = min(extend, self.token_budget)
        self.token_budget -= chunk
        params = pending.sampling_params
        if chunk < extend:
            req: Req = ChunkedReq(
                pending.input_ids[: cached_len + chunk],
                table_idx,
                cached_len,
                params.max_tokens,
                pending.uid,
                params,
                handle,
            )
            pending.chunked_req = req
        else:
            req = Req(
                pending.input_ids,
                table_idx,
                cached_len,
                params.max_tokens,
                pending.uid,
                params,
                handle,
            )
            pending.chunked_req = None
        return req


class PrefillManager:
    def __init__(
        self,
        cache_manager: CacheManager,
        table_manager: TableManager,
        decode_manager: DecodeManager,
        token_pool: torch.Tensor,
        page_table: torch.Tensor,
    ) -> None:
        self.cache_manager = cache_manager
        self.table_manager = table_manager
        self.decode_manager = decode_manager
        self.token_pool, self.page_table = token_pool, page_table
        self.pending: List[PendingReq] = []

    def add_one_req(self, uid: int, input_ids: torch.Tensor, params: SamplingParams) -> None:
        if params.prompt_logprobs:  # its prompt needs logits everywhere: a cached prefix has none
            self.cache_manager.never_match(input_ids)
        self.pending.append(PendingReq(uid, input_ids, params))

    def get(self, uid: int) -> PendingReq | None:
        return next((p for p in self.pending if p.uid == uid), None)

    def remove(self, pending: PendingReq) -> None:
        self.pending.remove(pending)

    @property
    def runnable(self) -> bool:
        return bool(self.pending)

    def _reserved_pages(self) -> int:
        """Pages the running requests may still ask for, up to their max_tokens."""
        p = self.cache_manager.page_size
        return sum(
            pages_for(r.max_device_len, p) - pages_for(r.cached_len, p)
            for r in self.decode_manager.running.values()
        )

    def schedule_next_batch(self, token_budget: int) -> Batch | None:
        """Build the next prefill batch from the queue, within `token_budget`; None if nothing fits.

        First come, first served: requests are offered in arrival order and the first one that has
        to wait stops the batch, so a later, smaller request never overtakes it.

        Receives: `token_budget`, the most prompt tokens this step may process; `self.pending`, the
            queued requests in arrival order (some part-way through a chunked prefill); the running
            requests in `self.decode_manager.running`.
        Returns: a prefill `Batch` of the requests and chunks added, or None when none was added.
        Leaves: a request out of `self.pending` once its last piece is in the batch; a chunked one
            stays, first in line, for the next step. Slots, pages and locks are taken by the adder.
        Uses: `PrefillAdder` and its `try_add_one` (ch10), `self._reserved_pages()` (ch08), `Batch`
            (ch01).
        Checked: chunked prefill gives Hugging Face's tokens; batches share the budget in arrival
            order and fill it while prompts wait; a long prompt is split and answered only after its
            last chunk; a waiting request is not overtaken.
        """
        adder = PrefillAdder(
            token_budget,
            self._reserved_pages(),
            self.cache_manager,
            self.table_manager,
            self.token_pool,
            self.page_table,
        )
        reqs: List[Req] = []
        for pending in list(self.pending):
            req = adder.try_add_one(pending)
            if req is None:
                break  # first come, first served: nobody overtakes a waiting request
            reqs.append(req)
            if pending.chunked_req is None:
                self.pending.remove(pending)
        return Batch(reqs=reqs, phase="prefill") if reqs else None
