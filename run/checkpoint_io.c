// run/checkpoint_io.c: what run/checkpoint_io.h declares.
#include "run/checkpoint_io.h"

#include "run/seams.h"

// Element offset of every canonical tensor in llm.c's tensor-major file order.
static void checkpoint_file_offsets(const GPT2Config* cfg, size_t* offsets) {
    int NT = gpt2_num_tensors(cfg);
    int* by_file = (int*)mallocCheck((size_t)NT * sizeof(int));
    for (int i = 0; i < NT; i++) by_file[gpt2_file_index(cfg, i)] = i;
    size_t at = 0;
    for (int k = 0; k < NT; k++) {
        offsets[by_file[k]] = at;
        at += gpt2_tensor_numel(cfg, by_file[k]);
    }
    free(by_file);
}

static void checkpoint_add_slice(CheckpointFilePlan* f, uint64_t offset, uint64_t bytes, int which,
                                 const OptimizerPiece* range) {
    if (f->num_slices == f->cap) {
        f->cap = f->cap ? 2 * f->cap : 64;
        CheckpointSlice* grown = (CheckpointSlice*)realloc(f->slices, (size_t)f->cap * sizeof(CheckpointSlice));
        if (!grown) fatal("out of memory planning the checkpoint I/O of %s", f->path);
        f->slices = grown;
    }
    CheckpointSlice* s = &f->slices[f->num_slices++];
    s->offset = offset;
    s->bytes = bytes;
    s->which = which;
    if (range) s->range = *range;
}

static int checkpoint_compare_slices(const void* a, const void* b) {
    uint64_t x = ((const CheckpointSlice*)a)->offset, y = ((const CheckpointSlice*)b)->offset;
    return (x > y) - (x < y);
}

// The slices of one file that this rank moves: the states the file holds (model.bin the
// master; optimizer.bin m, then v) for each of its pieces, cut to fit the staging buffer,
// plus the header on rank 0; then sorted and grouped into rounds of slices that are
// contiguous in the file and fit the buffer together.
static void checkpoint_plan_file(CheckpointFilePlan* f, int file, const char* dir, const GPT2Config* cfg,
                                 const size_t* file_offsets, const OptimizerPiece* pieces, int num_pieces,
                                 size_t staging, int with_header, int step) {
    memset(f, 0, sizeof(*f));
    f->file = file;
    f->step = step;
    path_format(f->path, sizeof(f->path), "%s/%s", dir, CHECKPOINT_FILES[file]);
    size_t n = gpt2_num_parameters(cfg);
    f->size = checkpoint_file_bytes(file, n, f->path);
    if (file == CHECKPOINT_MODEL) gpt2_model_file_header_for(cfg, MODEL_VERSION_FP32, f->header);
    else checkpoint_optimizer_header(step, f->header);
    if (with_header) checkpoint_add_slice(f, 0, CHECKPOINT_HEADER_BYTES, CHECKPOINT_HEADER_SLICE, NULL);
    const OptimizerState model_states[] = {OPTIMIZER_MASTER}, optimizer_states[] = {OPTIMIZER_M, OPTIMIZER_V};
    const OptimizerState* states = file == CHECKPOINT_MODEL ? model_states : optimizer_states;
    int num_states = file == CHECKPOINT_MODEL ? 1 : 2;
    size_t max_elems = staging / sizeof(float);
    for (int k = 0; k < num_states; k++) {
        for (int i = 0; i < num_pieces; i++) {
            for (size_t done = 0; done < pieces[i].n; done += max_elems) {
                OptimizerPiece range = {pieces[i].param, pieces[i].start + done, pieces[i].n - done};
                if (range.n > max_elems) range.n = max_elems;
                size_t element = (size_t)k * n + file_offsets[range.param] + range.start;
                checkpoint_add_slice(f, CHECKPOINT_HEADER_BYTES + element * sizeof(float), range.n * sizeof(float),
                                     states[k], &range);
            }
        }
    }
    if (f->num_slices > 1) qsort(f->slices, (size_t)f->num_slices, sizeof(CheckpointSlice), checkpoint_compare_slices);
    f->rounds = (CheckpointRound*)mallocCheck((size_t)(f->num_slices ? f->num_slices : 1) * sizeof(CheckpointRound));
    for (int i = 0; i < f->num_slices; i++) {
        const CheckpointSlice* s = &f->slices[i];
        CheckpointRound* last = f->num_rounds ? &f->rounds[f->num_rounds - 1] : NULL;
        if (last && last->offset + last->bytes == s->offset && last->bytes + s->bytes <= staging) {
            last->bytes += s->bytes;
            last->count++;
            continue;
        }
        CheckpointRound r = {s->offset, s->bytes, i, 1};
        f->rounds[f->num_rounds++] = r;
    }
}

static void checkpoint_free_plan(CheckpointFilePlan* f) {
    free(f->slices);
    free(f->rounds);
}

void checkpoint_io_begin(const CheckpointFilePlan* f, int saving, const char* call) {
    char what[PATH_MAX_LEN + 96];
    snprintf(what, sizeof(what), "checkpoint %s: %s of %s at step %d", saving ? "save" : "load", call, f->path,
             f->step);
    mpi_blocking_begin(what);
}

void checkpoint_io_check(int rc, const char* path, const char* call, int saving) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof(text), "MPI error %d", rc);
    int error_class = MPI_ERR_OTHER;
    MPI_Error_class(rc, &error_class);
    int missing = error_class == MPI_ERR_NO_SUCH_FILE;  // its directory is gone: run/run_dir.h explains
    fatal("%s: %s failed: %s%s", path, call, text, saving && !missing ? " (is the disk full, or the file past ulimit -f?)" : "");
}

// Saving: the round's slices from the optimizer (and the header) into the staging buffer.
// Loading: from the staging buffer into the optimizer (a header is only checksummed).
void checkpoint_stage_round(const CheckpointFilePlan* f, const CheckpointRound* r, Optimizer* o,
                            unsigned char* staging, int saving) {
    uint64_t at = 0;
    for (int i = r->first; i < r->first + r->count; i++) {
        const CheckpointSlice* s = &f->slices[i];
        if (s->which == CHECKPOINT_HEADER_SLICE) {
            if (saving) memcpy(staging + at, f->header, CHECKPOINT_HEADER_BYTES);
        } else if (saving) {
            o->ops->read_piece(o, (OptimizerState)s->which, &s->range, (float*)(staging + at));
        } else {
            o->ops->write_piece(o, (OptimizerState)s->which, &s->range, (const float*)(staging + at));
        }
        at += s->bytes;
    }
}

// The file offset of the first NaN or infinity in a round's state slices (a header holds
// integers), or of a negative AdamW v (a sum of squares), or CHECKPOINT_FINITE.
uint64_t checkpoint_round_nonfinite(const CheckpointFilePlan* f, const CheckpointRound* r,
                                    const unsigned char* staging) {
    uint64_t at = 0;
    for (int i = r->first; i < r->first + r->count; i++) {
        const CheckpointSlice* s = &f->slices[i];
        if (s->which != CHECKPOINT_HEADER_SLICE) {
            const float* x = (const float*)(staging + at);
            size_t n = s->bytes / sizeof(float), j = floats_first_nonfinite(x, n);
            if (s->which == OPTIMIZER_V) {
                for (size_t k = 0; k < j; k++) {
                    if (x[k] < 0) j = k;
                }
            }
            if (j < n) return s->offset + j * sizeof(float);
        }
        at += s->bytes;
    }
    return CHECKPOINT_FINITE;
}

// Collective: this rank's rounds of one file, in as many collective calls as the rank
// with the most rounds needs. Fills crcs[0..f->num_rounds). dir_fd: the file's directory,
// open (checkpoint_transfer).
static void checkpoint_move_file(const CheckpointFilePlan* f, int dir_fd, Optimizer* o, unsigned char* staging,
                                 int saving, CheckpointCrc* crcs) {
    MPI_File fh;
    int mode = saving ? MPI_MODE_CREATE | MPI_MODE_WRONLY : MPI_MODE_RDONLY;
    if (f->file == CHECKPOINT_MODEL) {  // tests: a rank that hangs here, -o removed under a save (run/seams.h)
        if (saving) seam_stop_at("save_open", f->step, "in the checkpoint save, before opening model.bin, of step");
        else seam_stop_at("load", f->step, "in the checkpoint load of step");
    }
    // Open MPI 4.1 copies the name with a suffix into a 256-byte buffer and aborts the job on a
    // longer one (-o of about 200 characters), so MPI-IO gets a name of the same file that is
    // short at any -o: relative to the open directory, through /proc. Messages name f->path.
    char short_name[64];
    path_format(short_name, sizeof(short_name), "/proc/self/fd/%d/%s", dir_fd, CHECKPOINT_FILES[f->file]);
    CHECKPOINT_IO(f, saving, "MPI_File_open", MPI_File_open(MPI_COMM_WORLD, short_name, mode, MPI_INFO_NULL, &fh));
    int rounds = f->num_rounds, max_rounds = 0;
    MPI_Request request;
    mpiCheck(MPI_Iallreduce(&rounds, &max_rounds, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, "checkpoint round count", f->step);
    for (int k = 0; k < max_rounds; k++) {
        const CheckpointRound* r = k < rounds ? &f->rounds[k] : NULL;
        MPI_Offset at = r ? (MPI_Offset)r->offset : 0;
        int bytes = r ? (int)r->bytes : 0;  // at most the staging size, 1 GiB
        if (r && saving) checkpoint_stage_round(f, r, o, staging, 1);
        if (saving && k == 0 && f->file == CHECKPOINT_MODEL) seam_stop_at("save", f->step, "in the checkpoint save of step");
        // Blocking collective I/O (Open MPI 4's non-blocking MPI_File_iwrite_at_all crashed
        // on a full disk, where this one reports the error), under the watchdog thread.
        const char* call = saving ? "MPI_File_write_at_all" : "MPI_File_read_at_all";
        MPI_Status status;
        CHECKPOINT_IO(f, saving, call,
                      saving ? MPI_File_write_at_all(fh, at, staging, bytes, MPI_BYTE, &status)
                             : MPI_File_read_at_all(fh, at, staging, bytes, MPI_BYTE, &status));
        int moved = 0;
        mpiCheck(MPI_Get_count(&status, MPI_BYTE, &moved));
        if (moved != bytes) {
            fatal("%s: %s moved %d of %d bytes at offset %lld (%s)", f->path, call, moved, bytes, (long long)at,
                  saving ? "is the disk full, or the file past ulimit -f?" : "was the file cut short?");
        }
        if (!r) continue;
        CheckpointCrc c = {r->offset, r->bytes, crc32c(staging, r->bytes), f->file,
                           checkpoint_round_nonfinite(f, r, staging)};
        crcs[k] = c;
        if (!saving) checkpoint_stage_round(f, r, o, staging, 0);
    }
    // Everything on stable storage before the manifest can say the checkpoint is whole.
    if (saving) CHECKPOINT_IO(f, saving, "MPI_File_sync", MPI_File_sync(fh));
    CHECKPOINT_IO(f, saving, "MPI_File_close", MPI_File_close(&fh));
}

static int checkpoint_compare_crcs(const void* a, const void* b) {
    const CheckpointCrc *x = (const CheckpointCrc*)a, *y = (const CheckpointCrc*)b;
    if (x->file != y->file) return (x->file > y->file) - (x->file < y->file);
    return (x->offset > y->offset) - (x->offset < y->offset);
}

// Rank 0: the CRC32C of each large file from every rank's reports, in file order, and the
// offset of its first non-finite value. The reports must tile each file exactly: a gap or
// an overlap is a bug in the pieces.
static void checkpoint_combine_crcs(CheckpointCrc* all, int n, const CheckpointFilePlan* plans,
                                    uint32_t* crc_of_file, uint64_t* nonfinite_of_file) {
    qsort(all, (size_t)n, sizeof(CheckpointCrc), checkpoint_compare_crcs);
    int i = 0;
    for (int k = 0; k < 2; k++) {
        const CheckpointFilePlan* f = &plans[k];
        uint64_t expect = 0;
        uint32_t crc = 0;  // the CRC of nothing; combining onto it gives the first piece's
        nonfinite_of_file[f->file] = CHECKPOINT_FINITE;
        for (; i < n && all[i].file == f->file; i++) {
            if (all[i].nonfinite_at < nonfinite_of_file[f->file]) nonfinite_of_file[f->file] = all[i].nonfinite_at;
            if (all[i].offset != expect) {
                fatal("checkpoint: the ranks' pieces of %s %s at byte %" PRIu64 " (a bug)", f->path,
                      all[i].offset > expect ? "leave a gap" : "overlap", expect);
            }
            crc = crc32c_combine(crc, all[i].crc, all[i].bytes);
            expect += all[i].bytes;
        }
        if (expect != f->size) {
            fatal("checkpoint: the ranks' pieces of %s end at byte %" PRIu64 " of %" PRIu64 " (a bug)", f->path, expect,
                  f->size);
        }
        crc_of_file[f->file] = crc;
    }
}

// Collective: every rank's reports to rank 0 (the array is rank 0's to free; NULL elsewhere).
static CheckpointCrc* checkpoint_gather_crcs(const CheckpointCrc* mine, int n, int* total) {
    int world, rank, bytes = n * (int)sizeof(CheckpointCrc);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int* counts = (int*)mallocCheck((size_t)world * sizeof(int));
    int* displs = (int*)mallocCheck((size_t)world * sizeof(int));
    MPI_Request request;
    mpiCheck(MPI_Igather(&bytes, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, "checkpoint checksum gather", -1);
    CheckpointCrc* all = NULL;
    *total = 0;
    if (rank == 0) {
        int sum = 0;
        for (int r = 0; r < world; r++) {
            displs[r] = sum;
            sum += counts[r];
        }
        *total = sum / (int)sizeof(CheckpointCrc);
        all = (CheckpointCrc*)mallocCheck((size_t)sum);
    }
    mpiCheck(MPI_Igatherv(mine, bytes, MPI_BYTE, all, counts, displs, MPI_BYTE, 0, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, "checkpoint checksum gather", -1);
    free(counts);
    free(displs);
    return all;
}

int checkpoint_plan_transfer(CheckpointTransfer* t, const char* dir, const GPT2Config* cfg, Optimizer* o, int step,
                             size_t staging_bytes) {
    memset(t, 0, sizeof(*t));
    int num_pieces = o->ops->checkpoint_pieces(o, NULL, 0);
    OptimizerPiece* pieces = (OptimizerPiece*)mallocCheck((size_t)(num_pieces ? num_pieces : 1) * sizeof(OptimizerPiece));
    o->ops->checkpoint_pieces(o, pieces, num_pieces);
    for (int i = 0; i < num_pieces; i++) t->state_bytes += OPTIMIZER_NUM_STATES * pieces[i].n * sizeof(float);
    size_t* file_offsets = (size_t*)mallocCheck((size_t)gpt2_num_tensors(cfg) * sizeof(size_t));
    checkpoint_file_offsets(cfg, file_offsets);
    int rank = utils_rank();
    for (int k = 0; k < 2; k++) {
        checkpoint_plan_file(&t->plans[k], k == 0 ? CHECKPOINT_MODEL : CHECKPOINT_OPTIMIZER, dir, cfg, file_offsets,
                             pieces, num_pieces, staging_bytes, rank == 0, step);
    }
    free(file_offsets);
    free(pieces);
    return t->plans[0].num_rounds + t->plans[1].num_rounds;
}

void checkpoint_collect_crcs(CheckpointTransfer* t, const CheckpointCrc* crcs, int num_rounds) {
    int total;
    CheckpointCrc* all = checkpoint_gather_crcs(crcs, num_rounds, &total);
    if (utils_rank() == 0) {
        checkpoint_combine_crcs(all, total, t->plans, t->crc, t->nonfinite_at);
        t->mib_moved = (double)(t->plans[0].size + t->plans[1].size) / (1 << 20);
    }
    free(all);
}

void checkpoint_free_transfer(CheckpointTransfer* t) {
    for (int k = 0; k < 2; k++) checkpoint_free_plan(&t->plans[k]);
}

// Collective: moves this rank's pieces of model.bin and optimizer.bin of checkpoint dir
// (saving: from the optimizer into the files; loading: the other way) and gives rank 0
// the files' CRCs.
static void checkpoint_transfer(CheckpointTransfer* t, const char* dir, const GPT2Config* cfg, Optimizer* o,
                                int step, int saving) {
    size_t staging_bytes = checkpoint_staging_bytes();
    int num_rounds = checkpoint_plan_transfer(t, dir, cfg, o, step, staging_bytes);
    CheckpointCrc* crcs = (CheckpointCrc*)mallocCheck((size_t)(num_rounds ? num_rounds : 1) * sizeof(CheckpointCrc));
    unsigned char* staging = (unsigned char*)mallocCheck(staging_bytes);  // pages are touched only as rounds fill them
    int dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) fatal("cannot open the checkpoint directory %s: %s", dir, strerror(errno));
    checkpoint_move_file(&t->plans[0], dir_fd, o, staging, saving, crcs);
    checkpoint_move_file(&t->plans[1], dir_fd, o, staging, saving, crcs + t->plans[0].num_rounds);
    close(dir_fd);
    free(staging);
    checkpoint_collect_crcs(t, crcs, num_rounds);
    free(crcs);
    checkpoint_free_transfer(t);
}

static double checkpoint_status_mib(const char* field) {
    double kib = memory_read_key("/proc/self/status", field);  // run/memory_check.h
    if (kib < 0) fatal("%s: /proc/self/status has no %s", CHECKPOINT_MEMCHECK_ENV, field);
    return kib / 1024.0;
}

// Returns the resident MiB before the operation, or -1 when the check is off.
static double checkpoint_memcheck_begin(void) {
    const char* on = getenv(CHECKPOINT_MEMCHECK_ENV);
    if (!on || strcmp(on, "1") != 0) return -1.0;
    FILE* f = fopen("/proc/self/clear_refs", "w");
    if (!f || fputs("5", f) < 0 || fclose(f) != 0) {
        fatal("%s: cannot reset the peak RSS (/proc/self/clear_refs): %s", CHECKPOINT_MEMCHECK_ENV, strerror(errno));
    }
    return checkpoint_status_mib("VmRSS");
}

static void checkpoint_memcheck_end(double rss_before, const char* what, const CheckpointTransfer* t) {
    if (rss_before < 0) return;
    double peak = checkpoint_status_mib("VmHWM");
    printf("checkpoint memcheck: rank %d %s: peak growth %.2f MiB above %.1f MiB resident (its pieces: %.2f MiB of "
           "master+m+v; staging %zu MiB)\n", utils_rank(), what, peak - rss_before, rss_before,
           (double)t->state_bytes / (1 << 20), checkpoint_staging_bytes() >> 20);
    fflush(stdout);
}

// Rank 0: -1 when both files of a transfer are finite; else the file that holds the first
// NaN or infinity (or negative v), and in what which value it is ("element 3 of h0.qkvb in
// AdamW's v is not finite or is negative").
static int checkpoint_nonfinite_where(const CheckpointTransfer* t, const GPT2Config* cfg, char* what,
                                      size_t cap) {
    for (int k = 0; k < 2; k++) {
        int file = t->plans[k].file;
        if (t->nonfinite_at[file] == CHECKPOINT_FINITE) continue;
        size_t n = gpt2_num_parameters(cfg), element = (t->nonfinite_at[file] - CHECKPOINT_HEADER_BYTES) / sizeof(float);
        const char* state = file == CHECKPOINT_MODEL ? "the master weights"
                            : element < n                ? "AdamW's m"
                                                         : "AdamW's v";
        int is_v = file != CHECKPOINT_MODEL && element >= n;  // a sum of squares: negative is no value either
        element %= n;
        size_t* offsets = (size_t*)callocCheck((size_t)gpt2_num_tensors(cfg), sizeof(size_t));
        checkpoint_file_offsets(cfg, offsets);
        int tensor = 0;
        for (int i = 0; i < gpt2_num_tensors(cfg); i++) {
            if (offsets[i] <= element && element - offsets[i] < gpt2_tensor_numel(cfg, i)) tensor = i;
        }
        char name[64];
        snprintf(what, cap, "element %zu of %s in %s is not finite%s", element - offsets[tensor],
                 gpt2_tensor_name(cfg, tensor, name, sizeof(name)), state,
                 is_v ? " or is negative" : "");
        free(offsets);
        return file;
    }
    return -1;
}

// Collective: rank 0's verdict (why: the message, "" when all is well: -o is still the
// directory this job locked, run/run_dir.h, and the state was finite) to every rank, so
// that all stop alike.
static void checkpoint_stop_with_rank0(char* why, int step) {
    MPI_Request request;
    mpiCheck(MPI_Ibcast(why, RUN_DIR_WHY_MAX, MPI_CHAR, 0, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, "checkpoint directory check", step);
    if (why[0]) fatal("%s", why);
}

void checkpoint_save_begin(const char* out_dir, int step, char* tmp, size_t n) {
    checkpoint_path(tmp, n, out_dir, step, 1);
    char lost[RUN_DIR_WHY_MAX] = "";
    if (utils_rank() == 0 && !run_dir_lost(lost)[0]) {
        run_dir_make(out_dir);
        checkpoint_remove_stale_temporaries(out_dir);
        if (mkdir(tmp, 0755) != 0) fatal("cannot create %s: %s", tmp, strerror(errno));
    }
    checkpoint_stop_with_rank0(lost, step);  // and the directory exists before any rank opens a file in it
}

void checkpoint_save_commit(const char* out_dir, const GPT2Config* cfg, Optimizer* o, const CheckpointState* s,
                            const CheckpointTransfer* t, double t0, const char* how) {
    int rank = utils_rank();
    char tmp[PATH_MAX_LEN], final_path[PATH_MAX_LEN], path[PATH_MAX_LEN], lost[RUN_DIR_WHY_MAX] = "";
    checkpoint_path(tmp, sizeof(tmp), out_dir, s->step, 1);
    checkpoint_path(final_path, sizeof(final_path), out_dir, s->step, 0);
    // Every rank has synced and closed both files (their reports reached rank 0 after that).
    char what[128];
    seam_stop_at("save_commit", s->step, "in the checkpoint save, its files written, of step");
    if (rank == 0 && checkpoint_nonfinite_where(t, cfg, what, sizeof(what)) >= 0) {
        checkpoint_remove_dir(tmp);
        snprintf(lost, sizeof(lost), "checkpoint of step %d not saved: %s (the earlier checkpoints "
                 "are kept)", s->step, what);
    } else if (rank == 0 && !run_dir_lost(lost)[0]) {  // lost meanwhile: the checkpoint is not renamed into place
        CheckpointManifest m;
        for (int k = 0; k < 2; k++) {
            m.bytes[t->plans[k].file] = t->plans[k].size;
            m.crc[t->plans[k].file] = t->crc[t->plans[k].file];
        }
        path_format(path, sizeof(path), "%s/%s", tmp, CHECKPOINT_FILES[CHECKPOINT_STATE]);
        checkpoint_write_state(path, s);
        checkpoint_fsync(path);
        size_t bytes;
        m.crc[CHECKPOINT_STATE] = crc32c_file(path, &bytes);
        m.bytes[CHECKPOINT_STATE] = bytes;
        checkpoint_write_manifest(tmp, &m);
        checkpoint_fsync(tmp);
        // A checkpoint of the same step from an earlier run in this directory gives way.
        if (!checkpoint_remove_dir(final_path)) fatal("cannot replace %s (see the warning above)", final_path);
        if (rename(tmp, final_path) != 0) fatal("cannot rename %s to %s: %s", tmp, final_path, strerror(errno));
        checkpoint_fsync(out_dir);
        printf("checkpoint: step %d saved in %s (%.1f MiB by %d ranks in %.2f s%s)\n", s->step, final_path,
               t->mib_moved, o->world, (wall_ms() - t0) / 1e3, how);
    }
    checkpoint_stop_with_rank0(lost, s->step);  // and nobody runs ahead of a checkpoint being renamed into place
}

void checkpoint_save(const char* out_dir, const GPT2Config* cfg, Optimizer* o, const CheckpointState* s) {
    double rss_before = checkpoint_memcheck_begin(), t0 = wall_ms();
    char tmp[PATH_MAX_LEN];
    checkpoint_save_begin(out_dir, s->step, tmp, sizeof(tmp));
    CheckpointTransfer t;
    checkpoint_transfer(&t, tmp, cfg, o, s->step, 1);
    checkpoint_save_commit(out_dir, cfg, o, s, &t, t0, "");
    checkpoint_memcheck_end(rss_before, "save", &t);
}

// Collective: loads every rank's pieces of checkpoint dir (opened and checked by
// checkpoint_open_for_resume) into the optimizer, verifying both large files' CRC32C.
static void checkpoint_load(const char* dir, const GPT2Config* cfg, Optimizer* o,
                            const CheckpointManifest* manifest, int step, CheckpointTransfer* t) {
    checkpoint_transfer(t, dir, cfg, o, step, 0);
    int verdict[2] = {-1, 0};  // the first damaged file, and its CRC
    if (utils_rank() == 0) {
        for (int k = 0; k < 2 && verdict[0] < 0; k++) {
            int file = t->plans[k].file;
            if (t->crc[file] != manifest->crc[file]) {
                verdict[0] = file;
                verdict[1] = (int)t->crc[file];
            }
        }
    }
    MPI_Request request;  // every rank stops alike
    mpiCheck(MPI_Ibcast(verdict, 2, MPI_INT, 0, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, "checkpoint verdict", step);
    if (verdict[0] >= 0) {
        char path[PATH_MAX_LEN];
        path_format(path, sizeof(path), "%s/%s", dir, CHECKPOINT_FILES[verdict[0]]);
        checkpoint_checksum_mismatch(path, (uint32_t)verdict[1], manifest->crc[verdict[0]]);
    }
    char why[RUN_DIR_WHY_MAX] = "", what[128];
    int file = utils_rank() == 0 ? checkpoint_nonfinite_where(t, cfg, what, sizeof(what)) : -1;
    if (file >= 0) {
        // The directory twice: each at most half the room (-o's length is checked at start).
        snprintf(why, sizeof(why), "resume: %.2000s/%s: %s (an older build saved its run's state after "
                 "it had diverged): move %.2000s away to resume from the checkpoint before it", dir,
                 CHECKPOINT_FILES[file], what, dir);
    }
    checkpoint_stop_with_rank0(why, step);
    o->ops->finish_import(o, step);
}

void checkpoint_find_resume(TrainConfig* cfg, CheckpointResume* r) {
    GPT2Config run_shape;
    model_shape_of(cfg->model, &run_shape);
    if (!checkpoint_open_for_resume(cfg->output_dir, &run_shape, cfg->model, r->dir, sizeof(r->dir), &r->state,
                                    &r->manifest)) {
        cfg->resume = 0;
        return;
    }
    path_format(r->model_path, sizeof(r->model_path), "%s/%s", r->dir, CHECKPOINT_FILES[CHECKPOINT_MODEL]);
    cfg->model = r->model_path;
}

void checkpoint_step_meaning(const TrainConfig* cfg, int max_steps, CheckpointState* s) {
    s->max_steps = max_steps;
    s->warmup_steps = cfg->warmup_steps;
    s->overfit_single_batch = cfg->overfit_single_batch;
    s->lr = cfg->lr;
    s->final_lr_fraction = cfg->final_lr_fraction;
    s->weight_decay = cfg->weight_decay;
    s->beta1 = cfg->beta1;
    s->beta2 = cfg->beta2;
    s->eps = cfg->eps;
    s->grad_clip = cfg->grad_clip;
    s->has_step_meaning = 1;
    s->shuffle = cfg->shuffle;
    s->data_seed = cfg->seed;
    s->has_data_order = 1;
    snprintf(s->optimizer, sizeof(s->optimizer), "%s", cfg->optimizer);
    s->muon_momentum = cfg->muon_momentum;
    s->muon_nesterov = cfg->muon_nesterov;
    s->muon_ns_steps = cfg->muon_ns_steps;
    snprintf(s->muon_coefficients, sizeof(s->muon_coefficients), "%s", cfg->muon_coefficients);
    snprintf(s->muon_scale, sizeof(s->muon_scale), "%s", cfg->muon_scale);
    s->muon_extra_scale = cfg->muon_extra_scale;
    s->muon_split_qkv = cfg->muon_split_qkv;
    s->has_optimizer = 1;
}

// Appends ", NAME SAVED -> NOW" to the list of differences when the two differ.
static void checkpoint_note_change(char* list, size_t n, const char* name, double saved, double now) {
    if (saved == now) return;
    char a[32], b[32];
    snprintf(a, sizeof(a), "%g", saved);
    snprintf(b, sizeof(b), "%g", now);
    if (strcmp(a, b) == 0) {  // they differ beyond %g's 6 digits
        snprintf(a, sizeof(a), "%.9g", saved);
        snprintf(b, sizeof(b), "%.9g", now);
    }
    size_t at = strlen(list);
    snprintf(list + at, n - at, "%s%s %s -> %s", at ? ", " : "", name, a, b);
}

// Appends ", NAME SAVED -> NOW" when two words differ.
static void checkpoint_note_word_change(char* list, size_t n, const char* name, const char* saved, const char* now) {
    if (strcmp(saved, now) == 0) return;
    size_t at = strlen(list);
    snprintf(list + at, n - at, "%s%s %s -> %s", at ? ", " : "", name, saved, now);
}

// -y 1: the checkpoint's optimizer must be this run's. AdamW's two moments and Muon's momentum
// are different state, and neither converts exactly into the other, so a change is refused even
// with --allow-resume-change; Muon's settings are changes of what a step means.
static void checkpoint_optimizer_check(const TrainConfig* cfg, const CheckpointResume* r, char* changes, size_t n) {
    const CheckpointState* saved = &r->state;
    const char* was = saved->has_optimizer ? saved->optimizer : "adamw";
    if (strcmp(was, cfg->optimizer) != 0) {
        fatal("resume: %s was trained with --optimizer %s, and this run asks for --optimizer %s: their states differ "
              "(AdamW keeps two moments per element, Muon one momentum per matrix element) and neither converts "
              "exactly into the other: resume with --optimizer %s, or start the new optimizer in another -o", r->dir,
              was, cfg->optimizer, was);
    }
    if (!config_uses_muon(cfg)) return;
    checkpoint_note_change(changes, n, "--muon-momentum", saved->muon_momentum, cfg->muon_momentum);
    checkpoint_note_change(changes, n, "--muon-nesterov", saved->muon_nesterov, cfg->muon_nesterov);
    checkpoint_note_change(changes, n, "--muon-ns-steps", saved->muon_ns_steps, cfg->muon_ns_steps);
    checkpoint_note_word_change(changes, n, "--muon-coefficients", saved->muon_coefficients, cfg->muon_coefficients);
    checkpoint_note_word_change(changes, n, "--muon-scale", saved->muon_scale, cfg->muon_scale);
    checkpoint_note_change(changes, n, "--muon-extra-scale", saved->muon_extra_scale, cfg->muon_extra_scale);
    checkpoint_note_change(changes, n, "--muon-split-qkv", saved->muon_split_qkv, cfg->muon_split_qkv);
}

// -y 1, once the train data is open (every rank alike): the checkpoint's corpus must be the
// one -i names now (run/data_identity.h), unless --allow-corpus-change says the change is
// meant; the saved data position then applies to the new data as it stands. A checkpoint
// that predates the record resumes with the data unchecked, saying so.
static void checkpoint_corpus_check(const TrainConfig* cfg, const CheckpointResume* r, const DataIdentity* now) {
    const CheckpointState* saved = &r->state;
    char was[160], is[160];
    if (!saved->has_corpus) {
        if (utils_rank() == 0) printf("resume: %s predates the record of its train data; the data was not checked\n", r->dir);
        return;
    }
    if (saved->corpus_shards == now->shards && saved->corpus_digest == now->digest) return;  // names do not count
    data_identity_text(saved->corpus, saved->corpus_shards, saved->corpus_digest, was, sizeof(was));
    data_identity_text(now->corpus, now->shards, now->digest, is, sizeof(is));
    // The same shards, perhaps, but their manifest is gone: without it only the first shard's
    // checksum is known, so from two shards on the digests cannot agree.
    if (!cfg->allow_corpus_change && strcmp(saved->corpus, "-") != 0 && strcmp(now->corpus, "-") == 0 &&
        saved->corpus_shards == now->shards && now->shards > 1) {
        fatal("resume: %s was trained on corpus '%s' (%zu shards, listed in its manifest), and -i '%s' matches %zu "
              "shards without a manifest: put %s_manifest.txt back beside them, so that they can be checked, or pass "
              "--allow-corpus-change", r->dir, saved->corpus, saved->corpus_shards, cfg->train_pattern, now->shards,
              saved->corpus);
    }
    if (!cfg->allow_corpus_change) {
        fatal("resume: %s was trained on other data (%s) than -i '%s' holds now (%s): resume on the saved corpus, or "
              "pass --allow-corpus-change to continue on this one", r->dir, was, cfg->train_pattern, is);
    }
    if (utils_rank() == 0) {
        printf("resume: --allow-corpus-change: continuing %s on other data (%s; it was trained on %s)\n", r->dir, is,
               was);
    }
}

int checkpoint_resume_check(const TrainConfig* cfg, const CheckpointResume* r, const DataIdentity* data,
                            long long tokens_per_step, int max_steps) {
    const CheckpointState* saved = &r->state;
    if (saved->step > max_steps) {
        fatal("resume: %s is at step %d, beyond -x %d: raise -x, or use another -o for a shorter run", r->dir,
              saved->step, max_steps);
    }
    char changes[1024] = "";
    long long saved_tokens = (long long)saved->world * saved->B * saved->T * saved->grad_accum_steps;
    checkpoint_note_change(changes, sizeof(changes), "tokens per step (ranks x B x T x accumulation)",
                           (double)saved_tokens, (double)tokens_per_step);
    checkpoint_note_change(changes, sizeof(changes), "-t", saved->T, cfg->T);
    if (saved->has_step_meaning) {
        CheckpointState now;
        checkpoint_step_meaning(cfg, max_steps, &now);
        checkpoint_note_change(changes, sizeof(changes), "-a", saved->overfit_single_batch, now.overfit_single_batch);
        checkpoint_note_change(changes, sizeof(changes), "-l", saved->lr, now.lr);
        checkpoint_note_change(changes, sizeof(changes), "-u", saved->warmup_steps, now.warmup_steps);
        checkpoint_note_change(changes, sizeof(changes), "-q", saved->final_lr_fraction, now.final_lr_fraction);
        // -x sets the length of the cosine decay; with a constant rate (-q 1) it is only where the run stops.
        if (saved->final_lr_fraction != 1.0f || now.final_lr_fraction != 1.0f) {
            checkpoint_note_change(changes, sizeof(changes), "-x", saved->max_steps, now.max_steps);
        }
        checkpoint_note_change(changes, sizeof(changes), "-c", saved->weight_decay, now.weight_decay);
        checkpoint_note_change(changes, sizeof(changes), "--beta1", saved->beta1, now.beta1);
        checkpoint_note_change(changes, sizeof(changes), "--beta2", saved->beta2, now.beta2);
        checkpoint_note_change(changes, sizeof(changes), "--eps", saved->eps, now.eps);
        checkpoint_note_change(changes, sizeof(changes), "--grad-clip", saved->grad_clip, now.grad_clip);
    }
    checkpoint_optimizer_check(cfg, r, changes, sizeof(changes));
    // The data order: a checkpoint from before --shuffle read the data in file order.
    checkpoint_note_change(changes, sizeof(changes), "--shuffle", saved->has_data_order && saved->shuffle, cfg->shuffle);
    if (saved->has_data_order && saved->shuffle && cfg->shuffle) {
        checkpoint_note_change(changes, sizeof(changes), "--seed (which sets the --shuffle order)", saved->data_seed,
                               cfg->seed);
    }
    // --skip-batches A-B at a checkpoint past step A: only the run that skipped them (a
    // requeued job repeats its command line) may name them; else other batches would go.
    if (cfg->skip_from && cfg->skip_from <= saved->step && !skip_batches_has(&saved->skipped, cfg->skip_from,
                                                                              cfg->skip_to)) {
        for (int i = 0; i < saved->skipped.count; i++) {  // a part of a range it skipped: say which
            if (saved->skipped.from[i] > cfg->skip_from || saved->skipped.to[i] < cfg->skip_to) continue;
            fatal("--skip-batches %d-%d lies inside %d-%d, which the run that saved %s skipped already: repeat "
                  "that range (a requeued job's command line), or leave the flag out", cfg->skip_from, cfg->skip_to,
                  saved->skipped.from[i], saved->skipped.to[i], r->dir);
        }
        fatal("--skip-batches %d-%d: %s is at step %d, past step %d, and %s: resume from a checkpoint of step %d or "
              "earlier (move the newer ones out of %s), or name steps after %d", cfg->skip_from, cfg->skip_to, r->dir,
              saved->step, cfg->skip_from,
              saved->skipped.count == SKIP_BATCHES_KEPT
                  ? "its record of skipped ranges, full (the newest 16), does not hold this one: an older one dropped "
                    "out, or it was never skipped"
                  : "the run that saved it did not skip those batches",
              cfg->skip_from - 1, cfg->output_dir, saved->step);
    }
    if (changes[0] && !cfg->allow_resume_change) {
        fatal("resume: this run's steps would not mean what %s's did (saved -> now: %s): resume with the saved "
              "settings, or pass --allow-resume-change to continue with the new ones", r->dir, changes);
    }
    if (changes[0] && utils_rank() == 0) {
        printf("resume: --allow-resume-change: continuing %s with changed settings (saved -> now: %s)\n", r->dir,
               changes);
    }
    if (!saved->has_step_meaning && utils_rank() == 0) {
        printf("resume: %s predates the saved schedule and AdamW settings; only the batch was checked\n", r->dir);
    }
    checkpoint_corpus_check(cfg, r, data);
    if (saved->step < max_steps) return 0;
    if (utils_rank() == 0) printf("resume: %s is at step %d = -x: the run is already complete\n", r->dir, saved->step);
    return 1;
}

float checkpoint_moments_bound(float b1, float b2) {
    double r = (double)b1 * b1 / b2;
    return r < 1 ? (float)((1.0 - b1) * (1.0 - b1) / ((1.0 - b2) * (1.0 - r))) : 0.0f;
}

// The first model-space element, over all ranks (collective), whose m and v break
// m^2 <= bound v (checkpoint_moments_bound), or SIZE_MAX; Muon's matrices (a momentum, v
// zeros) are left out.
static size_t checkpoint_moments_first_broken(const GPT2Config* mc, Optimizer* o, double c, int muon, int step) {
    uint64_t first = UINT64_MAX;
    size_t* offsets = (size_t*)callocCheck((size_t)gpt2_num_tensors(mc), sizeof(size_t));
    checkpoint_file_offsets(mc, offsets);
    int n = o->ops->checkpoint_pieces(o, NULL, 0);
    OptimizerPiece* pieces = (OptimizerPiece*)mallocCheck((size_t)(n > 0 ? n : 1) * sizeof(OptimizerPiece));
    o->ops->checkpoint_pieces(o, pieces, n);
    const size_t chunk = (size_t)1 << 20;  // 8 MiB of m and v at a time, whatever the model
    float* m = (float*)mallocCheck(chunk * sizeof(float));
    float* v = (float*)mallocCheck(chunk * sizeof(float));
    for (int i = 0; i < n; i++) {
        if (muon && gpt2_tensor_is_hidden_matrix(mc, pieces[i].param)) continue;
        for (size_t at = 0; at < pieces[i].n; at += chunk) {
            OptimizerPiece r = {pieces[i].param, pieces[i].start + at, pieces[i].n - at < chunk ? pieces[i].n - at : chunk};
            o->ops->read_piece(o, OPTIMIZER_M, &r, m);
            o->ops->read_piece(o, OPTIMIZER_V, &r, v);
            for (size_t k = 0; k < r.n; k++) {  // fp32 rounding and underflow: 1% and 1e-30 of slack
                if ((double)m[k] * m[k] > c * v[k] * 1.01 + 1e-30) {
                    uint64_t e = offsets[r.param] + r.start + k;
                    if (e < first) first = e;
                    break;
                }
            }
        }
    }
    free(m);
    free(v);
    free(pieces);
    free(offsets);
    MPI_Request request;
    mpiCheck(MPI_Iallreduce(MPI_IN_PLACE, &first, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD, &request));
    mpi_wait_deadline(&request, "checkpoint moments check", step);
    return first == UINT64_MAX ? SIZE_MAX : (size_t)first;
}

void checkpoint_restore(const CheckpointResume* r, const GPT2Config* mc, Optimizer* o, DataLoader* train,
                        uint64_t* sample_rng, int muon, float moments_bound) {
    double rss_before = checkpoint_memcheck_begin(), t0 = wall_ms();
    CheckpointTransfer t;
    checkpoint_load(r->dir, mc, o, &r->manifest, r->state.step, &t);
    size_t broken = moments_bound > 0 ? checkpoint_moments_first_broken(mc, o, moments_bound, muon, r->state.step)
                                      : SIZE_MAX;
    if (broken != SIZE_MAX) {
        size_t* offsets = (size_t*)callocCheck((size_t)gpt2_num_tensors(mc), sizeof(size_t));
        checkpoint_file_offsets(mc, offsets);
        int tensor = 0;
        for (int i = 0; i < gpt2_num_tensors(mc); i++) {
            if (offsets[i] <= broken) tensor = i;
        }
        char name[64];
        fatal("resume: %s/optimizer.bin: AdamW's m and v cannot be averages of the same gradients at element %zu of %s "
              "(m^2 above %.4g v, the most the run's betas allow): m and v swapped, or ranks' parts moved, though "
              "the checksums match; resume from another checkpoint", r->dir, broken - offsets[tensor],
              gpt2_tensor_name(mc, tensor, name, sizeof(name)), moments_bound);
    }
    DataPosition at = {r->state.epoch, r->state.shard, r->state.shard_tokens_done};
    dataloader_seek(train, at);
    *sample_rng = r->state.sample_rng;
    if (utils_rank() == 0) {
        printf("resumed from %s: step %d (saved by %d ranks x B=%d x T=%d x %d micro-steps; %.1f MiB read and verified "
               "in %.2f s)\n", r->dir, r->state.step, r->state.world, r->state.B, r->state.T,
               r->state.grad_accum_steps, t.mib_moved, (wall_ms() - t0) / 1e3);
    }
    checkpoint_memcheck_end(rss_before, "load", &t);
}

void checkpoint_share_split(float* buf, size_t total, int world) {
    const size_t max_count = (size_t)1 << 30;
    for (int root = 0; root < world; root++) {
        size_t lo, hi;
        optimizer_split_range(total, root, world, &lo, &hi);
        for (size_t at = lo; at < hi; at += max_count) {
            size_t n = hi - at < max_count ? hi - at : max_count;
            MPI_Request request;
            mpiCheck(MPI_Ibcast(buf + at, (int)n, MPI_FLOAT, root, MPI_COMM_WORLD, &request));
            mpi_wait_deadline(&request, "checkpoint state broadcast", -1);
        }
    }
}
