// run/test_stop.c: what run/test_stop.h declares.
#include "run/test_stop.h"

// LLMC_TEST_STOP, parsed once; a malformed value is an error (a test that meant to stop
// somewhere must not run on unstopped).
static int test_stop_specs(const TestStop** out) {
    static TestStop specs[TEST_STOP_MAX];
    static int count = -1;
    if (count < 0) {
        count = 0;
        const char* env = getenv("LLMC_TEST_STOP");
        for (const char* p = env; p && *p && count < TEST_STOP_MAX;) {
            TestStop* s = &specs[count];
            char rank[16];
            int used = 0;
            if (sscanf(p, "%23[a-z_]:%15[0-9*]:%ld%n", s->point, rank, &s->n, &used) != 3 || (p[used] && p[used] != ',')) {
                fatal("LLMC_TEST_STOP = '%s': expected POINT:RANK:N[,POINT:RANK:N...] (RANK a number or *)", env);
            }
            s->rank = strcmp(rank, "*") == 0 ? -1 : atoi(rank);
            count++;
            p += used + (p[used] == ',');
        }
    }
    *out = specs;
    return count;
}

void test_stop_at(const char* point, long n, const char* where) {
    const TestStop* specs;
    int count = test_stop_specs(&specs);
    for (int i = 0; i < count; i++) {
        const TestStop* s = &specs[i];
        if (strcmp(s->point, point) != 0 || s->n != n || (s->rank >= 0 && s->rank != utils_rank())) continue;
        char mark[16], fired[16 * TEST_STOP_MAX] = "";
        snprintf(mark, sizeof(mark), ",%d,", i);
        const char* before = getenv("LLMC_TEST_STOP_FIRED");
        if (before && strstr(before, mark)) continue;
        snprintf(fired, sizeof(fired), "%s%s", before ? before : "", mark);
        setenv("LLMC_TEST_STOP_FIRED", fired, 1);
        fflush(stdout);
        fprintf(stderr, "test: rank %d stops itself %s %ld (LLMC_TEST_STOP, pid %ld)\n", utils_rank(), where, n,
                (long)getpid());
        fflush(stderr);
        raise(SIGSTOP);
    }
}

void test_stop_in_wait(const char* what) {
    const TestStop* specs;
    if (test_stop_specs(&specs) == 0) return;
    const char* at = strstr(what, " at step ");
    long step = at ? strtol(at + 9, NULL, 10) : 0;
    if (step > 0) test_stop_at("wait", step, "in a deadline wait, right after its clock read, at step");
}
