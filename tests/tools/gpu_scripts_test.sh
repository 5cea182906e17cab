#!/usr/bin/env bash
# The device-call scripts against stub stages (no GPU). .ci/gpu-ab: the interleaved order of its
# runs, the summary lines it prints from each benchmark's output, runs of binaries a stage lacks
# reported as skipped, the time limit, and the logs packed into one file. The stubs print lines in
# the benchmarks' formats (tests/bench/mmq_bench.cu, layer_bench.cu, batched_bench.cu) with
# per-stage figures. .ci/gpu-suite run with GPU_SUITE_PACK=1: its logs packed into one file.
# Usage: gpu_scripts_test.sh REPO_ROOT
set -uo pipefail
root=$1
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}
expect_line() {  # FILE FIXED-STRING
  grep -qF -- "$2" "$1" || fail "$(basename "$1") lacks the line: $2"
}

# Stub stages: old (every binary) and new (no moe_layer_test; a failing batched test).
mk() {  # STAGE BIN BODY
  mkdir -p "$w/$1/tests"
  printf '#!/usr/bin/env bash\necho "%s %s $*" >> %s/order.txt\n%s\n' "$1" "$2" "$w" "$3" > "$w/$1/tests/$2"
  chmod +x "$w/$1/tests/$2"
}
for s in old new; do
  gu=115.8; dn=94.4; tr=73.4
  [ $s = new ] && gu=101.2 && dn=90.1 && tr=70.0
  mk $s mmq_bench "echo 'device-to-device copy: 3031 GB/s (read + write, 1 GiB, median of 25)'
for n in \"\$@\"; do
  echo \"| gate+up Q2_K, MMVQ (streamed engine) | \$n | 185.1 | 669 | 22% | 16.32 |\"
  echo \"| gate+up Q2_K, MMQ | \$n | $gu | 1070 | 35% | 26.09 |\"
  echo \"| down Q3_K, MMQ | \$n | $dn | 859 | 28% | 15.99 |\"
done"
  mk $s layer_bench "echo 'device-to-device copy: 3030 GB/s (read + write, 1 GiB, median of 25)'
if [ \"\$1\" = trace ]; then echo \"first kernel start to last kernel end, median of 30 replays: $tr us\"; fi
if [ \"\$1\" = quick ]; then echo 'graph row: device route, one graph, quick pass 1 | T=1 | device 78.8 us | device queued 76.5 us (0 of 220 late) | floor 50.0 us | queued / floor 1.53x'; fi"
  mk $s batched_bench "echo 'device-to-device copy: 3009 GB/s (read + write, 1 GiB, median of 25)'
echo '### batched_bench'
echo '| T | ours us |'
echo '| 64 | 1485.2 |'"
  mk $s mmvq_test "echo '[  PASSED  ] 3 tests.'"
done
mk old moe_layer_test "echo '[  PASSED  ] 1 test.'"
mk new moe_layer_batched_test "echo '[  FAILED  ] 1 test, listed below:'; exit 1"
mk old moe_layer_batched_test "echo '[  PASSED  ] 1 test.'"
mkdir -p "$w/bin"
printf '#!/bin/sh\necho "GPU 0: Stub GPU (UUID: GPU-0)"\n' > "$w/bin/nvidia-smi"
chmod +x "$w/bin/nvidia-smi"

# 1. Every step, packed.
(cd "$w" && PATH="$w/bin:$PATH" OUT="$w/out" AB_TESTS="mmvq_test moe_layer_test moe_layer_batched_test" \
  AB_TRACE_T="1 64" AB_MMQ="8 16" bash "$root/.ci/gpu-ab" "$w/old" "$w/new" > "$w/stdout" 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "gpu-ab exited $rc"
S=$w/stdout
expect_line "$S" "mmq_bench old (rc 0, copy: 3031 GB/s): gu 8: 115.8, dn 8: 94.4, gu 16: 115.8, dn 16: 94.4"
expect_line "$S" "mmq_bench new (rc 0, copy: 3031 GB/s): gu 8: 101.2, dn 8: 90.1, gu 16: 101.2, dn 16: 90.1"
expect_line "$S" "test mmvq_test: [  PASSED  ] 3 tests. rc 0"
expect_line "$S" "test moe_layer_test: skipped ($w/new/tests/moe_layer_test is not in the stage)"
expect_line "$S" "test moe_layer_batched_test: [  FAILED  ] 1 test, listed below: rc 1"
expect_line "$S" "trace T=1 new: 70.0 us (rc 0, copy: 3030 GB/s)"
expect_line "$S" "trace T=64 old-again: 73.4 us (rc 0, copy: 3030 GB/s)"
expect_line "$S" "quick new: rc 0 (copy: 3030 GB/s)"
expect_line "$S" "batched_bench old: rc 0 (copy: 3009 GB/s)"
# The interleaved order of the timed runs (the tests run in parallel: left out).
got=$(grep -vE '^[a-z]+ [a-z_]+_test ' "$w/order.txt" | tr '\n' ';')
want="old mmq_bench 8 16;new mmq_bench 8 16;old mmq_bench 8 16;new mmq_bench 8 16;"
want+="old layer_bench trace 1;new layer_bench trace 1;old layer_bench trace 1;"
want+="old layer_bench trace 64;new layer_bench trace 64;old layer_bench trace 64;"
want+="old layer_bench quick;new layer_bench quick;new batched_bench ;old batched_bench ;"
[ "$got" = "$want" ] || fail "run order: got '$got', want '$want'"
# At most 8 files come back from a device call: the pack and the summary alone.
files=$(cd "$w/out" && find . -type f | sort | tr '\n' ' ')
[ "$files" = "./ab-logs.tar.xz ./ab-summary.txt " ] || fail "files left in OUT: $files"
cmp -s "$S" "$w/out/ab-summary.txt" || fail "ab-summary.txt differs from the script's output"
list=$(tar tJf "$w/out/ab-logs.tar.xz" 2>/dev/null | sort | tr '\n' ' ')
for f in ab/gpu.txt ab/mmq_bench_1_old.log ab/mmq_bench_4_new.log ab/test_moe_layer_test.log \
  ab/trace_64_old-again.log ab/quick_new.log ab/batched_old.log ab/summary.txt; do
  [[ " $list " == *" $f "* ]] || fail "the pack lacks $f (it holds: $list)"
done

# 2. The time limit: with 25 s, the runs that would start with under 20 s left are skipped and
#    say so; AB_PACK=0 keeps the loose logs beside the pack.
rm -f "$w/order.txt"
mk new mmq_bench "sleep 6; echo 'device-to-device copy: 3031 GB/s'"
(cd "$w" && PATH="$w/bin:$PATH" OUT="$w/out2" AB_TESTS="" AB_TRACE_T="1" AB_MMQ="8" AB_LIMIT=25 \
  AB_PACK=0 bash "$root/.ci/gpu-ab" "$w/old" "$w/new" > "$w/stdout2" 2>&1)
S2=$w/stdout2
expect_line "$S2" "batched_bench old: skipped ("
grep -q "left of AB_LIMIT=25" "$S2" || fail "no run reports the limit: $(cat "$S2")"
[ -f "$w/out2/ab/mmq_bench_1_old.log" ] || fail "AB_PACK=0 removed the loose logs"
[ -f "$w/out2/ab-logs.tar.xz" ] || fail "AB_PACK=0 left no pack"

# 3. Bad arguments: exit 2 with the usage line.
bash "$root/.ci/gpu-ab" "$w/old" > "$w/stdout3" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "one stage: exit $rc, want 2"
expect_line "$w/stdout3" "usage: .ci/gpu-ab OLD_STAGE NEW_STAGE"

# 4. .ci/gpu-suite run GPU_SUITE_PACK=1 on a stage with no tests and no benchmarks asked: the
#    logs it writes (gpu.txt, ctest-gpu.log) end in STAGE's logs.tar.xz, nothing else is left.
mkdir -p "$w/st/tests"
echo "# Build directory: $w/build/tests" > "$w/st/tests/CTestTestfile.cmake"
(cd "$w" && PATH="$w/bin:$PATH" OUT="$w/out4" GPU_SUITE_PACK=1 GPU_SUITE_BENCH="" GPU_SUITE_CLI=0 \
  bash "$root/.ci/gpu-suite" run "$w/st" > "$w/stdout4" 2>&1)
files=$(cd "$w/out4" && find . -mindepth 1 | sort | tr '\n' ' ')
[ "$files" = "./st ./st/logs.tar.xz " ] || fail "gpu-suite pack: OUT holds $files ($(cat "$w/stdout4"))"
list=$(tar tJf "$w/out4/st/logs.tar.xz" 2>/dev/null | sort | tr '\n' ' ')
[ "$list" = "./ctest-gpu.log ./gpu.txt " ] || fail "gpu-suite pack holds: $list"
tar xJf "$w/out4/st/logs.tar.xz" -C "$w" ./gpu.txt && expect_line "$w/gpu.txt" "Stub GPU"
# Without GPU_SUITE_PACK the logs stay loose.
(cd "$w" && PATH="$w/bin:$PATH" OUT="$w/out5" GPU_SUITE_BENCH="" GPU_SUITE_CLI=0 \
  bash "$root/.ci/gpu-suite" run "$w/st" > /dev/null 2>&1)
[ -f "$w/out5/st/gpu.txt" ] && [ ! -e "$w/out5/st/logs.tar.xz" ] || fail "gpu-suite without GPU_SUITE_PACK packed"

if [ $fails -ne 0 ]; then
  trap - EXIT
  echo "$fails checks failed; repro: bash $root/tests/tools/gpu_scripts_test.sh $root (work folder kept: $w)"
  exit 1
fi
echo "gpu_scripts_test: all checks passed"
