#!/usr/bin/env bash
# The Dockerfile's runtime stage installs every shared library the programs need: each library a
# built program names (its NEEDED entries; what those load in turn comes with their packages'
# dependencies) comes from a package the stage's apt-get line names, or from libc6, which every
# Debian image has. The image's own check (ldd in its last RUN) runs only where Docker builds
# it, which CI does not; this one runs with the tests.
# usage: dockerfile_libs.sh DOCKERFILE PROGRAM...
set -euo pipefail
dockerfile=$1
shift
fail() { echo "dockerfile_libs: $*" >&2; exit 1; }
command -v dpkg-query >/dev/null || { echo "dockerfile_libs: no dpkg here: skipped"; exit 77; }
# package names are a release's (bookworm's libcurl4 is trixie's libcurl4t64): only on the image's
image=$(sed -n 's/^ARG DEBIAN_IMAGE=.*:\([a-z]*\).*/\1/p' "$dockerfile")
here=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
if [ -z "$image" ] || [ "$image" != "$here" ]; then
  echo "dockerfile_libs: the image is Debian '${image:-?}', this machine '${here:-?}': skipped"
  exit 77
fi
# the runtime stage's install line (with its continuation lines)
named=$(sed -n '/^FROM .* AS runtime/,$p' "$dockerfile" |
  sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | grep -m1 'apt-get install' |
  tr ' ' '\n' | grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -vE '^(apt-get|install|update|rm)$' || true)
[ -n "$named" ] || fail "no apt-get install line in the runtime stage of $dockerfile"
# every (program, library, path) first, then one dpkg-query for all the paths: a query reads
# dpkg's whole database (a second or so each on a loaded machine, one per library took 30 s)
needs=()
for prog in "$@"; do
  [ -x "$prog" ] || fail "$prog: not built"
  paths=$(ldd "$prog" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
  for lib in $(readelf -d "$prog" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    case $lib in ld-linux* | lib*san.so*) continue ;; esac # the loader; a sanitizer build's
    path=$(awk -v l="$lib" '$1 == l {print $2}' <<<"$paths")
    [ -n "$path" ] || fail "$prog: $lib is not found here"
    needs+=("$(basename "$prog") $lib $path $(readlink -f "$path")")
  done
done
# "package[:arch]: path" for each path dpkg knows, the link's own name or its target's
owners=$(printf '%s\n' "${needs[@]}" | awk '{print $3; print $4}' | sort -u |
  xargs dpkg-query -S 2>/dev/null | sed 's/^\([^:]*\)\(:[^:]*\)\{0,1\}: /\1 /' || true)
missing=0
for n in "${needs[@]}"; do
  read -r prog lib path real <<<"$n"
  pkg=$(awk -v p="$real" '$2 == p {print $1; exit}' <<<"$owners")
  [ -n "$pkg" ] || pkg=$(awk -v p="$path" '$2 == p {print $1; exit}' <<<"$owners")
  [ -n "$pkg" ] || fail "$prog: $lib ($path) belongs to no package"
  if [ "$pkg" != libc6 ] && ! grep -qx "$pkg" <<<"$named"; then
    echo "dockerfile_libs: $prog needs $lib from $pkg, which the runtime stage does not install" >&2
    missing=1
  fi
done
[ "$missing" = 0 ] || exit 1
echo "dockerfile_libs: every library of $# programs is installed by the runtime stage"
