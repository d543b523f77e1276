# Sourced by the multi-process training tests: compares the numbers two runs
# logged in their metrics.jsonl; a difference sets fail=1.
# values KEY FILE: the KEY numbers of the file's records, one a line
values() { grep -o "\"$1\":[^,}]*" "$2" | cut -d: -f2; }
# same KEY TOL A B: each of A's values within TOL (relative; 0: the same text) of B's
same() {
  local a b
  a=$(values "$1" "$3"); b=$(values "$1" "$4")
  echo "$1, $3:" $a
  echo "$1, $4:" $b
  if [ -z "$a" ] || [ "$(echo "$a" | wc -l)" != "$(echo "$b" | wc -l)" ]; then echo "FAIL: $1: no values or not as many"; fail=1; return; fi
  paste <(echo "$a") <(echo "$b") | awk '{ d = ($1 - $2) / ($1 < 0 ? -$1 : $1); if (d < 0) d = -d; if (d > m) m = d } END { printf "  largest relative difference %.3g\n", m }'
  if ! paste <(echo "$a") <(echo "$b") | awk -v tol="$2" '
      { if (tol == 0 ? $1 != $2 : ($1 - $2 > tol * ($1 < 0 ? -$1 : $1) || $2 - $1 > tol * ($1 < 0 ? -$1 : $1))) bad = 1 }
      END { exit bad }'; then
    echo "FAIL: $1 differs (tolerance $2)"; fail=1
  fi
}
