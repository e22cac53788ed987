#!/usr/bin/env bash
# The GPU path on one NVIDIA GPU with no network, in parts that each fit a short lease (<= 8 min on
# one H100 with imports; benchmarks/gpu_check.py says what each runs):
#   bash benchmarks/gpu_check.sh --part headline --out DIR   # the MFU table (tinytrain vs the raw loop, the levers off and on): first
#   bash benchmarks/gpu_check.sh --part a --out DIR   # a: packed isolation on the real kernels + a 30-step bf16 run with export
#                                                     # b: DeepSpeed zero2 / zero3 bf16 + fp16; c: mfu.py plain / --compile / --liger
#                                                     # d: peak GPU memory against the plan's estimate
#                                                     # e: ring context parallel (torch's) against whole sequences (2 GPUs)
#                                                     # f: one Llama-3-8B layer at 32k-128k tokens: memory against the plan, time
#   bash benchmarks/gpu_check.sh --part a --out DIR --dry-run   # on a CPU: proves the part (tiny model)
# Every part appends its rows to DIR/gpu_check.json and rewrites DIR/gpu_check.md, so a later part or
# lease continues the table. First it installs the wheels of benchmarks/gpu_wheels.txt from the folder
# --wheels DIR (or WHEELS=DIR; default benchmarks/.whl; filled by benchmarks/gpu_wheels.sh) with
# `pip install --no-index --no-deps --target` into benchmarks/.site, so the machine's torch stays.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
python="${PYTHON:-python}"
wheels="${WHEELS:-$here/.whl}"
site="${GPU_CHECK_SITE:-$here/.site}"
usage="usage: bash benchmarks/gpu_check.sh --part headline|a|b|c|d|e|f --out DIR [--wheels DIR] [--dry-run]"

args=() part=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --wheels) wheels="${2:?$usage}"; shift 2 ;;
        --part) part="${2:-}"; args+=("$1" "$part"); shift; [[ $# -gt 0 ]] && shift ;;
        *) args+=("$1"); shift ;;
    esac
done
case "$part" in
    headline|a|b|c|d|e|f) ;;
    "") echo "gpu_check: no --part given; $usage" >&2; exit 2 ;;
    *) echo "gpu_check: --part '$part' is not a part: use headline (the MFU table, first), a (isolation + bf16 run), b (DeepSpeed), c (mfu.py), d (memory), e (ring) or f (long-context layer); $usage" >&2; exit 2 ;;
esac

if [[ -d "$wheels" ]]; then
    missing=()
    while read -r spec; do
        spec="${spec%%#*}"; spec="${spec// /}"; [[ -n "$spec" ]] || continue
        name="${spec%%==*}"; file="$(echo "$name" | tr 'A-Z-.' 'a-z__')"
        compgen -G "$wheels/$file-*.whl" > /dev/null || compgen -G "$wheels/$name-*.whl" > /dev/null || missing+=("$spec")
    done < "$here/gpu_wheels.txt"
    if [[ ${#missing[@]} -gt 0 ]]; then
        echo "gpu_check: the wheel folder $wheels lacks ${missing[*]}: fill it on a machine with PyPI with: bash benchmarks/gpu_wheels.sh $wheels" >&2
        exit 2
    fi
    # --no-deps: the machine's torch, transformers and lightning stay; --target: nothing else is touched.
    "$python" -m pip install -q --disable-pip-version-check --no-index --no-deps --upgrade --target "$site" "$wheels"/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$site/bin:$PATH"  # ninja's binary, for the DeepSpeed ops that build on first use
fi
cd "$repo"
exec "$python" benchmarks/gpu_check.py "${args[@]}"
