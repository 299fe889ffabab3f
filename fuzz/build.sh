#!/usr/bin/env bash
# Builds the sanitizer targets (clang, ASan + UBSan, every UB report fatal) into build/fuzz/:
#   scan_fuzz         libFuzzer harness of the C scan (fuzz/scan_fuzz.c), SSE2 string scan
#   scan_fuzz_scalar  the same with the scalar string scan only (-DSHIPPER_NO_SIMD)
#   _native<suffix>   shipper/_native.c as an extension, also with libFuzzer's coverage hooks, for
#                     SHIPPER_NATIVE_MODULE=... (the unit tests, fuzz/splice_fuzz.py, fuzz/lines_fuzz.py)
# and prints the ASan runtime to LD_PRELOAD into an uninstrumented python (see fuzz/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/fuzz
mkdir -p "$out"
cc=${CC:-clang}
py=${PYTHON:-.venv/bin/python}
san=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1)
"$cc" "${san[@]}" -fsanitize=fuzzer fuzz/scan_fuzz.c -o "$out/scan_fuzz"
"$cc" "${san[@]}" -fsanitize=fuzzer -DSHIPPER_NO_SIMD fuzz/scan_fuzz.c -o "$out/scan_fuzz_scalar"
inc=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
suffix=$("$py" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
"$cc" "${san[@]}" -fsanitize=fuzzer-no-link -shared -fPIC -I"$inc" shipper/_native.c \
  -o "$out/_native$suffix"
echo "built: $out/scan_fuzz $out/scan_fuzz_scalar $out/_native$suffix"
echo "asan runtime: $("$cc" -print-file-name=libclang_rt.asan-$(uname -m).so)"
