#!/usr/bin/env bash
# The checks that need one GPU, each through the pods' own entry (python -m mnnvl.runtime.launch):
#   1. verify on one GPU: NOT_JUDGED, exit 4, a plot that says why (no zero line)
#   2. the 8b preset on one GPU: refused before the model is built (exit 2, the estimate named)
#   3. CUDA out of memory at run time (1b preset, batch too large): one line, exit 10, no retry
#   4. a stopped (SIGSTOP) worker: the launcher's watchdog ends the pod with exit 12 within
#      --stall-timeout-s (30 s, collective timeout 10 s)
# Usage: bash bench/gpu_one_gpu_checks.sh OUT_DIR      (prints one summary line per check)
set -uo pipefail
out="${1:?usage: gpu_one_gpu_checks.sh OUT_DIR}"
mkdir -p "$out"
launch=(python3 -m mnnvl.runtime.launch --nproc-per-node 1)
summary() { printf '%-28s exit %-3s %6.1f s  %s\n' "$1" "$2" "$3" "$4" | tee -a "$out/summary.txt"; }
elapsed() { python3 -c "import time,sys; print(time.time()-float(sys.argv[1]))" "$1"; }

t=$(date +%s.%N)
python3 bench/bench_verify.py --nproc 1 --max-bytes 64M --output-dir "$out/one-gpu" \
  --json-out "$out/one-gpu.json" > "$out/verify.log" 2>&1; rc=$?
summary "verify one GPU" "$rc" "$(elapsed "$t")" "$(grep -m1 -o 'NOT_JUDGED: [^"]*' "$out/verify.log" | head -1)"

t=$(date +%s.%N)
"${launch[@]}" -m mnnvl.runtime.train --model 8b --steps 5 > "$out/8b.log" 2>&1; rc=$?
summary "8b preset one GPU" "$rc" "$(elapsed "$t")" "$(grep -m1 -i 'estimate\|GiB' "$out/8b.log" | head -c 160)"

t=$(date +%s.%N)
"${launch[@]}" -m mnnvl.runtime.train --model 1b --steps 5 --batch-size 256 \
  --activation-checkpointing none > "$out/oom.log" 2>&1; rc=$?
summary "1b batch 256 (OOM)" "$rc" "$(elapsed "$t")" "$(grep -m1 -i 'out of memory' "$out/oom.log" | head -c 200)"

t=$(date +%s.%N)
"${launch[@]}" -m mnnvl.runtime.train --model 1b --steps 100000 --log-every 10 \
  --collective-timeout-s 10 --stall-timeout-s 30 > "$out/stall.log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do grep -q "step 20" "$out/stall.log" 2>/dev/null && break; sleep 1; done
worker=$(pgrep -P "$pid" | head -1)
stopped=$(date +%s.%N)
kill -STOP "$worker"
wait "$pid"; rc=$?
kill -CONT "$worker" 2>/dev/null
summary "SIGSTOP worker (stall 30 s)" "$rc" "$(elapsed "$stopped")" "$(grep -m1 -i 'stalled' "$out/stall.log" | head -c 200)"
