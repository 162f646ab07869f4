/*
 * zero1/testing/test_doubles.h: the test device and communicator, linked only into test
 * binaries (the harnesses of dev/test/ swap them in: dev/test/testing_options.h).
 *   device_deferred.c  keeps device_ops.h's contract and nothing more: device pointers the
 *                      host cannot dereference, every op run as late as ordering allows
 *   comm_hazard.c      wraps a real communicator so that comm.h's "in flight" rule bites:
 *                      a collective's regions read NaN until its handle is finished
 * docs/testing.md explains how each catches what it is for.
 */
#ifndef ZERO1_TESTING_TEST_DOUBLES_H
#define ZERO1_TESTING_TEST_DOUBLES_H

#include <stddef.h>

#include "zero1/comm.h"
#include "zero1/device_ops.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const Zero1DeviceOps zero1_device_deferred_ops;

// The deferred test device. Its own state; destroy when done.
Zero1Device zero1_device_deferred_create(void);
void zero1_device_deferred_destroy(Zero1Device* dev);
// The host address behind a range of the deferred device's memory, for a model that runs
// on the host (the CPU trainer's): it may touch it only where it has synced the compute
// stream, as if its work were queued there.
void* zero1_device_deferred_host_view(const Zero1Device* dev, const void* p, size_t bytes);

// Wraps inner (which keeps its ordering) so that every collective's region reads NaN bytes
// (0xFF) while in flight and its result appears only when the handle is finished; test()
// answers "not yet" at random (seeded). Takes ownership of inner.
Zero1Comm* zero1_comm_hazard_create(Zero1Comm* inner, const Zero1Device* dev, unsigned seed);

#ifdef __cplusplus
}
#endif
#endif
