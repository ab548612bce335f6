#!/usr/bin/env bash
# Train a few regularisation settings side by side on one GPU (the model is tiny,
# so the runs are launch-bound and share the GPU well), keep the run with the
# lowest held-out loss and copy its files, flat, into OUT_DIR:
#   config.json model.safetensors generation_config.json tokenizer.json
#   tokenizer_config.json special_tokens_map.json train.log sweep.log
#
#   usage: tools/train_model/gpu_sweep.sh DATA_DIR OUT_DIR [extra train.py args...]
set -euo pipefail
DATA=$1; OUT=$2; shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=${SWEEP_WORK:-/tmp/shakespeare_sweep}
rm -rf "$WORK"; mkdir -p "$WORK" "$OUT"

# name          train.py arguments
CONFIGS=(
  "d0.1         --dropout 0.1 --lr 1e-3"
  "d0.2         --dropout 0.2 --lr 1e-3"
  "d0.3         --dropout 0.3 --lr 1e-3"
  "d0.2_lr2e-3  --dropout 0.2 --lr 2e-3"
)
COMMON=(--steps 4000 --eval-every 50 --patience 15 --max-seconds 240)

pids=()
for c in "${CONFIGS[@]}"; do
  read -r name cargs <<<"$c"
  # shellcheck disable=SC2086
  python3 "$HERE/train.py" "$DATA" "$WORK/$name" "${COMMON[@]}" $cargs "$@" >"$WORK/$name.out" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done

python3 - "$WORK" "$OUT" <<'EOF'
import json, shutil, sys
from pathlib import Path
work, out = Path(sys.argv[1]), Path(sys.argv[2])
runs = {}
for d in sorted(p for p in work.iterdir() if p.is_dir()):
    f = d / "train_summary.json"
    if f.exists():
        runs[d.name] = json.loads(f.read_text())
lines = ["run          best_val  saved_bf16_val  step  seconds  train_eval_at_best"]
for n, r in runs.items():
    b = r["best"]
    lines.append(f"{n:12s} {b['val']:.4f}    {b.get('val_saved_bf16_weights', float('nan')):.4f}        "
                 f"{b['step']:5d}  {b['seconds']:6.1f}   {b['train_eval']:.4f}")
best = min(runs, key=lambda n: runs[n]["best"]["val"])
lines.append(f"chosen: {best}")
print("\n".join(lines))
with (out / "sweep.log").open("w") as f:
    f.write("\n".join(lines) + "\n")
    for n in runs:
        f.write(f"\n\n######## {n}\n" + (work / n / "train.log").read_text())
for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
             "tokenizer_config.json", "special_tokens_map.json", "train.log"):
    shutil.copy(work / best / name, out / name)
EOF
exit $rc
