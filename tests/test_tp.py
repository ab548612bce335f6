"""Tensor parallelism: LLM(model, tp_size=N), N processes on torch.distributed (gloo on a CPU).

- TP=2 and TP=4 give TP=1's greedy tokens, and transformers', on the bundled model (8 heads, 4 KV
  heads), overlap on and off, and on checkpoint rows with one KV head (fewer than the ranks: each
  is replicated) and a vocabulary of 257 (no rank count divides it: padded);
- each forward makes 2 * layers + 1 all-reduces and 1 all-gather; rank 0 holds its share of each
  weight; the sharded read puts the whole tensor back together;
- a tp_size that does not divide the heads is refused at LLM() naming the field; a rank killed or
  raising gives the caller a RankFailure naming it within seconds and leaves no process; shutdown()
  ends every rank; every rank runs MINISGL_SERVER_INIT first (the judge's swap reaches it so).

The engines are shared (one at a time: one tensor-parallel group per process), so the file runs in
well under a minute on two cores.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
import torch

from checkpoints import checkpoint
from helpers import (
    MODEL,
    assert_tokens_equal,
    build_llm,
    greedy,
    hf_greedy,
    prompt_ids,
    test_device,
)
from minisgl.distributed.ranks import RankFailure
from minisgl.env import ENV
from minisgl.models import ModelConfig
from minisgl.models.sharding import Shard, rank_config, vocab_rows

NEW_TOKENS = 12
_shared: dict = {}


def rank_device(tp_size: int) -> str:
    """cuda with one GPU per rank where the machine has them (NCCL), else the CPU (gloo): on one
    GPU, several ranks check the sharding on the CPU."""
    if test_device() == "cuda" and torch.cuda.device_count() >= tp_size:
        return "cuda"
    return "cpu"


def shared_llm(tp_size: int):
    """The engine of `tp_size` ranks the tests share (another one is shut down first)."""
    if tp_size not in _shared:
        close_shared()
        _shared[tp_size] = build_llm(
            tp_size=tp_size, overlap_scheduling=None, device=rank_device(tp_size)
        )
    return _shared[tp_size]


def close_shared() -> None:
    for llm in _shared.values():
        llm.shutdown()
    _shared.clear()


@pytest.fixture(scope="module", autouse=True)
def _shut_down_at_end():
    yield
    close_shared()


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"tp{n}")
def tp_llm(request):
    """A shared engine of 2, then of 4 ranks (pytest groups the tests by it)."""
    return shared_llm(request.param)


@pytest.fixture(scope="module")
def tp1_tokens():
    llm = build_llm(device=rank_device(2))
    out = [o["token_ids"] for o in llm.generate(prompt_ids(), greedy(NEW_TOKENS))]
    llm.shutdown()
    return out


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, ended but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True  # no /proc (macOS): the signal said it exists


# ---------------------------------------------------------------- the same tokens


def test_greedy_tokens_equal_tp1_and_transformers(tp_llm, tp1_tokens):
    llm, tp_size = tp_llm, tp_llm.tp_size
    want = hf_greedy(prompt_ids(), NEW_TOKENS)
    assert_tokens_equal(tp1_tokens, want, "TP=1 against transformers")
    for overlap in (True, False):  # the radix cache is warm on the second run
        ENV.DISABLE_OVERLAP_SCHEDULING.value = not overlap
        got = [o["token_ids"] for o in llm.generate(prompt_ids(), greedy(NEW_TOKENS))]
        assert_tokens_equal(got, tp1_tokens, f"TP={tp_size}, overlap {overlap}")


def test_sampled_tokens_equal_tp1_with_the_same_seed(tp_llm):
    # the only sampling run of the shared engines: their generators are still at the seed (0)
    from minisgl import SamplingParams

    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, top_p=0.9, ignore_eos=True)
    one = build_llm(seed=0, device=rank_device(tp_llm.tp_size))  # sampling differs by device
    want = [o["token_ids"] for o in one.generate(prompt_ids(), params)]
    got = [o["token_ids"] for o in tp_llm.generate(prompt_ids(), params)]
    assert_tokens_equal(got, want, f"TP={tp_llm.tp_size} sampled, seed 0")


def test_per_request_seeds_stops_and_logprobs_equal_tp1(tp_llm):
    """A request's own seed draws the same tokens on every rank (else the ranks' next inputs would
    differ and the output would be garbage), as TP=1 draws them; stops end it on every rank; the
    logprobs come from the gathered logits."""
    from minisgl import SamplingParams

    seeded = SamplingParams(max_tokens=NEW_TOKENS, temperature=1.0, seed=1234, ignore_eos=True)
    scored = SamplingParams(max_tokens=2, prompt_logprobs=True, logprobs=2, ignore_eos=True)
    one = build_llm(device=rank_device(tp_llm.tp_size))
    prompts = prompt_ids()
    want = one.generate(prompts[:2], [seeded, scored])
    stop = one.decode(want[0]["token_ids"])[4:6]
    want_stop = one.generate(prompts[0], SamplingParams(max_tokens=NEW_TOKENS, stop=stop))
    one.shutdown()
    got = tp_llm.generate(prompts[:2], [seeded, scored])
    assert got[0]["token_ids"] == want[0]["token_ids"], f"TP={tp_llm.tp_size} seeded"
    for a, b in zip(got[1]["prompt_logprobs"][1:], want[1]["prompt_logprobs"][1:]):
        assert abs(a["logprob"] - b["logprob"]) < 1e-4
        assert [i for i, _ in a["top_logprobs"]] == [i for i, _ in b["top_logprobs"]]
    got_stop = tp_llm.generate(prompts[0], SamplingParams(max_tokens=NEW_TOKENS, stop=stop))
    assert got_stop == want_stop


@pytest.mark.parametrize("name", ["qwen3-head32-kv1-bias", "qwen3-vocab257-untied"])
def test_checkpoint_rows_with_fewer_kv_heads_than_ranks_or_an_odd_vocabulary(name):
    close_shared()
    ckpt = checkpoint(name)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 256, (24,), generator=g).tolist()
    prompts = [ids[:5], ids[5:24], ids[5:17] + ids[:3]]
    want = hf_greedy(prompts, 8, model=ckpt)
    cfg = ModelConfig.from_dir(ckpt)
    for tp_size in (2, 4):
        assert cfg.num_kv_heads < tp_size or cfg.vocab_size % tp_size, "the row tests nothing"
        llm = build_llm(ckpt, tp_size=tp_size, device=rank_device(tp_size))
        try:
            got = [o["token_ids"] for o in llm.generate(prompts, greedy(8))]
        finally:
            llm.shutdown()
        assert_tokens_equal(got, want, f"checkpoint {name}, TP={tp_size}")


# ---------------------------------------------------------------- what each rank does and holds


def test_each_forward_makes_two_all_reduces_a_layer_plus_one_and_one_all_gather(tp_llm):
    llm = tp_llm
    layers = ModelConfig.from_dir(MODEL).num_layers
    llm.comm.reset_counts()
    steps = llm.steps_launched
    llm.generate(prompt_ids()[:2], greedy(5))
    forwards = llm.steps_launched - steps
    assert forwards > 0
    assert llm.comm.counts["all_reduce"] == (2 * layers + 1) * forwards
    assert llm.comm.counts["all_gather"] == forwards


def test_rank_zero_holds_its_share_of_every_weight(tp_llm):
    llm, tp_size = tp_llm, tp_llm.tp_size
    cfg = ModelConfig.from_dir(MODEL)
    h, kv, d, n = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, tp_size
    state = llm.engine.model.state_dict()
    layer = "model.layers.0."
    assert state[layer + "self_attn.qkv_proj.weight"].shape == ((h + 2 * kv) // n * d, 256)
    assert state[layer + "self_attn.o_proj.weight"].shape == (256, h // n * d)
    assert state[layer + "mlp.gate_up_proj.weight"].shape == (2 * cfg.intermediate_size // n, 256)
    assert state[layer + "mlp.down_proj.weight"].shape == (256, cfg.intermediate_size // n)
    assert state["model.embed_tokens.weight"].shape == (cfg.vocab_size // n, 256)
    assert llm.engine.kv_cache.k_cache(0).shape[-2:] == (kv // n, d)


class _Slice:
    """safetensors' get_slice for a tensor already in memory."""

    def __init__(self, t):
        self.t = t

    def get_shape(self):
        return list(self.t.shape)

    def __getitem__(self, index):
        return self.t[index].clone()


def test_the_ranks_slices_put_each_tensor_back_together():
    cfg = ModelConfig.from_dir(checkpoint("qwen3-vocab257-untied"))
    embed = torch.randn(257, 4)
    for n in (2, 4):
        rows = [Shard(cfg, r, n).read("model.embed_tokens.weight", _Slice(embed)) for r in range(n)]
        assert all(p.shape == (vocab_rows(257, n), 4) for p in rows)
        whole = torch.cat(rows)
        assert torch.equal(whole[:257], embed) and not whole[257:].any()  # padding is zero
        down = torch.randn(64, 128)
        cols = [
            Shard(cfg, r, n).read("layers.0.mlp.down_proj.weight", _Slice(down)) for r in range(n)
        ]
        assert torch.equal(torch.cat(cols, dim=1), down)
    one_kv = ModelConfig.from_dir(checkpoint("qwen3-head32-kv1-bias"))
    k = torch.randn(32, 64)
    parts = [
        Shard(one_kv, r, 4).read("layers.0.self_attn.k_proj.weight", _Slice(k)) for r in range(4)
    ]
    assert all(torch.equal(p, k) for p in parts)  # one KV head, replicated on every rank
    assert rank_config(one_kv, 4).num_kv_heads == 1


# ---------------------------------------------------------------- processes


def test_a_tp_size_that_does_not_divide_the_heads_is_refused_naming_the_field():
    with pytest.raises(
        ValueError, match=r"tp_size=3 does not divide the model's num_attention_heads"
    ):
        build_llm(tp_size=3)
    with pytest.raises(TypeError, match="tp_size must be an integer"):
        build_llm(tp_size="2")


def test_a_killed_rank_gives_a_clear_error_fast_and_leaves_no_process():
    close_shared()
    llm = build_llm(tp_size=2, device=rank_device(2))
    pids = llm.rank_pids
    os.kill(pids[0], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RankFailure, match="rank 1 was killed by SIGKILL"):
        llm.generate(prompt_ids()[:1], greedy(4))
    assert time.monotonic() - start < 10
    assert not any(_alive(p) for p in pids)
    with pytest.raises(RuntimeError, match="stopped"):
        llm.generate(prompt_ids()[:1], greedy(4))


def test_a_rank_that_raises_is_named_with_its_error_and_every_rank_ends():
    close_shared()
    llm = build_llm(tp_size=4, device=rank_device(4))
    pids = llm.rank_pids
    llm._ranks.control.broadcast(("no such command",))  # every other rank raises ValueError
    start = time.monotonic()
    with pytest.raises(RankFailure, match="unknown command from rank 0"):
        llm.generate(prompt_ids()[:1], greedy(4))
    assert time.monotonic() - start < 10
    assert not any(_alive(p) for p in pids)


def test_every_rank_runs_the_server_init_hook_first(monkeypatch):
    # the judge's swap reaches a spawned rank only this way; json.loads() without its argument
    # stands for a hook that fails, and the rank that ran it must say so
    close_shared()
    monkeypatch.setenv("MINISGL_SERVER_INIT", "json:loads")
    with pytest.raises(RankFailure, match=r"rank 1 raised TypeError: .*loads\(\) missing"):
        build_llm(tp_size=2, device=rank_device(2))


CTRL_C_SCRIPT = """
import faulthandler, signal, sys, time
# Ctrl-C raises KeyboardInterrupt, as in a terminal: a parent started in the background
# (`nohup ... &`) hands its children SIGINT ignored, and Python then installs no handler for it
signal.signal(signal.SIGINT, signal.default_int_handler)
faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it hangs, if it does
sys.path[:0] = {paths!r}
from helpers import build_llm, greedy, prompt_ids
llm = build_llm(tp_size=2, device={device!r})
print("ranks", *llm.rank_pids, flush=True)
try:
    while True:  # the interrupt comes while a generate runs
        llm.generate(prompt_ids()[:2], greedy(64))
except KeyboardInterrupt:
    print("interrupted", flush=True)
try:
    llm.generate(prompt_ids()[:1], greedy(2))
except RuntimeError as e:
    print("then:", e, flush=True)
"""


@pytest.mark.parametrize("to", ["the terminal's group", "rank 0 alone"])
def test_ctrl_c_stops_every_rank_and_the_llm_says_so(to, tmp_path):
    """Ctrl-C in a terminal reaches the whole foreground group (the ranks too, which ignore it:
    rank 0 decides); a notebook's interrupt reaches the kernel alone. Either way the generate
    raises KeyboardInterrupt, every rank ends, and the LLM says it is stopped."""
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    script = tmp_path / "ctrl_c.py"
    script.write_text(
        CTRL_C_SCRIPT.format(paths=[here, os.path.dirname(here)], device=rank_device(2))
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group, as a terminal gives a command
    )
    try:
        before = []  # what came first: a warning, or the error that kept the ranks from starting
        for line in proc.stdout:
            if line.startswith("ranks "):
                break
            before.append(line)
        else:
            proc.wait(timeout=30)
            raise AssertionError(
                f"the script did not start its ranks (exit {proc.returncode}):\n"
                + "".join(before)[-3000:]
            )
        pids = [int(p) for p in line.split()[1:]]
        time.sleep(1.0)  # generating now
        if to == "rank 0 alone":
            os.kill(proc.pid, signal.SIGINT)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            for pid in [proc.pid, *pids]:  # every rank's threads' stacks into the output
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGUSR1)
                time.sleep(0.5)
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise AssertionError(f"still running 30 s after the interrupt:\n{out[-12000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{out[-2000:]}"
    assert "interrupted" in out and "stopped by KeyboardInterrupt" in out, out[-2000:]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "a rank outlived the interrupt"


def test_shutdown_ends_every_rank_and_a_new_group_can_start():
    close_shared()
    llm = build_llm(tp_size=2, device=rank_device(2))
    pids = llm.rank_pids
    llm.shutdown()
    assert not any(_alive(p) for p in pids)
    again = build_llm(tp_size=2, device=rank_device(2))
    assert again.generate(prompt_ids()[:1], greedy(3))[0]["token_ids"]
    again.shutdown()


def test_serve_tp_size_2_answers_the_openai_client_with_the_offline_text():
    import openai

    from minisgl.server.background import BackgroundServer

    close_shared()
    offline = build_llm(device=rank_device(2))
    want = offline.generate(["ROMEO:\n"], greedy(16))[0]["text"]
    offline.shutdown()
    server = BackgroundServer(
        "--tp-size", "2", "--device", rank_device(2), "--port", "0", timeout=120
    )
    with server as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        r = client.completions.create(
            model="shakespeare-qwen3", prompt="ROMEO:\n", max_tokens=16, temperature=0
        )
    assert r.choices[0].text == want, (r.choices[0].text, want)


# ---------------------------------------------------------------- one GPU


def test_ranks_with_a_gpu_each_use_nccl_and_ranks_sharing_one_use_gloo():
    from minisgl.llm.parallel import collective_backend

    assert collective_backend(torch.device("cuda")) == "nccl"  # rank r on GPU r
    assert collective_backend(torch.device("cuda", 0)) == "gloo"  # NCCL refuses a shared GPU
    assert collective_backend(torch.device("cpu")) == "gloo"


needs_cuda = pytest.mark.skipif(test_device() != "cuda", reason="runs with --device cuda")


@needs_cuda
def test_the_tensor_parallel_path_at_tp_size_1_on_nccl_gives_the_one_process_tokens():
    from minisgl.llm import TensorParallelLLM

    close_shared()
    one = build_llm(device="cuda")
    want = [o["token_ids"] for o in one.generate(prompt_ids(), greedy(NEW_TOKENS))]
    one.shutdown()
    llm = build_llm(llm_class=TensorParallelLLM, tp_size=1, device="cuda")
    try:
        assert torch.distributed.get_backend() == "nccl"
        got = [o["token_ids"] for o in llm.generate(prompt_ids(), greedy(NEW_TOKENS))]
    finally:
        llm.shutdown()
    assert_tokens_equal(got, want)


@needs_cuda
def test_two_ranks_sharing_one_gpu_give_tp1_tokens_over_gloo_without_graphs():
    close_shared()
    one = build_llm(device="cuda:0")
    want = [o["token_ids"] for o in one.generate(prompt_ids(), greedy(NEW_TOKENS))]
    one.shutdown()
    with pytest.raises(ValueError, match="need NCCL"):
        build_llm(tp_size=2, device="cuda:0", use_cuda_graph=True)
    llm = build_llm(tp_size=2, device="cuda:0")
    try:
        assert not llm.engine.use_cuda_graph
        got = [o["token_ids"] for o in llm.generate(prompt_ids(), greedy(NEW_TOKENS))]
        counts = dict(llm.comm.counts)
    finally:
        llm.shutdown()
    assert_tokens_equal(got, want)
    assert counts.get("all_reduce", 0) > 0 and counts.get("all_gather", 0) > 0, counts
