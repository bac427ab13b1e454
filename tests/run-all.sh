#!/usr/bin/env bash
# Every test (`make test` runs this; so does CI, through `.ci/run`), in three parts:
# 1. the tests that need no cluster (tests/unit, tests/security), alone: many start several training
#    processes and judge them by the clock, so they get the machine to themselves;
# 2. then the cluster's tests (tests/e2e, tests/chaos) in two streams at once, each against a local cluster of
#    its own (its own control plane, node agent, operator and pod network): they spend most of their time
#    waiting on training and on the control plane, so on two cores two streams take little longer than one.
#    Stream B (the real node, the images, the benchmarks' smoke, Kueue and the rest) runs in the background,
#    its output kept in build/e2e-b.log and printed once stream A (chaos, faults, health, drills, the
#    operator) is done.
# Any part failing, or collecting no test at all (pytest's exit 5), fails the run.
#   usage: tests/run-all.sh PYTHON [pytest arguments for every part]
set -u
python=$1
shift
mkdir -p build
status=0
judge() { # name, pytest exit code
  if [ "$2" -eq 5 ]; then
    echo "pytest collected no $1 tests: failing" >&2
    status=1
  elif [ "$2" -ne 0 ]; then
    echo "the $1 tests failed (pytest exit $2)" >&2
    status=1
  fi
}

"$python" -m pytest tests/unit tests/security "$@"
judge "cluster-free" $?

stream_a=(
  tests/chaos
  tests/e2e/test_fault_tolerance.py tests/e2e/test_fault_scenarios.py tests/e2e/test_health.py
  tests/e2e/test_drills.py tests/e2e/test_operator.py tests/e2e/test_events.py tests/e2e/test_bad_input.py
  tests/e2e/test_lease_policy.py tests/e2e/test_network_policy.py
)
ignored=()
for path in "${stream_a[@]}"; do
  case $path in tests/e2e/*) ignored+=("--ignore=$path") ;; esac
done
log=build/e2e-b.log
# Its cluster's pod network is searched for from another octet: both clusters start at the same moment.
PHALANX_DEV_FIRST_CLUSTER_OCTET=180 "$python" -m pytest -m "not peers" tests/e2e "${ignored[@]}" "$@" >"$log" 2>&1 &
stream_b=$!
trap 'kill "$stream_b" 2>/dev/null' INT TERM
"$python" -m pytest -m "not peers" "${stream_a[@]}" "$@"
judge "cluster (stream A)" $?
wait "$stream_b"
b_rc=$?
echo
echo "======================== cluster tests, stream B (run beside stream A; also in $log)"
cat "$log"
judge "cluster (stream B)" $b_rc
exit $status
