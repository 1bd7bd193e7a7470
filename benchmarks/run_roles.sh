#!/bin/bash
# The v3 backward with its consumers split by role (dkv_roles, v3_bwd_roles.cuh): its GPU tests, then the backward
# sweep against the column split (dkv_split) and cuDNN at MLA's 192 x 128 and the other head dims above 128.
set -u
export PYTHONPATH=$PWD
out=${OUT:-/tmp}
if [ "${TEST_S:-240}" -gt 0 ]; then  # (TEST_S=0: the sweep only)
  timeout ${TEST_S:-240} python3 -m pytest -p no:cacheprovider -o addopts="" -q -x tests/test_gpu_v3_bwd_roles.py \
    > "$out/roles_tests.log" 2>&1
  echo "TESTS_RC=$?"
  tail -25 "$out/roles_tests.log"
fi
timeout ${SWEEP_S:-240} python3 benchmarks/v3_bwd_sweep.py "${ROLES_ITEMS:-192:plain:dv=128,192:plain:dv=128:dkv_roles=true,\
192:causal:dv=128,192:causal:dv=128:dkv_roles=true,192:cudnn:dv=128,192:cudnn_causal:dv=128,\
192:plain,192:plain:dkv_roles=true,256:plain:dv=128,256:plain:dv=128:dkv_roles=true}" ${ROUNDS:-2} 2>&1 | tail -14
