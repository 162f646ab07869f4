// run/test_hooks.c: what run/test_hooks.h declares.
#include "run/test_hooks.h"

static TestHooks test_hooks;

// NAME=STEP, or NAME=STEP+ where from_plus allows it, or NAME=STEP:X where value is
// given (*value: X; unchanged without it).
static TestHookSteps test_hooks_steps_from_env(const char* name, int from_plus, float* value) {
    TestHookSteps at = {-1, 0};
    const char* text = getenv(name);
    if (text == NULL || *text == '\0') return at;
    char* end;
    long step = strtol(text, &end, 10);
    at.from_on = from_plus && *end == '+';
    if (at.from_on) end++;
    if (value && *end == ':') *value = strtof(end + 1, &end);
    if (*end != '\0' || step < 0 || step > 1000000000L) {
        fatal("%s = '%s': expected a 0-based step%s%s", name, text, from_plus ? " (STEP+: every step from it)" : "",
              value ? " (STEP:X: the value X)" : "");
    }
    at.step = (int)step;
    return at;
}

static int test_hooks_acts(const TestHookSteps* at, int step) {
    return at->step >= 0 && (step == at->step || (at->from_on && step > at->step));
}

static void test_hooks_grad_done(void* ctx, int tensor) {
    TestHooks* h = &test_hooks;
    if (tensor == gpt2_idx_layer(0, LAYER_QKVB) && h->contributions++ == h->micro_steps - 1) {
        int nan = test_hooks_acts(&h->plant_nan, h->step), spike = test_hooks_acts(&h->grad_spike, h->step);
        if (nan || spike) {
            fprintf(stderr, "test: rank %d plants %s in h0.qkvb's gradient at step %d (%s)\n", utils_rank(),
                    nan ? "a NaN" : "a spike", h->step + 1, nan ? "LLMC_TEST_PLANT_NAN" : "LLMC_TEST_GRAD_SPIKE");
            h->write_grad(h->trainer, tensor, nan ? NAN : h->spike_value);
        }
    }
    if (h->inner.grad_contribution_done) h->inner.grad_contribution_done(ctx, tensor);
}

// The forward's last block (block L) ends after the loss: in the step's last micro-step, the
// loss becomes NaN. Evaluations run between steps and count into the step before, past its
// micro-steps, so they never match.
static void test_hooks_forward_end(void* ctx, int block) {
    TestHooks* h = &test_hooks;
    if (block == h->last_block && h->forwards++ == h->micro_steps - 1 && test_hooks_acts(&h->nan_loss, h->step)) {
        fprintf(stderr, "test: rank %d makes its loss NaN at step %d (LLMC_TEST_NAN_LOSS)\n", utils_rank(), h->step + 1);
        h->write_loss(h->trainer, NAN);
    }
    if (h->inner.forward_block_end) h->inner.forward_block_end(ctx, block);
}

void test_hooks_install(ModelHooks* hooks, void* trainer,
                        void (*write_grad)(void* trainer, int tensor, float value),
                        void (*write_loss)(void* trainer, float value), const TrainConfig* cfg,
                        const GPT2Config* mc, int micro_steps, int rank, int world) {
    TestHooks* h = &test_hooks;
    h->installed = 1;
    h->step = -1;
    h->plant_nan = test_hooks_steps_from_env("LLMC_TEST_PLANT_NAN", 1, NULL);
    h->spike_value = TEST_HOOKS_GRAD_SPIKE;
    h->grad_spike = test_hooks_steps_from_env("LLMC_TEST_GRAD_SPIKE", 0, &h->spike_value);
    h->loss_spike = test_hooks_steps_from_env("LLMC_TEST_LOSS_SPIKE", 0, NULL);
    h->nan_loss = test_hooks_steps_from_env("LLMC_TEST_NAN_LOSS", 1, NULL);
    h->micro_steps = micro_steps;
    h->positions = cfg->B * cfg->T;
    h->vocab_size = mc->vocab_size;
    h->last_block = mc->num_layers;
    if (rank != world - 1) return;
    h->inner = *hooks;  // the wrappers call on with the optimizer's ctx, which stays in hooks
    h->trainer = trainer;
    h->write_grad = write_grad;
    h->write_loss = write_loss;
    if (h->plant_nan.step >= 0 || h->grad_spike.step >= 0) hooks->grad_contribution_done = test_hooks_grad_done;
    if (h->nan_loss.step >= 0) hooks->forward_block_end = test_hooks_forward_end;
}

static void test_hooks_spiked_batch(void* ctx, int micro, const int** inputs, const int** targets) {
    TestHooks* h = (TestHooks*)ctx;
    h->batch(h->batch_ctx, micro, inputs, targets);
    if (!h->targets) h->targets = (int*)mallocCheck((size_t)h->positions * sizeof(int));
    for (int i = 0; i < h->positions; i++) h->targets[i] = h->vocab_size - 1;
    *targets = h->targets;
}

void test_hooks_begin_step(int step, BatchFn* batch, void** batch_ctx) {
    TestHooks* h = &test_hooks;
    h->step = step;
    h->contributions = h->forwards = 0;
    if (h->installed && test_hooks_acts(&h->loss_spike, step)) {
        h->batch = *batch;
        h->batch_ctx = *batch_ctx;
        *batch = test_hooks_spiked_batch;
        *batch_ctx = h;
    }
}
