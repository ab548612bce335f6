#!/usr/bin/env bash
# Everything chapter 11 needs from a GPU machine, in one go (run from the repository root):
#   bash benchmarks/gpu_check.sh [tests] [edges] [bench] [serve] [suite] | all   -> logs under $OUT (default ./gpu_out)
# The server's packages (fastapi, uvicorn, pyzmq, openai, ...) must be importable: on a machine without
# network, install wheels downloaded elsewhere first (pip install --no-index --find-links DIR ...).
# suite = the whole test suite and the judge's self-check side by side, then the ch11 judge, all on cuda.
# A call of the device tool runs 10 minutes at most: run `tests suite`, `bench` and `serve` as three calls.
# Chapter 20 (Qwen3-MoE): `moe` = the MoE tests and the ch20 judge on cuda; `moebench` =
# benchmarks/moe_bench.py (Qwen3-30B-A3B's shape, random bf16 weights): one call each, not in `all`.
# Tensor parallelism: `tp` = tests/test_tp.py on cuda (with one GPU: CPU ranks, tp_size=1 on NCCL, two
# ranks sharing the GPU over gloo) and, with 2+ GPUs, TP=2 on NCCL against TP=1 on cuda; not in `all`.
# Chapter 23 (scheduling under load): `sched` = the scheduling tests on cuda, then
# benchmarks/sched_load.py --gpu (the ablation on upstream's burst, the ablation on the tenants'
# shared prefixes, then ITL mixed vs unmixed, reserve-all vs optimistic, FCFS vs lpm; Qwen3-0.6B's
# shape, dummy bf16 weights), 8 minutes at most (time limits 110 + 220 + 90 + 60 s, each settable:
# SCHED_*_TIMEOUT): one call, not in `all`.
# Chapter 25 (routers): `router` = benchmarks/router.py --device cuda: 2 workers sharing the GPU,
# round-robin vs minisgl's cache-aware router vs sglang-router (if installed) on the multi-tenant
# workload, 6 minutes at most (ROUTER_TIMEOUT): one call, not in `all`.
# Speculative decoding (issue 47): `spec` = tests/test_speculative.py on cuda (torture aside), then
# benchmarks/spec_bench.py --gpu (a verify step of k+1 tokens against a decode step, batch 1..64,
# Qwen3-0.6B's shape, dummy bf16 weights) and the bundled model's acceptance and batch-1 tokens/s
# on cuda; 8 minutes at most (SPEC_*_TIMEOUT: 200 + 200 + 80 s): one call, not in `all`.
# Each part has its own time limit, so one that hangs does not take the others down.
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
what=" ${*:-all} "
want() { [[ $what == *" $1 "* || $what == *" all "* ]]; }
py=python3
part() { echo; echo "=== $1 ($(date +%T))"; }

part "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
$py -c "import torch, triton, transformers, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"

if want tests; then
  part "Triton prefill and decode kernels vs plain attention"
  if ! timeout 120 $py -m pytest -q --device cuda tests/test_ch11_gpu.py -k "triton_decode or triton_prefill" 2>&1 | tee "$OUT/kernel.txt"; then
    echo "!!! a Triton attention kernel failed: the rest runs with MINISGL_ATTENTION_BACKEND=torch (no CUDA graphs)"
    export MINISGL_ATTENTION_BACKEND=torch
  fi
  part "fused element-wise kernels vs the torch ops"
  if ! timeout 120 $py -m pytest -q --device cuda tests/test_ch11_gpu.py -k fused_elementwise 2>&1 | tee "$OUT/fused.txt"; then
    echo "!!! a fused kernel failed: the rest runs with MINISGL_FUSED_KERNELS=0"
    export MINISGL_FUSED_KERNELS=0
  fi
  part "GPU tests (tests/test_ch11_gpu.py)"
  timeout 200 $py -m pytest -q -rfE --device cuda tests/test_ch11_gpu.py -k "not triton_decode and not triton_prefill and not fused_elementwise" 2>&1 | tee "$OUT/gpu_tests.txt"
fi
if want edges; then
  part "engine edges on cuda: context length, threads, interrupted generate, Mistral (issue 29)"
  timeout 300 $py -m pytest -q -rfE --device cuda tests/test_context_length.py tests/test_llm_threads.py \
    tests/test_interrupted_generate.py tests/test_checkpoints.py 2>&1 | tee "$OUT/edges.txt"
fi
if want bench; then
  part "ablation benchmark"
  timeout ${BENCH_TIMEOUT:-300} $py benchmarks/overlap_ablation.py ${BENCH_ARGS:-} --out "$OUT/ablation.json" 2>&1 | tee "$OUT/ablation.txt"
  part "minisgl vs transformers' generate (bundled model; each figure a fresh process, default threads)"
  timeout 300 $py benchmarks/throughput.py --device cuda --no-busy --repeat 2 2>&1 | tee "$OUT/throughput.txt"
  part "the decode step against the memory floor, programmatic dependent launch on and off, twice"
  timeout 300 $py benchmarks/decode_step.py --repeat 2 --out "$OUT/decode_step.json" 2>&1 | tee "$OUT/decode_step.txt"
  part "decode kernels alone"
  timeout 120 $py benchmarks/decode_kernels.py --quick 2>&1 | tee "$OUT/decode_kernels.txt"
fi
if want serve; then
  part "serving: the OpenAI-compatible server under load vs the offline LLM (Qwen3-0.6B's shape, dummy weights)"
  timeout ${SERVE_TIMEOUT:-400} $py benchmarks/bench_serve.py --dummy-qwen3-0.6b --device cuda --dtype bfloat16 \
    --max-running-req 64 --num-requests 256 --rates 4,16,64,inf ${SERVE_ARGS:-} \
    --out "$OUT/bench_serve.json" 2>&1 | tee "$OUT/bench_serve.txt"
fi
if [[ $what == *" tp "* ]]; then
  part "tensor parallelism: tests/test_tp.py with --device cuda (one GPU: its ranks on the CPU over gloo, the TP path at tp_size=1 on NCCL, two ranks sharing cuda:0 over gloo), then TP=2 on NCCL if there are 2 GPUs"
  timeout 200 $py -m pytest -q -rfE --device cuda tests/test_tp.py 2>&1 | tee "$OUT/tp_tests.txt"
  timeout 200 $py -c "
import torch; from minisgl import LLM, SamplingParams
p = SamplingParams(max_tokens=32, ignore_eos=True, temperature=0); prompts = ['ROMEO:\n', 'KING HENRY:\n']
want = [o['token_ids'] for o in LLM(device='cuda').generate(prompts, p)]
if torch.cuda.device_count() < 2: print('one GPU: TP=2 on NCCL needs two (tp_size=1 on cuda above)'); raise SystemExit
llm = LLM(tp_size=2, device='cuda'); got = [o['token_ids'] for o in llm.generate(prompts, p)]; llm.shutdown()
print('TP=2 on NCCL equals TP=1:', got == want)" 2>&1 | tee "$OUT/tp_nccl.txt"
fi
if [[ $what == *" moe "* ]]; then
  part "Qwen3-MoE: the fused MoE kernel against the torch path, MoE checkpoints in every mode, on cuda"
  timeout 300 $py -m pytest -q -rfE --device cuda tests/test_moe_kernel.py tests/test_moe.py \
    tests/test_ch20_moe.py tests/test_checkpoints.py -k "moe" 2>&1 | tee "$OUT/moe_tests.txt"
  part "judge ch20 on cuda"
  timeout 200 $py judge.py ch20 --solution --device cuda 2>&1 | tail -20 | tee "$OUT/moe_judge.txt"
  timeout 200 $py judge.py --selfcheck ch20 --device cuda 2>&1 | tail -12 | tee "$OUT/moe_selfcheck.txt"
fi
if [[ $what == *" moebench "* ]]; then
  part "Qwen3-MoE benchmark: fused kernel vs torch path (Qwen3-30B-A3B's shape, random bf16 weights)"
  timeout ${MOE_TIMEOUT:-560} $py benchmarks/moe_bench.py ${MOE_ARGS:-} --out "$OUT/moe_bench.json" \
    2>&1 | tee "$OUT/moe_bench.txt"
fi
if [[ $what == *" sched "* ]]; then
  part "scheduling under load: lpm, retraction, mixed batches on cuda (tests/test_sched_load.py)"
  timeout ${SCHED_TESTS_TIMEOUT:-110} $py -m pytest -q -rfE --device cuda tests/test_sched_load.py \
    tests/test_ch23_order.py tests/test_mixed_handling.py -k "not torture" \
    2>&1 | tee "$OUT/sched_tests.txt"
  # each workload of the ablation has its own limit: the burst's 7 configurations take most of it
  part "scheduling under load: the ablation on upstream's burst (benchmarks/sched_load.py --gpu: Qwen3-0.6B's shape, dummy weights)"
  timeout ${SCHED_ABLATION_TIMEOUT:-220} $py benchmarks/sched_load.py --gpu --parts ablation \
    --workloads upstream --out "$OUT/sched_ablation.json" 2>&1 | tee "$OUT/sched_ablation.txt"
  part "scheduling under load: the ablation on the tenants' shared prefixes"
  timeout ${SCHED_TENANTS_TIMEOUT:-90} $py benchmarks/sched_load.py --gpu --parts ablation \
    --workloads tenants --out "$OUT/sched_ablation_tenants.json" 2>&1 | tee "$OUT/sched_ablation_tenants.txt"
  part "scheduling under load: ITL mixed vs unmixed, reserve-all vs optimistic, FCFS vs lpm"
  timeout ${SCHED_TIMEOUT:-60} $py benchmarks/sched_load.py --gpu --parts itl,admission,prefix \
    --out "$OUT/sched_load.json" 2>&1 | tee "$OUT/sched_load.txt"
fi
if [[ $what == *" router "* ]]; then
  part "routers: 2 workers sharing the GPU, round-robin vs cache-aware vs sglang-router (benchmarks/router.py)"
  timeout ${ROUTER_TIMEOUT:-360} $py benchmarks/router.py --device cuda --workers 2 ${ROUTER_ARGS:---requests 240 --rate 16} \
    2>&1 | tee "$OUT/router.txt"
fi
if [[ $what == *" spec "* ]]; then
  part "speculative decoding on cuda (tests/test_speculative.py, torture aside)"
  timeout ${SPEC_TESTS_TIMEOUT:-200} $py -m pytest -q -rfE --device cuda tests/test_speculative.py -k "not torture" \
    2>&1 | tee "$OUT/spec_tests.txt"
  part "speculative decoding: verify step vs decode step (benchmarks/spec_bench.py --gpu)"
  timeout ${SPEC_GPU_TIMEOUT:-200} $py benchmarks/spec_bench.py --gpu --steps 10 2>&1 | tee "$OUT/spec_gpu.txt"
  part "speculative decoding: bundled model on cuda, acceptance and batch-1 tokens/s"
  timeout ${SPEC_BUNDLED_TIMEOUT:-80} $py benchmarks/spec_bench.py --device cuda --new-tokens 48 --repeat 2 \
    2>&1 | tee "$OUT/spec_bundled.txt"
fi
if want suite; then
  part "whole suite and the judge's self-check on cuda, side by side"
  # Several test processes share the GPU here, as they share a laptop's cores: that load once
  # exposed a stream race that one process alone never hit.
  timeout ${SUITE_TIMEOUT:-400} $py -m pytest -q -rfE --device cuda --timeout 120 -n ${SUITE_WORKERS:-8} -p no:cacheprovider \
    tests --ignore=tests/torture \
    > "$OUT/suite_full.txt" 2>&1 &
  timeout ${SELFCHECK_TIMEOUT:-400} $py judge.py --selfcheck --device cuda --workers ${SELFCHECK_WORKERS:-6} \
    > "$OUT/selfcheck_full.txt" 2>&1 &
  wait
  tail -40 "$OUT/suite_full.txt" | tee "$OUT/suite.txt"
  grep -v "^ok " "$OUT/selfcheck_full.txt" | tail -60 | tee "$OUT/selfcheck.txt"
  part "judge ch11 on cuda"
  timeout 120 $py judge.py ch11 --solution --device cuda 2>&1 | tail -40 | tee "$OUT/judge.txt"
fi
