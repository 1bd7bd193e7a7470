#!/bin/bash
# The clamped sequence views of packed kernels (varlen.cuh, forty-sixth session) against the tree in
# $OLD (an extracted copy of the previous commit's attncompiler/ and templates/): varlen_bench.py, v3 forward and the
# automatic backward, trees interleaved, two rounds.
set -u
OLD=${OLD:-_old}
for r in 1 2; do
  for tree in new old; do
    if [ $tree = new ]; then pp=$PWD; else pp=$PWD/$OLD; fi
    echo "== round $r, $tree tree"
    PYTHONPATH=$pp timeout 200 python3 benchmarks/varlen_bench.py --schedule v3 2>&1 | tail -7
  done
done
