"""Train the tiny Qwen3 Shakespeare model bundled in minisgl/assets/shakespeare-qwen3.

Input: the work folder written by prepare.py (train.npy, val.npy, tokenizer files).
Output folder: config.json, model.safetensors (bfloat16), generation_config.json,
tokenizer files and train.log.

    python tools/train_model/train.py .train_data out/            # GPU run
    python tools/train_model/train.py .train_data /tmp/smoke --device cpu \\
        --steps 20 --batch 4 --eval-every 10 --eval-windows 16      # CPU smoke test

The model is small (about 5.8 M parameters) and the corpus is small (about 1.5 M
tokens), so it overfits quickly: held-out loss is evaluated every --eval-every
steps on the held-out plays and the best checkpoint (lowest held-out loss) is
the one saved.  Regularisation: residual/embedding dropout (training-time forward
hooks, nothing in the saved model) and AdamW weight decay.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

PROMPTS = ("ROMEO:\n", "To be, or not to be")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class Log:
    def __init__(self, path: Path):
        self.f = path.open("w")

    def __call__(self, *a) -> None:
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        self.f.write(s + "\n")
        self.f.flush()


def build_model(
    vocab: int, eos_id: int, attn_dropout: float, layers: int = 6, intermediate: int = 768
) -> Qwen3ForCausalLM:
    cfg = Qwen3Config(
        vocab_size=vocab,
        hidden_size=256,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        hidden_act="silu",
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        attention_dropout=attn_dropout,
        initializer_range=0.02,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    # Flat copy for readers that look for the pre-v5 key; same value as rope_parameters.
    cfg.rope_theta = 10000.0
    return Qwen3ForCausalLM(cfg)


def init_from(model: Qwen3ForCausalLM, source: Path, log: Log) -> None:
    """Start a smaller model from a trained one: the embedding (tied to the output head), the
    final norm and the first layers copied, so it starts from the target's token space."""
    src = Qwen3ForCausalLM.from_pretrained(source, dtype=torch.float32).state_dict()
    own = model.state_dict()
    taken = {k: v for k, v in src.items() if k in own and own[k].shape == v.shape}
    model.load_state_dict(taken, strict=False)
    log(f"init from {source}: {len(taken)} of {len(own)} tensors copied")


def distill_loss(logits: torch.Tensor, teacher: torch.Tensor, y: torch.Tensor, alpha: float):
    """alpha * KL(teacher || student) at temperature 1 + (1 - alpha) * cross-entropy on the
    data: the draft learns the target's whole next-token distribution, not just the data's
    token, which is what raises greedy agreement (acceptance) for a small model."""
    flat = logits.float().reshape(-1, logits.size(-1))
    ce = F.cross_entropy(flat, y.reshape(-1))
    t = F.log_softmax(teacher.float().reshape(-1, teacher.size(-1)), dim=-1)
    kl = F.kl_div(F.log_softmax(flat, dim=-1), t, log_target=True, reduction="batchmean")
    return alpha * kl + (1 - alpha) * ce


def add_dropout_hooks(model: Qwen3ForCausalLM, p: float) -> None:
    """Dropout on the embedding output and on each attention / MLP branch output."""
    if p <= 0:
        return

    def hook(mod, inp, out):
        if not mod.training:
            return out
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, True),) + tuple(out[1:])
        return F.dropout(out, p, True)

    model.model.embed_tokens.register_forward_hook(hook)
    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(hook)
        layer.mlp.register_forward_hook(hook)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", type=Path, help="work folder written by prepare.py")
    ap.add_argument("out", type=Path, help="output folder (model files + train.log)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--attn-dropout", type=float, default=0.0)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-windows", type=int, default=0, help="0 = whole held-out set")
    ap.add_argument(
        "--patience",
        type=int,
        default=0,
        help="stop after this many evals without improvement (0 = never)",
    )
    ap.add_argument("--max-seconds", type=float, default=0, help="wall-clock cap (0 = none)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--layers", type=int, default=6, help="decoder layers (hidden stays 256)")
    ap.add_argument("--intermediate", type=int, default=768, help="MLP width")
    ap.add_argument("--init-from", type=Path, help="trained model to copy matching tensors from")
    ap.add_argument(
        "--distill-from", type=Path, help="teacher model: train on KL to its logits (T = 1)"
    )
    ap.add_argument(
        "--distill-alpha", type=float, default=1.0, help="weight of the KL term (rest: CE)"
    )
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not 0.0 <= args.distill_alpha <= 1.0:
        ap.error(f"--distill-alpha must be in [0, 1], got {args.distill_alpha}")

    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "train.log")
    log("args:", json.dumps({k: str(v) for k, v in vars(args).items()}))
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        log("device:", torch.cuda.get_device_name(dev), "torch", torch.__version__)

    tok = AutoTokenizer.from_pretrained(args.data)
    eos_id = tok.eos_token_id
    train = torch.from_numpy(np.load(args.data / "train.npy").astype(np.int64)).to(dev)
    val = torch.from_numpy(np.load(args.data / "val.npy").astype(np.int64)).to(dev)
    log(f"tokens: train {train.numel():,}  val {val.numel():,}  vocab {len(tok)}  eos {eos_id}")

    model = build_model(len(tok), eos_id, args.attn_dropout, args.layers, args.intermediate)
    if args.init_from:
        init_from(model, args.init_from, log)
    model = model.to(dev)
    teacher = None
    if args.distill_from:
        teacher = Qwen3ForCausalLM.from_pretrained(args.distill_from, dtype=torch.float32)
        teacher = teacher.to(dev).eval().requires_grad_(False)
        if teacher.config.vocab_size != len(tok):
            raise SystemExit(
                f"teacher vocab {teacher.config.vocab_size} != tokenizer vocab {len(tok)}"
            )
        log(f"distilling from {args.distill_from} (alpha {args.distill_alpha})")
    n_params = sum(p.numel() for p in model.parameters())  # tied: embedding counted once
    log(f"parameters: {n_params:,}")
    add_dropout_hooks(model, args.dropout)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=cuda,
    )

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        t = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (
            args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * t))
        )

    S = args.seq

    def batch(gen: torch.Generator):
        ix = torch.randint(0, train.numel() - S - 1, (args.batch,), generator=gen, device="cpu").to(
            dev
        )
        off = ix[:, None] + torch.arange(S + 1, device=dev)[None]
        w = train[off]
        return w[:, :-1], w[:, 1:]

    def windows(data: torch.Tensor, n: int) -> torch.Tensor:
        total = (data.numel() - 1) // S
        idx = torch.arange(total if n <= 0 else min(n, total), device=dev) * S
        return idx

    val_idx = windows(val, args.eval_windows)
    g_fixed = torch.Generator().manual_seed(0)
    train_idx = torch.randint(0, train.numel() - S - 1, (val_idx.numel(),), generator=g_fixed).to(
        dev
    )

    def autocast():
        return (
            torch.autocast("cuda", dtype=torch.bfloat16)
            if cuda
            else torch.autocast("cpu", enabled=False)
        )

    @torch.no_grad()
    def evaluate(data: torch.Tensor, starts: torch.Tensor, amp: bool = True) -> float:
        model.eval()
        tot, cnt = 0.0, 0
        for i in range(0, starts.numel(), 128):
            off = starts[i : i + 128, None] + torch.arange(S + 1, device=dev)[None]
            w = data[off]
            with autocast() if amp else torch.autocast(dev.type, enabled=False):
                logits = model(input_ids=w[:, :-1]).logits
            loss = F.cross_entropy(
                logits.float().reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1), reduction="sum"
            )
            tot += loss.item()
            cnt += w[:, 1:].numel()
        model.train()
        return tot / cnt

    gen = torch.Generator().manual_seed(args.seed)
    best = {"val": float("inf"), "step": -1}
    best_state = None
    curve = []
    smooth = None
    bad = 0
    t0 = time.time()
    model.train()
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            if cuda:
                torch.cuda.synchronize()
            el = time.time() - t0
            vl, tl = evaluate(val, val_idx), evaluate(train, train_idx)
            curve.append((step, round(el, 1), tl, vl))
            mark = ""
            if vl < best["val"]:
                best = {
                    "val": vl,
                    "train_eval": tl,
                    "train_smooth": smooth,
                    "step": step,
                    "seconds": round(el, 1),
                    "tokens_seen": step * args.batch * S,
                    "epochs": step * args.batch * S / train.numel(),
                }
                best_state = {
                    k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()
                }
                mark, bad = " *best*", 0
            else:
                bad += 1
            log(
                f"step {step:5d}  t {el:7.1f}s  lr {lr_at(step):.2e}  train(ema) "
                f"{(smooth or float('nan')):.3f}  train(eval) {tl:.3f}  val {vl:.3f}{mark}"
            )
            if (
                step == args.steps
                or (args.patience and bad >= args.patience)
                or (args.max_seconds and el > args.max_seconds)
            ):
                break
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        x, y = batch(gen)
        with autocast():
            logits = model(input_ids=x).logits
            if teacher is not None:
                with torch.no_grad():
                    teacher_logits = teacher(input_ids=x).logits
        if teacher is None:
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        else:
            loss = distill_loss(logits, teacher_logits, y, args.distill_alpha)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        li = loss.item() if step % 10 == 0 else None
        if li is not None:
            smooth = li if smooth is None else 0.7 * smooth + 0.3 * li
    total_s = time.time() - t0

    log("")
    log("curve (step, s, train eval loss, held-out loss):")
    stride = max(1, len(curve) // 20)
    for c in curve[::stride] + ([curve[-1]] if (len(curve) - 1) % stride else []):
        log(f"  {c[0]:5d} {c[1]:7.1f}s  train {c[2]:.3f}  val {c[3]:.3f}")
    log(f"trained {curve[-1][0]} steps in {total_s:.1f}s")
    log("best:", json.dumps(best))

    # ---- save best checkpoint in bfloat16 ----
    model.load_state_dict(best_state)
    model.eval()
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id
    )
    model.save_pretrained(args.out, safe_serialization=True)
    for f in TOKENIZER_FILES:
        if (args.data / f).exists():
            shutil.copy(args.data / f, args.out / f)
    for f in sorted(args.out.iterdir()):
        log(f"  {f.name:28s} {f.stat().st_size:>10,} bytes")

    # ---- samples from the saved (bf16) weights, run in float32 ----
    model = model.float()
    saved_val = evaluate(val, val_idx, amp=False)
    log(f"held-out loss of the saved bf16 weights (computed in float32): {saved_val:.4f}")
    best["val_saved_bf16_weights"] = saved_val
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids.to(dev)
        with torch.no_grad():
            g = model.generate(ids, max_new_tokens=80, do_sample=False, pad_token_id=eos_id)
            torch.manual_seed(0)
            s = model.generate(
                ids,
                max_new_tokens=80,
                do_sample=True,
                temperature=0.8,
                top_k=50,
                pad_token_id=eos_id,
            )
        log(f"\n=== greedy: {prompt!r}\n{tok.decode(g[0], skip_special_tokens=True)}")
        log(
            "\n=== sampled (T=0.8, top-k 50, seed 0): "
            f"{prompt!r}\n{tok.decode(s[0], skip_special_tokens=True)}"
        )
    (args.out / "train_summary.json").write_text(
        json.dumps(
            {
                "parameters": n_params,
                "best": best,
                "total_seconds": round(total_s, 1),
                "curve": curve,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
