"""What one torture run does, as plain data, and the seeded generator that invents it.

A workload is an engine setup plus a script: which requests arrive before which loop iteration,
which of them are aborted and when, and a few oddities (aborts for uids nobody issued, a switch of
the loop mid-run). Being plain data, a workload can be printed, saved as JSON, replayed and shrunk.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field, replace
from typing import List

from .prompts import REF_TOKENS, PromptPool

# When an abort is sent:
#   step:    by the driver before loop iteration `at` (if `at` is its arrival: while it is queued)
#   launch:  from an event callback, when the `at`-th batch holding the request is launched
#   handle:  from an event callback, when the `at`-th batch holding the request has been handled
#   finish:  from an event callback, as its finished message is sent (right after it finished)
ABORT_MOMENTS = ("step", "launch", "handle", "finish")


@dataclass
class EngineSetup:
    cache_type: str = "radix"  # "radix" | "naive"
    page_size: int = 1
    num_pages: int = 1024
    max_extend_tokens: int = 8192
    max_running_req: int = 8
    overlap: bool = True
    cpu_streams: str = "eager"  # "eager" | "deferred"
    max_seq_len: int = 256  # context length: page-table and token-pool rows end here
    optimistic_admission: bool = False
    init_new_token_ratio: float = 0.7  # a low first estimate admits too many: retractions
    learn_ratio: bool = True  # False: the estimate stays low, and retractions go on
    mixed_batches: bool = False  # prefill steps carry the running requests' decodes


@dataclass
class RequestSpec:
    prompt: int  # index into the prompt pool
    max_tokens: int
    arrive: int  # added before this loop iteration
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    ignore_eos: bool = False

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass
class AbortSpec:
    request: int  # index into Workload.requests
    moment: str  # one of ABORT_MOMENTS
    at: int  # loop iteration (step) or occurrence count (launch, handle); unused for finish
    duplicate: bool = False  # also send the scheduler a second AbortBackendMsg for the same uid


@dataclass
class Workload:
    seed: int
    setup: EngineSetup
    requests: List[RequestSpec]
    aborts: List[AbortSpec] = field(default_factory=list)
    eos_token: int | None = None  # forced as the scheduler's EOS; None keeps the model's
    # iterations sending an abort for an unknown uid
    stray_aborts: List[int] = field(default_factory=list)
    # iterations before which the overlap switch flips
    switch_loop_at: List[int] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Workload":
        d = json.loads(text)
        return cls(
            seed=d["seed"],
            setup=EngineSetup(**d["setup"]),
            requests=[RequestSpec(**r) for r in d["requests"]],
            aborts=[AbortSpec(**a) for a in d["aborts"]],
            eos_token=d["eos_token"],
            stray_aborts=list(d["stray_aborts"]),
            switch_loop_at=list(d["switch_loop_at"]),
        )

    def without_request(self, i: int) -> "Workload":
        """The same workload minus request `i` (its aborts go too; later indices shift down)."""
        reqs = self.requests[:i] + self.requests[i + 1 :]
        aborts = [
            replace(a, request=a.request - (a.request > i)) for a in self.aborts if a.request != i
        ]
        return replace(self, requests=reqs, aborts=aborts)


def longest(requests: List[RequestSpec], pool: PromptPool) -> int:
    """The longest request, prompt plus max_tokens (the engine rejects what exceeds its limits)."""
    return max([len(pool.prompts[r.prompt]) + r.max_tokens for r in requests] or [1])


def min_pages(requests: List[RequestSpec], pool: PromptPool, page_size: int) -> int:
    """The smallest pool that can hold every request alone."""
    return -(-longest(requests, pool) // page_size)


def generate(
    seed: int,
    pool: PromptPool,
    max_requests: int = 8,
    retracting: bool = False,
    mixed: bool = False,
) -> Workload:
    """A random workload; the same seed always gives the same workload. `retracting`: longer
    requests on a pool that holds their prompts and little more, admitted on a first estimate of
    0.1 that does not learn, so decode steps retract requests all the time (half of them with mixed
    batches). `mixed`: prefill steps carry the running requests' decodes."""
    rng = random.Random(seed)
    page_size = rng.choice([1, 4])
    # a quarter of the workloads hammer a few prompts: duplicates, shared prefixes, cache hits
    choices = (
        rng.sample(range(len(pool.prompts)), 3) if rng.random() < 0.25 else range(len(pool.prompts))
    )
    requests = []
    for _ in range(rng.randint(1, max_requests)):
        kind = rng.random()
        spec = RequestSpec(
            prompt=rng.choice(choices),
            max_tokens=rng.choice([1, 2, rng.randint(1, 8), rng.randint(1, REF_TOKENS)]),
            arrive=0 if rng.random() < 0.5 else rng.randint(0, 30),
            ignore_eos=rng.random() < 0.4,
        )
        if 0.6 <= kind < 0.7:  # greedy, but through the sampler's filtering path
            spec.temperature, spec.top_k = rng.choice([0.7, 1.3]), 1
        elif kind >= 0.7:
            spec.temperature = rng.choice([0.5, 1.0, 1.5])
            spec.top_k = rng.choice([-1, 5, 50])
            spec.top_p = rng.choice([1.0, 0.9, 0.5])
        requests.append(spec)

    aborts = []
    for i, r in enumerate(requests):
        if rng.random() < 0.45:
            moment = rng.choice(ABORT_MOMENTS)
            at = (
                r.arrive + rng.choice([0, 0, 1, 2, rng.randint(0, 30)])
                if moment == "step"
                else rng.randint(1, 4)
            )
            aborts.append(AbortSpec(i, moment, at, duplicate=rng.random() < 0.3))

    eos_token = None
    greedy = [r for r in requests if r.is_greedy and not r.ignore_eos]
    if greedy and rng.random() < 0.6:  # an EOS the reference produces at a chosen position
        r = rng.choice(greedy)
        eos_token = pool.references[r.prompt][rng.randrange(r.max_tokens)]

    setup = EngineSetup(
        cache_type=rng.choice(["radix", "radix", "naive"]),
        page_size=page_size,
        max_extend_tokens=rng.choice([1, 2, 3, 5, 8, 16, 8192]),
        max_running_req=rng.choice([1, 2, 3, 4, 8]),
        overlap=rng.random() < 0.7,
        cpu_streams=rng.choice(["eager", "deferred"]),
    )
    if rng.random() < 0.3:  # requests that reach the very end of a row
        setup.max_seq_len = longest(requests, pool) + rng.choice([0, 0, 1, 3])
    # Tight pools force queueing and radix eviction; some are roomy.
    setup.num_pages = min_pages(requests, pool, page_size) + rng.choice(
        [0, 1, 2, 3, 6, 12, 40, 200]
    )
    stray = [rng.randint(0, 20) for _ in range(rng.choice([0, 0, 1, 2]))]
    switch = sorted(rng.sample(range(1, 30), rng.randint(1, 3))) if rng.random() < 0.15 else []
    if retracting:  # requests that grow long, together, on a pool that cannot hold them all
        setup.optimistic_admission, setup.init_new_token_ratio = True, 0.1
        setup.learn_ratio = False
        setup.max_running_req = max(setup.max_running_req, 4)
        for r in requests:
            r.max_tokens = max(r.max_tokens, rng.randint(REF_TOKENS // 2, REF_TOKENS))
            r.arrive = min(r.arrive, rng.choice([0, 0, 2, 5]))
        if setup.max_seq_len != 256:  # still a row's very end, for the longer requests
            setup.max_seq_len = longest(requests, pool) + rng.choice([0, 1])
        # room for every prompt (or the longest request), and little for what they generate
        prompts = sum(-(-len(pool.prompts[r.prompt]) // page_size) for r in requests)
        setup.num_pages = max(min_pages(requests, pool, page_size), prompts) + rng.choice(
            [0, 1, 2, 4]
        )
        setup.mixed_batches = rng.random() < 0.5
    if mixed:
        setup.mixed_batches = True
    return Workload(seed, setup, requests, aborts, eos_token, stray, switch)
