#!/usr/bin/env bash
# lint_selftest.sh SOURCE_DIR: the format check can fail. In a scratch tree outside any git
# checkout (so check_format.sh takes its glob path) with the repo's .clang-format, one formatted
# file passes, and one unformatted file fails the check, which names it and prints the fix.
set -u
src="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$src/.clang-format" "$tmp/"
mkdir -p "$tmp/src"
printf 'int f(int x) { return x + 1; }\n' > "$tmp/src/good.cpp"
out=$("$src/scripts/check_format.sh" "$tmp" 2>&1)
rc=$?
if [ "$rc" -ne 0 ]; then echo "FAIL: a formatted tree failed the check (exit $rc):"; echo "$out"; exit 1; fi
printf 'int  g( int x ){return x*2;}\n' > "$tmp/src/bad.cpp"
out=$("$src/scripts/check_format.sh" "$tmp" 2>&1)
rc=$?
if [ "$rc" -eq 0 ]; then echo "FAIL: an unformatted file passed the check:"; echo "$out"; exit 1; fi
if ! printf '%s\n' "$out" | grep -q 'clang-format -i src/bad.cpp$'; then
  echo "FAIL: the check does not print the fix for src/bad.cpp:"; echo "$out"; exit 1
fi
if printf '%s\n' "$out" | grep -q 'good.cpp'; then
  echo "FAIL: the check names the formatted file too:"; echo "$out"; exit 1
fi
echo "ok: the unformatted file was named with its fix"
