set -x
export PYTHONPATH=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 && export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv
env | grep -E 'NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS'
python3 -c 'import torch; print(torch.__version__, torch.cuda.nccl.version())'
date +%s.%N
for wl in trainjob job; do
  python3 -m mnnvl run --sim --workload $wl --nodes 1 --gpus-per-node 1 --model 125m --steps 60 --allow-unjudged --report-dir /tmp/rep-$wl --run-id gpu-$wl > $OUT/$wl.json 2> $OUT/$wl.err; echo "$wl rc=$?"; date +%s.%N
  tail -25 $OUT/$wl.err
done
python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tail -5
