#!/usr/bin/env bash
# Every test kvrouter has: installs what is missing, builds, then runs
#   plain     the whole suite on a plain build (warnings are errors under CI),
#   js        tests/js, the client-protocol conformance suite in JavaScript (docs/protocol.md),
#             against fleets of the plain build's daemons (Node's test runner; npm ci installs it),
#   asan      the whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer, in a
#             debugoptimized build so assertions run,
#   valgrind  the unit tests under valgrind (leaks and memory errors fail the run; the hostile-
#             input ones and the socket tests of the engines' wire run plain and under ASan only),
#   tsan      the integration suite with kvrouter, kvworker, kvengine and kvbench under TSan,
#   fuzz      every libFuzzer target (tests/fuzz) for FUZZ_SECONDS each (default 5), clang,
#   format    a formatting check of every C file against .clang-format, and scripts/structure.sh
#             (file and function sizes, include cycles).
# STAGES="asan tsan" runs only those (in the order above); each stage's time is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh

# Run a command with its output shown only when it fails (meson prints its errors on stdout).
quiet() {
  local out
  out=$("$@" 2>&1) || { printf '%s\n' "$out"; return 1; }
}

# Configure DIR with options (applied with meson configure when DIR exists, so a build made before
# an option changed gets it too) and build it.
build() {
  local dir=$1
  shift
  if [ -f "$dir/build.ninja" ] && [ $# -gt 0 ]; then
    quiet meson configure "$dir" "$@"
  fi
  bash scripts/build.sh "$dir" "$@"
}

# Fail if a sanitizer wrote a report into the directory $1 (else remove it).
check_reports() {
  if compgen -G "$1/*" >/dev/null; then
    head -100 "$1"/*
    echo "sanitizers reported errors (logs in $1)"
    exit 1
  fi
  rm -rf "$1"
}

# Tests at once in the plain, asan and tsan stages: the integration tests mostly wait on their
# processes and sockets (on 2 cores, 3 at a time take 90 s where 2 take 122 s). The longest start
# first (tests/integration/meson.build: priorities, and replicas in two shards). The plain and
# asan stages run one more at a time (4: plain 66-69 s against 89 s; asan 166 s against 190 and
# 199 s, 2026-12-06); the tsan stage, whose daemons are slower still, stays at 3.
JOBS=${JOBS:-3}

# The sanitizer and fuzz builds, made in the background at the lowest CPU priority from the start
# of the plain stage's tests: the integration tests mostly wait on sockets (about half the CPU of
# 2 cores is idle while they run), and a stage that uses one of these builds waits for it to be
# done first. A build that failed there is run again by its stage, in the foreground, where its
# errors show.
prebuild_pid="" prebuilt=""
selected() { case " ${STAGES:-plain js asan valgrind tsan fuzz format} " in *" $1 "*) ;; *) return 1 ;; esac; }
build_asan() { build build-asan -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized; }
build_tsan() { build build-tsan -Db_sanitize=thread -Dtests=false; }
build_fuzz() { # configured once (build.sh: werror under CI), with clang for libFuzzer
  CC=clang bash scripts/build.sh build-fuzz -Dfuzz=true -Db_sanitize=address,undefined \
    -Db_lundef=false -Dtests=false
}
prebuild_start() {
  prebuilt=$(mktemp -d) # a file per build done (or failed), "end" when the job ends, the log
  set -m # a process group of its own, so an early exit stops the whole build (report below)
  (
    renice -n 19 -p "$BASHPID" >/dev/null
    for s in asan tsan fuzz; do
      if selected "$s"; then
        "build_$s" || echo "prebuild: $s failed"
        touch "$prebuilt/$s"
      fi
    done
    touch "$prebuilt/end"
  ) </dev/null >"$prebuilt/log" 2>&1 &
  prebuild_pid=$!
  set +m
}
prebuild_wait() { # $1: the build a stage needs
  while [ -n "$prebuild_pid" ] && [ ! -e "$prebuilt/$1" ] && kill -0 "$prebuild_pid" 2>/dev/null; do
    sleep 1
  done
}

stage_plain() {
  bash scripts/build.sh build
  prebuild_start
  meson test -C build --print-errorlogs --num-processes "$((JOBS + 1))"
}

stage_js() {
  bash scripts/build.sh build
  KVR_BUILD="$PWD/build" bash tests/js/run.sh
}

stage_asan() {
  # Criterion ignores how a test's child process exits, so the sanitizers write their reports to
  # files and any report fails the run.
  prebuild_wait asan
  build_asan
  local logs rc=0
  logs=$(mktemp -d)
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:log_path=$logs/asan" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$logs/ubsan" \
    meson test -C build-asan --print-errorlogs --num-processes "$((JOBS + 1))" || rc=$?
  check_reports "$logs"
  return "$rc"
}

stage_valgrind() {
  # the hostile-input tests drive the same handlers as test_routerd and test_worker (which run
  # here) with 44 more Criterion children of ~2 s each under valgrind; the socket tests of the
  # engines' wire (kvengine's HTTP and KV events, the OpenAI client against a real server, ZeroMQ)
  # wait on real sockets and take 4 minutes under valgrind, while their parsers and codecs run
  # here (openai_parse, kvevents); both kinds run plain and under ASan/UBSan with leak checks
  bash scripts/build.sh build
  meson test -C build --setup=valgrind --suite unit --no-suite hostile --no-suite sockets \
    --print-errorlogs --num-processes 2
}

stage_tsan() {
  # The daemons are built with -fsanitize=thread in build-tsan. Criterion cannot run under TSan
  # (its boxfort arena is mapped at random fixed addresses, which TSan's shadow memory occupies),
  # so the integration tests are the plain build's, run with the TSan daemons copied over the
  # plain ones for the run (the tests spawn the daemons from their build dir, KVR_BUILD_ROOT).
  # The copies are dated 1970, so ninja links the plain ones again on the next build of that dir
  # even if this stage is cut short. Reports go to files, as for ASan; tests/tsan.supp, if
  # present, holds suppressions for races inside libnats alone (not instrumented), one commented
  # entry each.
  prebuild_wait tsan
  build_tsan
  bash scripts/build.sh build
  local client=build logs opts bins=() rc=0
  for b in build-tsan/src/* build-tsan/src/standin/kvengine; do
    if [ -f "$b" ] && [ -x "$b" ]; then
      local to=$client/${b#build-tsan/}
      cp "$b" "$to"
      touch -d @1 "$to"
      bins+=("$to")
    fi
  done
  logs=$(mktemp -d)
  opts="log_path=$logs/tsan:second_deadlock_stack=1:history_size=4"
  [ -f tests/tsan.supp ] && opts+=":suppressions=$PWD/tests/tsan.supp"
  TSAN_OPTIONS=$opts meson test -C "$client" --suite integration --no-rebuild --print-errorlogs \
    --num-processes "$JOBS" || rc=$?
  rm -f "${bins[@]}" # the next ninja in build links the plain ones again
  check_reports "$logs"
  return "$rc"
}

stage_fuzz() {
  # tests/fuzz/README.md: libFuzzer needs clang; each target runs from seeds the encoders write,
  # two at a time, and any crash, leak, timeout or out-of-memory fails (reproducers are kept in
  # build-fuzz/tests/fuzz/work/<target>/).
  prebuild_wait fuzz
  build_fuzz
  FUZZ_SECONDS=${FUZZ_SECONDS:-5} meson test -C build-fuzz --suite fuzz --print-errorlogs \
    --num-processes 2
}

stage_format() {
  local files out
  files=$(git ls-files '*.c' '*.h' 2>/dev/null || find src include tests bench -name '*.[ch]')
  # one clang-format for every file (a process each took 30-45 s); it names each file it would
  # change in a "file:line:col: error: code should be clang-formatted" line
  # shellcheck disable=SC2086 # one file name per word
  if ! out=$(clang-format --dry-run --Werror $files 2>&1); then
    echo "not formatted with clang-format:" \
      "$(printf '%s\n' "$out" | sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: .*clang-format.*/\1/p' |
        sort -u | tr '\n' ' ')"
    exit 1
  fi
  # files <= 800 lines, functions <= 80 lines, no include cycle among src/ and include/
  bash scripts/structure.sh
}

# Each stage's time, printed at the end, also when a stage fails (then it is the last one).
start=$(date +%s)
times="" current="" t0=0
report() {
  local rc=$?
  # (only while it runs: once it ended, its process group id may be another's)
  if [ -n "$prebuild_pid" ] && [ ! -e "$prebuilt/end" ]; then
    kill -- "-$prebuild_pid" 2>/dev/null || true
  fi
  [ -z "$prebuilt" ] || rm -rf "$prebuilt"
  [ -n "$current" ] && times+="time: $current $(($(date +%s) - t0)) s (failed)"$'\n'
  printf '%s' "$times"
  [ "$rc" -ne 0 ] || echo "all tests passed in $(($(date +%s) - start)) s"
  exit "$rc"
}
trap report EXIT
trap 'exit 130' INT # so that report sees a failure
trap 'exit 143' TERM
for s in plain js asan valgrind tsan fuzz format; do
  selected "$s" || continue
  echo "== $s"
  current=$s t0=$(date +%s)
  "stage_$s"
  times+="time: $s $(($(date +%s) - t0)) s"$'\n'
  current=""
done
