"""Overlap scheduling, CUDA graphs and the decode kernel, measured on one GPU.

    python benchmarks/overlap_ablation.py            # Qwen3-0.6B shape, dummy bf16 weights
    python benchmarks/overlap_ablation.py --quick    # a smaller workload, for a smoke test

What it prints, in one run:
* offline throughput of upstream mini-sglang's benchmark workload (256 requests, input and output
  lengths uniform in [100, 1024], fixed seed, ignore_eos, greedy) with overlap on and off;
* decode step time at batch 1 and 64 with CUDA graphs on and off: wall time per step of the
  scheduler loop, and GPU time per step (CUDA events on the engine stream);
* how busy the GPU is: the engine stream's time inside steps over the wall time of the whole run
  (events), and over a profiled window the union of all kernels' time (torch profiler);
* transformers `generate` on the same weights: batch 1 and 64, 128 new tokens.

The model has the shape of Qwen3-0.6B (28 layers, hidden 1024, 16 heads, 8 KV heads, head_dim
128, intermediate 3072, vocabulary 151,936, tied embeddings) with random bf16 weights, written as a
Hugging Face checkpoint to a temporary directory, so no download is needed.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minisgl.core import SamplingParams, set_global_ctx  # noqa: E402
from minisgl.env import ENV  # noqa: E402
from minisgl.llm import LLM  # noqa: E402

QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "dtype": "bfloat16",
    "torch_dtype": "bfloat16",
    "use_cache": True,
}


class TimedLLM(LLM):
    """Records a pair of CUDA events on the engine stream around every step it launches."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.spans: List[Tuple[torch.cuda.Event, torch.cuda.Event, str, int]] = []
        self.launched_at: List[float] = []  # host clock at each launch

    def _forward(self, forward_input):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.launched_at.append(time.perf_counter())
        start.record(self.engine.stream.raw)
        out = super()._forward(forward_input)
        end.record(self.engine.stream.raw)
        batch = forward_input.batch
        self.spans.append((start, end, batch.phase, batch.size))
        return out

    def clear(self) -> None:
        self.spans.clear()
        self.launched_at.clear()

    def gpu_ms(self, phase: str | None = None) -> List[float]:
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e, p, _ in self.spans if phase is None or p == phase]


def make_dummy_model(path: Path):
    """Write config.json + random bf16 safetensors of the Qwen3-0.6B shape; return the HF model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(QWEN3_06B, indent=1))
    cfg = AutoConfig.from_pretrained(path)
    torch.manual_seed(0)
    with torch.device("cuda"):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        except TypeError:  # a transformers that does not take dtype here
            model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    model.eval()
    model.save_pretrained(path)
    return model


def workload(n: int, lo: int, hi: int, vocab: int, seed: int = 0):
    """Upstream's offline benchmark: n requests, input and output lengths uniform in [lo, hi]."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
    params = [SamplingParams(max_tokens=rng.randint(lo, hi), ignore_eos=True) for _ in range(n)]
    return prompts, params


def build(
    model_dir: Path, max_running_req: int, graphs: bool, max_tokens_per_req: int, num_tokens: int
) -> TimedLLM:
    """Naive cache: the same prompts run more than once, and a prefix-cache hit would flatter
    whichever run comes second."""
    return TimedLLM(
        model_dir,
        dtype=torch.bfloat16,
        device="cuda",
        max_running_req=max_running_req,
        use_cuda_graph=graphs,
        cuda_graph_max_bs=max_running_req,
        cache_type="naive",
        max_seq_len_override=max_tokens_per_req,
        num_page_override=num_tokens,
    )


def release(llm) -> None:
    llm.shutdown()
    set_global_ctx(None)
    del llm
    gc.collect()
    torch.cuda.empty_cache()


def warm_up(llm: LLM, vocab: int, n: int = 64) -> None:
    """Every batch size from n down to 1 once: compiles each kernel variant, settles cuBLAS."""
    rng = random.Random(1)
    prompts = [[rng.randrange(vocab) for _ in range(32)] for _ in range(n)]
    llm.generate(
        prompts,
        [SamplingParams(max_tokens=i + 1, ignore_eos=True) for i in range(n)],
        progress=False,
    )
    llm.clear()


def run_workload(llm: TimedLLM, prompts, params) -> Dict[str, float]:
    torch.cuda.synchronize()
    llm.clear()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, progress=False)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    assert all(len(o["token_ids"]) == p.max_tokens for o, p in zip(outs, params))
    out_tokens = sum(p.max_tokens for p in params)
    gpu = llm.gpu_ms()
    busy = sum(gpu) / 1000
    # each step's share of the wall time: from its launch to the next one's (the last: to the end)
    ends = llm.launched_at[1:] + [t0 + wall]
    phases = {}
    for (_, _, phase, _), begin, end, ms in zip(llm.spans, llm.launched_at, ends, gpu):
        ph = phases.setdefault(phase, dict(steps=0, wall_s=0.0, gpu_s=0.0))
        ph["steps"] += 1
        ph["wall_s"] += end - begin
        ph["gpu_s"] += ms / 1000
    return dict(
        wall_s=wall,
        out_tok_s=out_tokens / wall,
        total_tok_s=(out_tokens + sum(map(len, prompts))) / wall,
        steps=len(llm.spans),
        gpu_busy=busy / wall,
        phases=phases,
    )


def kernel_union_busy(prof) -> Tuple[float, float, List[Tuple[str, float]]]:
    """From a profiler trace: (union of GPU activity / window, window ms, top kernels by time)."""
    spans, by_name = [], {}
    for ev in prof.events():
        if (
            ev.device_type == torch.autograd.DeviceType.CUDA
            and ev.time_range.end > ev.time_range.start
        ):
            spans.append((ev.time_range.start, ev.time_range.end))
            by_name[ev.name] = by_name.get(ev.name, 0.0) + (ev.time_range.end - ev.time_range.start)
    if not spans:  # no device events in this torch's trace: fall back to the kernels' total time
        avg = prof.key_averages()
        total = sum(getattr(e, "self_device_time_total", 0.0) for e in avg)
        top = sorted(
            ((e.key, getattr(e, "self_device_time_total", 0.0) / 1000) for e in avg),
            key=lambda x: -x[1],
        )
        return float("nan"), total / 1000, top[:8]
    spans.sort()
    busy, cur_s, cur_e = 0.0, spans[0][0], spans[0][1]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    window = spans[-1][1] - spans[0][0]
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:8]
    return busy / window, window / 1000, [(n, t / 1000) for n, t in top]


def profile_window(llm: TimedLLM, prompts, params, skip: int, steps: int):
    """Run a workload, profiling `steps` loop iterations after the first `skip`."""
    from torch.profiler import ProfilerActivity, profile

    for p, sp in zip(prompts, params):
        llm.add_request(p, sp)
    prof = profile(activities=[ProfilerActivity.CUDA])
    i = 0
    while llm.busy:
        if i == skip:
            torch.cuda.synchronize()
            prof.start()
        llm.step()
        i += 1
        if i == skip + steps:
            torch.cuda.synchronize()
            prof.stop()
    llm.results.clear()
    return kernel_union_busy(prof)


def decode_step_times(
    llm: TimedLLM, vocab: int, batch: int, prompt_len: int, steps: int, profile_steps: int = 0
):
    """Wall and GPU ms per decode step at a fixed batch size (overlap loop); with `profile_steps`,
    also where a step's GPU time goes (printed, and returned under "kernels", "busy", "top")."""
    rng = random.Random(2)
    for _ in range(batch):
        llm.add_request(
            [rng.randrange(vocab) for _ in range(prompt_len)],
            SamplingParams(max_tokens=steps + profile_steps + 8, ignore_eos=True),
        )
    first = llm._step
    while llm.prefill_manager.pending or llm._step < first + 4:  # the prefills, then a few decodes
        llm.step()
    torch.cuda.synchronize()
    llm.clear()
    t0 = time.perf_counter()
    for _ in range(steps):
        llm.step()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1000 / steps
    gpu = [
        t
        for t, (_, _, phase, size) in zip(llm.gpu_ms(), llm.spans)
        if phase == "decode" and size == batch
    ]
    if profile_steps:  # where a step's GPU time goes
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(profile_steps):
                llm.step()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        frac, window_ms, top = kernel_union_busy(prof)
        print(
            f"    profile of {profile_steps} steps at batch {batch}: "
            f"{len(kernels) / profile_steps:.0f} kernels "
            f"a step, GPU busy {100 * frac:.1f}% of {window_ms:.2f} ms"
        )
        for name, ms in top[:6]:
            print(f"    {ms / profile_steps * 1000:8.1f} us/step  {name[:90]}")
        prof_info = dict(
            kernels=len(kernels) / profile_steps,
            busy=frac,
            top=[(name, ms / profile_steps * 1000) for name, ms in top],
        )
    llm.run_until_idle()
    llm.results.clear()
    times = dict(wall_ms=wall_ms, gpu_ms=statistics.median(gpu))
    return {**times, **prof_info} if profile_steps else times


def hf_generate_tok_s(model, vocab: int, batch: int, prompt_len: int, new_tokens: int) -> float:
    rng = random.Random(3)
    ids = torch.tensor(
        [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(batch)], device="cuda"
    )
    kw = dict(
        attention_mask=torch.ones_like(ids),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    with torch.no_grad():
        # warm-up
        model.generate(
            ids[:, :16],
            **{
                **kw,
                "max_new_tokens": 4,
                "min_new_tokens": 4,
                "attention_mask": torch.ones_like(ids[:, :16]),
            },
        )
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, **kw)
        torch.cuda.synchronize()
    assert out.shape[1] == prompt_len + new_tokens
    return batch * new_tokens / (time.perf_counter() - t0)


def engine_generate_tok_s(
    llm: LLM, vocab: int, batch: int, prompt_len: int, new_tokens: int
) -> float:
    rng = random.Random(3)
    prompts = [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(batch)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=new_tokens, ignore_eos=True), progress=False)
    torch.cuda.synchronize()
    return batch * new_tokens / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="64 requests of 100-256 tokens (smoke test)"
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit(
            "benchmarks/overlap_ablation.py measures a GPU: it needs a CUDA GPU (and Triton); "
            "on a CPU, benchmarks/throughput.py compares the loops"
        )
    n, lo, hi = (64, 100, 256) if args.quick else (256, 100, 1024)
    vocab = QWEN3_06B["vocab_size"]
    res: Dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }
    tmp = Path(tempfile.mkdtemp(prefix="qwen3-0.6b-dummy-"))
    t = time.perf_counter()
    hf = make_dummy_model(tmp)
    print(f"dummy Qwen3-0.6B written to {tmp} in {time.perf_counter() - t:.1f}s", flush=True)

    # --- transformers generate (same weights), then free it
    res["hf_tok_s"] = {}
    for bs in (1, 64):
        res["hf_tok_s"][bs] = hf_generate_tok_s(hf, vocab, bs, 256, 128)
        print(f"transformers generate  batch {bs:3d}: {res['hf_tok_s'][bs]:9.1f} tok/s", flush=True)
    del hf
    gc.collect()
    torch.cuda.empty_cache()

    # --- the offline workload, overlap on and off (one engine, CUDA graphs on)
    prompts, params = workload(n, lo, hi, vocab)
    seq = 2 * hi + 64
    llm = build(tmp, n, True, seq, n * seq + 4096)
    warm_up(llm, vocab)
    res["engine_tok_s"] = {bs: engine_generate_tok_s(llm, vocab, bs, 256, 128) for bs in (1, 64)}
    for bs in (1, 64):
        ratio = res["engine_tok_s"][bs] / res["hf_tok_s"][bs]
        print(
            f"engine generate        batch {bs:3d}: {res['engine_tok_s'][bs]:9.1f} tok/s  "
            f"({ratio:.1f}x transformers)",
            flush=True,
        )
    res["workload"] = {}
    for overlap in (True, False):
        ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
        r = run_workload(llm, prompts, params)
        res["workload"]["on" if overlap else "off"] = r
        print(
            f"overlap {'on ' if overlap else 'off'}: {r['wall_s']:6.2f}s  "
            f"{r['out_tok_s']:8.0f} output tok/s  "
            f"{r['total_tok_s']:8.0f} total tok/s  {r['steps']} steps  GPU busy (events) "
            f"{100 * r['gpu_busy']:.1f}%",
            flush=True,
        )
        print(
            "    "
            + ";  ".join(
                f"{name}: {ph['steps']} steps, {ph['wall_s']:.2f} s wall, {ph['gpu_s']:.2f} s "
                "in steps "
                f"on the engine stream"
                for name, ph in r["phases"].items()
            ),
            flush=True,
        )
    on, off = res["workload"]["on"], res["workload"]["off"]
    res["overlap_speedup"] = on["out_tok_s"] / off["out_tok_s"]
    print(f"overlap speed-up: {res['overlap_speedup']:.2f}x", flush=True)

    res["profile"] = {}
    for overlap in (True, False):  # steps 40-70 of the workload: all 256 requests decoding
        ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
        frac, window_ms, top = profile_window(llm, prompts, params, skip=40, steps=30)
        key = "on" if overlap else "off"
        res["profile"][key] = dict(busy=frac, window_ms=window_ms, top=top)
        print(
            f"profiled 30 decode-heavy steps, overlap {key}: GPU busy (kernel union) "
            f"{100 * frac:.1f}% "
            f"of {window_ms:.1f} ms",
            flush=True,
        )
        for name, ms in top:
            print(f"    {ms:8.2f} ms  {name[:100]}")
    ENV.DISABLE_OVERLAP_SCHEDULING.value = False
    release(llm)

    # --- decode step time at batch 1 and 64, graphs on and off
    res["decode_step"] = {}
    for graphs in (True, False):
        llm = build(tmp, 64, graphs, 1024, 64 * 1024 + 4096)
        warm_up(llm, vocab)
        for bs in (1, 64):
            step = decode_step_times(llm, vocab, bs, 512, 64, profile_steps=10 if graphs else 0)
            wall_ms, gpu_ms = step["wall_ms"], step["gpu_ms"]
            res["decode_step"][f"graphs={'on' if graphs else 'off'},bs={bs}"] = dict(
                wall_ms=wall_ms, gpu_ms=gpu_ms
            )
            print(
                f"decode step, batch {bs:2d}, graphs {'on ' if graphs else 'off'}: "
                f"{wall_ms:7.3f} ms wall/step "
                f"(overlap loop), {gpu_ms:7.3f} ms GPU/step",
                flush=True,
            )
        release(llm)

    if args.out is not None:
        args.out.write_text(json.dumps(res, indent=1, default=str))
        print(f"results written to {args.out}")


if __name__ == "__main__":
    main()
