"""A hybrid model (Gated DeltaNet layers, 3 of every 4) against an all-attention one of its size.

    python benchmarks/hybrid_bench.py             # a GPU: Qwen3-0.6B's shape, contexts 512 to 32k
    python benchmarks/hybrid_bench.py --quick     # a CPU smoke run: a small shape, contexts to 512
    python benchmarks/hybrid_bench.py --memory-only --device cpu   # the memory table (arithmetic)

The all-attention model has Qwen3-0.6B's shape (28 layers, hidden 1024, 16 query and 8 KV heads of
128, vocabulary 151,936, tied). The hybrid is Qwen3.5's architecture on the same shape: layers
4, 8, ... 28 gated full attention (RoPE on a quarter of each head), the other 21 Gated DeltaNet
(16 key and 16 value heads of 128, a 4-wide convolution). Both have random weights drawn on the
device (nothing is downloaded; only config.json is written).

What it prints:
* memory: a request's DeltaNet state (bytes, whatever its length) and each model's KV bytes per
  token, from the engine's own formulas (minisgl/engine/state.py, KVCache.bytes_per_page); how many
  requests of 1k, 8k and 32k tokens fit in `--budget-gib` (default 100 GiB: an H200's 141 GB less
  the weights and the activations' share), the state pool paid per request;
* decode step time (wall ms, overlap loop, CUDA graphs where the engine takes them) at batch
  `--batch` against the context length, for both models; on a GPU the hybrid twice, its DeltaNet
  layers' decode step in plain torch and in Triton (minisgl/kernel/triton_delta_rule.py), every
  other kernel the same, and the ratio; then one layer's decode step alone, both ways;
* the delta rule over one prompt (16 heads of 128, float32): the chunked form (prefill) against
  the token-by-token recurrence (decode's form), ms and their largest difference; on a GPU also
  the whole recurrence in one Triton launch (triton_delta_rule.delta_rule_fused_recurrent), the
  measure of whether prefill should use it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minisgl import SamplingParams  # noqa: E402
from minisgl.engine.config import EngineConfig  # noqa: E402
from minisgl.engine.state import state_pool_bytes  # noqa: E402
from minisgl.kernel.delta_rule import (  # noqa: E402
    delta_rule_chunked,
    delta_rule_recurrent,
    l2_normalize,
)
from minisgl.kvcache import KVCache  # noqa: E402
from minisgl.llm import LLM  # noqa: E402
from minisgl.models import ModelConfig, create_model  # noqa: E402

QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "dtype": "bfloat16",
}
SMALL = dict(
    QWEN3_06B,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=1024,
)


def hybrid_of(cfg: dict, linear_heads: int, linear_dim: int) -> dict:
    """Qwen3.5's architecture on `cfg`'s shape: every 4th layer full attention."""
    layers = cfg["num_hidden_layers"]
    return dict(
        cfg,
        architectures=["Qwen3_5ForCausalLM"],
        layer_types=[
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)
        ],
        linear_num_key_heads=linear_heads,
        linear_num_value_heads=linear_heads,
        linear_key_head_dim=linear_dim,
        linear_value_head_dim=linear_dim,
        linear_conv_kernel_dim=4,
        rope_parameters=dict(cfg["rope_parameters"], partial_rotary_factor=0.25),
    )


@contextmanager
def random_weights():
    """The engine's load_model replaced: random weights drawn on the device, no checkpoint."""

    def load_model(model_dir, dtype, device, max_positions=None, comm=None):
        cfg = ModelConfig.from_dir(model_dir)
        model = create_model(cfg, dtype, torch.device("meta"), max_positions)
        gen = torch.Generator(device=device).manual_seed(0)
        state = {}
        for key, t in model.named_tensors():
            w = torch.empty(t.shape, dtype=t.dtype, device=device)
            state[key] = w.fill_(1.0) if t.dim() == 1 else w.normal_(0, 0.02, generator=gen)
        model.load_state_dict(state)
        model.move_rotary(device)
        return model

    with mock.patch("minisgl.engine.engine.load_model", load_model):
        yield


def write_config(root: Path, name: str, cfg: dict) -> Path:
    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def params(cfg: ModelConfig) -> int:
    model = create_model(cfg, torch.bfloat16, torch.device("meta"), 16)
    return sum(t.numel() for _, t in model.named_tensors())


def memory(cfgs: dict, budget: int, contexts) -> None:
    print(f"memory (bf16, budget {budget / 2**30:.0f} GiB for KV and state):")
    for name, cfg in cfgs.items():
        engine = EngineConfig(model_path="-", max_running_req=1)
        state = state_pool_bytes(engine, cfg, torch.bfloat16) // 2  # one slot's row (of 2)
        kv = KVCache.bytes_per_page(
            cfg.num_kv_layers, 1, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16
        )
        fits = [budget // (state + ctx * kv) for ctx in contexts]
        print(
            f"  {name:>14}: {params(cfg) / 1e6:6.0f} M parameters, {cfg.num_kv_layers:>2} KV "
            f"layers, KV {kv / 1024:6.1f} KiB/token, state {state / 2**20:6.2f} MiB/request "
            f"(= {state / kv:6.0f} tokens of its KV)"
        )
        print(
            "                  requests that fit: "
            + ", ".join(f"{n:>7,} at {c // 1024}k" for n, c in zip(fits, contexts))
        )


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextmanager
def deltanet_decode(kernel: str):
    """The DeltaNet layers' decode step in Triton ("triton", where the engine's fused kernels
    apply: a GPU) or in plain torch ("torch"); every other fused kernel stays as the engine has it,
    so the two differ only in the DeltaNet decode step."""
    if kernel == "triton":
        yield
        return
    with mock.patch("minisgl.models.gated_deltanet.fused_for", lambda x: None):
        yield


def decode_ms(
    model_dir: Path, device: str, batch: int, ctx: int, steps: int, vocab: int, kernel="torch"
):
    """Wall ms of a decode step at batch `batch` after prompts of `ctx` tokens, the DeltaNet
    layers' decode step in `kernel` from start-up on (the graphs capture it)."""
    with deltanet_decode(kernel):
        return _decode_ms(model_dir, device, batch, ctx, steps, vocab)


def _decode_ms(model_dir: Path, device: str, batch: int, ctx: int, steps: int, vocab: int):
    options = dict(
        dtype=torch.bfloat16 if device.startswith("cuda") else torch.float32,
        device=device,
        cache_type="naive",
        max_running_req=batch,
        max_seq_len_override=ctx + steps + 16,
    )
    if not device.startswith("cuda"):
        options["num_page_override"] = batch * (ctx + steps + 16)
    with random_weights():
        llm = LLM(model_dir, **options)
    rng = random.Random(0)
    for _ in range(batch):
        prompt = [rng.randrange(vocab) for _ in range(ctx)]
        llm.add_request(prompt, SamplingParams(max_tokens=steps + 8, ignore_eos=True))
    first = llm._step
    while llm.prefill_manager.pending or llm._step < first + 3:  # the prefills, a few decodes
        llm.step()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        llm.step()
    sync(device)
    ms = (time.perf_counter() - t0) * 1000 / steps
    llm.shutdown()
    del llm
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return ms


def rule_ms(device: str, lengths, heads: int = 16, dim: int = 128) -> None:
    print(f"the delta rule over one prompt ({heads} heads of {dim}, float32):")
    for length in lengths:
        g = torch.Generator(device=device).manual_seed(0)

        def rand(*shape):
            return torch.randn(*shape, device=device, generator=g)

        q = l2_normalize(rand(1, length, heads, dim)) * dim**-0.5
        k = l2_normalize(rand(1, length, heads, dim))
        v = rand(1, length, heads, dim)
        decay = -torch.rand(1, length, heads, device=device, generator=g) * 0.1
        beta = torch.rand(1, length, heads, device=device, generator=g)
        state = torch.zeros(1, heads, dim, dim, device=device)
        times = {}
        outs = {}
        forms = [("chunked", delta_rule_chunked), ("recurrent", delta_rule_recurrent)]
        if device.startswith("cuda"):  # the whole recurrence in one Triton launch
            from minisgl.kernel.triton_delta_rule import delta_rule_fused_recurrent

            forms.append(("triton", delta_rule_fused_recurrent))
        for name, fn in forms:
            fn(q[:, :64], k[:, :64], v[:, :64], decay[:, :64], beta[:, :64], state)  # warm-up
            sync(device)
            t0 = time.perf_counter()
            outs[name] = fn(q, k, v, decay, beta, state)[0]
            sync(device)
            times[name] = (time.perf_counter() - t0) * 1000
        diff = (outs["chunked"] - outs["recurrent"]).abs().max().item()
        line = (
            f"  {length:>6} tokens: chunked {times['chunked']:9.1f} ms, token by token "
            f"{times['recurrent']:9.1f} ms ({times['recurrent'] / times['chunked']:5.1f}x), "
            f"max |diff| {diff:.1e}"
        )
        if "triton" in times:
            fused_diff = (outs["triton"] - outs["recurrent"]).abs().max().item()
            line += (
                f"; Triton fused recurrence {times['triton']:9.2f} ms (chunked / Triton "
                f"{times['chunked'] / times['triton']:5.2f}x), max |diff| {fused_diff:.1e}"
            )
        print(line)


def layer_step_us(device: str, heads: int, dim: int, batch: int, iters: int = 200) -> None:
    """One DeltaNet layer's decode step alone (bfloat16 inputs, float32 state, rows of a 64-row
    pool out of order): the torch path of GatedDeltaNet.forward (gather the rows, convolution,
    gates, recurrence, scatter) against the two Triton launches; eager and replayed from a CUDA
    graph (the engine's decode steps replay graphs), microseconds per step."""
    from minisgl.kernel.delta_rule import causal_conv1d_step
    from minisgl.kernel.triton_delta_rule import conv_step_, delta_rule_step_

    g = torch.Generator(device=device).manual_seed(0)
    key = heads * dim
    channels = 3 * key

    def rand(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, device=device, generator=g) * scale).to(dtype)

    x, a, b = rand(batch, channels), rand(batch, heads), rand(batch, heads)
    weight = rand(channels, 4, scale=0.5)
    a_log, dt_bias = rand(heads, dtype=torch.float32), rand(heads, dtype=torch.float32)
    conv = rand(64, channels, 3)
    rec = rand(64, heads, dim, dim, dtype=torch.float32, scale=0.1)
    rows = torch.randperm(64, device=device, generator=g)[:batch]

    def torch_step():
        windows, states = conv.index_select(0, rows), rec.index_select(0, rows)
        mixed, windows = causal_conv1d_step(x, windows, weight)
        q, k, v = mixed.float().split([key, key, key], dim=-1)
        q, k = (l2_normalize(t.reshape(batch, heads, dim)) for t in (q, k))
        gate = -a_log.exp() * F.softplus(a.float() + dt_bias)
        inputs = (q * dim**-0.5, k, v.reshape(batch, heads, dim), gate, b.sigmoid().float())
        out, states = delta_rule_recurrent(*(t.unsqueeze(1) for t in inputs), states)
        conv.index_copy_(0, rows, windows)
        rec.index_copy_(0, rows, states)
        return out[:, 0].to(x.dtype)

    def triton_step():
        mixed = conv_step_(x, conv, rows, weight)
        return delta_rule_step_(mixed, a, b, a_log, dt_bias, rec, rows, heads)

    saved = conv.clone(), rec.clone()
    outs = {}
    for name, fn in (("torch", torch_step), ("triton", triton_step)):
        conv.copy_(saved[0])
        rec.copy_(saved[1])
        outs[name] = fn().float()
    diff = (outs["torch"] - outs["triton"]).abs().max().item()
    print(
        f"one DeltaNet layer's decode step at batch {batch} ({heads} heads of {dim}; us per "
        f"step, {iters} steps; outputs differ by {diff:.1e} at most, bfloat16):"
    )
    for name, fn in (("torch", torch_step), ("triton", triton_step)):
        for _ in range(5):
            fn()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync(device)
        eager = (time.perf_counter() - t0) * 1e6 / iters
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # warm-up on the capturing stream
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            fn()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            graph.replay()
        sync(device)
        replayed = (time.perf_counter() - t0) * 1e6 / iters
        print(f"  {name:>6}: eager {eager:8.1f} us, from a CUDA graph {replayed:8.1f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small shape and short contexts")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--budget-gib", type=float, default=100.0)
    ap.add_argument("--memory-only", action="store_true", help="the memory table alone")
    args = ap.parse_args()
    base = SMALL if args.quick else QWEN3_06B
    linear = (4, 32) if args.quick else (16, 128)
    shapes = {"all-attention": base, "hybrid": hybrid_of(base, *linear)}
    contexts = (64, 128, 256, 512) if args.quick else (512, 2048, 8192, 32768)
    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, device {args.device}", end="")
    if args.device.startswith("cuda"):
        print(f" ({torch.cuda.get_device_name()})", end="")
    print(f", torch {torch.__version__}, {'quick' if args.quick else 'full'} run")

    with tempfile.TemporaryDirectory() as tmp:
        dirs = {n: write_config(Path(tmp), n, c) for n, c in shapes.items()}
        cfgs = {n: ModelConfig.from_dir(d) for n, d in dirs.items()}
        memory(cfgs, int(args.budget_gib * 2**30), (1024, 8192, 32768))
        if args.memory_only:
            return
        # the DeltaNet decode step in Triton needs the engine's fused kernels: a GPU
        kernels = ("torch", "triton") if args.device.startswith("cuda") else ("torch",)
        print(
            f"decode step at batch {args.batch} (wall ms, {args.steps} steps; the hybrid's "
            f"DeltaNet decode in {' and in '.join(kernels)}):"
        )
        for ctx in contexts:
            run = lambda name, kernel: decode_ms(  # noqa: E731
                dirs[name], args.device, args.batch, ctx, args.steps, base["vocab_size"], kernel
            )
            full = run("all-attention", "torch")  # no DeltaNet layer: the kernel changes nothing
            hybrid = {k: run("hybrid", k) for k in kernels}
            cells = [f"all-attention {full:8.2f} ms"]
            cells += [f"hybrid ({k}) {ms:8.2f} ms ({ms / full:.2f}x)" for k, ms in hybrid.items()]
            if len(hybrid) == 2:
                cells.append(f"torch / triton {hybrid['torch'] / hybrid['triton']:.2f}")
            print(f"  context {ctx:>6}: " + ", ".join(cells))
        if args.device.startswith("cuda"):
            layer_step_us(args.device, *linear, args.batch)
    rule_ms(args.device, (256, 1024) if args.quick else (512, 2048, 8192))


if __name__ == "__main__":
    main()
