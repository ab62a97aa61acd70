#!/usr/bin/env bash
# Runs the capacity scenarios, each against a fresh throwaway stack built
# from this checkout, and writes docs/evidence/<name>.json, then renders
# docs/CAPACITY.md from the evidence.
#
#   loadtest/scenarios.sh                 # every scenario, in order
#   loadtest/scenarios.sh pg-2000x150     # only the ones named
#   loadtest/scenarios.sh -l              # list them
#
# Needs Postgres (LOAD_PG, default the local server; the tool creates and
# drops a relay_bench_* database per run) and, for the replica scenario,
# Redis (LOAD_REDIS). Run it on a quiet machine from a clean tree: a dirty
# tree is marked as such on the page, and other work on the machine is in
# every figure. A scenario that fails its checks still keeps its report
# (the page marks it FAIL) and the script exits 1 at the end.
set -euo pipefail

cd "$(dirname "$0")/.."

# name|flags, in the page's order. Every run offers sends for 60 s with
# wait=20 polls; -drain defaults to wait+10s.
scenarios=(
	"sqlite-200x50|-store sqlite -pairs 200 -rate 50"
	"sqlite-500x100|-store sqlite -pairs 500 -rate 100"
	"sqlite-1000x100|-store sqlite -pairs 1000 -rate 100"
	"sqlite-2000x150|-store sqlite -pairs 2000 -rate 150"
	"pg-200x50|-store postgres -pairs 200 -rate 50"
	"pg-500x100|-store postgres -pairs 500 -rate 100"
	"pg-1000x100|-store postgres -pairs 1000 -rate 100"
	"pg-2000x150|-store postgres -pairs 2000 -rate 150"
	"pg-5000x500|-store postgres -pairs 5000 -rate 500"
	"pg-10000x1000|-store postgres -pairs 10000 -rate 1000"
	"pg-herd-10000x1000|-store postgres -pairs 10000 -rate 1000 -herd"
	"pg-2replicas-2000x150|-store postgres -replicas 2 -pairs 2000 -rate 150"
)

if [[ "${1:-}" == "-l" ]]; then
	for s in "${scenarios[@]}"; do
		printf '%-24s %s\n' "${s%%|*}" "${s#*|}"
	done
	exit 0
fi

declare -A wanted=()
for n in "$@"; do
	wanted[$n]=1
done
for n in "${!wanted[@]}"; do
	found=0
	for s in "${scenarios[@]}"; do
		[[ "${s%%|*}" == "$n" ]] && found=1
	done
	if [[ $found == 0 ]]; then
		echo "unknown scenario $n (loadtest/scenarios.sh -l lists them)" >&2
		exit 2
	fi
done

if [[ -n "$(git status --porcelain)" ]]; then
	echo "warning: the tree is dirty; every report will say so" >&2
fi

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
# Built once, so every scenario runs the same relay; the tool still boots a
# fresh stack (data, key, ports, database) per scenario.
go build -o "$bin/relay" .
go build -o "$bin/loadtest" ./loadtest
mkdir -p docs/evidence

status=0
for s in "${scenarios[@]}"; do
	name=${s%%|*}
	flags=${s#*|}
	if [[ $# -gt 0 && -z "${wanted[$name]:-}" ]]; then
		continue
	fi
	echo "== $name: $flags" >&2
	# shellcheck disable=SC2086 # flags are words on purpose
	if ! "$bin/loadtest" -relay-bin "$bin/relay" $flags -duration 60s -wait 20 \
		-name "$name" -out "docs/evidence/$name.json"; then
		status=1
	fi
done

go run ./loadtest/capacity
exit $status
