# Sourced by the device scripts: finds cuBLAS 13 (toolkit or PyTorch's pip wheels) and the
# shared libraries carried in .devbuild/lib; table_kv_args for the issue's table.
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib $(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__file__))' 2>/dev/null); do
  lib=$(find "$d" -name 'libcublas.so.13*' 2>/dev/null | head -1)
  [ -n "$lib" ] && export LD_LIBRARY_PATH="$(dirname "$lib"):${LD_LIBRARY_PATH:-}" && break
done
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$PWD/.devbuild/lib"
export DS_TEST_DATA_DIR="$PWD/tests/data"

# The issue's table on this card: an 80 GB card holds the KV of 32 sequences at 16k, not 64 (64 GB
# at the 27B's shape), so on a card under 100 GB `bench model` skips the decode pairs above
# 524,288 KV tokens. Prints the arguments (none on an H200): KV=($(table_kv_args)).
table_kv_args() {
  [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ] &&
    echo --max-kv-tokens 524288
  return 0
}
