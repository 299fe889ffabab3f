#!/usr/bin/env bash
# The sanitizer step of .ci/run (about 1.5 minutes): the C fast paths built with ASan + UBSan
# (clang), the splice and line tests run against that build, 60 s of the scan fuzzer beside 15 s
# of each differential harness (one core each). A crash fails the step and prints the reproducer's path.
# Needs clang, libclang-rt-dev and the venv (.ci/run installs them); FUZZ_SECONDS=N changes the 60.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
out=build/fuzz
seconds=${FUZZ_SECONDS:-60}
"$py" -c "import atheris" 2>/dev/null || .venv/bin/pip install -q atheris
fuzz/build.sh >/dev/null
"$py" fuzz/make_corpus.py "$out/corpus" >/dev/null
mkdir -p "$out/artifacts" "$out/ci-corpus/scan" "$out/ci-corpus/splice" "$out/ci-corpus/lines" "$out/ci-corpus/fused"
so=$(ls "$PWD/$out"/_native.*.so)
asan_rt=$(clang -print-file-name="libclang_rt.asan-$(uname -m).so")
atheris_rt="$("$py" -c 'import atheris; print(atheris.path())')/asan_with_fuzzer.so"
export ASAN_OPTIONS=detect_leaks=0:malloc_context_size=0:quarantine_size_mb=64:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export SHIPPER_NATIVE_MODULE=$so

echo "== sanitizer build: tests/unit/test_splice*.py test_lines.py test_split_splice.py against $so"
LD_PRELOAD=$asan_rt "$py" -c "from shipper import native; assert native.module.__file__ == '$so', native.module"
LD_PRELOAD=$asan_rt "$py" -m pytest -q -p no:randomly tests/unit/test_splice.py tests/unit/test_splice_native.py \
  tests/unit/test_lines.py tests/unit/test_split_splice.py tests/unit/test_ecs.py

fuzz_run() {   # name, log, command...: run one fuzzer; on a crash print the log's end and the reproducer
  local name=$1 log=$2
  shift 2
  if "$@" >"$log" 2>&1; then
    grep -E "^(#[0-9]+[[:space:]]+DONE|Done [0-9]+ runs|stat::(number_of_executed_units|new_units_added))" "$log" | sed "s/^/$name: /" || true
    return 0
  fi
  tail -n 40 "$log"
  echo "$name: FAILED; reproducer: $(grep -o 'Test unit written to .*' "$log" | sed 's/Test unit written to //' || echo '(none written)')"
  echo "$name: replay: the same command with the reproducer as its only input (fuzz/README.md)"
  return 1
}

echo "== scan fuzzer (libFuzzer, ASan + UBSan), ${seconds}s, beside the differential harnesses (atheris, the sanitizer build), 15s each"
fuzz_run scan_fuzz "$out/scan_fuzz.log" "$out/scan_fuzz" -max_total_time="$seconds" -dict=fuzz/json.dict \
  -max_len=16384 -timeout=10 -artifact_prefix="$out/artifacts/" -print_final_stats=1 \
  "$out/ci-corpus/scan" "$out/corpus/scan" &
scan=$!
failed=0
fuzz_run splice_fuzz "$out/splice_fuzz.log" env LD_PRELOAD="$atheris_rt" "$py" fuzz/splice_fuzz.py -detect_leaks=0 \
  -max_total_time=15 -dict=fuzz/json.dict -max_len=8192 -timeout=30 -artifact_prefix="$out/artifacts/" \
  "$out/ci-corpus/splice" "$out/corpus/splice" || failed=1
fuzz_run lines_fuzz "$out/lines_fuzz.log" env LD_PRELOAD="$atheris_rt" "$py" fuzz/lines_fuzz.py -detect_leaks=0 \
  -max_total_time=15 -max_len=2048 -timeout=30 -artifact_prefix="$out/artifacts/" \
  "$out/ci-corpus/lines" "$out/corpus/lines" || failed=1
fuzz_run fused_fuzz "$out/fused_fuzz.log" env LD_PRELOAD="$atheris_rt" "$py" fuzz/fused_fuzz.py -detect_leaks=0 \
  -max_total_time=15 -dict=fuzz/json.dict -max_len=4096 -timeout=30 -artifact_prefix="$out/artifacts/" \
  "$out/ci-corpus/fused" "$out/corpus/fused" || failed=1
wait "$scan" || failed=1
exit "$failed"
