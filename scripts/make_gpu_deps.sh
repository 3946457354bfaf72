#!/usr/bin/env bash
# Packs the third-party headers and static libraries the build needs (the Debian
# packages of scripts/install_deps.sh) into .deps/, for a GPU machine that has CUDA,
# CMake and a compiler but none of those packages (spdlog and fmt as headers: the build
# uses them header-only). Build there with
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_PREFIX_PATH=$PWD/.deps && cmake --build build-gpu
# .deps/ is ignored by git (add "/.deps/" to .git/info/exclude); it also gets a copy of
# ../shared/configs for the benchmarks. Of Boost (used header-only: Asio, for the HTTP
# server) only the headers the build includes are copied, found by `g++ -M` on the sources
# that include Boost, plus boost/config (chosen by compiler), so .deps stays small.
# Gloo is a shared library: .deps/lib gets libgloo.so.0 and the libraries it needs that the
# GPU machine lacks (ldd libgloo.so.0: libhiredis, libibverbs, libnl-3, libnl-route-3);
# the build's RPATH points there (CMakeLists.txt). Its CMake config is copied with the
# library's absolute path made relative to .deps. CUTLASS's headers go as
# .deps/cutlass-include.tar.xz (CMakeLists.txt unpacks it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
D=.deps
rm -rf "$D"
mkdir -p "$D/include" "$D/lib/x86_64-linux-gnu/cmake" "$D/share/cmake" "$D/configs"
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/gtest /usr/include/gmock \
  /usr/include/spdlog /usr/include/fmt "$D/include/"
cp /usr/include/xxhash.h /usr/include/xxh3.h /usr/include/pcre2.h "$D/include/"
cp /usr/lib/x86_64-linux-gnu/libpcre2-8.a "$D/lib/"
cp /usr/include/zlib.h /usr/include/zconf.h "$D/include/"  # PNG plots (bench sweep)
cp /usr/lib/x86_64-linux-gnu/libz.a "$D/lib/"
cp /usr/lib/x86_64-linux-gnu/libgtest*.a /usr/lib/x86_64-linux-gnu/libgmock*.a "$D/lib/x86_64-linux-gnu/"
cp -r /usr/lib/x86_64-linux-gnu/cmake/GTest "$D/lib/x86_64-linux-gnu/cmake/"
cp -r /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 "$D/share/cmake/"
cp -r /usr/include/gloo "$D/include/"
cp -a /usr/lib/libgloo.so /usr/lib/libgloo.so.0 /usr/lib/libgloo.so.0.5.0 "$D/lib/"
for l in libhiredis.so.0.14 libibverbs.so.1 libnl-3.so.200 libnl-route-3.so.200; do
  cp -L "/usr/lib/x86_64-linux-gnu/$l" "$D/lib/"
done
cp -r /usr/share/cmake/Gloo "$D/share/cmake/"
sed -i 's|"/usr/lib/libgloo|"${_IMPORT_PREFIX}/lib/libgloo|g' "$D"/share/cmake/Gloo/GlooTargets-*.cmake
root=$PWD
boost_sources=$(grep -rl --include='*.cpp' --include='*.h' '#include <boost/' src tests || true)
for f in $boost_sources; do
  g++ -std=c++20 -DFMT_HEADER_ONLY=1 -DSPDLOG_FMT_EXTERNAL=1 -Isrc -M "$f"
done | tr ' \\' '\n\n' | sed -n 's|^/usr/include/\(boost/.*\)|\1|p' | sort -u > "$D/boost-headers.txt"
(cd /usr/include && xargs cp --parents -t "$root/$D/include" < "$root/$D/boost-headers.txt")
cp -r /usr/include/boost/config "$D/include/boost/"
rm "$D/boost-headers.txt"
# CUTLASS / CuTe headers (27 MB) as one archive; CMake unpacks it into the build folder.
bash scripts/install_cutlass.sh
tar -C .venv-build/lib/python3*/site-packages/cutlass_library/source -cJf "$D/cutlass-include.tar.xz" include
if [ -d ../shared/configs ]; then cp ../shared/configs/*.json "$D/configs/"; fi
du -sh "$D"
