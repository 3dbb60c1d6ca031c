# Sourced by the device scripts: finds cuBLAS 13 (toolkit or PyTorch's pip wheels) and the
# shared libraries carried in .devbuild/lib.
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib $(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__file__))' 2>/dev/null); do
  lib=$(find "$d" -name 'libcublas.so.13*' 2>/dev/null | head -1)
  [ -n "$lib" ] && export LD_LIBRARY_PATH="$(dirname "$lib"):${LD_LIBRARY_PATH:-}" && break
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$PWD/.devbuild/lib"
export DS_TEST_DATA_DIR="$PWD/tests/data"
