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
# drops a relay_bench_* database per run) and, for the replica scenarios,
# Redis (LOAD_REDIS). The hostile scenario caps the relay's memory with a
# cgroup, which takes root (without it the cap falls back to an
# address-space limit and the report says so); the 20,000-pair scenario
# needs 20,000 client sockets, which the tool lifts its open-file limit for
# when it may (as root) and spreads over loopback source addresses when the
# ephemeral ports are short. Run it on a quiet machine from a clean tree: a dirty
# tree is marked as such on the page, and other work on the machine is in
# every figure. A scenario that fails its checks still keeps its report
# (the page marks it FAIL) and the script exits 1 at the end.
set -euo pipefail

cd "$(dirname "$0")/.."

# Each relay's Redis pool is FN_REDIS_MAX_CONNECTIONS_PER_LOOP x GOMAXPROCS
# (one loop per core); this keeps it at 16 connections or fewer. Above 16
# cores one per loop is already more, and the report's relay settings and
# Redis connected_clients say so.
cores=$(nproc)
redis_per_loop=$((16 / cores))
if ((redis_per_loop < 1)); then
	redis_per_loop=1
fi

# name|flags, in the page's order. Every run offers sends for 60 s with
# wait=20 polls; -drain defaults to wait+10s.
#
# The two idle populations differ only in how many recipients hold polls,
# so that the page can give memory per held poll as the slope between
# them. The crash runs kill the relay twice (SIGKILL, restart on the same
# data and port) with recipients that acknowledge with POST /v1/ack. The
# hostile run floods one relay from 200 connections beside the load, and
# from 600 slow readers of one token (-slow-readers' default), under a
# 256 MiB memory cap. The pairing run sends only the hostile kinds against
# the endpoints that take no token (guessed codes and renewal secrets,
# floods, oversized and stalled bodies), without slow readers or a cap, to
# set their cost beside the clean run of the same size. The two renewal
# runs pair 40 devices that renew every 5 s (far more often than a device
# does), without and beside a flood of pairing guesses from 64 source
# addresses, the renewers on those addresses too: every renewal must
# succeed in both. The 20,000-pair replica run holds 10,000 polls on
# each of two relays, every send crossing relays. The failover run puts the
# relay on a pg_auto_failover formation (synchronous replication) and kills
# its primary 20 s in; it needs pg_autoctl. The stream runs hold
# GET /v1/stream instead of polls and acknowledge as the relay's clients
# do (at most every 15 s while envelopes come, and at the next ping); the
# stream crash run has the relay killed under open streams.
scenarios=(
	"sqlite-200x50|-store sqlite -pairs 200 -rate 50"
	"sqlite-500x100|-store sqlite -pairs 500 -rate 100"
	"sqlite-1000x100|-store sqlite -pairs 1000 -rate 100"
	"sqlite-2000x150|-store sqlite -pairs 2000 -rate 150"
	"sqlite-herd-5000x500|-store sqlite -pairs 5000 -rate 500 -herd"
	"sqlite-crash-1000x100|-store sqlite -pairs 1000 -rate 100 -crash 20s,40s -ack explicit"
	"hostile-1000x100|-store sqlite -pairs 1000 -rate 100 -hostile 200 -relay-memory 256MiB"
	"hostile-pairing-1000x100|-store sqlite -pairs 1000 -rate 100 -hostile 200 -hostile-kinds pairing -slow-readers 0"
	"renewals-200x50|-store sqlite -pairs 200 -rate 50 -renewers 40"
	"renewals-flood-200x50|-store sqlite -pairs 200 -rate 50 -renewers 40 -hostile 64 -hostile-kinds pairing -slow-readers 0"
	"pg-200x50|-store postgres -pairs 200 -rate 50"
	"pg-500x100|-store postgres -pairs 500 -rate 100"
	"pg-1000x100|-store postgres -pairs 1000 -rate 100"
	"pg-2000x150|-store postgres -pairs 2000 -rate 150"
	"pg-5000x500|-store postgres -pairs 5000 -rate 500"
	"pg-10000x1000|-store postgres -pairs 10000 -rate 1000"
	"pg-herd-5000x500|-store postgres -pairs 5000 -rate 500 -herd"
	"pg-herd-5000x500-stream|-store postgres -pairs 5000 -rate 500 -herd -stream"
	"pg-herd-10000x1000|-store postgres -pairs 10000 -rate 1000 -herd"
	"pg-idle-1000x10|-store postgres -pairs 1000 -rate 10"
	"pg-idle-10000x10|-store postgres -pairs 10000 -rate 10"
	"pg-idle-1000x10-stream|-store postgres -pairs 1000 -rate 10 -stream"
	"pg-idle-10000x10-stream|-store postgres -pairs 10000 -rate 10 -stream"
	"pg-crash-1000x100|-store postgres -pairs 1000 -rate 100 -crash 20s,40s -ack explicit"
	"pg-crash-stream-1000x100|-store postgres -pairs 1000 -rate 100 -crash 20s,40s -stream"
	"pg-2replicas-2000x150|-store postgres -replicas 2 -pairs 2000 -rate 150"
	"pg-failover-sync-1000x100|-failover sync -pairs 1000 -rate 100"
)

if [[ "${1:-}" == "-l" ]]; then
	for s in "${scenarios[@]}"; do
		printf '%-26s %s\n' "${s%%|*}" "${s#*|}"
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
	# A failover run starts the Postgres it kills, and refuses LOAD_PG.
	unset_pg=()
	if [[ $flags == *-failover* ]]; then
		unset_pg=(env -u LOAD_PG)
	fi
	# shellcheck disable=SC2086 # flags are words on purpose
	if ! "${unset_pg[@]}" "$bin/loadtest" -relay-bin "$bin/relay" $flags -duration 60s -wait 20 \
		-name "$name" -out "docs/evidence/$name.json"; then
		status=1
	fi
done

go run ./loadtest/capacity
exit $status
