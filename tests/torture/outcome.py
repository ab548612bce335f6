"""What every request of a finished run must have received.

* A request that was not aborted gets exactly one finished message, on its last token, and exactly
  min(max_tokens, up to and including the first EOS) tokens. Greedy ones get Hugging Face's tokens
  (the pool's reference, cut at max_tokens and after the first EOS unless ignore_eos).
* An aborted request gets nothing after the scheduler processed its abort (checked live by the
  driver); what it got before is a prefix of what it would have got, and the client's result holds
  exactly the tokens that arrived before `llm.abort` was called.
* Sampled requests are checked for lengths, EOS and finish flags only.
"""

from __future__ import annotations

from typing import List

from .invariants import Violation
from .runner import STRAY_UID
from .workload import RequestSpec


def expected_greedy(spec: RequestSpec, reference: List[int], eos: int | None) -> List[int]:
    want = list(reference[: spec.max_tokens])
    if not spec.ignore_eos and eos in want:
        want = want[: want.index(eos) + 1]
    return want


def _check_sampled(
    uid: int, spec: RequestSpec, tokens: List[int], eos: int | None, complete: bool
) -> None:
    if len(tokens) > spec.max_tokens:
        raise Violation(
            "length", f"uid {uid}: {len(tokens)} tokens, max_tokens is {spec.max_tokens}"
        )
    if not spec.ignore_eos and eos in tokens[:-1]:
        raise Violation("eos", f"uid {uid}: tokens continue after EOS {eos}: {tokens}")
    if complete and len(tokens) < spec.max_tokens and (spec.ignore_eos or tokens[-1:] != [eos]):
        raise Violation(
            "length",
            f"uid {uid}: stopped after {len(tokens)} of {spec.max_tokens} tokens "
            f"without an EOS: {tokens}",
        )


def check_outcome(driver) -> None:
    wl, t, llm, pool = driver.wl, driver.t, driver.llm, driver.pool
    vocab = llm.vocab_size
    if t.rejects:
        raise Violation("rejected", "; ".join(t.rejects))
    for i, spec in enumerate(wl.requests):
        uid = t.uids[i]
        sent = t.messages.get(uid, [])
        tokens = [m.next_token for _, m in sent]
        flags = [m.finished for _, m in sent]
        fa = t.frontend_aborts.get(uid)
        aborted = fa is not None and not fa.had_finished
        what = f"uid {uid} (request {i}{', aborted' if aborted else ''})"
        if any(not 0 <= tok < vocab for tok in tokens):
            raise Violation("bad-token", f"{what}: token outside the vocabulary: {tokens}")
        if True in flags[:-1]:
            raise Violation(
                "finished-early", f"{what}: finished flag before its last message: {flags}"
            )
        if spec.is_greedy:
            want = expected_greedy(spec, pool.references[spec.prompt], driver.eos)
            if tokens != want[: len(tokens)] or (not aborted and len(tokens) != len(want)):
                raise Violation(
                    "greedy-mismatch", f"{what}: got {tokens}, Hugging Face gives {want}"
                )
        else:
            _check_sampled(uid, spec, tokens, driver.eos, complete=not aborted)
        result = llm.results[uid]
        if not aborted:
            if flags[-1:] != [True]:
                raise Violation("not-finished", f"{what}: no finished message (flags {flags})")
            if result.token_ids != tokens or not result.finished or result.aborted:
                raise Violation(
                    "client-result", f"{what}: client holds {result}, scheduler sent {tokens}"
                )
        else:
            before = [m.next_token for seq, m in sent if seq < fa.seq]
            if result.token_ids != before or not result.aborted:
                raise Violation(
                    "client-result", f"{what}: client holds {result}, had {before} when it aborted"
                )
    for k in range(len(wl.stray_aborts)):
        if STRAY_UID + k not in t.scheduler_aborts:
            raise Violation(
                "stray-abort", f"the abort of unknown uid {STRAY_UID + k} was never processed"
            )
