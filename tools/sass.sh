#!/usr/bin/env bash
# The SASS (sm_90a machine code) of one of the project's CUDA sources, on a machine without a GPU:
# to count what a kernel's loop costs a stage, or see where a load or a request sits, before a
# device call measures it. CUDA 13's nvcc here has no disassembler, so this fetches Debian's
# nvidia-cuda-toolkit 11.8 (non-free; its nvdisasm knows sm_90) into .cache/sass once, compiles the
# source to a cubin with the build's flags, and retags the cubin's ELF header as 11.8 wrote
# sm_90 cubins (tools/sass_stats.py retag); the instruction encoding did not change.
#
#   tools/sass.sh FILE.cu [KERNEL [nvcc flags...]]
#
# env SASS_BY_LINE=SOURCE (a file name such as qgemv_kernel.cuh): the cubin is built with
# -lineinfo, and each kernel's instructions are also counted by line of SOURCE, every instruction
# for the outermost inlined frame in that file (tools/sass_stats.py lines): how big a function or a
# call site is in the kernel.
#
# KERNEL: a substring of the mangled names of the kernels to print (all when empty), e.g.
# 'ILi1ELi1ELb1ELb0ELNS0_8GemvGateE0ELi1ELi2ELi576ELi0ELb1E' for qgemv_tma_kernel<1, 1, true,
# false, kNone, 1, 2, 576, 0, true>. Prints each kernel's demangled name, its instructions a
# loop (tools/sass_stats.py loops), and leaves its whole SASS in .cache/sass/<file>.sass.
# Dev tool only: nothing in the build or the tests uses it.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?usage: tools/sass.sh FILE.cu [KERNEL [nvcc flags...]]}
kernel=${2:-}
shift $(($# >= 2 ? 2 : 1))
dir=.cache/sass
mkdir -p "$dir"
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}

if [[ ! -x $dir/nvdisasm ]]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/lists/partial" "$work/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm non-free" \
    > "$work/sources.list"
  apt_opts=(-o "Dir::Etc::sourcelist=$work/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$work/lists"
            -o "Dir::Cache::Archives=$work/archives" -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update -qq
  (cd "$work" && apt-get "${apt_opts[@]}" download -qq nvidia-cuda-toolkit)
  dpkg -x "$work"/nvidia-cuda-toolkit_*.deb "$work/x"
  cp "$work/x/usr/bin/nvdisasm" "$work/x/usr/bin/cu++filt" "$dir/"
fi

name=$(basename "$src" .cu)
by_line=${SASS_BY_LINE:-}
"$nvcc" -cubin -gencode arch=compute_90a,code=sm_90a -O3 -DNDEBUG -std=c++20 -Isrc ${by_line:+-lineinfo} "$@" "$src" \
  -o "$dir/$name.cubin"
python3 tools/sass_stats.py retag "$dir/$name.cubin" "$dir/$name.old.cubin"
"$dir/nvdisasm" -c ${by_line:+-gi} "$dir/$name.old.cubin" > "$dir/$name.sass"
python3 tools/sass_stats.py loops "$dir/$name.sass" "$kernel" --demangle "$dir/cu++filt"
if [[ -n $by_line ]]; then
  python3 tools/sass_stats.py lines "$dir/$name.sass" "$kernel" "$by_line" --demangle "$dir/cu++filt"
fi
