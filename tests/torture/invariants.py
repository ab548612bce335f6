"""The properties every torture run must keep, checked while it runs and when it ends.

* slots (from the event log, as they happen): a slot has one owner at a time, a batch only uses
  slots its requests own, and no slot is handed out while a batch in flight still holds it (the
  scheduler writes a new prompt into the slot's token-pool row directly, outside the engine stream,
  so a batch still to run would read or overwrite the wrong tokens);
* pages (after every loop iteration): the free list, the prefix cache and the pages each live
  request holds are disjoint and together make up the pool exactly. A KV page may be handed out
  while a batch in flight still writes it: every KV write is ordered on the one engine stream, so
  the old write lands before the new owner's. Whether that ordering holds is checked by the outputs
  themselves: in the deferred CPU mode a broken order computes wrong tokens;
* radix locks: every node is locked exactly as often as live requests' handles pass through it;
* idle: every slot and page is back, nothing locked.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, Set

import torch

from minisgl.kvcache import RadixPrefixCache


class Violation(AssertionError):
    """A broken invariant. `kind` names it (shrinking keeps failures of the same kind)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"[{kind}] {detail}")
        self.kind, self.detail = kind, detail


class SlotWatch:
    """Follows slot_alloc / slot_free / launch / handle events and checks slot ownership live."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.owner: Dict[int, int] = {}  # table_idx -> uid
        self.in_flight: Dict[int, Set[int]] = {}  # step -> table_idxs of the batch launched then

    def on_event(self, ev) -> None:
        if ev.kind == "slot_alloc":
            idx, uid = ev["table_idx"], ev["uid"]
            if idx in self.owner:
                raise Violation(
                    "slot-double-alloc",
                    f"slot {idx} given to uid {uid} while uid {self.owner[idx]} owns it",
                )
            busy = [s for s, idxs in self.in_flight.items() if idx in idxs]
            if busy:
                raise Violation(
                    "slot-reuse-in-flight",
                    f"slot {idx} given to uid {uid} while the batch of step {busy[0]} still "
                    "holds it",
                )
            self.owner[idx] = uid
        elif ev.kind == "slot_free":
            idx, uid = ev["table_idx"], ev["uid"]
            if self.owner.get(idx) != uid:
                raise Violation(
                    "slot-bad-free", f"uid {uid} freed slot {idx}, owned by {self.owner.get(idx)}"
                )
            del self.owner[idx]
        elif ev.kind == "launch":
            for uid, idx in zip(ev["uids"], ev["table_idxs"]):
                if self.owner.get(idx) != uid:
                    raise Violation(
                        "slot-not-owned",
                        f"step {ev['step']} runs uid {uid} in slot {idx}, owned by "
                        f"{self.owner.get(idx)}",
                    )
            self.in_flight[ev["step"]] = set(ev["table_idxs"])
        elif ev.kind == "handle":
            self.in_flight.pop(ev["step"], None)

    def check(self, llm) -> None:
        free = llm.table_manager.available_size
        if free + len(self.owner) != self.capacity:
            raise Violation(
                "slot-accounting", f"{free} free + {len(self.owner)} owned != {self.capacity} slots"
            )


def check_pages(llm) -> None:
    # The pools are written on the scheduler's stream, non-blocking on a GPU: wait for it before
    # reading them from here (read unordered, a free list still being concatenated showed 8
    # distinct pages of 248 on an H100 shared by 6 test processes)
    llm.stream.synchronize()
    cm = llm.cache_manager
    free = cm.free_pages.long()
    cached = torch.unique(cm.prefix_cache.all_indices().long() // cm.page_size)
    live = llm.live_requests()
    held = [cm.held_pages(r).long() for r in live]
    everything = torch.cat([free, cached, *held])
    n_held = sum(len(h) for h in held)
    if len(everything) != cm.num_pages or len(torch.unique(everything)) != cm.num_pages:
        raise Violation(
            "page-accounting",
            f"free {len(free)} + cached {len(cached)} + held {n_held} by {len(live)} live "
            "request(s) "
            f"= {len(everything)} ({len(torch.unique(everything))} distinct), pool has "
            f"{cm.num_pages}",
        )


def check_locks(llm) -> None:
    cache = llm.cache_manager.prefix_cache
    if not isinstance(cache, RadixPrefixCache):
        return
    try:
        cache.check_integrity()
    except AssertionError as e:
        raise Violation("radix-integrity", str(e)) from None
    want: Counter = Counter()
    for req in llm.live_requests():
        node, depth = req.cache_handle.node, 0
        while node is not None and node is not cache.root:
            want[id(node)] += 1
            depth += len(node.key)
            node = node.parent
        if depth != req.cache_handle.cached_len:
            raise Violation(
                "radix-handle",
                f"uid {req.uid}: handle says {req.cache_handle.cached_len} tokens, "
                f"its path holds {depth}",
            )
    seen = 0
    stack = list(cache.root.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node.ref_count != want[id(node)]:
            raise Violation(
                "radix-lock",
                f"a node of {len(node.key)} tokens has ref_count {node.ref_count}, "
                f"{want[id(node)]} live request(s) use it",
            )
        seen += want[id(node)] > 0
    if seen != len(want):
        raise Violation(
            "radix-lock", "a live request's handle points at a node no longer in the tree"
        )


def check_running(llm, slots: SlotWatch) -> None:
    """After every loop iteration."""
    # The pools are written on the scheduler's stream; on a GPU that stream is non-blocking, so
    # reading them here must wait for it (between steps nothing else does).
    llm.stream.synchronize()
    slots.check(llm)
    check_pages(llm)
    check_locks(llm)


def check_idle(llm, slots: SlotWatch) -> None:
    """When the engine has nothing left to do: everything is back."""
    check_running(llm, slots)
    if llm.live_requests():
        raise Violation("idle-leak", f"idle, but live requests remain: {llm.live_requests()}")
    if llm.table_manager.available_size != slots.capacity:
        raise Violation(
            "idle-leak",
            f"idle, but {slots.capacity - llm.table_manager.available_size} slot(s) "
            f"are not back (owners {slots.owner})",
        )
    try:
        llm.cache_manager.check_integrity()
    except AssertionError as e:
        raise Violation("idle-integrity", str(e)) from None
