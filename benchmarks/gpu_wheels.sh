#!/usr/bin/env bash
# Fills DIR with a wheel for every package in benchmarks/gpu_wheels.txt (what the GPU path imports
# that the GPU image lacks), for CPython on manylinux x86_64, so that an offline GPU machine installs
# them with `pip install --no-index --no-deps --target` beside its own torch (benchmarks/gpu_check.sh
# does). Binary wheels come from PyPI as they are; packages PyPI has only as source (DeepSpeed,
# antlr4-python3-runtime) are built here into pure-Python wheels, DeepSpeed with its CUDA ops left to
# JIT on the GPU machine (DS_BUILD_OPS=0). Needs PyPI; a wheel already in DIR is kept.
#   bash benchmarks/gpu_wheels.sh DIR                       # for the GPU image's CPython 3.12
#   bash benchmarks/gpu_wheels.sh DIR --python-version 3.11 # for another CPython (the tests: this machine's)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python}"
limit_mib=40
usage="usage: bash benchmarks/gpu_wheels.sh DIR [--python-version 3.12]"
dir="" pyver=3.12
while [[ $# -gt 0 ]]; do
    case "$1" in
        --python-version) pyver="${2:?$usage}"; shift 2 ;;
        -h|--help) echo "$usage"; exit 0 ;;
        -*) echo "gpu_wheels: unknown option $1; $usage" >&2; exit 2 ;;
        *) dir="$1"; shift ;;
    esac
done
[[ -n "$dir" ]] || { echo "gpu_wheels: no folder given; $usage" >&2; exit 2; }
[[ "$pyver" =~ ^3\.[0-9]+$ ]] || { echo "gpu_wheels: --python-version $pyver: give it as 3.12" >&2; exit 2; }
mkdir -p "$dir"
abi="cp${pyver/./}"
pip=("$python" -m pip --disable-pip-version-check)

normalized() { echo "$1" | tr 'A-Z-.' 'a-z__'; }   # a wheel file's name as PEP 427 spells it
has_wheel() { compgen -G "$dir/$(normalized "$1")-*.whl" > /dev/null || compgen -G "$dir/$1-*.whl" > /dev/null; }

while read -r spec; do
    spec="${spec%%#*}"; spec="${spec// /}"
    [[ -n "$spec" ]] || continue
    name="${spec%%==*}"
    if has_wheel "$name"; then continue; fi
    if "${pip[@]}" download -q --no-deps --only-binary=:all: -d "$dir" --python-version "$pyver" --implementation cp --abi "$abi" \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 "$spec" 2> /dev/null; then
        continue
    fi
    echo "gpu_wheels: $spec has no wheel on PyPI for CPython $pyver: building a pure-Python one from its source"
    DS_BUILD_OPS=0 "${pip[@]}" wheel -q --no-deps --no-build-isolation -w "$dir" "$spec"
    built=$(compgen -G "$dir/$(normalized "$name")-*.whl" || true)
    if [[ -z "$built" || "$built" != *-py3-none-any.whl && "$built" != *-py2.py3-none-any.whl ]]; then
        echo "gpu_wheels: building $spec gave no pure-Python wheel (${built:-nothing}): it would not run on another Python" >&2
        exit 1
    fi
done < "$here/gpu_wheels.txt"

total=$(du -sk "$dir" | cut -f1)
echo "gpu_wheels: $(ls "$dir"/*.whl | wc -l) wheels in $dir, $((total / 1024)) MiB (limit $limit_mib MiB)"
if (( total > limit_mib * 1024 )); then
    echo "gpu_wheels: $dir holds more than $limit_mib MiB: remove what the GPU path does not import" >&2
    exit 1
fi
