"""A draft model as a drafter: a small model that shares the target's tokenizer proposes k tokens
greedily, each request's KV kept in the draft's own paged cache between steps.

The draft runs in an `Engine` of its own (its model, KV pool, page table and Context; Context's
forward_batch makes it the global context only while a draft forward runs, so the target's layers
never see the draft's cache). It does not go through the scheduler: the drafter is its own small
cache manager. Per request (keyed by `req.uid`) it keeps a slot (a page-table row), the pages it
holds and the tokens whose KV those pages hold.

`propose(reqs, k)` compares each request's cached tokens with `req.input_ids` (the prompt and every
accepted token): the longest common prefix is kept, the rest rolled back (pages past it return to
the free list, a rejected draft leaves nothing behind), what is missing runs as one batched extend
over all requests, and k - 1 batched greedy decode steps follow. The draft is greedy, so its
proposal is deterministic (draft_probs None for the verifier) and the target's verification stays
exact. Where every request lacks the KV of one or two tokens (the steady state: the draft ran all
its drafts but the last) and the draft's engine replays graphs, the whole proposal is one replay of
draft_graph.py's graph instead; `propose_on_device` leaves its drafts on the device for the verify
graph, and learns which tokens they were (`_settle`) only at the next call.

The draft KV is a cache, never the truth: a request's tokens can always be run again. So when the
pool or the slots run short, requests not in the current call lose theirs (least recently used
first) instead of failing the step.

Under tensor parallelism the draft runs unsharded on every rank (tp_size 1, on the rank's own
device): it is small, each rank gets the same tokens and runs the same greedy computation, and no
collective is needed between draft steps.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import List

import torch

from minisgl.attention import prepare_metadata
from minisgl.core import Batch, Req
from minisgl.engine import EngineConfig
from minisgl.engine.decode_rows import decode_rows
from minisgl.models import ModelConfig

from .draft_graph import FusedProposals, ProposalGraphs
from .draft_setup import build_quietly, check_draft_matches_target, this_rank_device


@dataclass(eq=False)
class _Cached:
    """What the draft keeps for one request: its page-table row, its pages (in position order)
    and the tokens whose KV they hold (positions 0..len-1)."""

    row: int
    pages: List[int] = field(default_factory=list)
    tokens: List[int] = field(default_factory=list)


@dataclass(eq=False)
class _Pass:
    """One request in one draft forward, in the form `prepare_metadata` reads (the lengths before
    the pass, like a scheduler's Req)."""

    table_idx: int
    cached_len: int
    device_len: int
    is_chunk = False

    @property
    def extend_len(self) -> int:
        return self.device_len - self.cached_len


def common_prefix_len(a: List[int], b: List[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case, compared at C speed
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class DraftModelDrafter(FusedProposals):
    """Greedy proposals from a small model with its own paged KV (the Drafter protocol of
    minisgl/speculative/drafter.py).

    `target_config`: the target engine's EngineConfig; the draft takes its device, dtype, page
    size, number of request slots, attention backend and graph settings, and checks that the two
    models share a tokenizer. `num_tokens`: the draft's KV pool in tokens (default: the target's
    pool when fixed by num_page_override, else cpu_kv_tokens). `max_seq_len`: the longest request
    the draft keeps (default: the target's max_seq_len_override, else the draft's own limit); a
    request that outgrows it gets fewer (or no) draft tokens."""

    def __init__(
        self,
        draft_model_path: str | Path,
        target_config: EngineConfig,
        *,
        num_tokens: int | None = None,
        max_seq_len: int | None = None,
    ) -> None:
        if not isinstance(target_config, EngineConfig):
            raise TypeError(
                "target_config must be the target's EngineConfig, got "
                f"{type(target_config).__name__}"
            )
        draft = ModelConfig.from_dir(draft_model_path)
        if draft.hybrid is not None:
            raise ValueError(
                f"draft model {draft_model_path} is {draft.architecture} (Gated DeltaNet layers): "
                "its recurrent state is rewritten in place at each token, so a rejected draft "
                "could not be rolled back to the accepted prefix; use a draft with attention "
                "layers only"
            )
        check_draft_matches_target(draft_model_path, target_config.model_path)
        page_size = target_config.page_size
        if num_tokens is None:
            fixed = target_config.num_page_override
            num_tokens = fixed * page_size if fixed is not None else target_config.cpu_kv_tokens
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 1:
            raise ValueError(f"num_tokens must be an integer >= 1, got {num_tokens!r}")
        limit = draft.max_position_embeddings
        if max_seq_len is None:
            max_seq_len = target_config.max_seq_len_override
        if max_seq_len is not None:
            max_seq_len = min(max_seq_len, limit)  # the draft's RoPE goes no further
        # only the engine's fields: a SchedulerConfig (what the LLM passes) carries more
        engine_fields = {f.name: getattr(target_config, f.name) for f in fields(EngineConfig)}
        engine_fields.update(
            model_path=draft_model_path,
            device=this_rank_device(target_config.device),
            num_page_override=-(-num_tokens // page_size),
            max_seq_len_override=max_seq_len,
            tp_size=1,  # unsharded on every rank: see the module's docstring
        )
        self.engine = build_quietly(EngineConfig(**engine_fields))
        self.page_size = page_size
        self.max_seq_len = self.engine.max_seq_len
        self.device = self.engine.device
        self.free_pages: List[int] = list(range(self.engine.num_pages))
        self.free_rows: List[int] = list(range(target_config.max_running_req))
        # uid -> what is cached for it, least recently proposed for first
        self.cached: OrderedDict[int, _Cached] = OrderedDict()
        # the whole proposal of k tokens as one graph replay, where the draft replays graphs and
        # the target's config says k (draft_graph.py)
        self.proposal = None
        self._unsettled = None  # drafts propose_on_device left on the device (_settle)
        self._table_writes = None  # page-table entries _reserve chose, not written yet
        k = getattr(target_config, "num_speculative_tokens", None)
        if self.engine.graph_runner is not None and isinstance(k, int) and k >= 1:
            max_reqs = min(target_config.cuda_graph_max_bs, target_config.max_running_req)
            self.proposal = ProposalGraphs(self.engine, k, max_reqs)

    # ------------------------------------------------------------------ the protocol

    @torch.inference_mode()
    def propose(self, reqs: List[Req], k: int) -> List[List[int]]:
        """Up to k greedy draft tokens per request (fewer only where the draft's context ends)."""
        out: List[List[int]] = [[] for _ in reqs]
        prepared = self._prepare(reqs, k)
        if prepared is None:
            return out
        work, entries = prepared
        drafts = self._propose_fused(work, entries, k)
        if drafts is not None:
            return self._record(out, work, entries, drafts.tolist())
        self._write_table()
        # One extend over every request, then decode steps over those still drafting. Each step's
        # tokens stay on the device as a [len(work)] column and feed the next step directly.
        passes = [_Pass(e.row, len(e.tokens), len(t)) for e, (_, t, _) in zip(entries, work)]
        ids = [x for e, (_, t, _) in zip(entries, work) for x in t[len(e.tokens) :]]
        ids = self._to_device(torch.tensor(ids, dtype=torch.int32))
        # (rows, graph size) of the last step when a graph ran it with one row per request (a
        # catch-up of one token each, as after a rejection, or a decode step): the next step
        # advances it
        first, replayed = self._forward(passes, ids)
        drafted = [first]
        live = list(range(len(work)))
        for j in range(1, k):
            still = [w for w in live if work[w][2] > j]
            if not still:
                break
            ids = drafted[-1]
            if len(still) < len(work):
                ids = ids.index_select(0, self._to_device(torch.tensor(still)))
            if replayed is not None and still == live:  # the same rows, one position further
                logits = self.engine.graph_runner.replay_next(ids, *replayed)
                tokens = logits.argmax(dim=-1).to(torch.int32)
            else:
                passes = []
                for w in still:
                    position = len(work[w][1]) + j - 1  # of draft j, whose KV this step writes
                    passes.append(_Pass(entries[w].row, position, position + 1))
                tokens, replayed = self._forward(passes, ids)
            live = still
            drafted.append(_scatter_back(tokens, live, len(work)))
        table = torch.stack(drafted, dim=1).tolist()  # one copy to the host for the whole call
        return self._record(out, work, entries, table)

    def _prepare(self, reqs: List[Req], k: int):
        """(work, entries) of a proposal: per request that drafts, (its index in reqs, its tokens,
        how many tokens it drafts), and its cache entry, rolled back to what it shares with its
        tokens and with pages up to its last draft's position; None when nobody drafts."""
        self._settle()
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k (draft tokens per request) must be an integer >= 0, got {k!r}")
        uids = [r.uid for r in reqs]
        if len(set(uids)) != len(uids):
            raise ValueError(f"propose got the same request twice: uids {uids}")
        if k == 0:
            return None
        work = []
        for i, req in enumerate(reqs):
            tokens = req.input_ids.tolist()
            budget = min(k, self.max_seq_len - len(tokens) + 1)  # draft j sits at len + j - 1
            if budget > 0 and tokens:
                work.append((i, tokens, budget))
        if not work:
            return None
        uids = [reqs[i].uid for i, _, _ in work]
        entries = self._entries(uids)
        for entry, (_, tokens, _) in zip(entries, work):
            # The last token runs again even when cached: its logits give the first draft.
            self._roll_back(entry, min(common_prefix_len(entry.tokens, tokens), len(tokens) - 1))
        writes = self._reserve(entries, [len(t) + b - 1 for _, t, b in work], busy=set(uids))
        self._table_writes = writes  # the proposal graph takes them, else `_write_table`
        return work, entries

    def _record(self, out, work, entries, table) -> List[List[int]]:
        """Each request's draft (`table` row, cut to its budget) into `out`; the tokens whose KV
        its entry now holds: its own and every draft but the last (which was never run)."""
        for w, (i, tokens, budget) in enumerate(work):
            out[i] = table[w][:budget]
            entries[w].tokens = tokens + out[i][:-1]
        return out

    def release(self, req: Req) -> None:
        """Free the request's pages and slot; a uid never proposed for holds nothing."""
        self._settle()
        entry = self.cached.pop(req.uid, None)
        if entry is not None:
            self._roll_back(entry, 0)
            self.free_rows.append(entry.row)

    # ------------------------------------------------------------------ sizes (tests, reports)

    @property
    def num_free_pages(self) -> int:
        return len(self.free_pages)

    @property
    def num_pages(self) -> int:
        return self.engine.num_pages

    # ------------------------------------------------------------------ the cache

    def _entries(self, uids: List[int]) -> List[_Cached]:
        """Each uid's entry, most recently used now; a new uid takes a free row, or the row of the
        least recently used request not in this call (whose KV is only a cache)."""
        entries = []
        for uid in uids:
            entry = self.cached.get(uid)
            if entry is None:
                if not self.free_rows:
                    self._drop_idle(set(uids), rows=True)
                if not self.free_rows:
                    raise RuntimeError(
                        f"draft model: {len(uids)} requests in one propose but only "
                        f"{self.engine.config.max_running_req} slots (max_running_req)"
                    )
                entry = self.cached[uid] = _Cached(self.free_rows.pop())
            self.cached.move_to_end(uid)
            entries.append(entry)
        return entries

    def _roll_back(self, entry: _Cached, keep: int) -> None:
        """Keep the KV of the first `keep` tokens; pages past them go back to the free list."""
        held = -(-keep // self.page_size)
        self.free_pages.extend(entry.pages[held:])
        del entry.pages[held:]
        del entry.tokens[keep:]

    def _drop_idle(self, busy: set, rows: bool = False, pages_needed: int = 0) -> None:
        """Free the KV (and with `rows` the slot) of requests not in `busy`, least recently used
        first, until a row is free or `pages_needed` pages are."""
        for uid in list(self.cached):
            if uid in busy:
                continue
            if rows and self.free_rows:
                return
            if not rows and len(self.free_pages) >= pages_needed:
                return
            entry = self.cached[uid]
            self._roll_back(entry, 0)
            if rows:
                del self.cached[uid]
                self.free_rows.append(entry.row)

    def _reserve(self, entries: List[_Cached], lengths: List[int], busy: set):
        """Pages for every position up to each request's final length in this call; the page-
        table entries of the positions not mapped yet, as (rows, columns, locations) lists."""
        p = self.page_size
        wanted = [-(-n // p) - len(e.pages) for e, n in zip(entries, lengths)]
        need = sum(w for w in wanted if w > 0)
        if need > len(self.free_pages):
            self._drop_idle(busy, pages_needed=need)
        if need > len(self.free_pages):
            raise RuntimeError(
                f"draft model: out of KV pages: this propose needs {need}, {len(self.free_pages)} "
                f"are free of {self.engine.num_pages} (raise num_tokens)"
            )
        rows, cols, locs = [], [], []
        for e, n, w in zip(entries, lengths, wanted):
            start = len(e.tokens)
            if w > 0:
                e.pages.extend(self.free_pages[:w])
                del self.free_pages[:w]
            for pos in range(start, n):
                rows.append(e.row)
                cols.append(pos)
                locs.append(e.pages[pos // p] * p + pos % p)
        return rows, cols, locs

    def _write_table(self) -> None:
        """The page-table entries `_reserve` chose, written in one go (the decode steps then only
        read locations)."""
        writes, self._table_writes = self._table_writes, None
        if writes is not None and writes[0]:
            block = self._to_device(torch.tensor(writes, dtype=torch.int64))
            self.engine.page_table[block[0], block[1]] = block[2].to(torch.int32)

    # ------------------------------------------------------------------ one forward

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        # page-locked and non-blocking on a GPU: a plain .to(device) waits for the device, and the
        # host would then prepare each draft step only once the previous one has finished
        return self.engine.kit.to_device(t)

    def _forward(self, passes: List[_Pass], ids: torch.Tensor):
        """(the greedy next token [B] int32 on the device after each pass's last token, and
        (B, graph size) when a graph ran one row per pass, which `replay_next` may advance; else
        None).

        A pass of one token is a decode row. A pass of several (the catch-up on the tokens
        accepted since the last propose, or a whole prompt) runs as decode rows too, one per token,
        whenever a CUDA graph holds them all (decode_rows.py), so the graph replays it; else as an
        extend (phase "prefill", whose LM head keeps each pass's last row)."""
        runner = self.engine.graph_runner
        if all(q.extend_len == 1 for q in passes) or (
            runner is not None and sum(q.extend_len for q in passes) <= runner.max_bs
        ):
            batch = decode_rows(
                [(q.table_idx, q.cached_len, q.device_len) for q in passes],
                self.engine.page_table,
                self.device,
            )
            batch.input_ids = ids
            size = runner.graph_size(batch) if runner is not None else None
            logits = self.engine.run_model(batch)
            if len(batch.reqs) > len(passes):  # each pass's last row
                ends = torch.tensor([q.extend_len for q in passes]).cumsum(0) - 1
                logits = logits[self._to_device(ends)]
                size = None
            tokens = logits.argmax(dim=-1).to(torch.int32)
            return tokens, None if size is None else (batch.size, size)
        rows = torch.cat([torch.full((q.extend_len,), q.table_idx) for q in passes])
        cols = torch.cat([torch.arange(q.cached_len, q.device_len) for q in passes])
        batch = Batch(reqs=passes, phase="prefill")
        batch.input_ids = ids
        batch.positions = self._to_device(cols)
        batch.out_loc = self.engine.page_table[self._to_device(rows), batch.positions].to(
            torch.int64
        )
        batch.attn_metadata = prepare_metadata(batch, self.engine.page_table, self.device)
        logits = self.engine.run_model(batch)
        return logits.argmax(dim=-1).to(torch.int32), None


def _scatter_back(tokens: torch.Tensor, live: List[int], total: int) -> torch.Tensor:
    """[len(live)] tokens as a [total] column (rows not drafting this step hold -1)."""
    if len(live) == total:
        return tokens
    column = torch.full((total,), -1, dtype=tokens.dtype, device=tokens.device)
    index = torch.tensor(live, dtype=torch.int64)
    if tokens.device.type == "cuda":  # page-locked: a plain copy would wait for the device
        index = index.pin_memory()
    column[index.to(tokens.device, non_blocking=True)] = tokens
    return column
