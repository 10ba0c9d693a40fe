#!/usr/bin/env bash
# check_format.sh [SOURCE_DIR]: fails when a C++/CUDA file of the tree is not formatted by the
# repo's .clang-format. Checks git's tracked files (untracked ones are not the tree's yet); outside a
# git checkout it globs src/ apps/ tests/ bench/. The tree is formatted with clang-format 14
# (Debian 12's, what CI installs): other major versions format some constructs differently, so
# they are refused rather than trusted. CLANG_FORMAT=path picks the binary.
set -uo pipefail
src=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$src" || exit 2
want_major=14

cf=${CLANG_FORMAT:-}
if [ -z "$cf" ]; then
  for c in clang-format-$want_major clang-format; do
    if command -v "$c" > /dev/null 2>&1; then cf=$c; break; fi
  done
fi
if [ -z "$cf" ] || ! command -v "$cf" > /dev/null 2>&1; then
  echo "check_format: clang-format not found (expected clang-format $want_major: run scripts/install_deps.sh, or set CLANG_FORMAT)"
  exit 1
fi
version=$("$cf" --version)
major=$(printf '%s\n' "$version" | sed -n 's/.*clang-format version \([0-9][0-9]*\)\..*/\1/p' | head -1)
if [ "$major" != "$want_major" ]; then
  echo "check_format: expected clang-format $want_major (Debian 12's, the version the tree is formatted with), found '$version' ($cf); install clang-format-$want_major or set CLANG_FORMAT to it"
  exit 1
fi

files=()
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  while IFS= read -r -d '' f; do
    [ -f "$f" ] && files+=("$f")  # a tracked file deleted in the work tree is not checked
  done < <(git ls-files -z -- '*.h' '*.hpp' '*.cpp' '*.cc' '*.cu' '*.cuh')
  how="tracked files"
else
  while IFS= read -r -d '' f; do
    files+=("$f")
  done < <(find src apps tests bench -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.cpp' \
             -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) -print0 2>/dev/null | sort -z)
  how="files under src/ apps/ tests/ bench/ (not a git checkout)"
fi
if [ ${#files[@]} -eq 0 ]; then
  echo "check_format: no C++/CUDA files found in $src"
  exit 1
fi

bad=()
for f in "${files[@]}"; do
  "$cf" --style=file --dry-run --Werror "$f" > /dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format: ${#bad[@]} of ${#files[@]} $how are not clang-formatted ($cf, major $major):"
  printf '  %s\n' "${bad[@]}"
  echo "first differences:"
  "$cf" --style=file --dry-run "${bad[0]}" 2>&1 | head -20
  echo "fix with (from $src):"
  printf '  clang-format -i'
  printf ' %q' "${bad[@]}"
  printf '\n'
  exit 1
fi
echo "check_format: ${#files[@]} $how formatted ($cf, major $major)"
