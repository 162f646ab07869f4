/*
 * The single-rank communicator: with one rank every collective is the identity, so
 * nothing is moved and every handle is complete at once (ordering holds trivially: the
 * buffer already is the result, in compute-stream order).
 */
#include <stdlib.h>

#include "llmc/utils.h"
#include "zero1/comm.h"

static Zero1Handle single_noop(Zero1Comm* c, void* buf, size_t n, Zero1Dtype t, int bucket) { return -1; }
static void single_wait(Zero1Comm* c, Zero1Handle h) {}
static int single_test(Zero1Comm* c, Zero1Handle h) { return 1; }
static void single_nothing(Zero1Comm* c) {}
static void single_destroy(Zero1Comm* c) { free(c); }

Zero1Comm* zero1_comm_single_create(const Zero1Device* dev) {
    Zero1Comm* c = (Zero1Comm*)callocCheck(1, sizeof(Zero1Comm));
    c->rank = 0;
    c->size = 1;
    c->name = "single";
    c->reduce_scatter = single_noop;
    c->all_gather = single_noop;
    c->all_reduce = single_noop;
    c->wait = single_wait;
    c->test = single_test;
    c->progress = single_nothing;
    c->group_begin = single_nothing;
    c->group_end = single_nothing;
    c->destroy = single_destroy;
    return c;
}
