#!/usr/bin/env bash
# Copy this machine's bubblewrap (bwrap) and the three libraries it links beyond glibc into FOLDER,
# for a machine that has no bwrap and no package registry (a GPU node): carry FOLDER there and run
# the local leaderboard with NVFP4_BWRAP=FOLDER/bwrap (a wrapper that finds the libraries beside it).
#
#   tools/bundle_bwrap.sh FOLDER [BWRAP]     # BWRAP: the bwrap to copy (default: the one on PATH)
#
# Tried with Debian's bwrap 0.8.0 run as root on Ubuntu 24.04; as another user, the node must allow
# unprivileged user namespaces (if it does not, the evaluation says so and runs without a sandbox).
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 FOLDER [BWRAP]" >&2
  exit 2
fi
folder=$1
bwrap=${2:-$(command -v bwrap || true)}
if [ -z "$bwrap" ] || [ ! -x "$bwrap" ]; then
  echo "$0: no bwrap to copy (install bubblewrap, or name one as BWRAP)" >&2
  exit 1
fi
mkdir -p "$folder/lib"
cp -L "$bwrap" "$folder/lib/bwrap"
for name in libselinux.so.1 libcap.so.2 libpcre2-8.so.0; do
  path=$(ldd "$bwrap" | awk -v name="$name" '$1 == name { print $3 }')
  if [ -z "$path" ]; then
    echo "$0: $bwrap does not link $name here: nothing to copy for it" >&2
    continue
  fi
  cp -L "$path" "$folder/lib/$name"
done
cat > "$folder/bwrap" <<'WRAPPER'
#!/bin/sh
# bwrap with the libraries carried beside it; the program it runs keeps the caller's environment.
here=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/lib/bwrap" "$@"
WRAPPER
chmod +x "$folder/bwrap" "$folder/lib/bwrap"
echo "$folder/bwrap: $("$folder/bwrap" --version) ($(ls "$folder/lib" | tr '\n' ' '))"
echo "use it with: NVFP4_BWRAP=$(readlink -f "$folder")/bwrap python -m nvfp4lib.leaderboard.evaluate FILE"
