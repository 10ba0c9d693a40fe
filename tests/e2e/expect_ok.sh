#!/usr/bin/env bash
# expect_ok.sh REGEX CMD...: passes when CMD exits 0, its output (stdout and stderr) matches REGEX,
# and no step line ("step: N  loss: ...") carries a non-finite number (nan or inf, any sign or
# case). ctest's PASS_REGULAR_EXPRESSION alone ignores the exit code, so it is not used.
set -u
regex="$1"; shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" > "$out" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then echo "FAIL: exit code $rc, expected 0; last lines:"; tail -20 "$out"; exit 1; fi
if ! grep -q -E -- "$regex" "$out"; then
  echo "FAIL: the output does not match /$regex/; last lines:"; tail -20 "$out"; exit 1
fi
bad=$(grep -E '^step: ' "$out" | grep -i -E '(^|[^[:alnum:]_])[-+]?(nan|inf|infinity)([^[:alnum:]_]|$)' || true)
if [ -n "$bad" ]; then echo "FAIL: non-finite values in step lines:"; printf '%s\n' "$bad"; exit 1; fi
echo "ok (exit 0, /$regex/ matched, $(grep -c -E '^step: ' "$out") finite step line(s))"
