"""A batch's device inputs: the KV locations its new tokens get, where each token's id is read and
where each sample is written, and the attention metadata, built on the scheduler's stream before
the batch is launched."""

from __future__ import annotations

import torch

from minisgl.attention import prepare_metadata
from minisgl.core import Batch
from minisgl.engine import BatchSamplingArgs, ForwardInput

# the batch fields the model reads, which `_prepare_batch` fills in
PREPARED = ("positions", "out_loc", "attn_metadata")


class BatchInputs:
    """A mixin of Scheduler (`self` is the scheduler)."""

    def _prepare_batch(self, batch: Batch) -> ForwardInput:
        """Allocate KV locations and build the index tensors of one step (on the scheduler stream).

        Receives: `batch`, a prefill batch (requests and chunks, `req.is_chunk`) or a decode batch,
            in order; each request processes positions [cached_len, device_len) of its slot's row
            (`req.table_idx`); the lengths are not yet advanced (that happens at launch).
        Returns: `ForwardInput(batch, sample_args, input_tuple, write_tuple)`. input_tuple = (rows,
            positions), int64 on the device, one entry per processed token in batch order: where
            each token's id is read in the token pool. write_tuple = (rows, columns), one per
            request: its row and column device_len, where its sample goes (a chunk's:
            `self.engine.dummy_row`, any column; the reference writes 0). sample_args: each
            request's sampling settings, in batch order.
        Leaves: KV locations of the new positions allocated in the page table; `batch.positions`,
            `batch.out_loc` (the page-table entry of every processed token, int64) and
            `batch.attn_metadata` filled in, both read from the page table after the allocation;
            `batch.input_ids` left unset (the engine gathers it through input_tuple, on its stream).
            Every tensor of the step (the batch's, the metadata's, the sampling arguments', both
            tuples) on `self.device`: index tensors through `self.engine.kit.to_device`.
        Uses: `self.cache_manager.allocate_paged` (ch08), `self.page_table` (ch04),
            `self.engine.kit.to_device`, `self.engine.dummy_row`, `ForwardInput` (ch06),
            `prepare_metadata` (ch05), `BatchSamplingArgs.from_params` (ch06), `req.is_chunk`
            (ch10).
        Checked: prefill and decode indices point at each token's row and position; out_loc is the
            page-table entry of every token, no location twice; a chunk's sample goes to the scratch
            row; each request gets its own sampling arguments; every tensor handed to the forward
            is on the device (on a CPU, `cpu:0` and tagged copies tell); outputs equal Hugging
            Face's.
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

    def _check_prepared(self, forward_input: ForwardInput, batch: Batch) -> None:
        """What `_prepare_batch` must leave, checked where the scheduler takes its result: a field
        left unset would otherwise fail deep inside the model ("'NoneType' object has no
        attribute 'clone'"), naming neither the field nor the function that should have set it."""
        if not isinstance(forward_input, ForwardInput):
            raise TypeError(
                f"_prepare_batch returned {type(forward_input).__name__}, expected a ForwardInput "
                "(batch, sample_args, input_tuple, write_tuple)"
            )
        unset = [f"batch.{name}" for name in PREPARED if getattr(batch, name, None) is None]
        if unset:
            raise ValueError(
                f"_prepare_batch left {', '.join(unset)} unset (None): it fills in "
                "batch.positions (input_tuple's positions), batch.out_loc (the page-table entry "
                "of every processed token) and batch.attn_metadata (prepare_metadata's)"
            )
