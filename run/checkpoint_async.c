// run/checkpoint_async.c: what run/checkpoint_async.h declares.
#include "run/checkpoint_async.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "run/seams.h"
#include "run/watchdog.h"

#define ASYNC_WAIT_ROUND_S 0.1  // a waiting rank reports to the others this often

static int async_status(const CheckpointAsync* a) { return __atomic_load_n(&a->status, __ATOMIC_ACQUIRE); }

static void async_progress_now(CheckpointAsync* a) {
    double now = watchdog_monotonic_s();
    __atomic_store(&a->progress_s, &now, __ATOMIC_RELEASE);
}

static void* async_fail(CheckpointAsync* a, int fd, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->error, sizeof(a->error), fmt, ap);
    va_end(ap);
    if (fd >= 0) close(fd);
    __atomic_store_n(&a->status, ASYNC_FAILED, __ATOMIC_RELEASE);
    return NULL;
}

static int async_pwrite_all(int fd, const unsigned char* p, uint64_t bytes, uint64_t offset) {
    while (bytes > 0) {
        ssize_t n = pwrite(fd, p, bytes, (off_t)offset);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            if (n == 0) errno = ENOSPC;
            return 0;
        }
        p += n;
        bytes -= (uint64_t)n;
        offset += (uint64_t)n;
    }
    return 1;
}

// The writer thread: this rank's rounds of both files from the snapshot, each file synced
// and closed, the rounds' reports in a->crcs. No MPI here.
static void* async_writer(void* arg) {
    CheckpointAsync* a = (CheckpointAsync*)arg;
    // The lowest priority (Linux: per thread): the step's threads keep their cores (the CPU
    // trainer uses them all), the write only has to end before the next save.
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
    const unsigned char* at = a->snapshot;
    CheckpointCrc* report = a->crcs;
    for (int k = 0; k < 2; k++) {
        const CheckpointFilePlan* f = &a->transfer.plans[k];
        // tests: a writer whose disk hangs (only this thread stops: run/seams.h)
        if (k == 0) seam_stop_at("save_write", f->step, "in the background write of the checkpoint of step");
        int fd = open(f->path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0) return async_fail(a, -1, "cannot create %s: %s", f->path, strerror(errno));
        for (int i = 0; i < f->num_rounds; i++) {
            const CheckpointRound* r = &f->rounds[i];
            if (!async_pwrite_all(fd, at, r->bytes, r->offset)) {
                return async_fail(a, fd, "cannot write %s at byte %" PRIu64 ": %s (is the disk full?)", f->path,
                                  r->offset, strerror(errno));
            }
            CheckpointCrc c = {r->offset, r->bytes, crc32c(at, r->bytes), f->file, checkpoint_round_nonfinite(f, r, at)};
            *report++ = c;
            at += r->bytes;
            async_progress_now(a);
        }
        // On stable storage before the manifest can say the checkpoint is whole.
        if (fsync(fd) != 0) return async_fail(a, fd, "cannot sync %s: %s", f->path, strerror(errno));
        if (close(fd) != 0) return async_fail(a, -1, "cannot close %s: %s", f->path, strerror(errno));
        async_progress_now(a);
    }
    __atomic_store_n(&a->status, ASYNC_DONE, __ATOMIC_RELEASE);
    return NULL;
}

void checkpoint_async_begin(CheckpointAsync* a, const char* out_dir, const GPT2Config* cfg, Optimizer* o,
                            const CheckpointState* s, double timeout_s) {
    if (a->in_flight) fatal("checkpoint: the save of step %d is still in flight at step %d's (a bug)", a->state.step, s->step);
    double t0 = wall_ms();
    char tmp[PATH_MAX_LEN];
    checkpoint_save_begin(out_dir, s->step, tmp, sizeof(tmp));
    a->num_rounds = checkpoint_plan_transfer(&a->transfer, tmp, cfg, o, s->step, checkpoint_staging_bytes());
    size_t bytes = 0;
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < a->transfer.plans[k].num_rounds; i++) bytes += a->transfer.plans[k].rounds[i].bytes;
    }
    if (bytes > a->snapshot_cap) {  // the same every save: allocated once
        free(a->snapshot);
        a->snapshot = (unsigned char*)mallocCheck(bytes);
        a->snapshot_cap = bytes;
    }
    a->crcs = (CheckpointCrc*)mallocCheck((size_t)(a->num_rounds ? a->num_rounds : 1) * sizeof(CheckpointCrc));
    unsigned char* at = a->snapshot;
    for (int k = 0; k < 2; k++) {
        const CheckpointFilePlan* f = &a->transfer.plans[k];
        for (int i = 0; i < f->num_rounds; i++) {
            checkpoint_stage_round(f, &f->rounds[i], o, at, 1);
            at += f->rounds[i].bytes;
        }
    }
    a->state = *s;
    a->out_dir = out_dir;
    a->cfg = cfg;
    a->opt = o;
    a->timeout_s = timeout_s;
    a->t0_ms = t0;
    a->error[0] = '\0';
    __atomic_store_n(&a->status, ASYNC_WRITING, __ATOMIC_RELEASE);
    async_progress_now(a);
    a->seen_progress_s = a->last_look_s = a->progress_s;
    a->quiet_s = 0;
    crc32c("", 0);  // its tables and CPU check are filled on first use: here, before the writer's
    int rc = pthread_create(&a->thread, NULL, async_writer, a);
    if (rc != 0) fatal("--async-save: cannot start the checkpoint writer thread: %s", strerror(rc));
    a->in_flight = 1;
    a->snapshot_ms = wall_ms() - t0;
}

// Whether the writer has gone --comm-timeout without completing a write, counted as
// run/watchdog.h counts a deadline: only time this process ran (a gap of more than
// WATCHDOG_STOPPED_GAP_S between two looks, a job stopped and continued, counts nothing).
static int async_stalled(CheckpointAsync* a) {
    double now = watchdog_monotonic_s(), progress, gap = now - a->last_look_s;
    __atomic_load(&a->progress_s, &progress, __ATOMIC_ACQUIRE);
    a->last_look_s = now;
    if (progress != a->seen_progress_s) {
        a->seen_progress_s = progress;
        a->quiet_s = 0;
    } else if (gap <= WATCHDOG_STOPPED_GAP_S) {
        a->quiet_s += gap;
    }
    return a->timeout_s > 0 && a->quiet_s > a->timeout_s;
}

// This rank's writer: done, failed, stalled, or still writing after up to wait_s seconds.
static int async_local_status(CheckpointAsync* a, double wait_s) {
    double until = watchdog_monotonic_s() + wait_s;
    for (;;) {
        int status = async_status(a);
        if (status != ASYNC_WRITING) return status;
        if (async_stalled(a)) return ASYNC_STALLED;
        if (watchdog_monotonic_s() >= until) return ASYNC_WRITING;
        usleep(1000);
    }
}

// Collective: the rank whose writer failed or stalled says why, and every rank stops with
// that line (rank 0's is the one printed: run/error.h).
static void async_stop(CheckpointAsync* a, int bad_rank, int status) {
    char why[2 * PATH_MAX_LEN + 512] = "";
    if (utils_rank() == bad_rank && status == ASYNC_FAILED) {
        snprintf(why, sizeof(why), "checkpoint save of step %d: rank %d's background write failed: %s (the earlier "
                 "checkpoints are kept)", a->state.step, bad_rank, a->error);
    } else if (utils_rank() == bad_rank) {
        snprintf(why, sizeof(why), "checkpoint save of step %d: rank %d's background write into %s made no progress "
                 "in %g s (--comm-timeout): its disk or file system hangs (the earlier checkpoints are kept)",
                 a->state.step, bad_rank, a->transfer.plans[0].path, a->timeout_s);
    }
    MPI_Request request;
    mpiCheck(MPI_Ibcast(why, (int)sizeof(why), MPI_CHAR, bad_rank, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, "checkpoint writer verdict", a->state.step);
    fatal("%s", why);
}

int checkpoint_async_progress(CheckpointAsync* a, int steps_done, int wait) {
    if (!a->in_flight) return 0;
    int world, rank;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int* all = (int*)mallocCheck((size_t)world * sizeof(int));
    double wait_t0 = wall_ms();
    int waited = 0;
    for (;;) {
        int mine = async_local_status(a, wait ? ASYNC_WAIT_ROUND_S : 0);
        mpi_allgather_deadline(&mine, all, 1, MPI_INT, "checkpoint writers' status", a->state.step);
        int done = 1;
        for (int r = 0; r < world; r++) {
            if (all[r] == ASYNC_FAILED || all[r] == ASYNC_STALLED) async_stop(a, r, all[r]);
            if (all[r] == ASYNC_WRITING) done = 0;
        }
        if (done) break;
        if (!wait) {
            free(all);
            return 0;
        }
        waited = 1;
    }
    free(all);
    pthread_join(a->thread, NULL);
    if (waited && rank == 0 && steps_done > a->state.step) {
        printf("checkpoint: step %d's save waited %.2f s for step %d's, still being written (one in flight at most)\n",
               steps_done, (wall_ms() - wait_t0) / 1e3, a->state.step);
    }
    checkpoint_collect_crcs(&a->transfer, a->crcs, a->num_rounds);
    free(a->crcs);
    a->crcs = NULL;
    char how[128];
    int ran = steps_done - a->state.step;
    snprintf(how, sizeof(how), "; in the background: the step paused %.3f s for the snapshot, %d step%s ran meanwhile",
             a->snapshot_ms / 1e3, ran, ran == 1 ? "" : "s");
    checkpoint_save_commit(a->out_dir, a->cfg, a->opt, &a->state, &a->transfer, a->t0_ms, how);
    checkpoint_free_transfer(&a->transfer);
    a->in_flight = 0;
    return a->state.step;
}

void checkpoint_async_free(CheckpointAsync* a) {
    free(a->snapshot);
    a->snapshot = NULL;
    a->snapshot_cap = 0;
}
