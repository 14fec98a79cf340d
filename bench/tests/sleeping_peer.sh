#!/bin/sh
# A peer that never finishes, for the tests of the benchmarks' time limit: it says it started,
# then waits on a child of its own (which the time limit must stop too).
echo "sleeping peer started: $*"
sleep 600 &
wait
