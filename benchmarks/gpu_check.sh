#!/usr/bin/env bash
# Proves the GPU path on one NVIDIA GPU with no network: installs the wheels carried beside this
# script (benchmarks/.whl/, or WHEELS=folder; see benchmarks/README.md), then runs
# benchmarks/gpu_check.py and prints its summary table.
#   bash benchmarks/gpu_check.sh            # on the GPU machine (~20 min)
#   bash benchmarks/gpu_check.sh --dry-run  # on a CPU: proves the script (tiny model, DeepSpeed skipped)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
python="${PYTHON:-python}"
wheels="${WHEELS:-$here/.whl}"
if [[ " $* " != *" --dry-run "* ]] && compgen -G "$wheels/*.whl" > /dev/null; then
    # --no-deps: the machine already has torch, lightning and transformers; nothing is fetched.
    "$python" -m pip install --no-index --no-deps "$wheels"/*.whl
fi
cd "$repo"
exec "$python" benchmarks/gpu_check.py "$@"
