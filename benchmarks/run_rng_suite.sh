#!/bin/bash
# After the device-pair dropout change: the full GPU suite (benchmarks/run_suite_check.sh), then training steps
# under reduce-overhead for causal and dropout at a small and a larger shape.
set -u
export PYTHONPATH=$PWD
SUITE_S=${SUITE_S:-440} FUZZ_S=0 bash benchmarks/run_suite_check.sh
for shape in 2,256,256 2,2048,1024; do
  echo "== shape $shape"
  timeout 150 python3 benchmarks/reduce_overhead.py --steps 20 --shape $shape --only causal,dropout 2>&1 | grep -v Warning | tail -12
done
