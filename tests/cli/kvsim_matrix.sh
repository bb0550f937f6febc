#!/usr/bin/env bash
# bench/kvsim_matrix.py's cache of reports, with a stand-in kvsim (a script writing a fixed report
# and logging each call): a report is reused only when the same binary made it with the same
# arguments; other kv flags rerun kv alone, another binary reruns everything, a report without
# its key is made again; a relative --out is taken from the caller's directory.
set -u
matrix=$1
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/kvsim" <<'PY'
#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
out, policies = args[args.index('--out') + 1], args[args.index('--policies') + 1]
with open(os.environ['STUB_LOG'], 'a') as f:
    f.write(' '.join(args) + '\n')
os.makedirs(out, exist_ok=True)
stat = {'mean': 10.0, 'p50': 10.0, 'p90': 10.0, 'p99': 10.0}
with open(os.path.join(out, 'report.json'), 'w') as f:
    json.dump({'results': [{'policy': p, 'ttft_ms': stat, 'itl_ms': stat, 'e2e_ms': stat,
                            'throughput_tok_s': 100.0, 'hit_rate': 0.5}
                           for p in policies.split(',')]}, f)
PY
chmod +x "$tmp/kvsim"
export STUB_LOG="$tmp/calls"
mkdir "$tmp/cwd"
# runs the matrix from $tmp/cwd with a relative --out; n: how many kvsim runs it made
calls() {
  : >"$STUB_LOG"
  (cd "$tmp/cwd" && python3 "$matrix" --kvsim "$tmp/kvsim" --out rel --jobs 1 "$@" \
    >"$tmp/table" 2>"$tmp/err") || fail "kvsim_matrix.py $* failed: $(tail -1 "$tmp/err")"
  n=$(wc -l <"$STUB_LOG")
}
calls; [ "$n" -eq 26 ] || fail "first pass: $n runs, 13 loads x (baselines, kv) expected"
[ -s "$tmp/cwd/rel/kv/seed_10_8/report.json" ] || fail "a relative --out is not the caller's: $(ls "$tmp/cwd")"
grep -q "figures where kv is behind the best baseline: 0 of 91" "$tmp/table" || fail "no table: $(cat "$tmp/table")"
calls; [ "$n" -eq 0 ] || fail "same binary, same arguments: $n runs instead of none"
calls -- --stall-weight 0.7; [ "$n" -eq 13 ] || fail "other kv flags: $n runs, kv's 13 expected"
grep -q -- "--stall-weight 0.7" "$STUB_LOG" || fail "the flags did not reach kvsim"
calls -- --stall-weight 0.7; [ "$n" -eq 0 ] || fail "the same kv flags again: $n runs"
calls; [ "$n" -eq 13 ] || fail "back to no flags: $n runs, kv's 13 expected"
echo "# another build" >>"$tmp/kvsim"
calls; [ "$n" -eq 26 ] || fail "another binary: $n runs, 26 expected"
rm "$tmp/cwd/rel/baselines/burst_4_8/report.key.json"
calls; [ "$n" -eq 1 ] || fail "a report without its key: $n runs, 1 expected"
echo "1 passed, 0 failed"
