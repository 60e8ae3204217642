export PYTHONPATH=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1 && export PYTHONPATH=/tmp/site:$PWD
n=0
for wl in job trainjob trainjob job; do
  n=$((n+1))
  python3 -m mnnvl run --sim --workload $wl --nodes 1 --gpus-per-node 1 --model 125m --steps 60 --allow-unjudged --report-dir /tmp/rep-$n --run-id gpu-$wl-$n > $OUT/$n-$wl.json 2> $OUT/$n-$wl.err; echo "$n $wl rc=$?"
  grep -E "train: step|train: final|Running$|complete$|summary" $OUT/$n-$wl.err | head -8
done
