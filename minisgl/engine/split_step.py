"""A step in two launches, for batches with a constrained request: the forward now, the sampling
later, once the scheduler has filled the step's bitmask.

The forward does not need the mask; only the sampling does, and the mask of step N+1 depends on
the token of step N, which under overlap the CPU handles after step N+1 is launched. So the
scheduler launches the forward (`launch_forward`), handles step N (each matcher accepts its
token), fills step N+1's bitmask, then launches the sampling (`launch_sample`): the grammar's CPU
work runs while the device computes the forward. Both launches go on the engine stream in that
order, and the output's `copy_done` is recorded after the sampling, as `Engine.forward_batch`
records it after its single launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict

import torch

from minisgl.structured.bitmask import sample_with_bitmask

from .engine import Engine, ForwardInput, ForwardOutput


@dataclass
class PendingSample:
    """A launched forward whose sampling is still to be launched."""

    fi: ForwardInput
    out: ForwardOutput
    logits: Dict[str, Any] = field(default_factory=dict)  # filled on the engine stream


def launch_forward(engine: Engine, fi: ForwardInput) -> PendingSample:
    """Queue the batch's forward on the engine stream and advance its requests (as
    `Engine.forward_batch` does); the logits wait on the device for `launch_sample`."""
    batch = fi.batch
    bs = batch.size
    out = ForwardOutput(
        next_tokens_gpu=torch.empty(bs, dtype=torch.int32, device=engine.device),
        next_tokens_cpu=engine.kit.pin(torch.empty(bs, dtype=torch.int32)),
        copy_done=engine.kit.new_event(),
    )
    pending = PendingSample(fi, out)

    def work() -> None:
        batch.input_ids = engine.token_pool[fi.input_tuple]
        pending.logits["value"] = engine.run_model(batch)

    engine.stream.launch(work)
    for req in batch.reqs:
        req.complete_one()
    return pending


def launch_sample(
    engine: Engine, pending: PendingSample, rows: torch.Tensor, bitmask: torch.Tensor
) -> None:
    """Queue the sampling of `pending`'s logits with `bitmask` [C, W] (host int32) applied to
    logits rows `rows` [C] (host int64), then the token writes and copies, then `copy_done`."""
    fi, out = pending.fi, pending.out
    # Copied on the engine stream, inside the work: the scheduler's stream, where other inputs
    # are copied, was waited for at the forward's launch, not since (page-locked: asynchronous)
    rows, bitmask = engine.kit.pin(rows), engine.kit.pin(bitmask)

    def work() -> None:
        logits = pending.logits.pop("value")
        rows_dev = rows.to(logits.device, non_blocking=True)
        bitmask_dev = bitmask.to(logits.device, non_blocking=True)
        tokens = sample_with_bitmask(engine.sampler, logits, fi.sample_args, rows_dev, bitmask_dev)
        out.next_tokens_gpu.copy_(tokens)
        engine.token_pool[fi.write_tuple] = tokens  # before copy_done, as in forward_batch
        out.next_tokens_cpu.copy_(tokens, non_blocking=True)

    engine.stream.launch(work)
    out.copy_done.record(engine.stream)
