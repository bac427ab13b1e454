#!/usr/bin/env bash
# Every test, in two streams at once (`make test` runs this; so does CI, through `.ci/run`):
# - the end-to-end and chaos tests against the local cluster (tests/e2e, tests/chaos), in the foreground;
# - beside them, at a lower CPU priority, the tests that need no cluster (tests/unit, tests/security), their
#   output kept in build/unit-tests.log and printed once the cluster's tests are done.
# The cluster's tests spend most of their time waiting on training and on the control plane, so on two cores the
# two streams take little longer than the cluster's alone. Either stream failing, or collecting no test at all
# (pytest's exit 5), fails the run.
#   usage: tests/run-all.sh PYTHON [pytest arguments for both streams]
set -u
python=$1
shift
mkdir -p build
log=build/unit-tests.log
nice -n 10 "$python" -m pytest tests/unit tests/security "$@" >"$log" 2>&1 &
unit=$!
trap 'kill "$unit" 2>/dev/null' INT TERM
"$python" -m pytest -m "not peers" tests/e2e tests/chaos "$@"
cluster_rc=$?
wait "$unit"
unit_rc=$?
echo
echo "======================== the tests without a cluster (run beside the ones above; also in $log)"
cat "$log"
status=0
for pair in "cluster:$cluster_rc" "unit:$unit_rc"; do
  name=${pair%%:*}
  rc=${pair#*:}
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no $name tests: failing" >&2
    status=1
  elif [ "$rc" -ne 0 ]; then
    echo "the $name tests failed (pytest exit $rc)" >&2
    status=1
  fi
done
exit $status
