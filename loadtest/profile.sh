#!/usr/bin/env bash
# Profiles the relay under a load-test scenario and writes
# docs/evidence/profile-<name>.txt: the tester's summary line, a CPU profile
# of the relay taken in the middle of the offered window, and a count of the
# relay's system calls in a later stretch of it (strace -c, taken apart from
# the profile because tracing slows the process it traces).
#
#   loadtest/profile.sh pg-herd-5000x500 -store postgres -pairs 5000 -rate 500 -herd
#
# The flags after the name are the load tester's; -duration defaults to 70s
# here so that both samples fall well inside the window. Needs what the
# scenario needs (see scenarios.sh), go tool pprof, and strace for the
# system calls (without it that part says so). Run it on a quiet machine:
# the figures are CPU time, and other work on the machine is in them.
set -euo pipefail

cd "$(dirname "$0")/.."

if [[ $# -lt 1 || "$1" == -* ]]; then
	echo "usage: loadtest/profile.sh NAME [loadtest flags...]" >&2
	exit 2
fi
name=$1
shift
out="docs/evidence/profile-$name.txt"
profile_seconds=20
strace_seconds=10
# The profile starts this long after the first send, the strace after it.
settle=10

commit=$(git rev-parse HEAD)
# As the load tester does, the evidence and the page rendered from it do
# not count: they say nothing about what ran.
if [[ -n "$(git status --porcelain -- . ':(exclude)docs/evidence' ':(exclude)docs/CAPACITY.md')" ]]; then
	commit="$commit (dirty tree)"
fi

work=$(mktemp -d)
tester=0
cleanup() {
	if ((tester > 0)); then
		kill "$tester" 2>/dev/null || true
		wait "$tester" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/relay" .
go build -o "$work/loadtest" ./loadtest
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pprof_addr="127.0.0.1:$port"

"$work/loadtest" -relay-bin "$work/relay" -relay-env "FN_PPROF_ADDR=$pprof_addr" \
	-duration 70s -wait 20 "$@" -name "profile-$name" \
	>"$work/summary" 2>"$work/progress" &
tester=$!

# The tester logs "sending" when the first send is due.
until grep -q 'msg=sending' "$work/progress" 2>/dev/null; do
	if ! kill -0 "$tester" 2>/dev/null; then
		cat "$work/progress" >&2
		echo "the load tester stopped before sending" >&2
		exit 1
	fi
	sleep 0.2
done
sleep "$settle"
pid=$(pgrep -f "^$work/relay serve" | head -1)
# The relay's user and system CPU time over the profile's window: fields
# 14 and 15 of /proc/<pid>/stat, in clock ticks.
ticks() { awk '{print $14, $15}' "/proc/$pid/stat" 2>/dev/null || true; }
read -r user0 sys0 < <(ticks) || true
curl -sf -o "$work/cpu.prof" "http://$pprof_addr/debug/pprof/profile?seconds=$profile_seconds"
read -r user1 sys1 < <(ticks) || true

strace_out="strace not found: no system call count"
if command -v strace >/dev/null; then
	timeout -s INT "$strace_seconds" strace -c -f -p "$pid" -o "$work/strace" 2>/dev/null || true
	strace_out=$(cat "$work/strace")
fi

wait "$tester" || true
tester=0
rate=$(grep -o 'achieved=[0-9.]*' "$work/summary" | cut -d= -f2)

{
	echo "# CPU profile and system calls of the relay under load-test scenario $name"
	echo "#"
	echo "# commit $commit"
	echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, $(uname -sr), $(go env GOVERSION)"
	echo "# command: loadtest/profile.sh $name $*"
	echo "# the load tester: $(cat "$work/summary")"
	echo "# profile: ${profile_seconds}s from ${settle}s after the first send; system calls: the ${strace_seconds}s after that"
	echo
	echo "## CPU profile (go tool pprof -top -cum)"
	go tool pprof -top -cum -nodecount=45 "$work/relay" "$work/cpu.prof" 2>/dev/null
	echo
	# The same profile, showing only the relay's own functions: each with
	# the time of everything it called, so that a request's or a
	# delivery's parts can be told apart.
	echo "## The relay's own functions (go tool pprof -top -cum -show 'flamenet/relay/')"
	go tool pprof -top -cum -nodecount=60 -show 'flamenet/relay/' "$work/relay" "$work/cpu.prof" 2>/dev/null | sed -n '/flat%/,$p'
	echo
	echo "## User and system CPU time (/proc/<pid>/stat, over the profile's ${profile_seconds}s at ${rate}/s achieved)"
	awk -v u=$((${user1:-0} - ${user0:-0})) -v s=$((${sys1:-0} - ${sys0:-0})) -v hz="$(getconf CLK_TCK)" -v n="$profile_seconds" -v r="${rate:-0}" 'BEGIN {
		n *= r
		if (u + s <= 0 || n == 0) { print "no CPU time read"; exit }
		printf "user   %6.2fs  %4.0f%%  %5.0f us per delivered envelope\n", u / hz, 100 * u / (u + s), 1e6 * u / hz / n
		printf "system %6.2fs  %4.0f%%  %5.0f us per delivered envelope\n", s / hz, 100 * s / (u + s), 1e6 * s / hz / n
	}'
	echo
	echo "## System calls (strace -c -f, ${strace_seconds}s at ${rate}/s achieved)"
	echo "$strace_out"
	if [[ -s "$work/strace" && -n "$rate" ]]; then
		echo
		echo "## System calls per delivered envelope (calls / (${strace_seconds}s x ${rate}/s))"
		awk -v n="$strace_seconds" -v r="$rate" '
			BEGIN { n *= r }
			$NF ~ /^[a-z_0-9]+$/ && $4 ~ /^[0-9]+$/ && $NF != "total" {
				if ($4 / n >= 0.01) printf "%-16s %6.2f\n", $NF, $4 / n
			}' "$work/strace"
	fi
} >"$out"
echo "wrote $out" >&2
