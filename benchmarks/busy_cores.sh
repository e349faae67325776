#!/usr/bin/env bash
# Runs a command and prints its wall time and this machine's busy and idle core-seconds meanwhile (/proc/stat),
# the measure of docs/benchmarks/test_suite_time.md: how much of the cores a test module keeps busy.
#   bash benchmarks/busy_cores.sh .venv/bin/python -m pytest -p no:xdist tests/api/test_jobs.py -q
set -euo pipefail
read -r _ u n s i w q sq _ < /proc/stat
t0=$(date +%s.%N)
status=0
"$@" || status=$?
read -r _ u2 n2 s2 i2 w2 q2 sq2 _ < /proc/stat
t1=$(date +%s.%N)
hz=$(getconf CLK_TCK)
busy=$(( (u2 + n2 + s2 + q2 + sq2) - (u + n + s + q + sq) ))
idle=$(( (i2 + w2) - (i + w) ))
echo "wall $(python3 -c "print(f'{$t1 - $t0:.1f}')") s; busy $((busy / hz)) core-s; idle $((idle / hz)) core-s"
exit $status
