#!/usr/bin/env bash
# Every GPU check in one go, for a machine with an NVIDIA GPU held for a few minutes:
#   bench/gpu_all.sh OUTDIR
# 1. the backend tests with the Triton kernels compiled for the GPU (bench/gpu_check.py --no-bench), in the
#    background on 6 workers, while
# 2. bench/gpu_generate.py compiles the tiny Llama (float32) and then the 494 M Qwen2-architecture model
#    (bfloat16) for cuda; the 494 M model's timings wait until the tests have ended;
# 3. bench/gpu_check.py --no-tests: egraft's Triton kernels against torch eager and torch.compile.
# Logs and JSON land in OUTDIR; each part has its own time limit (TESTS_S, TINY_S, GEN_S, BENCH_S seconds; 0 skips
# the part), so one that hangs does not take the rest.
set -u
out=${1:?usage: bench/gpu_all.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false EGRAFT_CACHE_DIR=${EGRAFT_CACHE_DIR:-/tmp/egraft-gpu-cache}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi -L > "$out/gpu.txt" 2>&1
rm -f /tmp/egraft-gpu-tests-done
[ "${TESTS_S:-200}" = 0 ] && touch /tmp/egraft-gpu-tests-done
[ "${TESTS_S:-200}" = 0 ] || ( timeout ${TESTS_S:-200} python3 bench/gpu_check.py --no-bench -- -n 6 --timeout 90 -p no:cacheprovider -rfE --tb=short \
    > "$out/tests.log" 2>&1; echo "rc $? at $(date +%T)" >> "$out/tests.log"; touch /tmp/egraft-gpu-tests-done ) &
[ "${TINY_S:-90}" = 0 ] || timeout ${TINY_S:-90} python3 bench/gpu_generate.py --model llama-tiny --dtype float32 --budget 5s --rounds 3 \
    --new 8 --out "$out/gen_tiny.json" > "$out/gen_tiny.log" 2>&1; echo "tiny rc $? at $(date +%T)"
[ "${GEN_S:-330}" = 0 ] || timeout ${GEN_S:-330} python3 bench/gpu_generate.py --model qwen2-0.5b --dtype bfloat16 --budget ${BUDGET:-20s} \
    --quiet-after /tmp/egraft-gpu-tests-done --out "$out/gen_0.5b.json" > "$out/gen_0.5b.log" 2>&1
echo "0.5b rc $? at $(date +%T)"
wait
tail -3 "$out/tests.log"
[ "${BENCH_S:-120}" = 0 ] || timeout ${BENCH_S:-120} python3 bench/gpu_check.py --no-tests > "$out/kernels.log" 2>&1; echo "kernels rc $? at $(date +%T)"
tail -15 "$out/kernels.log"
