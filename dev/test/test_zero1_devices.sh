#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=fast,full
# The deferred test device and the hazard communicator against the device and
# communicator contracts (dev/test/test_zero1_devices.c): once without MPI (the device,
# and the hazard over the single communicator), then the hazard over MPI at np 1, 2, 3,
# direct on the CPU device and staged on the deferred device.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
make -s test_zero1_devices >/dev/null || fatal "build test_zero1_devices"
check "the devices and the hazard communicator without MPI" timeout 120 ./test_zero1_devices
for np in 1 2 3; do
    check "the hazard communicator over MPI, np=$np" timeout 120 "${MPIRUN[@]}" -np $np ./test_zero1_devices --mpi
done
done_testing
