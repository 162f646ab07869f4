/*
 * cuda_cpu/tests/layer_test.h: what the layer's CUDA tests share (test_layer.cu,
 * test_tools.cu, test_memcheck.cu, test_boundary.cu): TAP lines (tap.h), and child
 * processes: a case that must end in a fault (a fault is sticky, as on a GPU) or needs its
 * own environment runs as this same program with the case's name as its argument.
 */
#ifndef CUDA_CPU_TESTS_LAYER_TEST_H
#define CUDA_CPU_TESTS_LAYER_TEST_H

#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_cpu/tests/tap.h"

extern char** environ;

static void check(int ok, const char* what) { tap_ok(ok, "%s", what); }

// Runs `self name` with our environment plus env (one NAME=value, or NULL); returns its exit
// status (128 + signal when killed) and its stderr in err.
static int run_case(const char* self, const char* name, const char* env, char* err, size_t n) {
    char path[] = "/tmp/cuda_cpu_case_stderr.XXXXXX";
    int fd = mkstemp(path);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, 2);
    char* argv[] = {(char*)self, (char*)name, NULL};
    int count = 0;
    while (environ[count]) count++;
    char** envp = (char**)calloc(count + 2, sizeof(char*));
    for (int i = 0; i < count; i++) envp[i] = environ[i];
    if (env) envp[count] = (char*)env;
    pid_t pid;
    int status = -1;
    if (posix_spawn(&pid, self, &fa, NULL, argv, envp) == 0) waitpid(pid, &status, 0);
    free(envp);
    lseek(fd, 0, SEEK_SET);
    ssize_t got = read(fd, err, n - 1);
    err[got > 0 ? got : 0] = '\0';
    close(fd);
    unlink(path);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A case run as above must exit with want_exit and print each of needles (NULL-ended, or NULL)
// on stderr; one TAP line, and the case's stderr when it fails.
static inline void expect(const char* self, const char* name, const char* env, int want_exit,
                          const char* const* needles, const char* what) {
    char err[16384];
    int code = run_case(self, name, env, err, sizeof(err));
    int ok = code == want_exit;
    for (int i = 0; needles && needles[i]; i++) ok &= strstr(err, needles[i]) != NULL;
    check(ok, what);
    if (!ok) printf("    exit %d (want %d), stderr:\n%s\n", code, want_exit, err);
}

#endif
