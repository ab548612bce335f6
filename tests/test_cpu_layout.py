"""The CPU engine's speed-ups keep its numbers: column-major matmul weights (minisgl/layers/
cpu_layout.py) and RoPE's rows looked up once per forward (RotaryEmbedding.rows_held)."""

from __future__ import annotations

import torch

from minisgl.layers import Linear, RotaryEmbedding
from minisgl.layers.cpu_layout import lay_out_for_cpu
from minisgl.models import BUNDLED_MODEL, load_model


def test_cpu_layout_moves_every_matmul_weight_and_keeps_the_logits():
    model = load_model(BUNDLED_MODEL, torch.float32, torch.device("cpu"))
    before = {k: t.clone() for k, t in model.named_tensors()}
    moved = lay_out_for_cpu(model)
    cfg = model._config
    assert moved == 4 * cfg.num_layers + 1  # qkv, o, gate_up, down per layer; the (tied) LM head
    for key, t in model.named_tensors():
        assert torch.equal(t, before[key]), key  # same values, same shape
        if key.endswith("proj.weight") or key == "model.embed_tokens.weight":
            assert t.t().is_contiguous() and not t.is_contiguous(), key
    assert lay_out_for_cpu(model) == 0  # already laid out
    x, w = torch.randn(3, 256), next(t for k, t in model.named_tensors() if "qkv" in k)
    assert torch.allclose(
        torch.nn.functional.linear(x, w),
        x @ before["model.layers.0.self_attn.qkv_proj.weight"].t(),
        atol=1e-5,
    )


def test_cpu_layout_leaves_a_plain_linear_alone_when_already_column_major():
    lin = Linear(4, 6, False, torch.float32, torch.device("cpu"))
    lin.weight = torch.randn(4, 6).t()  # column-major already
    assert lay_out_for_cpu(lin) == 0


def test_rope_rows_held_are_looked_up_once_and_released():
    rot = RotaryEmbedding(8, 16, 10000.0, torch.device("cpu"))
    pos = torch.tensor([3, 5])
    q, k = torch.randn(2, 2, 8), torch.randn(2, 1, 8)
    plain = rot.forward(pos, q, k)
    with rot.rows_held(pos, q.dtype):
        rot._cos = rot._cos * 0  # a second lookup inside would now give other numbers
        held = rot.forward(pos, q, k)
        other = rot.forward(pos.clone(), q, k)  # another positions tensor is looked up anew
    assert all(torch.equal(a, b) for a, b in zip(plain, held))
    assert not torch.equal(other[0], plain[0])
    assert rot._step_rows is None


def test_the_cpu_engine_runs_on_column_major_weights():
    from minisgl import LLM

    llm = LLM(max_running_req=2, device="cpu")  # the CPU engine, whatever the test device
    w = llm.engine.model.model.layers[0].self_attn.qkv_proj.weight
    assert w.t().is_contiguous() and not w.is_contiguous()
