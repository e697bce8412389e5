#!/bin/sh
# Test double for nvcc: SIGKILLs itself (as the kernel's OOM killer would) when it compiles $TINYEXT_KILL_UNIT.
if [ -n "${TINYEXT_KILL_UNIT:-}" ]; then
    for arg in "$@"; do
        case "$arg" in
            *"/$TINYEXT_KILL_UNIT") kill -9 $$ ;;
        esac
    done
fi
exec "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" "$@"
