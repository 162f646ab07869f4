/*
 * The CPU trainer's test options at work (dev/test/testing_options.h): include after
 * train_gpt2.c (built with TESTING), parse testing_option_table(1) with the trainer's
 * flags, then call testing_use_options(): the trainer's zero1/ plugin is then built on the
 * device and communicators the options ask for.
 */
#ifndef DEV_TEST_TESTING_CPU_H
#define DEV_TEST_TESTING_CPU_H

#include "dev/test/testing_options.h"

#ifdef USE_ZERO1
static Zero1Backend* testing_backend_cpu(const TrainConfig* cfg, int world) {
    Zero1Backend* be;
    if (strcmp(testing_options.device, "deferred") == 0) {
        be = (Zero1Backend*)callocCheck(1, sizeof(Zero1Backend));
        be->device = zero1_device_deferred_create();
        be->destroy_device = zero1_device_deferred_destroy;
        be->host_view = zero1_device_deferred_host_view;
        zero1_backend_cpu_on(cfg, world, be);
    } else {
        be = zero1_backend_cpu(cfg, world);
    }
    return testing_wrap_backend(be, (unsigned)cfg->seed);
}

static Optimizer* testing_cpu_optimizer(const TrainConfig* cfg, const GPT2Config* mc, int world) {
    return zero1_gpt2_optimizer(cfg, mc, testing_backend_cpu(cfg, world), ZERO1_FP32);
}
#endif

static inline void testing_use_options(void) {
    testing_options_check(plugin_optimizer != NULL);
#ifdef USE_ZERO1
    plugin_optimizer = testing_cpu_optimizer;
#endif
}

#endif
