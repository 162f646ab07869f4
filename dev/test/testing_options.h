/*
 * The trainer options that only test binaries have (the product's -h lists none of them):
 * test_gpt2, test_gpt2cu, test_zero1 and train_gpt2_testing parse this table besides the
 * trainer's (run/config.h: config_parse) and build zero1/'s backend from
 * zero1/testing/'s doubles where it asks for them.
 *   --test-hazard               every zero1/ communicator wrapped in the hazard one
 *   --test-device cpu|deferred  the CPU trainer's zero1/ device (dev/test/testing_cpu.h)
 */
#ifndef DEV_TEST_TESTING_OPTIONS_H
#define DEV_TEST_TESTING_OPTIONS_H

#include <stddef.h>
#include <string.h>

#include "run/config.h"
#include "run/files.h"

typedef struct {
    const char* device;
    int hazard;
} TestingOptions;

#define TESTING_OPTIONS_NONE {"cpu", 0}
static TestingOptions testing_options = TESTING_OPTIONS_NONE;

// --test-hazard first: the GPU harness takes it alone (the deferred device is a CPU device).
static const OptionSpec TESTING_OPTIONS[] = {
    {NULL, "--test-hazard", OPT_FLAG, offsetof(TestingOptions, hazard), 0, 0,
     "test: zero1/'s collectives read NaN in their buffers while in flight (zero1/testing/comm_hazard.c)"},
    {NULL, "--test-device", OPT_STR, offsetof(TestingOptions, device), 0, 0,
     "test: zero1/'s device, cpu or deferred (every op as late as ordering allows: zero1/testing/device_deferred.c)"},
};

static inline OptionTable testing_option_table(int with_device) {
    OptionTable t = {TESTING_OPTIONS, with_device ? 2 : 1, &testing_options};
    return t;
}

// After parsing: the options act on the zero1/ plugin, which this build must have.
static inline void testing_options_check(int have_plugin) {
    cli_choice("--test-device", testing_options.device, "cpu|deferred");
    if (!have_plugin && (testing_options.hazard || strcmp(testing_options.device, "cpu") != 0)) {
        fatal("--test-hazard and --test-device act on the zero1/ plugin: build with USE_ZERO1=1");
    }
}

#ifdef USE_ZERO1
#include "zero1/optimizer.h"
#include "zero1/testing/test_doubles.h"

// --test-hazard: the backend's communicators (comm, and cross with --dist-opt-instances)
// behind hazard ones, each with its own seed.
static inline Zero1Backend* testing_wrap_backend(Zero1Backend* be, unsigned seed) {
    if (!testing_options.hazard) return be;
    be->comm = zero1_comm_hazard_create(be->comm, &be->device, seed);
    if (be->cross) be->cross = zero1_comm_hazard_create(be->cross, &be->device, seed + 1);
    return be;
}
#endif

#endif
