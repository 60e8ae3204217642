#!/usr/bin/env bash
# Goodput at the defaults on one GPU (H200), each training run through the pods' own entry
# (python3 -m mnnvl.runtime.launch --nproc-per-node 1 -m mnnvl.runtime.train):
#   mfu       the 1b preset at its defaults (compiled: --compile auto on a GPU): MFU, tokens/s
#             and the first step's time (the compile warm-up); then eager (--no-compile)
#   stall     how long checkpoints hold training up, 1b preset, 3 saves to local disk 150 steps
#             apart: background saves (the default), then the synchronous save
#             (MNNVL_TRAIN_TUNING=ckpt=sync, the "before"), then a new DefaultStager per save
#             (ckpt=async-fresh)
#   recovery  bench/bench_recovery.py on the simulator with the 1b preset on this GPU: a killed
#             worker after step 120 restarted in place from the host copy in /dev/shm, in place
#             from disk (hostcopy=off) and with the pods recreated, then a stopped one in place;
#             fault -> detection -> gang restarted -> checkpoint loaded (from where, how long)
#             -> first resumed step, steps redone (needs the kubernetes client, see below)
#   tests     tests/gpu/test_checkpoint_gpu.py (6 background saves, a kill mid-save, the resume,
#             from the pod's host copy in the same pod)
#             and tests/gpu/test_verify_gpu.py (one GPU: NOT_JUDGED, "n/a: one rank")
# Usage: bash bench/gpu_goodput.sh OUT_DIR [PART...]   (parts: mfu stall recovery tests; all)
# A run starts only while BUDGET_S (default 480) seconds are left, and is cut at what is left;
# skipped runs are named in the summary. All parts take more than one 10-minute call: run
#   bash bench/gpu_goodput.sh "$OUT" mfu stall                       (about 8 minutes)
#   BUDGET_S=570 bash bench/gpu_goodput.sh "$OUT" recovery tests     (recovery alone about 7)
# Writes OUT_DIR/summary.txt (one line per run), OUT_DIR/results.jsonl (each run's RESULT or
# benchmark JSON, labelled), OUT_DIR/env.txt (GPU, torch, the checkpoint disk's write speed)
# and OUT_DIR/logs.tgz (every run's full log). Checkpoints go to CKPT_ROOT (default
# /tmp/mnnvl-goodput, about 15 GB per 1b checkpoint, deleted after each run), never to OUT_DIR.
# The recovery part imports the kubernetes client; the GPU image has none, so carry wheels
# (device README): kubernetes google-auth pyasn1 pyasn1-modules cryptography cffi pycparser
# websocket-client requests-oauthlib oauthlib downloaded into .whl/; they are installed from
# there into /tmp/site when present. NCCL and multicast variables are left as the host sets them.
set -uo pipefail
out="${1:?usage: gpu_goodput.sh OUT_DIR [mfu] [stall] [recovery] [tests]}"
shift
parts="${*:-mfu stall recovery tests}"
budget="${BUDGET_S:-480}"
ckpt="${CKPT_ROOT:-/tmp/mnnvl-goodput}"
mkdir -p "$out/logs" "$ckpt"
export PYTHONUNBUFFERED=1
start=$(date +%s)
model="${MODEL:-1b}"  # another preset only to try the script out (MODEL=tiny runs on a CPU)
train=(python3 -m mnnvl.runtime.launch --nproc-per-node 1 -m mnnvl.runtime.train --model "$model")

left() { echo $((budget - ($(date +%s) - start))); }
note() { printf '%s\n' "$*" | tee -a "$out/summary.txt"; }

# run NAME MIN_S CAP_S ENV COMMAND...: runs when MIN_S are left, for at most CAP_S (or less).
run() {
  local name=$1 min=$2 cap=$3 envs=$4
  shift 4
  local have
  have=$(left)
  if ((have < min)); then
    printf '%-16s skipped: %s s of the budget left, needs about %s\n' "$name" "$have" "$min"
    return
  fi
  ((cap > have)) && cap=$have
  local t0 rc
  t0=$(date +%s.%N)
  env $envs timeout --signal=TERM --kill-after=20 "$cap" "$@" > "$out/logs/$name.log" 2>&1
  rc=$?
  rm -rf "${ckpt:?}/$name"
  python3 - "$name" "$rc" "$t0" "$out" <<'EOF'
import json, sys, time
name, rc, t0, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
text = open(f"{out}/logs/{name}.log", errors="replace").read()
found = [ln for ln in text.splitlines() if ln.startswith("RESULT ") or ln.startswith('{"bench"')]
res = json.loads(found[-1].split(" ", 1)[1] if found and found[-1].startswith("RESULT ") else found[-1]) if found else {}
with open(f"{out}/results.jsonl", "a") as f:
    f.write(json.dumps({"run": name, "exit": rc, **res}) + "\n")
words = f"exit {rc:<3} {time.time() - t0:6.1f} s"
if res.get("kind") == "train":
    mfu, stall = res.get("mfu"), res.get("checkpoint_stall_s")
    words += (f"  mfu {mfu:.1%}" if mfu else "  mfu n/a") + (
        f"  tok/s/gpu {res['tokens_per_s_per_gpu']:.0f}  compile {res.get('compile')}"
        f"  first step {res.get('first_step_s')} s")
    split = res.get("step_split_ms") or {}
    words += f"  step {split.get('step')} ms" if split else ""
    if stall:
        words += (f"  stall last {stall['last']} s max {stall['max']} s ({stall['saves']} saves,"
                  f" {res['tuning']['ckpt']})  final write wait {res['checkpoint_final_wait_s']} s")
elif res.get("bench") == "recovery":
    for run, r in res.items():
        if " " in run:  # "<fault> <path>"
            words += (f"\n    {run}: failed {r['pod_failed_s']} detected {r['detected_s']} "
                      f"restarted {r['gang_restarted_s']} loaded {r['checkpoint_loaded_s']} "
                      f"({r.get('resume_source')}, {r.get('resume_load_s')} s) first step "
                      f"{r['first_resumed_step_s']} s, redone {r['steps_redone']} steps")
else:
    tail = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["no output"]
    words += f"  last line: {tail[0][:200]}"
print(f"{name:16} {words}")
EOF
} 2>&1
summarize() { run "$@" | tee -a "$out/summary.txt"; }

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None)"
  echo "NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE-unset} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST-unset} NVSHMEM_DISABLE_NVLS=${NVSHMEM_DISABLE_NVLS-unset}"
  echo "checkpoint disk ($ckpt): $(df -h "$ckpt" | tail -1)"
  echo "/dev/shm (the host copy's room): $(df -h /dev/shm | tail -1)"
  dd if=/dev/zero of="$ckpt/dd.bin" bs=1M count="${PROBE_MB:-2048}" oflag=direct conv=fsync 2>&1 | tail -1
  rm -f "$ckpt/dd.bin"
} > "$out/env.txt" 2>&1

for part in $parts; do
  case $part in
    mfu)
      summarize mfu-defaults 90 240 "" "${train[@]}" --steps 30 --log-every 10
      summarize mfu-no-compile 60 180 "" "${train[@]}" --steps 30 --log-every 10 --no-compile
      ;;
    stall)
      every=(--steps 450 --checkpoint-every 150 --log-every 10)
      summarize stall-async 120 300 "" "${train[@]}" "${every[@]}" --checkpoint-dir "$ckpt/stall-async"
      summarize stall-sync 120 300 "MNNVL_TRAIN_TUNING=ckpt=sync" "${train[@]}" "${every[@]}" \
        --checkpoint-dir "$ckpt/stall-sync"
      summarize stall-async-fresh 120 300 "MNNVL_TRAIN_TUNING=ckpt=async-fresh" "${train[@]}" \
        "${every[@]}" --checkpoint-dir "$ckpt/stall-async-fresh"
      ;;
    recovery)
      if [ -d .whl ] && ! python3 -c "import kubernetes" 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
          --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
      fi
      if ! python3 -c "import kubernetes" 2>/dev/null; then
        note "recovery         skipped: no kubernetes client (carry the wheels named in the header)"
        continue
      fi
      # The stall timeout covers a restart's checkpoint load and compile warm-up.
      recovery=(python3 bench/bench_recovery.py --model "$model" --gpus-per-node 1 --steps 150
        --every 50 --fail-at 120 --collective-timeout-s 60 --stall-timeout-s 150)
      summarize recovery-kill 300 560 "" "${recovery[@]}" --faults kill \
        --json-out "$out/logs/recovery-kill.json"
      summarize recovery-stop 150 300 "" "${recovery[@]}" --faults stop --paths in-place \
        --json-out "$out/logs/recovery-stop.json"
      ;;
    tests)
      summarize gpu-tests 120 300 "" python3 -m pytest -q -p no:cacheprovider \
        tests/gpu/test_checkpoint_gpu.py tests/gpu/test_verify_gpu.py
      ;;
    *) note "unknown part $part (mfu, stall, recovery, tests)" ;;
  esac
done
tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "$out/logs"
note "total $(($(date +%s) - start)) s"
