#!/usr/bin/env bash
# Layer check (ctest label `lint`): a file in src/meshtrain/<folder>/ or apps/ includes only
# "meshtrain/<folder>/..." headers of its own layer or lower ones, and only files under a cuda/ or
# nccl/ folder (built with CUDA alone) include those folders; a forward declaration at namespace
# scope (`class X;` / `struct X;` in column 0) names no type defined only in a higher layer (it
# would reach upward without an include). The order is read from one place: the layer table of
# ARCHITECTURE.md (the first `folder/` of each row's first cell, lowest first).
# Usage: check_layers.sh [ROOT]   (ROOT defaults to the repository this script is in)
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
arch="$root/ARCHITECTURE.md"
if [ ! -f "$arch" ]; then
  echo "check_layers: $arch not found (the layer table lives there)" >&2
  exit 2
fi
cd "$root"
mapfile -t files < <(find src/meshtrain apps -type f \
  \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) | LC_ALL=C sort)
if [ "${#files[@]}" -eq 0 ]; then
  echo "check_layers: no sources under $root/src/meshtrain or $root/apps" >&2
  exit 2
fi

# POSIX awk only (CI has mawk): match() with RSTART/RLENGTH, no gawk extensions.
awk -v arch="$arch" '
function folder_of(path,   rest) {
  if (path ~ /^apps\//) return "apps";
  rest = path; sub(/^src\/meshtrain\//, "", rest);
  if (index(rest, "/") == 0) return "";
  return substr(rest, 1, index(rest, "/") - 1);
}
function cuda_only(path) { return path ~ /(^|\/)(cuda|nccl)\//; }
# The type a column-0 `class X ...` / `struct X ...` line names.
function declared_name(line) {
  sub(/^(class|struct)[ \t]+/, "", line);
  match(line, /^[A-Za-z_][A-Za-z0-9_]*/);
  return substr(line, RSTART, RLENGTH);
}
BEGIN {
  n = 0; in_section = 0; in_table = 0;
  while ((getline line < arch) > 0) {
    if (line ~ /^## /) { in_section = (line ~ /^## Layers/); in_table = 0; continue; }
    if (!in_section) continue;
    if (line !~ /^\|/) { if (in_table) in_section = 0; continue; }
    in_table = 1;
    cell = line; sub(/^\|[ \t]*/, "", cell); sub(/\|.*/, "", cell);
    if (!match(cell, /`[a-z_]+\//)) continue;  # header and separator rows
    name = substr(cell, RSTART + 1, RLENGTH - 2);
    if (!(name in rank)) { rank[name] = n; order[n] = name; n++; }
  }
  close(arch);
  if (n < 2) {
    printf "check_layers: no layer table found in %s (section \"## Layers\", rows \"| `folder/` | ...\")\n", arch;
    bad = 1; exit 2;
  }
  bad = 0;
}
# Pass 1 (the files once): where each namespace-scope type is defined, by layer.
FNR == 1 { own = folder_of(FILENAME); }
pass == 1 {
  if ($0 ~ /^(class|struct)[ \t]+[A-Za-z_][A-Za-z0-9_]*([ \t]+final)?[ \t]*(:[^:]|:$|\{|$)/ && (own in rank)) {
    t = declared_name($0);
    if (!((t, rank[own]) in defined_in)) defined_in[t, rank[own]] = FILENAME;
  }
  next;
}
# Pass 2: the checks.
FNR == 1 {
  if (!(own in rank)) {
    printf "%s: folder %s is not in the layer table of ARCHITECTURE.md\n", FILENAME, own;
    bad = 1;
  }
}
/^[ \t]*#[ \t]*include[ \t]*"meshtrain\// {
  target = $0; sub(/^[^"]*"meshtrain\//, "", target); sub(/".*/, "", target);
  dep = substr(target, 1, index(target, "/") - 1);
  if (!(dep in rank)) {
    printf "%s:%d includes %s, whose folder %s is not in the layer table of ARCHITECTURE.md\n", FILENAME, FNR, target, dep;
    bad = 1;
  } else if ((own in rank) && rank[dep] > rank[own]) {
    printf "%s:%d includes layer %s above its own layer %s\n", FILENAME, FNR, dep, own;
    bad = 1;
  }
  if (cuda_only(target) && !cuda_only(FILENAME)) {
    printf "%s:%d includes %s, built only with CUDA, from a file built without CUDA too\n", FILENAME, FNR, target;
    bad = 1;
  }
}
/^(class|struct)[ \t]+[A-Za-z_][A-Za-z0-9_]*[ \t]*;/ && (own in rank) {
  t = declared_name($0);
  # Fine when any file of this layer or a lower one defines it (names repeat across namespaces).
  above = -1;
  for (i = 0; i < n; i++)
    if ((t, i) in defined_in) {
      if (i <= rank[own]) { above = -1; break; }
      if (above < 0) above = i;
    }
  if (above >= 0) {
    printf "%s:%d forward-declares %s, defined in layer %s above its own layer %s\n", FILENAME, FNR, t, order[above], own;
    bad = 1;
  }
}
END {
  if (bad) exit 1;
  line = "";
  for (i = 0; i < n; i++) line = line (i ? " < " : "") order[i];
  printf "check_layers: %d files keep the layer order %s\n", nfiles, line;
}
' nfiles="${#files[@]}" pass=1 "${files[@]}" pass=2 "${files[@]}"
