#!/usr/bin/env bash
# Structure checks of src/: no file over 800 lines, no function over 80 lines (Linux brace
# style: a function body opens with '{' in column 0 and closes with '}' in column 0), and no
# include cycle among src/ and include/ headers. Prints what breaks a rule; exits 1 if any does.
set -euo pipefail
cd "$(dirname "$0")/.."
max_file=${MAX_FILE_LINES:-800}
max_fn=${MAX_FUNCTION_LINES:-80}
fail=0
files=$(find src include -name '*.[ch]' | sort)
for f in $files; do
  n=$(wc -l <"$f")
  if [ "$n" -gt "$max_file" ]; then
    echo "structure: $f has $n lines (at most $max_file)"
    fail=1
  fi
  out=$(awk -v max="$max_fn" -v file="$f" '
    /^\{/ { start = NR; name = prev; next }
    /^\}/ && start { len = NR - start - 1;
      if (len > max) printf "structure: %s:%d %s is %d lines (at most %d)\n", file, start, name, len, max;
      start = 0 }
    { if ($0 !~ /^[ \t]*$/) prev = $0 }' "$f")
  if [ -n "$out" ]; then
    echo "$out"
    fail=1
  fi
done
# include graph: edges file -> included file (resolved against the includer's folder, src/*/, include/)
python3 - $files <<'PY' || fail=1
import os, re, sys
files = sys.argv[1:]
known = {os.path.normpath(f) for f in files}
dirs = sorted({os.path.dirname(f) for f in files}) + ["include"]
edges = {}
for f in files:
    f = os.path.normpath(f)
    deps = []
    for line in open(f, encoding="utf-8", errors="replace"):
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if not m:
            continue
        name = m.group(1)
        for d in [os.path.dirname(f)] + dirs:
            p = os.path.normpath(os.path.join(d, name))
            if p in known:
                deps.append(p)
                break
    edges[f] = deps
# a .c and its .h are one module: a cycle is one among modules
mod = lambda p: os.path.splitext(p)[0]
g = {}
for f, ds in edges.items():
    g.setdefault(mod(f), set()).update(mod(d) for d in ds if mod(d) != mod(f))
state, stack, bad = {}, [], []
def visit(n):
    state[n] = 1
    stack.append(n)
    for m in sorted(g.get(n, ())):
        if state.get(m) == 1:
            bad.append(stack[stack.index(m):] + [m])
        elif not state.get(m):
            visit(m)
    stack.pop()
    state[n] = 2
for n in sorted(g):
    if not state.get(n):
        visit(n)
for c in bad:
    print("structure: include cycle: " + " -> ".join(c))
sys.exit(1 if bad else 0)
PY
[ "$fail" -eq 0 ] && echo "structure: files <= $max_file lines, functions <= $max_fn lines, no include cycle"
exit "$fail"
