#!/usr/bin/env bash
# expect_fail.sh REGEX CMD...: passes when CMD exits non-zero and prints exactly one error line of
# its own ("meshtrain: ..." on stderr, whatever MPI adds around it) and that line matches REGEX.
set -u
regex="$1"; shift
err=$(mktemp)
"$@" >/dev/null 2>"$err"
rc=$?
lines=$(grep -E '^meshtrain: ' "$err" || true)
count=$(printf '%s' "$lines" | grep -c '^' || true)
if [ "$rc" -eq 0 ]; then echo "FAIL: exit code 0, expected non-zero"; cat "$err"; exit 1; fi
if [ "$count" -ne 1 ]; then echo "FAIL: expected one 'meshtrain:' error line, found $count:"; cat "$err"; exit 1; fi
if ! printf '%s' "$lines" | grep -q -E "$regex"; then
  echo "FAIL: error line does not match /$regex/:"; printf '%s\n' "$lines"; exit 1
fi
echo "ok (exit $rc): $lines"
rm -f "$err"
