#!/usr/bin/env bash
# The main job: installs what is missing, builds, and routes a generated shared-prefix workload
# through the routing core with the kv policy and round_robin, printing what each decision chose
# and why, then a summary per policy. Extra arguments go to `kvsim explain`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh build
exec ./build/src/kvsim explain "$@"
