#!/bin/bash
# Writes link/hot-text.txt: the functions a release kvol runs as an agent with its bundled driver
# (start, the README's example node, 100 claims and pods published, a metrics scrape, those pods
# deleted, shutdown), as valgrind's callgrind saw them.
# Needs root (mounts, in a private mount namespace), valgrind, nm, readelf, curl.
# Usage: crates/kvol/link/collect-hot-text.sh [path to a release kvol]   (about four minutes)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(realpath "${1:-$here/../../../target/release/kvol}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root/manifests" "$work/out"

unshare -m --propagation private bash -s "$bin" "$root" "$work/out" "$here/../../../examples/agent" <<'WORKLOAD'
set -u
bin=$1 root=$2 out=$3 examples=$4
valgrind --tool=callgrind --trace-children=yes --demangle=no --callgrind-out-file="$out/cg.%p" \
  "$bin" agent --root "$root" --node-name hot --metrics-address 127.0.0.1:19809 >"$out/agent.log" 2>&1 &
agent=$!
published() { grep -o '"phase": *"published"' "$root/status.json" 2>/dev/null | wc -l; }
# wait_until ge|le N: until the number of published volumes is >= or <= N.
wait_until() {
  for _ in $(seq 1 1500); do [ "$(published)" -"$1" "$2" ] && return 0; sleep 0.2; done
  echo "note: published -$1 $2 not reached in 300 s ($(published) are; valgrind is slow): going on, the list holds what ran; the agent's log ends:" >&2
  tail -20 "$out/agent.log" >&2
}
sleep 15
# The README's example node (emptyDir, hostPath, Flexvolume, CSI persistent and ephemeral, a
# migrated in-tree volume whose driver is absent): 6 volumes published.
cp "$examples"/*.yaml "$root/manifests/"
for i in $(seq 1 100); do
  printf 'apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: c%s, namespace: default}\nspec: {storageClassName: kvol-hostpath, accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Mi}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p%s, namespace: default}\nspec:\n  containers: [{name: app, image: busybox}]\n  volumes: [{name: data, persistentVolumeClaim: {claimName: c%s}}]\n' "$i" "$i" "$i" >"$root/manifests/.p$i"
  mv "$root/manifests/.p$i" "$root/manifests/p$i.yaml"
done
wait_until ge 106
curl -s http://127.0.0.1:19809/metrics >/dev/null || echo "no metrics answer" >&2
rm -f "$root"/manifests/p*.yaml
wait_until le 6
kill "$agent"; wait "$agent"
umount -R "$root/kubelet" 2>/dev/null || true
WORKLOAD

nm --defined-only "$bin" | awk '$2 ~ /^[tTwW]$/ {print $3}' | sort -u >"$work/symbols"
cat "$work"/out/cg.* | sed -n 's/^c\{0,1\}fn=([0-9]*) //p' | sort -u >"$work/ran"
# Every symbol's hash depends on the compiler that built it: the list says which one (lld reads
# `#` as a comment), and kvol's image is pinned to it (tests/containerfiles.rs).
made_by=$(readelf -p .comment "$bin" | grep -o 'rustc version [0-9.]*')
{
  echo "# $made_by: the functions a release kvol ran (link/README.md)"
  comm -12 "$work/symbols" "$work/ran"
} >"$here/hot-text.txt"
echo "$(grep -vc "^#" "$here/hot-text.txt") functions of $(wc -l <"$work/symbols") written to $here/hot-text.txt"
