// run/blas_cores.c: what run/blas_cores.h declares.
#include "run/blas_cores.h"

#include "run/seams.h"

// How capable a kernel family is (its level): 3 AVX-512, 2 AVX2+FMA, 1 AVX, 0 SSE only; -1
// for a name not listed (a newer OpenBLAS's name: assume it knows what it is doing). Levels,
// not exact names, are compared: on an AMD CPU OpenBLAS may pick Haswell, as good as Zen.
static int blas_core_level(const char* name) {
    static const char* const by_level[4] = {
        " unknown generic katmai coppermine northwood prescott banias atom core2 penryn dunnington"
        " nehalem athlon opteron opteron_sse3 barcelona nano bobcat ",
        " sandybridge bulldozer piledriver steamroller excavator ",
        " haswell zen ",
        " skylakex cooperlake sapphirerapids ",
    };
    char word[40];
    if (!name || strlen(name) + 3 > sizeof(word)) return -1;
    snprintf(word, sizeof(word), " %s ", name);
    for (char* p = word; *p; p++) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p);
    for (int level = 3; level >= 0; level--)
        if (strstr(by_level[level], word)) return level;
    return -1;
}

#ifdef BLAS_CORES_X86
// The best core name OpenBLAS 0.3.21 accepts in OPENBLAS_CORETYPE for this CPU, or NULL
// when SSE kernels are all it can use. *features describes what was found, for messages.
static const char* blas_cpu_best_core(const char** features) {
    unsigned a = 0, b = 0, c = 0, d = 0, vendor[3];
    if (!__get_cpuid_count(0, 0, &a, &vendor[0], &vendor[2], &vendor[1])) return NULL;
    unsigned max_leaf = a;
    __get_cpuid_count(1, 0, &a, &b, &c, &d);
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    // The CPU having AVX is not enough: the OS must save the ymm (XCR0 bits 1-2) and for
    // AVX-512 also the opmask and zmm state (bits 5-7), or the instructions fault.
    unsigned xcr0 = 0;
    if (osxsave) {
        unsigned hi;
        __asm__ volatile("xgetbv" : "=a"(xcr0), "=d"(hi) : "c"(0));
    }
    int ymm = (xcr0 & 0x06) == 0x06, zmm = ymm && (xcr0 & 0xe0) == 0xe0;
    unsigned ebx7 = 0;
    if (max_leaf >= 7) __get_cpuid_count(7, 0, &a, &ebx7, &c, &d);
    // SkylakeX kernels are built for F, CD, BW, DQ and VL (bits 16, 28, 30, 17, 31); F alone
    // (Xeon Phi) is not enough. Cooperlake's kernels differ only in bf16 sbgemm, which we
    // never call, and 0.3.21 rejects OPENBLAS_CORETYPE=Cooperlake: SkylakeX for all.
    const unsigned avx512 = 1u << 16 | 1u << 17 | 1u << 28 | 1u << 30 | 1u << 31;
    if (zmm && (ebx7 & avx512) == avx512) {
        *features = "AVX-512";
        return "SkylakeX";
    }
    if (ymm && avx && fma && ((ebx7 >> 5) & 1)) {
        *features = "AVX2 and FMA";
        int amd = !memcmp(vendor, "AuthenticAMD", 12) || !memcmp(vendor, "HygonGenuine", 12);
        return amd ? "Zen" : "Haswell";
    }
    if (ymm && avx) {
        *features = "AVX";
        return "Sandybridge";
    }
    return NULL;
}
#endif

// The name the kernel gave the process before the restart: its program's file name, as
// in argv[0] (the exec of /proc/self/exe made it "exe").
static void blas_take_back_name(const char* argv0) {
#ifdef __linux__
    const char* slash = argv0 ? strrchr(argv0, '/') : NULL;
    const char* name = slash ? slash + 1 : argv0;
    if (name && *name) prctl(PR_SET_NAME, name, 0, 0, 0);  // the kernel keeps 15 characters, as at exec
#else
    (void)argv0;
#endif
}

void blas_pick_kernels(char** argv) {
#ifdef BLAS_CORES_X86
    if (!openblas_get_corename) return;
    const char* user = getenv("OPENBLAS_CORETYPE");
    int restarted = getenv("LLMC_BLAS_REEXEC") != NULL;
    if (user && *user && !restarted) return;  // the user's choice (OpenBLAS ignores "")
    unsetenv("LLMC_BLAS_REEXEC");             // not inherited by programs we start
    if (restarted) blas_take_back_name(argv[0]);
    const char* chosen = openblas_get_corename();
    const char* fake = seam_blas_corename();  // a test build's
    if (fake && !restarted) chosen = fake;
    const char* features = "";
    const char* best = blas_cpu_best_core(&features);
    int level = blas_core_level(chosen);
    if (!best || level < 0 || level >= blas_core_level(best)) return;
    int loud = utils_rank() == 0;  // a job's hosts normally have one CPU model: one line is enough
    if (restarted) {
        if (loud)
            fprintf(stderr, "blas: warning: OpenBLAS still runs the %s kernels after restarting with "
                    "OPENBLAS_CORETYPE=%s; going on with them (matmuls will be slow)\n", chosen, user ? user : "");
        return;
    }
    if (loud) {
        printf("blas: OpenBLAS chose the %s kernels on a CPU with %s; restarting with OPENBLAS_CORETYPE=%s "
               "(set OPENBLAS_CORETYPE yourself to choose)\n", chosen, features, best);
        fflush(stdout);  // exec drops whatever stdio still buffers
    }
    setenv("OPENBLAS_CORETYPE", best, 1);
    setenv("LLMC_BLAS_REEXEC", "1", 1);
    execv("/proc/self/exe", argv);
    int err = errno;
    // Only on failure: undo, so that nothing downstream mistakes the variables for the user's.
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("LLMC_BLAS_REEXEC");
    if (loud) fprintf(stderr, "blas: warning: could not restart (%s); going on with the %s kernels\n",
                      strerror(err), chosen);
#else
    (void)argv;
#endif
}
