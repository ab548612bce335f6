"""The CacheManager: who owns which KV page.

Every page is in exactly one of three places: the free list, the prefix cache, or held by a running
request (the part of its KV the prefix cache has not taken). `check_integrity` verifies the first
two add up to the whole pool whenever no request is running.

Pages are `page_size` consecutive locations. A request's page-table row lists one location per
token; its pages are allocated as its length grows, a page at a time.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Iterator, List, Tuple

import torch

from minisgl.core import Req
from minisgl.kvcache import BasePrefixCache, CacheHandle, create_prefix_cache
from minisgl.utils import EventLog


def pages_for(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


class CacheManager:
    def __init__(
        self,
        num_pages: int,
        page_size: int,
        page_table: torch.Tensor,
        cache_type: str,
        events: EventLog | None = None,
    ) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        self.page_table = page_table
        self.device = page_table.device
        self.prefix_cache: BasePrefixCache = create_prefix_cache(cache_type, page_size, self.device)
        self.free_pages = torch.arange(num_pages, dtype=torch.int32, device=self.device)
        self._events = events or EventLog()
        self._lazy: List[torch.Tensor] | None = None
        # id -> prompt tensor of the requests that must compute their whole prompt (match_req)
        self._never_match: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    # ------------------------------------------------------------------ sizes

    @property
    def num_free_pages(self) -> int:
        return len(self.free_pages)

    @property
    def available_pages(self) -> int:
        """Pages a new request could get: free ones plus those the prefix cache could give up."""
        return self.num_free_pages + self.prefix_cache.evictable_size // self.page_size

    # ------------------------------------------------------------------ matching and locking

    def match_req(self, input_ids: torch.Tensor) -> Tuple[CacheHandle, torch.Tensor]:
        """The cached prefix a new request can reuse. The last prompt token is never matched: the
        model must run on at least one token to produce the first output's logits. A prompt
        registered with `never_match` (one that asks for prompt logprobs: a cached prefix has no
        logits) reuses nothing."""
        if self._never_match.get(id(input_ids)) is input_ids:
            return self.prefix_cache.match_prefix(input_ids[:0])
        return self.prefix_cache.match_prefix(input_ids[: len(input_ids) - 1])

    def never_match(self, input_ids: torch.Tensor) -> None:
        """Make `match_req(input_ids)` match nothing for this very tensor (the prompt a pending
        request holds and the prefill adder passes): held weakly, so it is forgotten with the
        request."""
        self._never_match[id(input_ids)] = input_ids

    def lock(self, handle: CacheHandle) -> None:
        self.prefix_cache.lock_handle(handle)

    def unlock(self, handle: CacheHandle) -> None:
        self.prefix_cache.lock_handle(handle, unlock=True)

    # ------------------------------------------------------------------ allocation

    def _take_pages(self, n: int) -> torch.Tensor:
        if n > self.num_free_pages:
            evicted = self.prefix_cache.evict((n - self.num_free_pages) * self.page_size)
            self._free_locations(evicted)
            self._flush_lazy()
        if n > self.num_free_pages:
            raise RuntimeError(f"out of KV pages: need {n}, have {self.num_free_pages} free")
        pages, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return pages

    def allocate_paged(self, reqs: List[Req]) -> None:
        """Give each request KV locations for the positions it is about to process.

        A page is `page_size` consecutive locations, and position j of a request sits at offset j %
        page_size of its page. Locations below cached_len were allocated before, so the request's
        last page may still have room. The loop over requests only does arithmetic on the CPU; the
        page table (on the device) is touched by a fixed handful of operations per batch, not a few
        per request: with 256 requests a step, per-request launches would cost the CPU more than the
        GPU's whole step.

        Receives: `reqs`, the batch's requests (chunks included), each with its slot `table_idx` and
            positions [cached_len, device_len) to process; its page-table row is filled below
            cached_len.
        Returns: nothing.
        Leaves: the locations of positions [cached_len, device_len) written into each request's
            page-table row, nothing else of the row changed; positions that fit in the request's
            last held page use it, the rest take whole fresh pages, each request its own; the pages
            taken gone from the free list (evicting from the prefix cache if the free list is
            short); one `pages_alloc` event (uid, pages) per request that got new pages.
        Uses: `self._take_pages`, `pages_for`, `self.page_table`, `self._events.emit` (ch08).
        Checked: whole pages are taken and the last one is filled first; each request gets its own
            pages; only this step's positions are written and the pages given are reported; running
            requests hold page-aligned, disjoint pages; every page is back or cached at the end.
        """
        p = self.page_size
        # positions that still fit in the request's last held page: (row, column, distance from
        # the request's last location); positions in fresh pages: (row, column, which fresh page)
        room: Tuple[List[int], List[int], List[int]] = ([], [], [])
        fresh: Tuple[List[int], List[int], List[int]] = ([], [], [])
        needs: List[Tuple[int, int]] = []  # (uid, pages) of the requests that get new pages
        taken = 0
        for req in reqs:
            start, end = req.cached_len, req.device_len
            held = pages_for(start, p)  # pages the request already has
            room_end = min(held * p, end)
            n = room_end - start
            if n > 0:
                room[0].extend([req.table_idx] * n)
                room[1].extend(range(start, room_end))
                room[2].extend(range(1, n + 1))
            need = pages_for(end, p) - held
            if need > 0:
                n = end - room_end  # room_end is page-aligned here
                fresh[0].extend([req.table_idx] * n)
                fresh[1].extend(range(room_end, end))
                fresh[2].extend([taken + k // p for k in range(n)])
                needs.append((req.uid, need))
                taken += need
        new_pages = self._take_pages(taken) if taken else None
        for uid, need in needs:
            self._events.emit("pages_alloc", uid=uid, pages=need)
        if room[0]:
            rows, cols, dist = self._index_tensor(room)
            self.page_table[rows, cols] = self.page_table[rows, cols - dist] + dist.to(torch.int32)
        if fresh[0]:
            rows, cols, which = self._index_tensor(fresh)
            self.page_table[rows, cols] = new_pages[which] * p + (cols % p).to(torch.int32)

    def _index_tensor(self, columns: Tuple[List[int], ...]) -> torch.Tensor:
        """Lists of equal length -> one int64 tensor [len(columns), n] on the device, in one copy
        (from page-locked memory, so the copy does not make the CPU wait)."""
        t = torch.tensor(columns, dtype=torch.int64)
        if self.device.type != "cuda":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    # ------------------------------------------------------------------ freeing

    def _free_locations(self, locs: torch.Tensor) -> None:
        """Free the pages of `locs`, a page-aligned run of locations (whole pages)."""
        if locs.numel() == 0:
            return
        pages = locs[:: self.page_size] // self.page_size
        self._events.emit("pages_free", pages=len(pages))
        if self._lazy is not None:
            self._lazy.append(pages.to(torch.int32))
        else:
            self.free_pages = torch.cat([self.free_pages, pages.to(torch.int32)])

    def _flush_lazy(self) -> None:
        if self._lazy:
            self.free_pages = torch.cat([self.free_pages, *self._lazy])
            self._lazy.clear()

    @contextmanager
    def lazy_free_region(self) -> Iterator[None]:
        """Collect the frees of a whole batch and concatenate once: one cat instead of dozens."""
        self._lazy = []
        try:
            yield
        finally:
            lazy, self._lazy = self._lazy, None
            if lazy:
                self.free_pages = torch.cat([self.free_pages, *lazy])

    def cache_req(self, req: Req, *, finished: bool) -> None:
        """Hand the request's computed prefix (its first cached_len tokens) to the prefix cache.

        Tokens the cache already had under other locations are duplicates: ours are freed and the
        request reads the cache's copy. A running request keeps its prefix locked; a finished one
        gives back everything the cache did not take.

        Receives: `req`, whose page-table row holds the locations of its first cached_len tokens,
            whose `input_ids` has at least those tokens, and whose `cache_handle` is the (locked)
            prefix it started on; `finished`, whether the request has ended.
        Returns: nothing.
        Leaves: the request's whole pages offered to the prefix cache (the radix cache keeps them,
            the naive one nothing); its locations that duplicate the cache's freed; the lock of its
            old handle dropped. Finished: every location past the new handle's cached_len (a partial
            last page) freed, and `req.cache_handle` = `CacheHandle(0)`. Running: its page-table row
            points at the cache's copy of the duplicated range, and the new handle is locked and
            stored in `req.cache_handle`.
        Uses: `self.prefix_cache.insert_prefix` and `.match_prefix` (ch04, the prefix-cache
            interface), `self.lock`, `self.unlock`, `self._free_locations` (ch08), `CacheHandle`.
        Checked: duplicates are freed and the cache's copy shared; a running request's prefix is
            locked, also when it started on a cached prefix; a finished request leaves its whole
            sequence in the cache and its partial last page free; every page is free or cached once
            all end.
        """
        row, n = req.table_idx, req.cached_len
        locs = self.page_table[row, :n]
        old: CacheHandle = req.cache_handle
        prefix_len, new = self.prefix_cache.insert_prefix(req.input_ids[:n], locs)
        if prefix_len > old.cached_len:
            self._free_locations(locs[old.cached_len : prefix_len].clone())
        self.unlock(old)
        if finished:
            self._free_locations(self.page_table[row, new.cached_len : n].clone())
            req.cache_handle = CacheHandle(0)
            return
        if prefix_len > old.cached_len:
            _, cached = self.prefix_cache.match_prefix(req.input_ids[: new.cached_len])
            self.page_table[row, old.cached_len : prefix_len] = cached[old.cached_len : prefix_len]
        self.lock(new)
        req.cache_handle = new

    def release_uncached(self, req: Req) -> None:
        """Give back everything a request holds without caching what it computed (its step failed,
        so the KV of its last positions may be half written): the pages of its positions past the
        prefix its handle locks are freed, and the lock is dropped."""
        handle: CacheHandle = req.cache_handle
        self._free_locations(
            self.page_table[req.table_idx, handle.cached_len : req.device_len].clone()
        )
        self.unlock(handle)
        req.cache_handle = CacheHandle(0)

    def reset_to_cached(self) -> None:
        """With no request running (after an interrupted run): every page the prefix cache does not
        hold is free, and nothing is locked, whatever the requests cut short held."""
        self._lazy = None
        self.prefix_cache.unlock_all()
        cached = torch.unique(self.prefix_cache.all_indices().to(torch.int64) // self.page_size)
        every = torch.arange(self.num_pages, dtype=torch.int64, device=self.device)
        self.free_pages = every[~torch.isin(every, cached.to(self.device))].to(torch.int32)

    # ------------------------------------------------------------------ checks

    def held_pages(self, req: Req) -> torch.Tensor:
        """The pages `req` holds itself (for integrity checks while requests run): those of its
        computed tokens past the prefix its handle locks in the prefix cache. Together with the free
        list and the cache's pages, the pages of every live request make up the whole pool."""
        locs = self.page_table[req.table_idx, req.cache_handle.cached_len : req.cached_len]
        return torch.unique(locs // self.page_size)

    def check_integrity(self) -> None:
        """With no request running: every page is either free or in the prefix cache, once.

        Receives: the manager with no request running: `self.free_pages` (page numbers) and the
            prefix cache, which reports KV locations (`page_size` of them per page), not pages.
        Returns: nothing; raises AssertionError, with a message saying what is wrong, otherwise.
        Leaves: nothing changed (a check).
        Uses: `self.prefix_cache.check_integrity`, `.all_indices`, `.protected_size` (ch04, the
            prefix-cache interface), `self.free_pages`, `self.num_pages` (ch08).
        Checked: a healthy engine passes after a run; it catches, each with a message: a leaked
            page, a page both free and cached, a page freed twice or twice in the free list, more
            pages than the pool has, a lock left behind, and a broken prefix tree.
        """
        self.prefix_cache.check_integrity()
        cached_locs = self.prefix_cache.all_indices()
        cached_pages = torch.unique(cached_locs // self.page_size)
        free = self.free_pages
        n_free, n_cached = len(free), len(cached_pages)
        assert len(torch.unique(free)) == n_free, "a page is in the free list twice"
        assert n_free + n_cached == self.num_pages, (
            f"{n_free} free + {n_cached} cached pages, expected {self.num_pages}: with no "
            "request running every page is free or in the prefix cache, once (fewer: a page "
            "taken and never given back; more: a page freed twice, or freed while the cache "
            "holds it)"
        )
        overlap = torch.isin(free, cached_pages.to(free.dtype))
        assert not bool(overlap.any()), (
            f"{int(overlap.sum())} page(s) are both free and in the prefix cache"
        )
        assert self.prefix_cache.protected_size == 0, (
            "a prefix is still locked with no request running"
        )
