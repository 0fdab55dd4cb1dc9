#!/usr/bin/env bash
# Shows that registry lookups make no syscalls: runs the registry bench in --lookups-only mode
# under `strace -f -c` with 0 and with N lookups (default 1,000,000) and prints both syscall
# totals and their difference, which should be about 0.
set -euo pipefail

n=${1:-1000000}

if ! command -v strace >/dev/null 2>&1; then
    echo "strace is not installed: cannot count syscalls, skipping"
    exit 0
fi

cd "$(dirname "$0")/../../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! cargo bench -p kvol-plugin --bench registry --no-run --message-format=json \
    >"$tmp/build.json" 2>"$tmp/build.err"; then
    cat "$tmp/build.err" >&2
    echo "building the registry bench failed" >&2
    exit 1
fi
bin=$(grep '"reason":"compiler-artifact"' "$tmp/build.json" | grep 'kvol-plugin' |
    grep '"kind":\["bench"\]' | grep '"name":"registry"' |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
if [ -z "$bin" ]; then
    # Older cargo or an odd layout: the newest registry-* executable of the release profile.
    for f in $(ls -t target/release/deps/registry-* 2>/dev/null); do
        if [ -f "$f" ] && [ -x "$f" ]; then
            bin=$f
            break
        fi
    done
fi
if [ -z "$bin" ]; then
    echo "cannot find the registry bench executable" >&2
    exit 1
fi
echo "bench executable: $bin"

# count LOOKUPS: runs the bench under strace, prints the successes and leaves the summary in $tmp.
count() {
    local ok
    ok=$(strace -f -c -o "$tmp/strace.$1" "$bin" --lookups-only "$1")
    if [ "$ok" != "$1" ]; then
        echo "expected $1 successful lookups, got $ok" >&2
        exit 1
    fi
    awk '$NF == "total" { print $4 }' "$tmp/strace.$1"
}

zero=$(count 0)
many=$(count "$n")
echo "syscalls with 0 lookups:  $zero"
echo "syscalls with $n lookups: $many"
echo "difference:               $((many - zero))"

# Per-syscall differences, if any.
awk 'FNR == 1 { file++ }
     $NF != "total" && $4 ~ /^[0-9]+$/ { calls[$NF, file] = $4; names[$NF] = 1 }
     END {
         for (s in names) {
             d = calls[s, 2] - calls[s, 1]
             if (d != 0) printf "  %-20s %+d\n", s, d
         }
     }' "$tmp/strace.0" "$tmp/strace.$n"
