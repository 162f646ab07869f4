/*
 * Corpora -> llm.c token shards with GPT-2's BPE, tokenized on every core.
 *
 *   ./prepro_corpus --out-dir DIR [options] INPUT...
 *
 * Inputs, read in the order given, each by its name:
 *   NAME.jsonl, NAME.jsonl.zst, NAME.jsonl.gz   JSON Lines: one object per line, the
 *                                               document is its --text-field string
 *   NAME.txt, NAME.txt.zst, NAME.txt.gz         the whole file is one document
 *   -                                           JSON Lines on standard input (so any
 *                                               converter, e.g. a Parquet reader, pipes in)
 * Every document is prefixed with <|endoftext|>, as prepro_text does. Blank lines in
 * JSON Lines are passed over (they hold no record), and so is a byte order mark at the
 * start of an input. Compressed inputs are used only as far as their members' checksums
 * verified (tools/corpus_input.h); a damaged member stops the run, or with
 * --on-corrupt skip ends that input there.
 *
 * Writes (tools/shard_writer.h, shared with prepro_text): DIR/NAME_val_000000.bin, ...,
 * DIR/NAME_train_00000K.bin, ... (the first tokens are val: see "the val split" below;
 * shards of --shard-tokens tokens, under temporary names until the commit at the end),
 * DIR/gpt2_tokenizer.bin and DIR/NAME_manifest.txt. The run holds DIR/.lock (one run per
 * directory, under any NAME: run/run_dir.h) and first removes what killed runs left there
 * (their temporaries, of any NAME, and a commit cut short); a run that fails removes every
 * file it wrote, so shards without a manifest never survive and a full disk keeps no space
 * taken; DIR removed or replaced under the run ends it with an error, the last check after
 * the commit. DIR must not hold a corpus of NAME already (it would mix with this one under
 * the trainer's glob), unless that corpus is complete and came from this very job (the same
 * inputs, unchanged, and settings: the manifest's job line), which a rerun of a job killed
 * after its commit finds done: it exits 0 saying so.
 *
 * Parallelism: the main thread reads and decompresses, cutting the input into records
 * (lines, or whole .txt files) in batches; the workers parse the JSON, check it and
 * tokenize, each record by itself; the main thread then writes the batch's ids in input
 * order while the workers start on the next batch. The shards depend only on the input,
 * never on --threads.
 *
 * Bad records (invalid JSON or UTF-8, no text field or not a string, duplicate keys) are
 * reported as FILE:LINE: what. --on-error skip
 * (the default) warns about the first 20, counts all, and goes on; --on-error stop ends
 * with one error line and exit status 1.
 */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "run/run_dir.h"
#include "run/seams.h"
#include "run/files.h"
#include "tools/bpe.h"
#include "tools/corpus_input.h"
#include "tools/shard_writer.h"

// REC_INPUT_END: an input's end, or its verified part's (tools/corpus_input.h), so that
// what is said about the input comes in record order
enum { REC_PENDING, REC_OK, REC_BLANK, REC_BAD, REC_INPUT_END };

#define WARN_LIMIT 20             // bad records shown one by one under --on-error skip
#define DEFAULT_SHARD_TOKENS 100000000LL  // as llm.c's FineWeb shards
#define DEFAULT_VAL_CAP 10000000LL        // tokens: the default val split's most (see ValSplit)
#define DEFAULT_VAL_SHARE 10              // the default val split is 1/10 of the corpus

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ----------------------------------------------------------------------------
// batches of records

typedef struct {
    int status, format;
    uint32_t input;
    uint64_t line;     // where the record starts
    size_t off, len;   // its bytes in the batch's arena
    int worker;        // whose ids hold its tokens
    size_t ids_off, ids_len;
    char* msg;         // REC_BAD: what is wrong (allocated)
} Record;

typedef struct {
    BpeBytes arena;
    Record* rec;
    size_t n, cap;
    BpeIds* ids;  // one per worker
    atomic_size_t next;
    long long text_end, stored_end;  // bytes read when the batch was complete (for progress)
} Batch;

static void batch_init(Batch* b, int workers) {
    memset(b, 0, sizeof(*b));
    b->ids = (BpeIds*)callocCheck((size_t)workers, sizeof(BpeIds));
}

static void batch_reset(Batch* b, int workers) {
    for (size_t k = 0; k < b->n; k++) free(b->rec[k].msg);
    b->n = 0;
    b->arena.len = 0;
    for (int w = 0; w < workers; w++) b->ids[w].len = 0;
}

static Record* batch_add(Batch* b) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 4096;
        Record* p = (Record*)realloc(b->rec, b->cap * sizeof(Record));
        if (p == NULL) fatal("out of memory growing a batch to %zu records", b->cap);
        b->rec = p;
    }
    Record* r = &b->rec[b->n++];
    memset(r, 0, sizeof(*r));
    return r;
}

static char* format_message(const char* fmt, ...) LLMC_PRINTF(1, 2);
static char* format_message(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return copy_text(buf);
}

// ----------------------------------------------------------------------------
// the reader: inputs -> records, in order

typedef struct {
    Input* inputs;
    int n_inputs, cur;
    Verifier* verifier;
    unsigned char* chunk;
    size_t pos, len;
    int at_start;         // chunk holds the current input's first bytes (for a byte order mark)
    uint64_t line;        // line number at chunk[pos] in the current input
    int open;             // a record is being collected
    Record pending;       // ... this one (its bytes are at the arena's end)
    long long text_bytes; // decompressed bytes read, all inputs
} Reader;

static void reader_close_record(Reader* r, Batch* b) {
    Record* rec = batch_add(b);
    *rec = r->pending;
    rec->len = b->arena.len - rec->off;
    r->open = 0;
}

static void reader_open_record(Reader* r, Batch* b) {
    memset(&r->pending, 0, sizeof(r->pending));
    r->pending.status = REC_PENDING;
    r->pending.format = r->inputs[r->cur].format;
    r->pending.input = (uint32_t)r->cur;
    r->pending.line = r->line;
    r->pending.off = b->arena.len;
    r->open = 1;
}

static void reader_start_input(Reader* r) {
    verifier_reading(r->verifier, r->cur);
    seam_stop_at("corpus_input", r->cur, "before the reader opens input");  // tests: the input swapped here
    input_start(&r->inputs[r->cur]);
    r->line = 1;
    r->pos = r->len = 0;
    r->at_start = 1;
}

// The current input has ended (or its verified part has): its last record, unless the
// damage cut it, and a REC_INPUT_END record (at the first line lost), then the next input.
static void reader_end_input(Reader* r, Batch* b) {
    Input* in = &r->inputs[r->cur];
    uint64_t first_lost = r->open ? r->pending.line : r->line;
    if (in->damaged) {
        if (r->open) b->arena.len = r->pending.off;  // the record the verified part ends in is cut: lost
    } else {
        if (in->format == FORMAT_TEXT && !r->open) reader_open_record(r, b);  // an empty file: an empty document
        if (r->open) reader_close_record(r, b);
    }
    reader_open_record(r, b);
    r->pending.line = first_lost;
    r->pending.status = REC_INPUT_END;
    reader_close_record(r, b);
    input_close(in);
    r->cur++;
    if (r->cur < r->n_inputs) reader_start_input(r);
}

// Adds whole records to b until it holds about target bytes; 0 once every input is read.
static int reader_fill(Reader* r, Batch* b, size_t target, void (*tick)(void)) {
    while ((b->arena.len < target || r->open) && r->cur < r->n_inputs) {  // batches end between records
        Input* in = &r->inputs[r->cur];
        if (r->pos == r->len) {
            r->pos = 0;
            r->len = input_read(r->verifier, in, r->chunk, CHUNK_BYTES);
            r->text_bytes += (long long)r->len;
            if (r->len == 0) { reader_end_input(r, b); continue; }
            // A UTF-8 byte order mark (as some Windows tools write) is no part of the text.
            if (r->at_start && r->len >= 3 && memcmp(r->chunk, "\xEF\xBB\xBF", 3) == 0) r->pos = 3;
            r->at_start = 0;
            tick();
            if (r->pos == r->len) continue;
        }
        if (!r->open) reader_open_record(r, b);
        const unsigned char* start = r->chunk + r->pos;
        size_t avail = r->len - r->pos;
        if (in->format == FORMAT_TEXT) {  // the whole file is the record; count lines for messages
            for (const unsigned char* p = start; (p = memchr(p, '\n', avail - (size_t)(p - start))) != NULL; p++) r->line++;
            bpe_bytes_append(&b->arena, start, avail);
            r->pos = r->len;
            continue;
        }
        const unsigned char* nl = memchr(start, '\n', avail);
        size_t take = nl ? (size_t)(nl - start) : avail;
        bpe_bytes_append(&b->arena, start, take);
        r->pos += take;
        if (nl) {
            r->pos++;
            r->line++;
            reader_close_record(r, b);
        }
    }
    return b->n > 0 || r->cur < r->n_inputs;
}

// ----------------------------------------------------------------------------
// the workers: one record -> its tokens, or what is wrong with it

typedef struct {
    const char* text_field;
    int eot;
} Job;

// Offset of the first byte that breaks UTF-8 (overlong forms, surrogates and code points
// past U+10FFFF included), or n.
static size_t utf8_invalid_at(const unsigned char* s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t len;
        unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return i;
        if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k < len; k++) if ((s[i + k] & 0xC0) != 0x80) return i;
        i += len;
    }
    return n;
}

static int is_blank(const unsigned char* s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return 0;
    }
    return 1;
}

static const char* json_kind(const json_t* v) {
    switch (json_typeof(v)) {
        case JSON_OBJECT: return "an object";
        case JSON_ARRAY: return "an array";
        case JSON_STRING: return "a string";
        case JSON_INTEGER: case JSON_REAL: return "a number";
        case JSON_TRUE: case JSON_FALSE: return "a boolean";
        default: return "null";
    }
}

// A copy of the record's n bytes with every number outside strings written as 0 (padded
// with blanks, so byte positions stay): jansson refuses numbers beyond int64 or double
// (1e99999, a 30-digit integer), but only the text field matters, and it is a string.
static char* json_numbers_zeroed(const unsigned char* s, size_t n) {
    char* c = (char*)mallocCheck(n + 1);
    memcpy(c, s, n);
    c[n] = '\0';
    for (size_t i = 0, in_string = 0; i < n; i++) {
        if (in_string) {
            if (c[i] == '\\') i++;
            else if (c[i] == '"') in_string = 0;
        } else if (c[i] == '"') {
            in_string = 1;
        } else if (c[i] == '-' || (c[i] >= '0' && c[i] <= '9')) {
            size_t end = i + strspn(c + i + 1, "0123456789+-.eE") + 1;
            c[i] = '0';
            memset(c + i + 1, ' ', end - i - 1);
            i = end - 1;
        }
    }
    return c;
}

// The document of a JSON Lines record (pointing into *root), or NULL with r->msg set.
static const char* json_document(Record* r, const unsigned char* s, const Job* job, json_t** root, size_t* len) {
    json_error_t err;
    // Strict on purpose: a duplicate key makes "which text?" ambiguous; \u0000 is valid JSON.
    const size_t flags = JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_ALLOW_NUL;
    *root = json_loadb((const char*)s, r->len, flags, &err);
    if (*root == NULL && json_error_code(&err) == json_error_numeric_overflow) {
        char* zeroed = json_numbers_zeroed(s, r->len);
        *root = json_loadb(zeroed, r->len, flags, &err);
        free(zeroed);
    }
    if (*root == NULL) {
        if (json_error_code(&err) == json_error_invalid_utf8) {
            r->msg = format_message("invalid UTF-8 (byte %d of the line)", err.position);
        } else if (json_error_code(&err) == json_error_duplicate_key) {
            r->msg = format_message("invalid JSON: %s (keys must be unique)", err.text);
        } else {
            r->msg = format_message("invalid JSON: %s (byte %d of the line)", err.text, err.position);
        }
        return NULL;
    }
    if (!json_is_object(*root)) {
        r->msg = format_message("not a JSON object but %s", json_kind(*root));
        return NULL;
    }
    json_t* v = json_object_get(*root, job->text_field);
    if (v == NULL) {
        r->msg = format_message("no \"%s\" field", job->text_field);
        return NULL;
    }
    if (!json_is_string(v)) {
        r->msg = format_message("field \"%s\" is %s, not a string", job->text_field, json_kind(v));
        return NULL;
    }
    *len = json_string_length(v);
    return json_string_value(v);
}

static void encode_record(BpeEncoder* enc, const Job* job, Batch* b, int worker, Record* r) {
    if (r->status != REC_PENDING) return;  // the reader's verdict (a damaged stream)
    const unsigned char* s = b->arena.data + r->off;
    BpeIds* out = &b->ids[worker];
    r->worker = worker;
    r->ids_off = out->len;
    json_t* root = NULL;
    const unsigned char* doc = s;
    size_t len = r->len;
    if (r->format == FORMAT_JSONL) {
        if (is_blank(s, r->len)) { r->status = REC_BLANK; return; }
        doc = (const unsigned char*)json_document(r, s, job, &root, &len);
    } else {
        size_t bad = utf8_invalid_at(s, len);
        if (bad < len) {
            for (size_t i = 0; i < bad; i++) r->line += (s[i] == '\n');
            r->msg = format_message("invalid UTF-8 (byte 0x%02X)", s[bad]);
            doc = NULL;
        }
    }
    if (doc == NULL) {
        r->status = REC_BAD;
    } else {
        bpe_ids_push(out, job->eot);
        bpe_encode(enc, doc, len, out);
        r->status = REC_OK;
    }
    r->ids_len = out->len - r->ids_off;
    if (root) json_decref(root);
}

typedef struct Pool Pool;
typedef struct {
    Pool* pool;
    int index;
    BpeEncoder enc;
    pthread_t thread;
} Worker;

struct Pool {
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    unsigned long generation;
    int active, quit, n;
    Batch* batch;
    const Job* job;
    Worker* workers;
};

static void* worker_main(void* arg) {
    Worker* w = (Worker*)arg;
    Pool* p = w->pool;
    unsigned long seen = 0;
    while (1) {
        pthread_mutex_lock(&p->mu);
        while (p->generation == seen && !p->quit) pthread_cond_wait(&p->start, &p->mu);
        if (p->quit) { pthread_mutex_unlock(&p->mu); return NULL; }
        seen = p->generation;
        Batch* b = p->batch;
        pthread_mutex_unlock(&p->mu);
        // Records are claimed one at a time, so a long document does not hold up a thread's share.
        for (size_t i; (i = atomic_fetch_add(&b->next, 1)) < b->n;) encode_record(&w->enc, p->job, b, w->index, &b->rec[i]);
        pthread_mutex_lock(&p->mu);
        if (--p->active == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

static void pool_start(Pool* p, int n, const BpeEncoder* enc, const Job* job) {
    memset(p, 0, sizeof(*p));
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    p->n = n;
    p->job = job;
    p->workers = (Worker*)callocCheck((size_t)n, sizeof(Worker));
    for (int k = 0; k < n; k++) {
        Worker* w = &p->workers[k];
        w->pool = p;
        w->index = k;
        bpe_init_worker(&w->enc, enc);
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) fatal("cannot start tokenizer thread %d", k);
    }
}

static void pool_post(Pool* p, Batch* b) {
    pthread_mutex_lock(&p->mu);
    atomic_store(&b->next, 0);
    p->batch = b;
    p->active = p->n;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
}

static void pool_wait(Pool* p) {
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

static void pool_stop(Pool* p) {
    pthread_mutex_lock(&p->mu);
    p->quit = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int k = 0; k < p->n; k++) {
        pthread_join(p->workers[k].thread, NULL);
        bpe_free_worker(&p->workers[k].enc);
    }
    free(p->workers);
}

// ----------------------------------------------------------------------------
// progress on stderr, and the run's cleanup

static struct {
    double t0, last, every;
    int tty, shown;
    long long total_stored;  // bytes of all inputs as stored, -1 when one is unknown
    long long documents, tokens, bad;
    long long text_done, stored_done;  // bytes behind the documents written so far
} progress;

static void progress_clear(void) {
    if (progress.tty && progress.shown) fputs("\r\033[K", stderr);
    progress.shown = 0;
}

static void progress_tick(void) {
    double t = now_seconds();
    if (progress.every <= 0 || t - progress.last < progress.every) return;
    progress.last = t;
    double secs = t - progress.t0;
    char eta[64] = "";
    if (progress.total_stored > 0 && progress.stored_done > 0) {
        double frac = (double)progress.stored_done / (double)progress.total_stored;
        double left = secs * (1 - frac) / frac;
        snprintf(eta, sizeof(eta), ", %.0f%%, ETA %dm%02ds", 100 * frac, (int)(left / 60), (int)left % 60);
    }
    progress_clear();
    fprintf(stderr, "prepro_corpus: %.1f MB, %.1f MB/s, %lld documents, %lld tokens, %lld bad%s%s",
            (double)progress.text_done / 1e6, (double)progress.text_done / 1e6 / secs, progress.documents, progress.tokens,
            progress.bad, eta, progress.tty ? "" : "\n");
    progress.shown = 1;
    fflush(stderr);
}

static ShardWriter* g_writer;  // what a failed or interrupted run removes
static char g_tokenizer_tmp[PATH_MAX_LEN];  // ... and the tokenizer file's temporary

static void remove_partial_output(void) {
    if (g_writer) {
        shard_writer_abandon(g_writer);
        unlink(g_tokenizer_tmp);
    }
}

static void on_signal(int sig) {
    remove_partial_output();
    signal(sig, SIG_DFL);
    raise(sig);
}

// ----------------------------------------------------------------------------
// the val split: the corpus's first tokens, and always a train split after them
//
// --val-tokens N: the first N tokens (fewer than the corpus holds). By default a tenth of
// the corpus (at least 1 token), at most one shard's worth and DEFAULT_VAL_CAP. How much
// that is depends on the corpus's length, known only at its end, so the first tokens are
// held back (as uint16: at most 200 MB) until the end or until there are enough of them
// for the cap to decide.

typedef struct {
    ShardWriter* writer;
    long long given;  // --val-tokens, -1: the default
    size_t cap;       // the default's most
    int decided;      // the writer knows its val_tokens; nothing is held any more
    uint16_t* held;
    size_t n_held, cap_held;
} ValSplit;

static void val_split_init(ValSplit* v, ShardWriter* w, long long given, long long shard_tokens) {
    memset(v, 0, sizeof(*v));
    v->writer = w;
    v->given = given;
    v->cap = (size_t)(shard_tokens < DEFAULT_VAL_CAP ? shard_tokens : DEFAULT_VAL_CAP);
    if (given >= 0) {
        w->val_tokens = (size_t)given;
        v->decided = 1;
    }
}

// The val split is val_tokens: the held tokens go to the writer, and all that follow.
static void val_split_decide(ValSplit* v, size_t val_tokens) {
    v->writer->val_tokens = val_tokens;
    v->decided = 1;
    int ids[4096];
    for (size_t k = 0; k < v->n_held;) {
        size_t n = v->n_held - k < 4096 ? v->n_held - k : 4096;
        for (size_t i = 0; i < n; i++) ids[i] = v->held[k + i];
        shard_writer_push(v->writer, ids, n);
        k += n;
    }
    free(v->held);
    v->held = NULL;
    v->n_held = 0;
}

static void val_split_push(ValSplit* v, const int* ids, size_t n) {
    if (v->decided) {
        shard_writer_push(v->writer, ids, n);
        return;
    }
    if (v->n_held + n > v->cap_held) {  // doubling, but never far past what can be held
        size_t most = DEFAULT_VAL_SHARE * v->cap + n, grown = 2 * v->cap_held + 65536;
        v->cap_held = grown < most ? grown : most;
        if (v->cap_held < v->n_held + n) v->cap_held = v->n_held + n;
        v->held = (uint16_t*)realloc(v->held, v->cap_held * sizeof(uint16_t));
        if (v->held == NULL) fatal("out of memory holding back %zu tokens for the val split", v->n_held + n);
    }
    for (size_t k = 0; k < n; k++) {
        if (ids[k] < 0 || ids[k] > UINT16_MAX) fatal("token id %d does not fit uint16", ids[k]);
        v->held[v->n_held++] = (uint16_t)ids[k];
    }
    if (v->n_held >= DEFAULT_VAL_SHARE * v->cap) val_split_decide(v, v->cap);  // a tenth of any total from here
}

// At the end of the corpus: the default's share, and a train split in any case.
static void val_split_finish(ValSplit* v) {
    if (!v->decided) {
        if (v->n_held < 2) {
            fatal("the corpus holds %zu token%s: too few for a val and a train split", v->n_held,
                  v->n_held == 1 ? "" : "s");
        }
        size_t val = v->n_held / DEFAULT_VAL_SHARE;
        val_split_decide(v, val < 1 ? 1 : val);
    }
    const ShardWriter* w = v->writer;
    if (w->total_tokens <= w->val_tokens) {
        fatal("--val-tokens %lld takes all %zu tokens of the corpus: no train split would remain (give fewer, or "
              "leave --val-tokens out for a tenth of the corpus)", v->given, w->total_tokens);
    }
}

// ----------------------------------------------------------------------------
// writing the records in order

typedef struct {
    int stop_on_error, skip_corrupt;
    const Input* inputs;
    ValSplit* split;
    int damaged_inputs;  // --on-corrupt skip: inputs whose unverified rest was dropped
} Emitter;

static void report_bad(const Emitter* e, const Record* r) {
    const Input* in = &e->inputs[r->input];
    progress_clear();
    if (e->stop_on_error) fatal("%s:%llu: %s", in->label, (unsigned long long)r->line, r->msg);
    if (progress.bad <= WARN_LIMIT) {
        fprintf(stderr, "warning: %s:%llu: %s (skipped)\n", in->label, (unsigned long long)r->line, r->msg);
    } else if (progress.bad == WARN_LIMIT + 1) {
        fprintf(stderr, "warning: more bad records: counted, not shown\n");
    }
}

// What is said about an input at its end: a damaged member (tools/corpus_input.h) stops
// the run, or under --on-corrupt skip is dropped with the rest of the input; zstd frames
// without a checksum are named.
static void report_input_end(Emitter* e, const Record* r) {
    const Input* in = &e->inputs[r->input];
    progress_clear();
    if (in->damaged && !e->skip_corrupt) {
        fatal("%s: %s: it cannot be verified from there on, so no shard is written (--on-corrupt skip would keep "
              "the members before it and drop the rest)", in->label, in->damaged);
    }
    if (in->damaged) {
        e->damaged_inputs++;
        fprintf(stderr, "warning: %s: %s: dropped from byte %lld on, unverified; kept the %llu whole line%s before it "
                "(--on-corrupt skip)\n", in->label, in->damaged, in->damage_at, (unsigned long long)(r->line - 1),
                r->line == 2 ? "" : "s");
    }
    if (in->unchecked_frames > 0) {
        fprintf(stderr, "warning: %s: %d zstd frame%s without a checksum: corruption inside %s cannot be detected "
                "(zstd writes one unless told --no-check)\n", in->label, in->unchecked_frames,
                in->unchecked_frames == 1 ? "" : "s", in->unchecked_frames == 1 ? "it" : "them");
    }
}

// Marks where the reader stood when b was complete: the progress of its documents.
static void batch_mark(Batch* b, const Reader* r) {
    b->text_end = r->text_bytes;
    b->stored_end = 0;
    for (int k = 0; k < r->n_inputs; k++) b->stored_end += r->inputs[k].dec.raw_read;
}

static void emit_batch(Emitter* e, Batch* b, Input* inputs) {
    for (size_t k = 0; k < b->n; k++) {
        Record* r = &b->rec[k];
        Input* in = &inputs[r->input];
        if (r->status == REC_OK) {
            val_split_push(e->split, b->ids[r->worker].ids + r->ids_off, r->ids_len);
            in->documents++;
            progress.documents++;
            progress.tokens += (long long)r->ids_len;
        } else if (r->status == REC_BAD) {
            in->bad++;
            progress.bad++;
            report_bad(e, r);
        } else if (r->status == REC_INPUT_END) {
            report_input_end(e, r);
        }
    }
    progress.text_done = b->text_end;
    progress.stored_done = b->stored_end;
}

// ----------------------------------------------------------------------------

static void usage(void) {
    fprintf(stderr,
            "usage: ./prepro_corpus --out-dir DIR [options] INPUT...\n"
            "  INPUT: FILE.jsonl[.zst|.gz] (one JSON object per line), FILE.txt[.zst|.gz] (one document),\n"
            "         - (JSON Lines on stdin); read in the order given\n"
            "  --name NAME            shard names NAME_val_000000.bin, NAME_train_000001.bin ... (default corpus)\n"
            "  --text-field KEY       the document's field in each JSON object (default text)\n"
            "  --shard-tokens N       tokens per shard (default 100000000, as llm.c's FineWeb)\n"
            "  --val-tokens N         the first N tokens are the val split (fewer than the corpus holds; default:\n"
            "                         a tenth of the corpus, at most --shard-tokens and 10000000)\n"
            "  --threads N            tokenizer threads (default: the online CPUs)\n"
            "  --on-error skip|stop   bad records: warn, count and go on (default), or stop with exit 1\n"
            "  --on-corrupt stop|skip a corrupt or truncated gzip member or zstd frame: stop with exit 1 (default),\n"
            "                         or drop it and the rest of its input (the members before it are kept)\n"
            "  --progress SECONDS     progress line interval on stderr (default 1; 0: none)\n"
            "  --batch-bytes N        text bytes read ahead per batch (default max(4 MiB, threads x 512 KiB))\n"
            "  --encoder PATH --merges PATH   GPT-2 BPE (default dev/data/gpt2/encoder.json, vocab.bpe,\n"
            "                         relative to the working directory: run it from the repository root)\n"
            "  --                     the arguments after it are inputs (a file named -x too)\n");
}

static long long parse_count(const char* flag, const char* v, long long lo, long long hi) {
    char* end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) fatal("%s wants an integer in %lld..%lld, got '%s'", flag, lo, hi, v);
    return x;
}

// ----------------------------------------------------------------------------
// the output directory: one run at a time (its .lock), and what a killed run left there

enum { FILE_OTHER, FILE_SHARD, FILE_SHARD_TMP, FILE_MANIFEST, FILE_MANIFEST_TMP };

// What file f is to the corpus named name: NAME_val_N.bin or NAME_train_N.bin (N digits),
// NAME_manifest.txt, either with .tmp while unfinished, or none of these.
static int corpus_file_kind(const char* f, const char* name) {
    size_t n = strlen(name);
    if (strncmp(f, name, n) != 0 || f[n] != '_') return FILE_OTHER;
    const char* rest = f + n + 1;
    if (strcmp(rest, "manifest.txt") == 0) return FILE_MANIFEST;
    if (strcmp(rest, "manifest.txt.tmp") == 0) return FILE_MANIFEST_TMP;
    if (strncmp(rest, "val_", 4) == 0) rest += 4;
    else if (strncmp(rest, "train_", 6) == 0) rest += 6;
    else return FILE_OTHER;
    size_t digits = strspn(rest, "0123456789");
    if (digits == 0) return FILE_OTHER;
    if (strcmp(rest + digits, ".bin") == 0) return FILE_SHARD;
    if (strcmp(rest + digits, ".bin.tmp") == 0) return FILE_SHARD_TMP;
    return FILE_OTHER;
}

// The corpus name of a temporary a run writes (NAME_manifest.txt.tmp, NAME_val_N.bin.tmp,
// NAME_train_N.bin.tmp) into name (n bytes); 0 for any other file.
static int corpus_of_temporary(const char* f, char* name, size_t n) {
    const char* suffixes[] = {"_manifest.txt.tmp", "_val_", "_train_"};
    for (int k = 0; k < 3; k++) {
        for (const char* at = strstr(f, suffixes[k]); at; at = strstr(at + 1, suffixes[k])) {
            size_t len = (size_t)(at - f);
            if (len == 0 || len >= n) continue;
            memcpy(name, f, len);
            name[len] = '\0';
            int kind = corpus_file_kind(f, name);
            if (kind == FILE_SHARD_TMP || kind == FILE_MANIFEST_TMP) return 1;
        }
    }
    return 0;
}

// A corpus name is a plain file-name prefix: letters, digits, '.', '_', '-', not starting
// with '.' or '-' (so never "..", a hidden file, an option, or a path).
static int corpus_name_ok(const char* name) {
    if (name[0] == '\0' || name[0] == '.' || name[0] == '-' || strlen(name) > 200) return 0;
    for (const char* p = name; *p; p++) {
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
              *p == '_' || *p == '-')) {
            return 0;
        }
    }
    return 1;
}

static void remove_file(const char* dir, const char* f) {
    char path[PATH_MAX_LEN];
    path_format(path, sizeof(path), "%s/%s", dir, f);
    if (unlink(path) != 0 && errno != ENOENT) fatal("cannot remove '%s': %s", path, strerror(errno));
}

// A run of the corpus `name` that was killed (kill -9, a crash, a power cut) left its
// temporaries, and if it died during its commit (tools/shard_writer.h) a manifest some of
// whose shards are still temporaries. This run holds the directory's lock, so no live run
// owns them: they are removed, and the run says so.
static void remove_interrupted_run(const char* dir, const char* name) {
    DIR* d = opendir(dir);
    if (d == NULL) fatal("cannot read output directory '%s': %s", dir, strerror(errno));
    char** temps = NULL;
    int n_temps = 0, shard_temps = 0;
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        int kind = corpus_file_kind(e->d_name, name);
        if (kind != FILE_SHARD_TMP && kind != FILE_MANIFEST_TMP) continue;
        temps = (char**)realloc(temps, (size_t)(n_temps + 1) * sizeof(char*));
        if (temps == NULL) fatal("out of memory listing '%s'", dir);
        temps[n_temps++] = copy_text(e->d_name);
        shard_temps += kind == FILE_SHARD_TMP;
    }
    closedir(d);
    if (n_temps == 0) return;
    // An unfinished commit: the manifest names a shard that is still a temporary.
    char manifest[PATH_MAX_LEN], line[PATH_MAX_LEN + 128];
    path_format(manifest, sizeof(manifest), "%s/%s_manifest.txt", dir, name);
    struct stat st;
    FILE* f = lstat(manifest, &st) == 0 ? fopenCheck(manifest, "r") : NULL;
    char** listed = NULL;
    int n_listed = 0, in_commit = 0;
    while (f && fgets(line, sizeof(line), f)) {
        int at = -1;
        line[strcspn(line, "\n")] = '\0';
        if (sscanf(line, "shard %*s %*s %*s %*s %n", &at) != 0 || at < 0 || corpus_file_kind(line + at, name) != FILE_SHARD) continue;
        listed = (char**)realloc(listed, (size_t)(n_listed + 1) * sizeof(char*));
        if (listed == NULL) fatal("out of memory reading '%s'", manifest);
        listed[n_listed++] = copy_text(line + at);
        for (int k = 0; k < n_temps; k++) {
            if (strncmp(temps[k], line + at, strlen(line + at)) == 0 && strcmp(temps[k] + strlen(line + at), ".tmp") == 0) in_commit = 1;
        }
    }
    if (f) fclose(f);
    for (int k = 0; k < n_temps; k++) remove_file(dir, temps[k]);
    if (in_commit) {
        for (int k = 0; k < n_listed; k++) remove_file(dir, listed[k]);
        remove_file(dir, shard_base_name(manifest));
    }
    fprintf(stderr, "prepro_corpus: removed what an interrupted run of corpus '%s' left in '%s': %d unfinished "
            "shard%s%s\n", name, dir, shard_temps, shard_temps == 1 ? "" : "s",
            in_commit ? ", and the manifest and shards of the commit it did not finish" : "");
    for (int k = 0; k < n_temps; k++) free(temps[k]);
    for (int k = 0; k < n_listed; k++) free(listed[k]);
    free(temps);
    free(listed);
}

// Every killed run's leftovers, under any name (one run holds the directory at a time, so
// all of them are dead): on a full disk they would hold the space the next run needs.
static void remove_interrupted_runs(const char* dir) {
    char tokenizer_tmp[PATH_MAX_LEN];
    path_format(tokenizer_tmp, sizeof(tokenizer_tmp), "%s/gpt2_tokenizer.bin.tmp", dir);
    if (unlink(tokenizer_tmp) == 0) fprintf(stderr, "prepro_corpus: removed %s, left by an interrupted run\n", tokenizer_tmp);
    for (;;) {  // one name at a time: removing its files changes the listing
        DIR* d = opendir(dir);
        if (d == NULL) fatal("cannot read output directory '%s': %s", dir, strerror(errno));
        char name[256];
        int found = 0;
        for (struct dirent* e; !found && (e = readdir(d)) != NULL;) found = corpus_of_temporary(e->d_name, name, sizeof(name));
        closedir(d);
        if (!found) return;
        remove_interrupted_run(dir, name);
    }
}

// The job as it would be repeated: every input (its path as given, size and modification
// time), the settings that shape the shards, the BPE files. Its 64-bit FNV-1a digest, as
// 16 hex digits, is the manifest's job line; "-" for a job that reads stdin (never the same).
static void job_digest(const Input* inputs, int n_inputs, const char* const* settings, int n_settings,
                       char out[17]) {
    uint64_t h = 1469598103934665603ull;
    char item[PATH_MAX_LEN + 96];
    for (int k = 0; k < n_inputs + n_settings; k++) {
        const char* text = k < n_inputs ? inputs[k].path : settings[k - n_inputs];
        struct stat st;
        if (k < n_inputs && strcmp(text, "-") == 0) {
            snprintf(out, 17, "-");
            return;
        }
        int file = k < n_inputs || strncmp(text, "file ", 5) == 0;
        const char* path = k < n_inputs ? text : text + (file ? 5 : 0);
        if (file && stat(path, &st) == 0) {
            snprintf(item, sizeof(item), "%s %lld %lld.%09ld\n", text, (long long)st.st_size, (long long)st.st_mtim.tv_sec,
                     st.st_mtim.tv_nsec);
        } else {
            snprintf(item, sizeof(item), "%s\n", text);
        }
        for (const char* p = item; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    }
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

// Another run's shards under the same name would be read together with this run's. Returns
// 1 when the directory already holds this very job's corpus, complete (a rerun of a job
// killed after its commit: nothing to do); refuses any other corpus of that name.
static int corpus_already_prepared(const char* dir, const char* name, const char* job) {
    DIR* d = opendir(dir);
    if (d == NULL) fatal("cannot read output directory '%s': %s", dir, strerror(errno));
    char found[256] = "";
    for (struct dirent* e; (e = readdir(d)) != NULL && !found[0];) {
        int kind = corpus_file_kind(e->d_name, name);
        if (kind == FILE_SHARD || kind == FILE_MANIFEST) snprintf(found, sizeof(found), "%s", e->d_name);
    }
    closedir(d);
    if (!found[0]) return 0;
    char manifest[PATH_MAX_LEN], line[PATH_MAX_LEN + 128], saved_job[32] = "";
    path_format(manifest, sizeof(manifest), "%s/%s_manifest.txt", dir, name);
    struct stat st;
    FILE* f = lstat(manifest, &st) == 0 ? fopenCheck(manifest, "r") : NULL;
    int shards = 0, whole = f != NULL;
    while (f && fgets(line, sizeof(line), f)) {
        int at = -1;
        unsigned long long bytes = 0;
        line[strcspn(line, "\n")] = '\0';
        if (sscanf(line, "job %31s", saved_job) == 1) continue;
        if (sscanf(line, "shard %*s %*s %llu %*s %n", &bytes, &at) < 1 || at < 0) continue;
        char path[PATH_MAX_LEN];
        path_format(path, sizeof(path), "%s/%s", dir, line + at);
        shards++;
        if (stat(path, &st) != 0 || (unsigned long long)st.st_size != bytes) whole = 0;
    }
    if (f) fclose(f);
    if (whole && strcmp(saved_job, job) == 0 && strcmp(job, "-") != 0) {
        printf("prepro_corpus: '%s' already holds corpus '%s' from this job (the same inputs, unchanged, and settings), "
               "complete: its manifest and %d shards; nothing to do\n", dir, name, shards);
        return 1;
    }
    if (whole) {
        fatal("output directory '%s' already holds a corpus named '%s', complete (%s_manifest.txt and %d shards), %s: "
              "use another --out-dir or --name, or remove that corpus's files first", dir, name, name, shards,
              strcmp(job, "-") == 0 ? "and this job reads stdin, which cannot be compared with its inputs"
                                    : "prepared from other inputs or settings");
    }
    fatal("output directory '%s' already holds '%s' of a corpus named '%s': use another --out-dir or --name, or "
          "remove that corpus's files first", dir, found, name);
}

int main(int argc, char** argv) {
    const char* encoder_path = "dev/data/gpt2/encoder.json";
    const char* merges_path = "dev/data/gpt2/vocab.bpe";
    const char* out_dir = NULL;
    const char* name = "corpus";
    Job job = {"text", 0};
    long long shard_tokens = DEFAULT_SHARD_TOKENS, val_tokens = -1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cpus > 0 ? (int)(cpus < 1024 ? cpus : 1024) : 1;
    int stop_on_error = 0, skip_corrupt = 0;
    double progress_every = 1.0;
    long long batch_bytes = 0;  // 0: chosen from the thread count
    const char** paths = (const char**)mallocCheck((size_t)argc * sizeof(char*));
    int n_inputs = 0;

    int options_end = 0;  // after "--" every argument is an input, one named "-x" too
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (!options_end && strcmp(a, "--") == 0) { options_end = 1; continue; }
        if (!options_end && (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)) { usage(); return 0; }
        if (options_end || a[0] != '-' || strcmp(a, "-") == 0) { paths[n_inputs++] = a; continue; }
        if (i + 1 >= argc) { usage(); fatal("option '%s' is unknown or needs a value", a); }
        const char* v = argv[++i];
        if (strcmp(a, "--out-dir") == 0) out_dir = v;
        else if (strcmp(a, "--name") == 0) name = v;
        else if (strcmp(a, "--text-field") == 0) job.text_field = v;
        else if (strcmp(a, "--encoder") == 0) encoder_path = v;
        else if (strcmp(a, "--merges") == 0) merges_path = v;
        else if (strcmp(a, "--shard-tokens") == 0) shard_tokens = parse_count(a, v, 1, INT32_MAX);
        else if (strcmp(a, "--val-tokens") == 0) val_tokens = parse_count(a, v, 0, INT64_MAX);
        else if (strcmp(a, "--threads") == 0) threads = (int)parse_count(a, v, 1, 1024);
        else if (strcmp(a, "--progress") == 0) progress_every = (double)parse_count(a, v, 0, 3600);
        else if (strcmp(a, "--batch-bytes") == 0) batch_bytes = parse_count(a, v, 1, 1LL << 34);
        else if (strcmp(a, "--on-error") == 0) {
            if (strcmp(v, "skip") == 0) stop_on_error = 0;
            else if (strcmp(v, "stop") == 0) stop_on_error = 1;
            else fatal("--on-error wants skip or stop, got '%s'", v);
        } else if (strcmp(a, "--on-corrupt") == 0) {
            if (strcmp(v, "stop") == 0) skip_corrupt = 0;
            else if (strcmp(v, "skip") == 0) skip_corrupt = 1;
            else fatal("--on-corrupt wants stop or skip, got '%s'", v);
        } else {
            usage();
            fatal("unknown option '%s'", a);
        }
    }
    if (out_dir == NULL) { usage(); fatal("--out-dir DIR is required"); }
    if (n_inputs == 0) { usage(); fatal("no input given (files, or - for JSON Lines on stdin)"); }
    if (!corpus_name_ok(name)) {
        fatal("--name '%s': want a plain file name prefix (letters, digits, '.', '_', '-'; not starting with '.' or "
              "'-')", name);
    }
    for (int k = 0; k < n_inputs; k++) {
        for (int j = 0; j < k && strcmp(paths[k], "-") == 0; j++) {
            if (strcmp(paths[j], "-") == 0) fatal("- is given twice: standard input can be read once");
        }
    }

    Input* inputs = (Input*)callocCheck((size_t)n_inputs, sizeof(Input));
    long long total_stored = 0;
    for (int k = 0; k < n_inputs; k++) {
        input_probe(&inputs[k], paths[k]);
        total_stored = (total_stored < 0 || inputs[k].size < 0) ? -1 : total_stored + inputs[k].size;
    }
    BpeEncoder enc;
    bpe_init(&enc, encoder_path, merges_path);
    job.eot = enc.eot_token;
    char settings_text[5][PATH_MAX_LEN + 32];
    snprintf(settings_text[0], sizeof(settings_text[0]), "--text-field %s --shard-tokens %lld --val-tokens %lld "
             "--on-error %d --on-corrupt %d", job.text_field, shard_tokens, val_tokens, stop_on_error, skip_corrupt);
    snprintf(settings_text[1], sizeof(settings_text[1]), "file %s", encoder_path);
    snprintf(settings_text[2], sizeof(settings_text[2]), "file %s", merges_path);
    const char* settings[3] = {settings_text[0], settings_text[1], settings_text[2]};
    char job_id[17];
    job_digest(inputs, n_inputs, settings, 3, job_id);
    shard_make_dir(out_dir);
    run_dir_lock(out_dir, "their shards and manifests");  // held until the process ends, kill -9 included
    remove_interrupted_runs(out_dir);
    if (corpus_already_prepared(out_dir, name, job_id)) return 0;
    path_format(g_tokenizer_tmp, sizeof(g_tokenizer_tmp), "%s/gpt2_tokenizer.bin.tmp", out_dir);

    ShardWriter writer;
    shard_writer_init(&writer, out_dir, name, (size_t)shard_tokens, 0, 1, enc.vocab_size);
    ValSplit split;
    val_split_init(&split, &writer, val_tokens, shard_tokens);
    g_writer = &writer;
    atexit(remove_partial_output);  // fatal() exits: a failed run leaves no shard behind
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    files_size_limit_fails_writes();

    json_object_seed(0);  // before the threads: jansson seeds its hash tables once
    Pool pool;
    pool_start(&pool, threads, &enc, &job);
    Verifier verifier;
    verifier_start(&verifier, inputs, n_inputs);
    Reader reader = {.inputs = inputs, .n_inputs = n_inputs, .verifier = &verifier,
                     .chunk = (unsigned char*)mallocCheck(CHUNK_BYTES)};
    reader_start_input(&reader);
    progress.t0 = progress.last = now_seconds();
    progress.every = progress_every;
    progress.tty = isatty(fileno(stderr));
    progress.total_stored = total_stored;

    // Two batches: the workers tokenize one while the main thread writes the one before
    // and reads the one after.
    // Big enough that every thread has many records; the shards do not depend on it.
    size_t target = (size_t)threads << 19;
    if (target < (4u << 20)) target = 4u << 20;
    if (batch_bytes > 0) target = (size_t)batch_bytes;
    Batch batches[2];
    batch_init(&batches[0], threads);
    batch_init(&batches[1], threads);
    Emitter emitter = {stop_on_error, skip_corrupt, inputs, &split, 0};
    int cur = 0;
    int more = reader_fill(&reader, &batches[cur], target, progress_tick);
    batch_mark(&batches[cur], &reader);
    if (more) pool_post(&pool, &batches[cur]);
    while (more) {
        Batch* next = &batches[1 - cur];
        batch_reset(next, threads);
        more = reader_fill(&reader, next, target, progress_tick) && next->n > 0;
        batch_mark(next, &reader);
        pool_wait(&pool);
        if (more) pool_post(&pool, next);
        emit_batch(&emitter, &batches[cur], inputs);
        progress_tick();
        cur = 1 - cur;
    }
    pool_stop(&pool);
    progress_clear();

    if (progress.documents == 0) fatal("no documents: every record of the input was bad or blank%s",
                                           emitter.damaged_inputs ? ", or dropped as unverified" : "");
    val_split_finish(&split);
    shard_writer_finish(&writer);
    char tok_path[PATH_MAX_LEN];
    path_format(tok_path, sizeof(tok_path), "%s/gpt2_tokenizer.bin", out_dir);
    tokenizer_file_write(&enc, tok_path);
    BpeBytes extra = {0};
    for (int k = 0; k < n_inputs; k++) {
        char line[PATH_MAX_LEN + 128];
        const Input* in = &inputs[k];
        snprintf(line, sizeof(line), "input %lld %lld %lld %s\n", in->documents, in->bad, in->dec.raw_read, in->path);
        bpe_bytes_append(&extra, line, strlen(line));
        if (in->damaged) {  // --on-corrupt skip dropped the input's bytes from damage_at on
            snprintf(line, sizeof(line), "unverified %lld %lld %s\n", in->damage_at, in->size - in->damage_at, in->path);
            bpe_bytes_append(&extra, line, strlen(line));
        }
    }
    char line[128];
    snprintf(line, sizeof(line), "documents %lld %lld\njob %s\n", progress.documents, progress.bad, job_id);
    bpe_bytes_append(&extra, line, strlen(line) + 1);  // with its NUL
    seam_stop_at("corpus_commit", 1, "before the commit of run");
    shard_writer_write_manifest(&writer, "prepro_corpus", (const char*)extra.data);
    g_writer = NULL;  // complete; and writer lives in main's frame, gone when the atexit handler runs
    seam_stop_at("corpus_done", 1, "after the commit of run");
    run_dir_require();  // a corpus written into a directory removed meanwhile is lost: say so

    double secs = now_seconds() - progress.t0;
    printf("prepro_corpus: %d inputs, %.1f MB of text in %.2f s (%.1f MB/s, %d threads): %lld documents -> %zu tokens "
           "in %zu shards (val %zu, train %zu)\n", n_inputs, (double)reader.text_bytes / 1e6, secs,
           (double)reader.text_bytes / 1e6 / secs, threads, progress.documents, writer.total_tokens, (size_t)writer.n_done,
           writer.val_written, writer.total_tokens - writer.val_written);
    if (progress.bad > 0) fprintf(stderr, "prepro_corpus: %lld bad records skipped (see the warnings above)\n", progress.bad);
    if (emitter.damaged_inputs > 0) {
        fprintf(stderr, "prepro_corpus: %d input%s ended at a corrupt or truncated member: the unverified rest dropped "
                "(see the warnings above)\n", emitter.damaged_inputs, emitter.damaged_inputs == 1 ? "" : "s");
    }
    verifier_stop(&verifier);  // done with every input: the reader read them all
    free(extra.data);
    free(reader.chunk);
    for (int b = 0; b < 2; b++) {
        batch_reset(&batches[b], threads);
        for (int w = 0; w < threads; w++) bpe_ids_free(&batches[b].ids[w]);
        free(batches[b].ids); free(batches[b].rec); free(batches[b].arena.data);
    }
    shard_writer_free(&writer);
    free(inputs);
    free(paths);
    bpe_free(&enc);
    return 0;
}
