/*
 * train_gpt2_testing: the CPU trainer (train_gpt2.c, built with USE_ZERO1) with the test
 * options of dev/test/testing_options.h, for the scripts that run the whole trainer on
 * zero1/testing/'s doubles, e.g.
 *   mpirun -np 3 ./train_gpt2_testing -e d2 -z 1 --test-device deferred --test-hazard
 */
#define TESTING
#include "train_gpt2.c"

#include "dev/test/testing_cpu.h"

// The options are parsed by now: the plugin is built on what they ask for.
static void* testing_trainer_create(const TrainConfig* cfg, int rank, int world, TrainerParts* parts) {
    testing_use_options();
    return trainer_create(cfg, rank, world, parts);
}

int main(int argc, char** argv) {
    TrainerKind kind = CPU_TRAINER;
    kind.create = testing_trainer_create;
    OptionTable testing = testing_option_table(1);
    return train_main(argc, argv, &kind, &testing, 1);
}
