// run/threads.c: what run/threads.h declares.
#include "run/threads.h"

#include <pthread.h>

// A thread count from the environment, checked as libgomp and OpenBLAS do not: libgomp
// ignores "abc" or "0" with a warning and crashes starting 100,000 threads. Digits only, from 1
// to THREADS_MAX; 0 when the variable is unset or empty.
static int threads_env_count(const char* name) {
    const char* v = getenv(name);
    uint64_t n = 0;
    if (!v || !*v) return 0;
    if (!parse_u64_strict(v, &n) || n < 1 || n > THREADS_MAX)
        fatal("%s='%s': give a whole number of threads per rank from 1 to %d, or unset it (then one thread per core)",
              name, v, THREADS_MAX);
    return (int)n;
}

static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t probe_go = PTHREAD_COND_INITIALIZER;
static int probe_done;
static void* threads_probe_wait(void* arg) {
    (void)arg;
    pthread_mutex_lock(&probe_lock);
    while (!probe_done) pthread_cond_wait(&probe_go, &probe_lock);
    pthread_mutex_unlock(&probe_lock);
    return NULL;
}

// Starts n - 1 threads that all live at once, as OpenMP's pool will: a limit on threads
// (cgroup pids.max, ulimit -u, memory for their stacks) is then this one error, not libgomp's
// exit without one at the first parallel region.
static void threads_probe(int n) {
    pthread_t* ids = (pthread_t*)mallocCheck((size_t)n * sizeof(pthread_t));
    int started = 0, err = 0;
    probe_done = 0;
    while (started < n - 1 && (err = pthread_create(&ids[started], NULL, threads_probe_wait, NULL)) == 0) started++;
    pthread_mutex_lock(&probe_lock);
    probe_done = 1;
    pthread_cond_broadcast(&probe_go);
    pthread_mutex_unlock(&probe_lock);
    for (int i = 0; i < started; i++) pthread_join(ids[i], NULL);
    free(ids);
    if (err)
        fatal("could not start %d threads per rank (thread %d: %s): the limit on threads (ulimit -u, cgroup "
              "pids.max) or on memory (ulimit -v) is too small; set OMP_NUM_THREADS lower",
              n, started + 1, strerror(err));
}

static int core_set_count(const CoreSet* s) {
    int n = 0;
    for (int i = 0; i < 16; i++) n += __builtin_popcountll(s->bits[i]);
    return n;
}

// The cores this process may run on; all the machine's when the kernel will not say.
static CoreSet threads_allowed_cores(void) {
    CoreSet s;
    memset(&s, 0, sizeof(s));
    if (syscall(SYS_sched_getaffinity, 0, sizeof(s.bits), s.bits) > 0 && core_set_count(&s) > 0) return s;
    memset(&s, 0, sizeof(s));
    for (int c = 0; c < omp_get_num_procs() && c < 1024; c++) s.bits[c / 64] |= 1ull << (c % 64);
    return s;
}

// The ranks of this host whose allowed cores overlap `mine` (MPI's shared-memory split:
// one communicator per host), this rank included.
static int threads_ranks_sharing(const CoreSet* mine) {
    MPI_Comm host;
    mpiDeadline("the thread set-up's MPI_Comm_split_type",
                MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host));
    int n;
    mpiCheck(MPI_Comm_size(host, &n));
    CoreSet* all = (CoreSet*)mallocCheck((size_t)n * sizeof(CoreSet));
    MPI_Request request;
    mpiCheck(MPI_Iallgather(mine, (int)sizeof(CoreSet), MPI_BYTE, all, (int)sizeof(CoreSet), MPI_BYTE, host, &request));
    mpi_wait_deadline(&request, "the thread set-up's exchange of core sets", -1);
    int sharing = 0;
    for (int r = 0; r < n; r++) {
        uint64_t overlap = 0;
        for (int i = 0; i < 16; i++) overlap |= mine->bits[i] & all[r].bits[i];
        sharing += overlap != 0;
    }
    free(all);
    mpiDeadline("the thread set-up's MPI_Comm_free", MPI_Comm_free(&host));
    return sharing > 0 ? sharing : 1;
}

CpuThreads cpu_threads_setup(void) {
    CpuThreads t;
    memset(&t, 0, sizeof(t));
    CoreSet mine = threads_allowed_cores();
    t.cores = core_set_count(&mine);
    t.sharing = threads_ranks_sharing(&mine);
    int omp_env = threads_env_count("OMP_NUM_THREADS");
    t.user_omp = omp_env > 0;
    t.user_blas = threads_env_count("OPENBLAS_NUM_THREADS") > 0;
    t.blas_openmp = openblas_get_parallel && openblas_get_parallel() == 2;
    t.threads = t.user_omp ? omp_env : (t.cores / t.sharing > 0 ? t.cores / t.sharing : 1);
    threads_probe(t.threads);
    // OpenBLAS's OpenMP build sets OpenMP's thread count along with its own: it goes first.
    if (!t.user_blas && openblas_set_num_threads) openblas_set_num_threads(t.blas_openmp ? t.threads : 1);
    omp_set_num_threads(t.threads);
    t.blas_threads = openblas_get_num_threads ? openblas_get_num_threads() : 1;
    return t;
}

void cpu_threads_describe(const CpuThreads* t, char* buf, size_t n) {
    char why[96], blas[160];
    if (t->user_omp) snprintf(why, sizeof(why), "OMP_NUM_THREADS=%s, yours", getenv("OMP_NUM_THREADS"));
    else snprintf(why, sizeof(why), "%d core%s for %d rank%s of this host", t->cores, t->cores == 1 ? "" : "s",
                  t->sharing, t->sharing == 1 ? "" : "s");
    if (matmul_split_threads()) snprintf(blas, sizeof(blas), "OpenBLAS 1 thread%s", t->threads > 1 ? ", each matmul split over the threads" : "");
    else if (t->blas_openmp) snprintf(blas, sizeof(blas), "OpenBLAS's OpenMP build, %d thread%s from the same pool",
                                      t->blas_threads, t->blas_threads == 1 ? "" : "s");
    else snprintf(blas, sizeof(blas), "OpenBLAS %d threads of its own beside them", t->blas_threads);
    snprintf(buf, n, "threads: %d per rank (%s); %s%s%s%s", t->threads, why, blas, t->user_blas ? " (OPENBLAS_NUM_THREADS=" : "",
             t->user_blas ? getenv("OPENBLAS_NUM_THREADS") : "", t->user_blas ? ", yours)" : "");
}
