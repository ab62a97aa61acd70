#!/usr/bin/env bash
# A change that should not change behaviour or speed, checked in one
# sitting: the relay of BEFORE and of this checkout, side by side on a
# quiet machine.
#
#   loadtest/before-after.sh BEFORE OUT   (OUT: a path without extension)
#
# BenchmarkDelivery: each commit's relay test binary, six alternating runs
# of 5,000 envelopes, compared with benchstat. The load tester (this
# checkout's, for both) at -pairs 1000 -rate 100 on Postgres, three
# alternating runs of each relay, its checks unchanged. OUT.txt gets the
# commands, the machine, benchstat's table and each run's summary line;
# the runs' JSON reports go beside it (OUT-before-N.json, OUT-after-N.json).
set -euo pipefail

cd "$(dirname "$0")/.."

if [[ $# -ne 2 ]]; then
	echo "usage: loadtest/before-after.sh BEFORE OUT" >&2
	exit 2
fi
before=$(git rev-parse "$1")
after=$(git rev-parse HEAD)
out=$2
dirty=""
if [[ -n $(git status --porcelain) ]]; then
	dirty=" (dirty tree)"
fi

tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/before-src" 2>/dev/null || true; rm -rf "$tmp"' EXIT
git worktree add -q "$tmp/before-src" "$before"
(cd "$tmp/before-src" && go build -o "$tmp/relay-before" . && go test -c -o "$tmp/relay-before.test" ./relay/)
go build -o "$tmp/relay-after" .
go test -c -o "$tmp/relay-after.test" ./relay/
go build -o "$tmp/loadtest" ./loadtest

bench=(-test.run '^$' -test.bench Delivery -test.benchtime 5000x -test.benchmem)
for i in 1 2 3 4 5 6; do
	echo "== BenchmarkDelivery, round $i" >&2
	(cd relay && FN_TEST_REQUIRE_SERVICES=1 "$tmp/relay-before.test" "${bench[@]}" >>"$tmp/b-before.txt")
	(cd relay && FN_TEST_REQUIRE_SERVICES=1 "$tmp/relay-after.test" "${bench[@]}" >>"$tmp/b-after.txt")
done

load=(-store postgres -pairs 1000 -rate 100)
summaries=()
for i in 1 2 3; do
	for side in before after; do
		echo "== load tester, relay $side, round $i" >&2
		commit=$before
		[[ $side == after ]] && commit=$after
		"$tmp/loadtest" -relay-bin "$tmp/relay-$side" -relay-commit "$commit" "${load[@]}" \
			-name "before-after-$side-$i" -out "$out-$side-$i.json" >"$tmp/load.out" 2>"$tmp/load.log" || {
			cat "$tmp/load.out" "$tmp/load.log" >&2
			exit 1
		}
		summaries+=("$side $i: $(tail -n1 "$tmp/load.out")")
	done
done

{
	echo "# Before and after in one sitting: BenchmarkDelivery and the load tester"
	echo "#"
	echo "# before: $before; after: $after$dirty"
	echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores, $(uname -sr), $(go env GOVERSION)"
	echo "# command: loadtest/before-after.sh $1 $out"
	echo "#   BenchmarkDelivery: go test -c ./relay/ at each commit, six alternating runs of"
	echo "#   relay.test ${bench[*]}, then benchstat"
	echo "#   load tester: this checkout's, go build ./loadtest, three alternating runs of"
	echo "#   loadtest -relay-bin <each commit's relay> ${load[*]}"
	echo
	go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da "$tmp/b-before.txt" "$tmp/b-after.txt" |
		sed "s#$tmp/##g"
	echo
	echo "## The load tester's summary lines"
	printf '%s\n' "${summaries[@]}"
} >"$out.txt"
echo "wrote $out.txt" >&2
