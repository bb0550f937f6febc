#!/usr/bin/env bash
# kvsim hash as operators run it: output format, the partial-block rule, chaining, bad input.
set -u
kvsim=$1
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

out=$("$kvsim" hash --block-size 4 --tokens 1,2,3,4,5,6,7,8,9) || fail "exit status $?"
[ "$(echo "$out" | wc -l)" -eq 2 ] || fail "expected 2 full blocks, got: $out"
echo "$out" | grep -qvE '^[0-9a-f]{16} [0-9a-f]{16} [0-9a-f]{16}$' && fail "bad line format: $out"
line0=$(echo "$out" | sed -n 1p)
line1=$(echo "$out" | sed -n 2p)
[ "${line0%% *}" = 0000000000000000 ] || fail "first index: $line0"
[ "${line1%% *}" = 0000000000000001 ] || fail "second index: $line1"
read -r _ l0 s0 <<<"$line0"
read -r _ l1 s1 <<<"$line1"
[ "$l0" = "$s0" ] || fail "seq[0] must equal local[0]: $line0"
[ "$l1" != "$s1" ] || fail "seq[1] must chain the parent: $line1"

# the local hash of block 1 is the hash of its tokens alone
alone=$("$kvsim" hash --block-size 4 --tokens 5,6,7,8) || fail "exit status"
read -r _ la _ <<<"$alone"
[ "$la" = "$l1" ] || fail "local hash of 5,6,7,8 differs: $la vs $l1"

# a file (and stdin) with white space gives the same lines
printf '1, 2, 3, 4,\n5, 6, 7, 8, 9\n' | "$kvsim" hash --block-size 4 --tokens-file - | diff - <(echo "$out") \
  || fail "--tokens-file - differs from --tokens"

# a long list (longer than an option table's text) on the command line, either spelling
long=$(seq 0 999 | paste -sd, -)
"$kvsim" hash --block-size 16 --tokens "$long" >"$tmp/long" || fail "a 1,000-token --tokens failed"
[ "$(wc -l <"$tmp/long")" -eq 62 ] || fail "expected 62 blocks of 16 in 1,000 tokens"
echo "$long" | "$kvsim" hash --block-size 16 --tokens-file - | diff - "$tmp/long" >/dev/null \
  || fail "a long --tokens differs from --tokens-file"
"$kvsim" hash --block-size 16 "--tokens=$long" | diff - "$tmp/long" >/dev/null || fail "--tokens=LIST"

# fewer tokens than a block: no line, success
[ -z "$("$kvsim" hash --block-size 4 --tokens 1,2,3)" ] || fail "a partial block was hashed"

# bad input: a clear error and exit status 2, never a crash
for bad in "--block-size 0 --tokens 1" "--block-size 4 --tokens 1,,2" "--block-size 4 --tokens 1,x" \
           "--block-size 4 --tokens 4294967296" "--block-size 4 --tokens -1" "--block-size 4" \
           "--tokens 1,2" "--block-size 4 --tokens 1, --bogus"; do
  # shellcheck disable=SC2086
  "$kvsim" hash $bad >/dev/null 2>&1
  rc=$?
  [ $rc -eq 2 ] || fail "'kvsim hash $bad' exited $rc, expected 2"
done
echo "1 passed, 0 failed"
