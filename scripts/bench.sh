#!/usr/bin/env bash
# Measure the completion queue and the protocol
# engine against baselines run side by side, and print the ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
echo "==> completion queue vs rtrb / crossbeam ArrayQueue / atomic load / eventfd"
cargo bench --locked -p softverbs-cq --bench cq
echo
echo "==> protocol engine (two engines in memory) vs memcpy"
cargo bench --locked -p softverbs-sim --bench engine
