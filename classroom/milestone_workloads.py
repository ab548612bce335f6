"""The workload of each milestone, run with whatever code is in the engine (the learner's, swapped
in by milestone_worker.py, or the reference). Each returns its figures as rows of the table, the
checks (tokens and counts that must equal the reference's) and its run time.

Everything runs on the CPU with the bundled model, in a few seconds; the numbers are real, and a
CPU's: what they would be on a GPU is the chapters' business.
"""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Tuple

import torch

from minisgl import LLM, SamplingParams

OPTIONS = dict(
    device="cpu",
    dtype=torch.float32,
    max_running_req=8,
    num_page_override=1024,
    max_seq_len_override=512,
)
PROMPTS = [
    "ROMEO:\nBut soft, what light",
    "JULIET:\nO Romeo, Romeo",
    "HAMLET:\nTo be, or not to be",
    "KING HENRY:\nOnce more unto the breach",
    "MACBETH:\nIs this a dagger",
    "PORTIA:\nThe quality of mercy",
    "LEAR:\nBlow, winds, and crack",
    "PROSPERO:\nOur revels now are ended",
]
# One scene's opening, shared by the requests of the prefix-cache workload: the radix cache keeps
# its KV after the first request, so the others compute only their own last line.
PREAMBLE = (
    "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is "
    "the sun.\nArise, fair sun, and kill the envious moon,\nWho is already sick and pale with "
    "grief,\n"
)
QUESTIONS = ["JULIET:\nAy me!", "ROMEO:\nShe speaks.", "NURSE:\nMadam!", "JULIET:\nRomeo!"]
LONG_PROMPT = PREAMBLE * 3
CHUNK_BUDGET = 32


class RequestFailed(RuntimeError):
    """A request the engine ended with an error (a step that raised: lifecycle.py's reason)."""


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, ignore_eos=True)


def outputs(llm: LLM, prompts, params) -> List[List[int]]:
    """Every request's tokens; a request the engine failed raises, with the engine's reason."""
    got = llm.generate(prompts, params)
    for i, out in enumerate(got):
        if "error" in out:
            raise RequestFailed(f"request {i} failed: {out['error']}")
    return [out["token_ids"] for out in got]


def prefill_steps(records) -> List[List[int]]:
    return [e["extend_lens"] for e in records if e.kind == "launch" and e["phase"] == "prefill"]


def rate(tokens: int, seconds: float) -> str:
    return f"{tokens / seconds:,.0f}"


# ---------------------------------------------------------------------- part 1 (after chapter 6)


def part1() -> dict:
    """A batch of eight requests, greedy, then the same batch sampled with seeds."""
    llm = LLM(**OPTIONS, cache_type="naive")
    outputs(llm, PROMPTS[:1], greedy(2))  # warm-up: the first step pays for allocations
    records = llm.events.record()
    start = time.perf_counter()
    tokens = outputs(llm, PROMPTS, greedy(40))
    seconds = time.perf_counter() - start
    steps = [e["phase"] for e in records if e.kind == "launch"]
    sampled = [
        SamplingParams(max_tokens=24, temperature=0.8, top_k=20, top_p=0.9, seed=7 + i)
        for i in range(len(PROMPTS))
    ]
    drawn = outputs(llm, PROMPTS, sampled)
    new = sum(len(t) for t in tokens)
    rows = {
        "requests in the batch": str(len(PROMPTS)),
        "prompt tokens": str(sum(len(llm.encode(p)) for p in PROMPTS)),
        "new tokens (greedy)": str(new),
        "prefill steps + decode steps": f"{steps.count('prefill')} + {steps.count('decode')}",
        "seconds": f"{seconds:.2f}",
        "new tokens per second": rate(new, seconds),
    }
    return {
        "rows": rows,
        "checks": {"the greedy batch's tokens": tokens, "the sampled batch's tokens": drawn},
        "seconds": seconds,
    }


# ---------------------------------------------------------------------- part 2 (after chapter 11)


def shared_prefix(rows: Dict[str, str], checks: Dict[str, list]) -> None:
    """Four requests sharing the preamble, one after another, through the radix cache."""
    llm = LLM(**OPTIONS, cache_type="radix")
    records = llm.events.record()
    tokens, computed, total = [], [], 0
    for question in QUESTIONS:
        before = len(records)
        tokens += outputs(llm, [PREAMBLE + question], greedy(8))
        computed.append(sum(sum(lens) for lens in prefill_steps(records[before:])))
        total += len(llm.encode(PREAMBLE + question))
    rows["radix: prompt tokens of 4 requests"] = str(total)
    rows["radix: prefill tokens computed"] = " + ".join(map(str, computed))
    saved = total - sum(computed)
    rows["radix: prefill tokens saved"] = f"{saved} ({saved / total:.0%})"
    checks["the shared-prefix requests' tokens"] = tokens
    checks["the prefill tokens each shared-prefix request computed"] = computed


def chunked(rows: Dict[str, str], checks: Dict[str, list]) -> None:
    """A long prompt under a prefill budget of CHUNK_BUDGET tokens a step."""
    llm = LLM(**OPTIONS, cache_type="naive", max_extend_tokens=CHUNK_BUDGET)
    records = llm.events.record()
    tokens = outputs(llm, [LONG_PROMPT], greedy(8))
    pieces = [lens[0] for lens in prefill_steps(records)]
    rows["chunks: prompt tokens, budget per step"] = (
        f"{len(llm.encode(LONG_PROMPT))}, {CHUNK_BUDGET}"
    )
    rows["chunks: prefill steps"] = str(len(pieces))
    rows["chunks: tokens per prefill step"] = ", ".join(map(str, pieces))
    checks["the long prompt's tokens"] = tokens
    checks["the long prompt's prefill pieces"] = pieces


def overlap(rows: Dict[str, str], checks: Dict[str, list]) -> None:
    """The same batch with the normal loop and with the overlap loop."""
    speed = {}
    for on in (False, True):
        llm = LLM(**OPTIONS, cache_type="radix", overlap_scheduling=on)
        outputs(llm, PROMPTS[:1], greedy(2))  # warm-up
        start = time.perf_counter()
        out = outputs(llm, PROMPTS, greedy(48))
        seconds = time.perf_counter() - start
        name = "overlap loop" if on else "normal loop"
        checks[f"the batch's tokens under the {name}"] = out
        speed[name] = sum(len(t) for t in out) / seconds
        rows[f"{name}: new tokens per second"] = f"{speed[name]:,.0f}"
    rows["overlap's gain"] = f"{speed['overlap loop'] / speed['normal loop']:.2f}x"


def part2() -> dict:
    start = time.perf_counter()
    rows: Dict[str, str] = {}
    checks: Dict[str, list] = {}
    for figures in (shared_prefix, chunked, overlap):
        figures(rows, checks)
    return {"rows": rows, "checks": checks, "seconds": time.perf_counter() - start}


WORKLOADS = {1: part1, 2: part2}


# ---------------------------------------------------------------------- part 3 (after chapter 15)

SERVER_ARGS = ("--device", "cpu", "--max-running-req", "8", "--max-seq-len", "256")
REPLY_S = 20.0  # one request; the reference answers in well under a second on a laptop
START_S = 120.0  # three processes each import torch: seconds on a loaded laptop
# the label of a learner's cell in a server's traceback (judge/sources.py names snippets so)
STANDIN = re.compile(r"LearnerCodeError: (ch\d\d\.\w+: .*)")
EXCEPTION_LINE = re.compile(r"^(\w+(?:Error|Exception|Exit)\b.*)$", re.MULTILINE)
LEARNER_LINE = re.compile(r'File "([^"]+ cell \d+ \((ch\d\d\.\w+)\))", line (\d+), in (\w+)')


def streamed(client, model: str, prompt: str, max_tokens: int) -> Tuple[str, float, int, str]:
    """(the text, seconds to the first chunk with text, the tokens the usage chunk counts, the
    finish reason) of one streamed completion."""
    sent = time.perf_counter()
    first, text, count, reason = None, [], 0, ""
    stream = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        piece = chunk.choices[0].text if chunk.choices else ""
        if piece and first is None:
            first = time.perf_counter() - sent
        text.append(piece)
        if chunk.choices and chunk.choices[0].finish_reason:
            reason = chunk.choices[0].finish_reason
        if chunk.usage is not None:
            count = chunk.usage.completion_tokens
    return "".join(text), first if first is not None else float("nan"), count, reason


def part3() -> dict:
    """Eight streamed completions at once through the server's three processes, then one chat."""
    import openai

    from minisgl.server.background import BackgroundServer

    began = time.perf_counter()
    server = BackgroundServer(*SERVER_ARGS, timeout=START_S, env={"OMP_NUM_THREADS": "1"})
    try:
        url = server.start()
        with open(_server_pids(), "a") as f:  # for the worker, if this process is killed
            f.write(f"{server.proc.pid}\n")
    except RuntimeError as e:
        raise RequestFailed(f"your server did not start{_learner_lines(str(e))}") from None
    try:
        started = time.perf_counter() - began
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=REPLY_S, max_retries=0)
        model = client.models.list().data[0].id
        streamed(client, model, PROMPTS[0], 2)  # warm-up: the first step pays for allocations
        start = time.perf_counter()
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            runs = list(pool.map(lambda p: streamed(client, model, p, 32), PROMPTS))
        seconds = time.perf_counter() - start
        chat = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Who art thou?"}],
            max_tokens=16,
            temperature=0,
        )
    except (openai.OpenAIError, OSError) as e:
        raise RequestFailed(
            f"a request to your server failed: {type(e).__name__}: {str(e)[:200]}"
            + _learner_lines("".join(server.log))
        ) from None
    finally:
        server.stop()
        kept = [pid for pid in started_servers() if pid != server.proc.pid]
        with open(_server_pids(), "w") as f:  # stopped: not the worker's to kill any more
            f.write("".join(f"{pid}\n" for pid in kept))
    ttft = sorted(r[1] for r in runs)
    new = sum(r[2] for r in runs)
    rows = {
        "server start (3 processes), seconds": f"{started:.1f}",
        "streamed requests at once": str(len(PROMPTS)),
        "time to first token, fastest / slowest": f"{ttft[0] * 1e3:.0f} / {ttft[-1] * 1e3:.0f} ms",
        "all eight done, seconds": f"{seconds:.2f}",
        "new tokens per second (all streams)": rate(new, seconds),
    }
    checks = {
        "the streamed completions' text": [r[0] for r in runs],
        "the streams' token counts and finish reasons": [[r[2], r[3]] for r in runs],
        "the chat reply's text and finish reason": [
            [chat.choices[0].message.content, chat.choices[0].finish_reason]
        ],
    }
    return {"rows": rows, "checks": checks, "seconds": time.perf_counter() - began}


def _server_pids() -> str:
    import tempfile

    return os.path.join(tempfile.gettempdir(), "milestone-servers.txt")


def started_servers() -> List[int]:
    """The servers part 3's runs in this folder started (each in a session of its own)."""
    try:
        with open(_server_pids()) as f:
            return [int(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _learner_lines(log: str) -> str:
    """What a server's log says of the learner's code, in the judge's words: a stand-in's
    "chNN.name: why" (code that could not be put in place), or the exception a learner's line
    raised, with that line ("chNN.name: raised ...; in your code: <cell>, line N, in <fn>")."""
    standin = STANDIN.findall(log)
    if standin:
        return f"; {standin[-1]}"
    found = list(LEARNER_LINE.finditer(log))
    if not found:
        tail = [line for line in log.strip().splitlines() if line.strip()][-1:]
        return f"; the server's log ends: {tail[0].strip()[:200]}" if tail else ""
    m = found[-1]
    raised = EXCEPTION_LINE.search(log, m.end())
    what = raised.group(1).strip()[:200] if raised else "an exception"
    label, exercise, line, fn = m.groups()
    return f"; {exercise}: raised {what} in the server; in your code: {label}, line {line}, in {fn}"


WORKLOADS[3] = part3


# ---------------------------------------------------------------------- part 4 (after chapter 21)

ARRIVE_EVERY = 3  # steps between two arrivals in the benchmark run


def benchmark(rows: Dict[str, str], checks: Dict[str, list]) -> None:
    """Chapter 21's measures, computed by its functions (yours, swapped in) on a run where the
    requests arrive one every few steps: TTFT and inter-token latencies from the engine's replies,
    throughput over the run's wall span, the first request a warm-up."""
    from minisgl.bench import stats

    llm = LLM(**OPTIONS, cache_type="radix")
    arrivals: Dict[int, List[Tuple[float, int]]] = {}
    uid_of: Dict[int, int] = {}

    def on_event(event) -> None:
        if event.kind == "send":
            for msg in event["msgs"]:
                arrivals.setdefault(msg.uid, []).append((event.time, int(msg.next_token >= 0)))

    llm.events.subscribe(on_event)
    sent: Dict[int, float] = {}
    waiting = list(enumerate(PROMPTS))
    turn = 0
    while waiting or llm.busy:
        if waiting and turn % ARRIVE_EVERY == 0:
            i, prompt = waiting.pop(0)
            sent[i] = time.perf_counter()
            uid_of[i] = llm.add_request(prompt, greedy(24))
        llm.step()
        turn += 1
    ttfts, itls, spans = [], [], []
    for i in sorted(sent):
        chunks = arrivals.get(uid_of[i], [])
        ttft, gaps = stats.stream_latencies(sent[i], chunks)
        ttfts.append(ttft)
        itls += gaps
        tokens = sum(n for _, n in chunks)
        spans.append((sent[i], max(t for t, n in chunks if n), tokens))
    for name, values in (("TTFT", ttfts), ("inter-token latency", itls)):
        p50, p99 = stats.percentile(values, 50), stats.percentile(values, 99)
        rows[f"bench: {name} p50 / p99"] = f"{p50 * 1000:.1f} / {p99 * 1000:.1f} ms"
    rows["bench: output tokens per second"] = f"{stats.output_throughput(spans, warmup=1):,.0f}"
    results = [llm.results.pop(uid_of[i]).token_ids for i in sorted(sent)]
    checks["the benchmark's tokens"] = results
    checks["the tokens each benchmarked request received"] = [s[2] for s in spans]


def speed(llm: LLM, n: int = 32) -> Tuple[List[List[int]], float]:
    outputs(llm, PROMPTS[:1], greedy(2))  # warm-up
    start = time.perf_counter()
    out = outputs(llm, PROMPTS, greedy(n))
    return out, sum(len(t) for t in out) / (time.perf_counter() - start)


def engines(rows: Dict[str, str], checks: Dict[str, list]) -> None:
    """One batch on one process, on two tensor-parallel ranks (chapter 16, gloo on the CPU) and
    replayed from emulated CUDA graphs (chapter 18)."""
    for name, options in (
        ("one rank", {}),
        ("2 tensor-parallel ranks", {"tp_size": 2}),
        ("emulated CUDA graphs", {"use_cuda_graph": True, "cuda_graph_max_bs": 8}),
    ):
        llm = LLM(**OPTIONS, **options)
        try:
            out, rate_ = speed(llm)
        finally:
            llm.shutdown()
        rows[f"{name}: new tokens per second"] = f"{rate_:,.0f}"
        checks[f"the batch's tokens, {name}"] = out


def part4() -> dict:
    start = time.perf_counter()
    rows: Dict[str, str] = {}
    checks: Dict[str, list] = {}
    for figures in (benchmark, engines):
        figures(rows, checks)
    return {"rows": rows, "checks": checks, "seconds": time.perf_counter() - start}


WORKLOADS[4] = part4
