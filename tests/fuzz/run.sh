#!/usr/bin/env bash
# Run one fuzz target (meson test --suite fuzz runs every one through this).
# usage: run.sh TARGET SEEDS NAME WORKDIR
#   TARGET   the fuzz_NAME executable; SEEDS the fuzz_seeds executable
#   WORKDIR  WORKDIR/NAME/corpus keeps what the target finds (it grows across runs),
#            WORKDIR/NAME/seeds its seeds (written afresh every run; none for a target
#            fuzz_seeds does not know), WORKDIR/NAME/crash-* etc. the reproducers of this run
# Environment: FUZZ_SECONDS (default 5) or FUZZ_RUNS (executions; wins when set), FUZZ_ARGS (more
# libFuzzer flags). Exits non-zero on a crash, leak, timeout or out-of-memory.
set -euo pipefail
target=$1 seeds=$2 name=$3 work=$4
dir=$work/$name
mkdir -p "$dir/corpus"
rm -rf "$dir/seeds" "$dir/seeds.new" "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-*
"$seeds" "$dir/seeds.new"
if [ -d "$dir/seeds.new/$name" ]; then mv "$dir/seeds.new/$name" "$dir/seeds"; else mkdir "$dir/seeds"; fi
rm -rf "$dir/seeds.new"
# a target whose inputs are not ours to encode takes its seeds from tests/fixtures/NAME (the
# engines' KV-event batches, made by an independent encoder)
fixtures=$(dirname "$0")/../fixtures/$name
if [ -d "$fixtures" ]; then find "$fixtures" -name '*.msgpack' -exec cp {} "$dir/seeds/" \;; fi
limit=(-max_total_time="${FUZZ_SECONDS:-5}")
[ -n "${FUZZ_RUNS:-}" ] && limit=(-runs="$FUZZ_RUNS")
# UBSan only prints by default: make every finding a crash libFuzzer saves.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}
rc=0
# shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
"$target" "${limit[@]}" -rss_limit_mb=2048 -timeout=25 -print_final_stats=1 \
  -artifact_prefix="$dir/" ${FUZZ_ARGS:-} "$dir/corpus" "$dir/seeds" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "fuzz_$name failed ($rc)"
  for f in "$dir"/crash-* "$dir"/leak-* "$dir"/timeout-* "$dir"/oom-*; do
    [ -e "$f" ] && echo "reproducer: $f (replay: $target $f)"
  done
  exit 1 # not libFuzzer's 77, which meson reads as a skipped test
fi
