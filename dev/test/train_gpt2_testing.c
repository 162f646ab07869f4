/*
 * train_gpt2_testing: the CPU trainer (train_gpt2.c, built with USE_ZERO1) with the test
 * options of dev/test/testing_options.h, for the scripts that run the whole trainer on
 * zero1/testing/'s doubles, e.g.
 *   mpirun -np 3 ./train_gpt2_testing -e d2 -z 1 --test-device deferred --test-hazard
 */
#define TESTING
#include "train_gpt2.c"

#include "dev/test/testing_cpu.h"

int main(int argc, char** argv) {
    blas_pick_kernels(argv);
    Run run;
    OptionTable testing = testing_option_table(1);
    run_begin(&run, &argc, &argv, &TRAINER_BUILD, &testing, 1);
    testing_use_options();  // the plugin is built on what the options ask for
    return train(&run);
}
