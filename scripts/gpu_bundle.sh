#!/usr/bin/env bash
# Packs a built axon for a GPU host that has CUDA, cuDNN and PyTorch but not
# the Debian libraries axon links (gRPC, protobuf-c, libevent, cmocka,
# OpenBLAS, ...): run here, on Debian 12, after a build with the CUDA
# backend; then carry gpu-bundle/ to the GPU host and run
# scripts/gpu_check.sh there.
#
#   scripts/gpu_bundle.sh [BUILD_DIR]        (default: build/)
#
# gpu-bundle/ (ignored by git) gets:
#   bin/     axon-bench, axon-agent, axon-run and the tests/test_cuda_*
#            programs, stripped (flat, so AXON_BIN_DIR=bin finds axon-agent)
#   lib/     libaxon.so and every shared library the programs need that is
#            not part of glibc, libstdc++/libgcc_s or CUDA/cuDNN (those come
#            from the GPU host), found with ldd, stripped
#   env.sh   `. gpu-bundle/env.sh` puts lib/ first on LD_LIBRARY_PATH,
#            followed by the GPU host's CUDA/cuDNN library folders
#   MANIFEST what was packed, from where, and the build's CUDA/cuDNN versions
#   REQUIRES the glibc and libstdc++ (GLIBCXX) versions the bundle needs
# The build's RUNPATH is removed when patchelf is installed (Debian package
# patchelf); else it stays, harmless: LD_LIBRARY_PATH is searched first.
# Fails when the build has no CUDA backend, a library is missing here, or
# the bundle reaches 60 MiB (kept small enough to copy to a GPU host with
# the source tree in one transfer of at most 64 MiB).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=$root/gpu-bundle
limit_mib=60

die() { echo "gpu_bundle: $*" >&2; exit 1; }

# Libraries the GPU host provides: glibc, the C++ runtime, the driver and
# the CUDA toolkit / cuDNN libraries (found there by env.sh).
host_provided() {
  case "$1" in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libdl.so.* | \
      libpthread.so.* | librt.so.* | libresolv.so.* | libutil.so.* | \
      libmvec.so.* | libanl.so.*) return 0 ;;
    libstdc++.so.* | libgcc_s.so.*) return 0 ;;
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | \
      libcudnn*.so.* | libnvrtc*.so.* | libnvJitLink.so.*) return 0 ;;
  esac
  return 1
}

progs=(axon-bench axon-agent axon-run)
for p in "${progs[@]}"; do
  [[ -x $build/$p ]] || die "$build/$p is missing: build first (cmake --build $build)"
done
[[ -f $build/libaxon.so ]] || die "$build/libaxon.so is missing"
mapfile -t tests < <(find "$build/tests" -maxdepth 1 -type f -name 'test_cuda_*' -perm -u+x | sort)
((${#tests[@]} > 0)) || die "no test_cuda_* programs in $build/tests"
[[ -f $build/libaxon_cuda.so ]] ||
  die "$build/libaxon_cuda.so (the CUDA backend) is missing (configure where nvcc and cuDNN are found)"

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for p in "${progs[@]}"; do cp "$build/$p" "$out/bin/"; done
for t in "${tests[@]}"; do cp "$t" "$out/bin/"; done
# Under its SONAME (libaxon.so.N), the name the programs ask for.
soname=$(objdump -p "$build/libaxon.so" | awk '/SONAME/ {print $2}')
soname=${soname:-libaxon.so}
cp -L "$build/libaxon.so" "$out/lib/$soname"
# The CUDA backend, which libaxon loads from its own directory on demand.
cuda_soname=$(objdump -p "$build/libaxon_cuda.so" | awk '/SONAME/ {print $2}')
cuda_soname=${cuda_soname:-libaxon_cuda.so}
cp -L "$build/libaxon_cuda.so" "$out/lib/$cuda_soname"

# Every library ldd resolves for the programs and libaxon (ldd lists the
# whole closure), minus what the host provides.
declare -A packed=()
missing=()
for elf in "$out"/bin/* "$out/lib/$soname" "$out/lib/$cuda_soname"; do
  while read -r name arrow path _; do
    [[ $arrow == "=>" ]] || continue
    [[ $name == libaxon.so* ]] && continue
    host_provided "$name" && continue
    if [[ $path == "not" ]]; then
      missing+=("$name (needed by ${elf##*/})")
      continue
    fi
    if [[ -z ${packed[$name]:-} ]]; then
      cp -L "$path" "$out/lib/$name"
      packed[$name]=$(readlink -f "$path")
    fi
  done < <(ldd "$elf")
done
((${#missing[@]} == 0)) || die "not found here: ${missing[*]}"

chmod u+w "$out"/bin/* "$out"/lib/*
strip --strip-unneeded "$out"/bin/* "$out"/lib/* 2>/dev/null ||
  strip --strip-unneeded "$out"/bin/* "$out"/lib/*
runpath="kept (no patchelf here; LD_LIBRARY_PATH is searched first)"
if command -v patchelf >/dev/null; then
  for f in "$out"/bin/* "$out"/lib/*; do patchelf --remove-rpath "$f"; done
  runpath="removed (patchelf)"
fi

# The newest glibc / libstdc++ symbol versions the bundle uses: the GPU host
# must have at least these (gpu_check.sh compares).
max_ver() {
  for f in "$out"/bin/* "$out"/lib/*; do objdump -T "$f" 2>/dev/null; done |
    grep -o "$1[0-9.]*" | sort -uV | tail -1 | sed "s/^$1//"
}
need_glibc=$(max_ver GLIBC_)
need_glibcxx=$(max_ver GLIBCXX_)
printf 'glibc=%s\nglibcxx=%s\n' "$need_glibc" "$need_glibcxx" >"$out/REQUIRES"

cuda_ver=$(sed -n 's/.*release \([0-9.]*\),.*/\1/p' < <(/usr/local/cuda/bin/nvcc --version 2>/dev/null) || true)
cudnn_ver=$(awk '/define CUDNN_(MAJOR|MINOR|PATCHLEVEL) /{v = v (v ? "." : "") $3} END{print v}' \
  /usr/local/cuda/include/cudnn_version.h 2>/dev/null || true)
{
  echo "# gpu-bundle made $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "# from $build (git $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'))"
  echo "# built against CUDA ${cuda_ver:-?}, cuDNN ${cudnn_ver:-?}; RUNPATH $runpath"
  echo "# needs on the GPU host: glibc >= $need_glibc, libstdc++ with GLIBCXX_$need_glibcxx, and:"
  for elf in "$out"/bin/* "$out/lib/$soname" "$out/lib/$cuda_soname"; do ldd "$elf"; done |
    awk '{print $1}' | sort -u | while read -r n; do
      case "$n" in libcud* | libcublas* | libnvrtc* | libnvJitLink*) echo "#   $n" ;; esac
    done
  echo "# packed (name <- source):"
  for n in $(printf '%s\n' "${!packed[@]}" | sort); do echo "lib/$n <- ${packed[$n]}"; done
} >"$out/MANIFEST"

cat >"$out/env.sh" <<'EOF'
# Source from bash: `. gpu-bundle/env.sh`. Puts the bundle's libraries first
# on LD_LIBRARY_PATH, then the folders that hold CUDA and cuDNN on this host
# (the CUDA toolkit, then the pip nvidia-* wheels next to python3's
# PyTorch), then what LD_LIBRARY_PATH held before; puts bin/ on PATH and sets
# AXON_BIN_DIR (where the tests find axon-agent). Run python3 (PyTorch) from
# a shell WITHOUT this environment: the bundle's Debian copies of zlib,
# OpenSSL, libgomp, ... would shadow the host's.
AXON_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_ax_dirs=("$AXON_BUNDLE/lib")
for _ax_d in /usr/local/cuda/lib64 /usr/local/cuda/targets/*/lib /usr/local/cuda/lib; do
  [[ -d $_ax_d ]] && _ax_dirs+=("$_ax_d")
done
# pip wheels: nvidia/<pkg>/lib (cuDNN, CUDA 12 layout) and nvidia/cu13/lib
# (CUDA 13 layout), wherever the nvidia namespace package lives.
while IFS= read -r _ax_d; do
  [[ -n $_ax_d ]] && _ax_dirs+=("$_ax_d")
done < <(python3 - 2>/dev/null <<'PY'
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
seen = set()
for r in roots:
    for pat in ("*/lib", "*/*/lib", "*/lib64"):
        for d in sorted(glob.glob(os.path.join(r, pat))):
            if d not in seen and glob.glob(os.path.join(d, "lib*.so*")):
                seen.add(d)
                print(d)
PY
)
for _ax_d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
  [[ -d $_ax_d ]] && _ax_dirs+=("$_ax_d")
done
AXON_GPU_LIBDIRS=$(IFS=:; echo "${_ax_dirs[*]:1}")
LD_LIBRARY_PATH=$(IFS=:; echo "${_ax_dirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
PATH=$AXON_BUNDLE/bin:$PATH
AXON_BIN_DIR=$AXON_BUNDLE/bin
export AXON_BUNDLE AXON_GPU_LIBDIRS LD_LIBRARY_PATH PATH AXON_BIN_DIR
unset _ax_d _ax_dirs
EOF

size=$(du -sb "$out" | cut -f1)
mib=$(awk -v s="$size" 'BEGIN{printf "%.1f", s / 1048576}')
echo "gpu_bundle: $out: ${#packed[@]} libraries + $soname, $(ls "$out/bin" | wc -l) programs, $mib MiB"
du -b "$out"/lib/* | sort -rn | head -5 | awk '{printf "  %6.1f MiB  %s\n", $1 / 1048576, $2}'
((size < limit_mib * 1048576)) ||
  die "bundle is $mib MiB, over the ${limit_mib} MiB limit (the largest files are listed above)"
