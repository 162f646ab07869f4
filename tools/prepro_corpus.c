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
 * JSON Lines are passed over (they hold no record).
 *
 * Writes (tools/shard_writer.h, shared with prepro_text): DIR/NAME_val_000000.bin, ...,
 * DIR/NAME_train_00000K.bin, ... (the first tokens are val: see "the val split" below;
 * shards of --shard-tokens tokens; each written to a temporary name and renamed when complete),
 * DIR/gpt2_tokenizer.bin and, last, DIR/NAME_manifest.txt. A run that fails removes the
 * shards it wrote, so shards without a manifest never survive; DIR must not hold shards
 * of NAME already (another run's would mix with this one's under the trainer's glob).
 *
 * Parallelism: the main thread reads and decompresses, cutting the input into records
 * (lines, or whole .txt files) in batches; the workers parse the JSON, check it and
 * tokenize, each record by itself; the main thread then writes the batch's ids in input
 * order while the workers start on the next batch. The shards depend only on the input,
 * never on --threads.
 *
 * Bad records (invalid JSON or UTF-8, no text field or not a string, duplicate keys, a
 * truncated or corrupt zstd/gzip stream) are reported as FILE:LINE: what. --on-error skip
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
#include <zlib.h>
#include <zstd.h>

#include "llmc/utils.h"
#include "tools/bpe.h"
#include "tools/shard_writer.h"

enum { FORMAT_JSONL, FORMAT_TEXT };
enum { CODEC_PLAIN, CODEC_ZSTD, CODEC_GZIP };
enum { REC_PENDING, REC_OK, REC_BLANK, REC_BAD };

#define CHUNK_BYTES (1 << 18)     // decompressed bytes the reader handles at a time
#define WARN_LIMIT 20             // bad records shown one by one under --on-error skip
#define DEFAULT_SHARD_TOKENS 100000000LL  // as llm.c's FineWeb shards
#define DEFAULT_VAL_CAP 10000000LL        // tokens: the default val split's most (see ValSplit)
#define DEFAULT_VAL_SHARE 10              // the default val split is 1/10 of the corpus

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char* copy_string(const char* s) {
    size_t n = strlen(s) + 1;
    char* p = (char*)mallocCheck(n);
    memcpy(p, s, n);
    return p;
}

static int ends_with(const char* s, size_t n, const char* suffix) {
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

// ----------------------------------------------------------------------------
// inputs: a file (or stdin) and its decompressor, read as a stream of text bytes

typedef struct {
    const char* path;   // as given ("-": stdin)
    const char* label;  // for messages
    int format, codec;
    FILE* f;
    long long size;      // bytes as stored (compressed), -1 when unknown
    long long raw_read;  // of those, read so far
    unsigned char* in;   // compressed bytes not yet decompressed: in[in_pos..in_len)
    size_t in_pos, in_len;
    int in_eof;
    ZSTD_DStream* zs;
    size_t zs_last;  // ZSTD_decompressStream's last hint: 0 right after a complete frame
    z_stream z;
    int z_member_done;    // inflate finished a gzip member (another may follow)
    const char* damaged;  // why the stream ended early (truncated or corrupt), or NULL
    long long documents, bad;
} Input;

// The format and compression an input's name says; 0 if it says neither.
static int input_classify(Input* in) {
    const char* p = in->path;
    size_t n = strlen(p);
    in->codec = CODEC_PLAIN;
    if (strcmp(p, "-") == 0) { in->format = FORMAT_JSONL; return 1; }
    if (ends_with(p, n, ".zst")) { in->codec = CODEC_ZSTD; n -= 4; }
    else if (ends_with(p, n, ".gz")) { in->codec = CODEC_GZIP; n -= 3; }
    if (ends_with(p, n, ".jsonl")) in->format = FORMAT_JSONL;
    else if (ends_with(p, n, ".txt")) in->format = FORMAT_TEXT;
    else return 0;
    return 1;
}

// Checks every input before anything is written (a missing file ends the run at once);
// the files are opened one at a time later, so a corpus may have more files than fds.
static void input_probe(Input* in, const char* path) {
    memset(in, 0, sizeof(*in));
    in->path = path;
    in->label = strcmp(path, "-") == 0 ? "<stdin>" : path;
    const char* kind = strcmp(path, "-") == 0 ? NULL : not_regular_file_kind(path);
    if (kind) fatal("input '%s' is %s, not a regular file (pipe a stream in as -)", path, kind);
    if (!input_classify(in)) {
        fatal("input '%s': cannot tell its format from the name (want .jsonl, .jsonl.zst, .jsonl.gz, .txt, "
              ".txt.zst, .txt.gz, or - for JSON Lines on stdin)", path);
    }
    in->size = -1;
    struct stat st;
    if (strcmp(path, "-") == 0) {
        if (fstat(STDIN_FILENO, &st) == 0 && S_ISREG(st.st_mode)) in->size = (long long)st.st_size;
        return;
    }
    FILE* f = fopen(path, "rb");
    if (f == NULL) fatal("cannot read input '%s': %s", path, strerror(errno));
    if (fstat(fileno(f), &st) == 0) in->size = (long long)st.st_size;
    fclose(f);
}

static void input_start(Input* in) {
    in->f = strcmp(in->path, "-") == 0 ? stdin : fopen(in->path, "rb");
    if (in->f == NULL) fatal("cannot read input '%s': %s", in->path, strerror(errno));
    in->in = (unsigned char*)mallocCheck(CHUNK_BYTES);
    if (in->codec == CODEC_ZSTD) {
        in->zs = ZSTD_createDStream();
        if (in->zs == NULL) fatal("out of memory creating a zstd decoder");
        in->zs_last = 1;  // a frame is due: an empty file is a truncated one
    } else if (in->codec == CODEC_GZIP) {
        if (inflateInit2(&in->z, 16 + MAX_WBITS) != Z_OK) fatal("cannot start a gzip decoder");  // 16: gzip wrapper
    }
}

static void input_close(Input* in) {
    if (in->zs) ZSTD_freeDStream(in->zs);
    if (in->codec == CODEC_GZIP) inflateEnd(&in->z);
    if (in->f != stdin) fclose(in->f);  // read only: nothing to lose
    free(in->in);
    in->in = NULL;
    in->zs = NULL;
}

// More compressed bytes in in->in; 0 at the end of the file.
static int input_refill(Input* in) {
    if (in->in_pos < in->in_len) return 1;
    if (in->in_eof) return 0;
    size_t got = fread(in->in, 1, CHUNK_BYTES, in->f);
    if (got == 0) {
        if (ferror(in->f)) fatal("read error on input '%s': %s", in->label, strerror(errno));
        in->in_eof = 1;
        return 0;
    }
    in->in_pos = 0;
    in->in_len = got;
    in->raw_read += (long long)got;
    return 1;
}

static size_t read_zstd(Input* in, unsigned char* out, size_t cap) {
    while (1) {
        int more = input_refill(in);
        // At the end of the file, a decoder between frames is done; inside one it may
        // still hold output, and if it holds none the frame was cut short.
        if (!more && in->zs_last == 0) return 0;
        ZSTD_inBuffer ib = {in->in, in->in_len, in->in_pos};
        ZSTD_outBuffer ob = {out, cap, 0};
        size_t r = ZSTD_decompressStream(in->zs, &ob, &ib);
        in->in_pos = ib.pos;
        if (ZSTD_isError(r)) {
            in->damaged = ZSTD_getErrorName(r);  // a static string
            return 0;
        }
        in->zs_last = r;
        if (ob.pos > 0) return ob.pos;
        if (!more) {
            in->damaged = "truncated zstd frame";
            return 0;
        }
    }
}

static size_t read_gzip(Input* in, unsigned char* out, size_t cap) {
    while (1) {
        int more = input_refill(in);
        if (in->z_member_done) {  // gzip files may hold several members, one after the other
            if (!more) return 0;
            inflateReset(&in->z);
            in->z_member_done = 0;
        }
        in->z.next_in = in->in + in->in_pos;
        in->z.avail_in = (uInt)(in->in_len - in->in_pos);
        in->z.next_out = out;
        in->z.avail_out = (uInt)cap;
        int r = inflate(&in->z, Z_NO_FLUSH);
        in->in_pos = in->in_len - in->z.avail_in;
        size_t produced = cap - in->z.avail_out;
        if (r == Z_STREAM_END) in->z_member_done = 1;
        else if (r != Z_OK && r != Z_BUF_ERROR) {
            in->damaged = r == Z_MEM_ERROR ? "out of memory in zlib" : "corrupt gzip data";
            return 0;
        }
        if (produced > 0) return produced;
        if (!more && !in->z_member_done) {
            in->damaged = "truncated gzip stream";
            return 0;
        }
    }
}

// Up to cap text bytes; 0 at the end of the input, or where it is damaged (in->damaged).
static size_t input_read(Input* in, unsigned char* out, size_t cap) {
    if (in->codec == CODEC_ZSTD) return read_zstd(in, out, cap);
    if (in->codec == CODEC_GZIP) return read_gzip(in, out, cap);
    if (!input_refill(in)) return 0;
    size_t n = in->in_len - in->in_pos < cap ? in->in_len - in->in_pos : cap;
    memcpy(out, in->in + in->in_pos, n);
    in->in_pos += n;
    return n;
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
    return copy_string(buf);
}

// ----------------------------------------------------------------------------
// the reader: inputs -> records, in order

typedef struct {
    Input* inputs;
    int n_inputs, cur;
    unsigned char* chunk;
    size_t pos, len;
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

// The current input has ended (or broke off): its last record, or the damage, then the next input.
static void reader_end_input(Reader* r, Batch* b) {
    Input* in = &r->inputs[r->cur];
    if (in->damaged) {
        if (r->open) b->arena.len = r->pending.off;  // the record it broke off in is lost with it
        else reader_open_record(r, b);
        r->pending.line = r->line;  // the line the stream reached
        r->pending.status = REC_BAD;
        r->pending.msg = copy_string(in->damaged);
        reader_close_record(r, b);
    } else {
        if (in->format == FORMAT_TEXT && !r->open) reader_open_record(r, b);  // an empty file: an empty document
        if (r->open) reader_close_record(r, b);
    }
    input_close(in);
    r->cur++;
    r->line = 1;
    r->pos = r->len = 0;
    if (r->cur < r->n_inputs) input_start(&r->inputs[r->cur]);
}

// Adds whole records to b until it holds about target bytes; 0 once every input is read.
static int reader_fill(Reader* r, Batch* b, size_t target, void (*tick)(void)) {
    while ((b->arena.len < target || r->open) && r->cur < r->n_inputs) {  // batches end between records
        Input* in = &r->inputs[r->cur];
        if (r->pos == r->len) {
            r->pos = 0;
            r->len = input_read(in, r->chunk, CHUNK_BYTES);
            r->text_bytes += (long long)r->len;
            if (r->len == 0) { reader_end_input(r, b); continue; }
            tick();
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

// The document of a JSON Lines record (pointing into *root), or NULL with r->msg set.
static const char* json_document(Record* r, const unsigned char* s, const Job* job, json_t** root, size_t* len) {
    json_error_t err;
    // Strict on purpose: a duplicate key makes "which text?" ambiguous; \u0000 is valid JSON.
    *root = json_loadb((const char*)s, r->len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
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

static void remove_partial_output(void) {
    if (g_writer) shard_writer_abandon(g_writer);
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
    int stop_on_error;
    const Input* inputs;
    ValSplit* split;
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

// Marks where the reader stood when b was complete: the progress of its documents.
static void batch_mark(Batch* b, const Reader* r) {
    b->text_end = r->text_bytes;
    b->stored_end = 0;
    for (int k = 0; k < r->n_inputs; k++) b->stored_end += r->inputs[k].raw_read;
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
            "  --progress SECONDS     progress line interval on stderr (default 1; 0: none)\n"
            "  --batch-bytes N        text bytes read ahead per batch (default max(4 MiB, threads x 512 KiB))\n"
            "  --encoder PATH --merges PATH   GPT-2 BPE (default dev/data/gpt2/encoder.json, vocab.bpe)\n");
}

static long long parse_count(const char* flag, const char* v, long long lo, long long hi) {
    char* end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) fatal("%s wants an integer in %lld..%lld, got '%s'", flag, lo, hi, v);
    return x;
}

// Another run's shards under the same name would be read together with this run's.
static void refuse_existing_shards(const char* dir, const char* name) {
    DIR* d = opendir(dir);
    if (d == NULL) fatal("cannot read output directory '%s': %s", dir, strerror(errno));
    char val[PATH_MAX_LEN], train[PATH_MAX_LEN], manifest[PATH_MAX_LEN];
    path_format(val, sizeof(val), "%s_val_", name);
    path_format(train, sizeof(train), "%s_train_", name);
    path_format(manifest, sizeof(manifest), "%s_manifest.txt", name);
    for (struct dirent* e; (e = readdir(d)) != NULL;) {
        const char* f = e->d_name;
        int ours = strncmp(f, val, strlen(val)) == 0 || strncmp(f, train, strlen(train)) == 0 || strcmp(f, manifest) == 0;
        if (ours) {
            closedir(d);
            fatal("output directory '%s' already holds '%s' of a corpus named '%s': use another --out-dir or "
                  "--name, or remove that corpus's files first", dir, f, name);
        }
    }
    closedir(d);
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
    int stop_on_error = 0;
    double progress_every = 1.0;
    long long batch_bytes = 0;  // 0: chosen from the thread count
    const char** paths = (const char**)mallocCheck((size_t)argc * sizeof(char*));
    int n_inputs = 0;

    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) { usage(); return 0; }
        if (a[0] != '-' || strcmp(a, "-") == 0) { paths[n_inputs++] = a; continue; }
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
        } else {
            usage();
            fatal("unknown option '%s'", a);
        }
    }
    if (out_dir == NULL) { usage(); fatal("--out-dir DIR is required"); }
    if (n_inputs == 0) { usage(); fatal("no input given (files, or - for JSON Lines on stdin)"); }
    if (name[0] == '\0' || strchr(name, '/') || strpbrk(name, " \t\n")) fatal("--name '%s': want a plain file name prefix", name);

    Input* inputs = (Input*)callocCheck((size_t)n_inputs, sizeof(Input));
    long long total_stored = 0;
    for (int k = 0; k < n_inputs; k++) {
        input_probe(&inputs[k], paths[k]);
        total_stored = (total_stored < 0 || inputs[k].size < 0) ? -1 : total_stored + inputs[k].size;
    }
    BpeEncoder enc;
    bpe_init(&enc, encoder_path, merges_path);
    job.eot = enc.eot_token;
    shard_make_dir(out_dir);
    refuse_existing_shards(out_dir, name);

    ShardWriter writer;
    shard_writer_init(&writer, out_dir, name, (size_t)shard_tokens, 0, 1, enc.vocab_size);
    ValSplit split;
    val_split_init(&split, &writer, val_tokens, shard_tokens);
    g_writer = &writer;
    atexit(remove_partial_output);  // fatal() exits: a failed run leaves no shard behind
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);

    json_object_seed(0);  // before the threads: jansson seeds its hash tables once
    Pool pool;
    pool_start(&pool, threads, &enc, &job);
    Reader reader = {inputs, n_inputs, 0, (unsigned char*)mallocCheck(CHUNK_BYTES), 0, 0, 1, 0, {0}, 0};
    input_start(&inputs[0]);
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
    Emitter emitter = {stop_on_error, inputs, &split};
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

    if (progress.documents == 0) fatal("no documents: every record of the input was bad or blank");
    val_split_finish(&split);
    shard_writer_finish(&writer);
    char tok_path[PATH_MAX_LEN];
    path_format(tok_path, sizeof(tok_path), "%s/gpt2_tokenizer.bin", out_dir);
    tokenizer_file_write(&enc, tok_path);
    BpeBytes extra = {0};
    for (int k = 0; k < n_inputs; k++) {
        char line[PATH_MAX_LEN + 128];
        snprintf(line, sizeof(line), "input %lld %lld %lld %s\n", inputs[k].documents, inputs[k].bad,
                 inputs[k].raw_read, inputs[k].path);
        bpe_bytes_append(&extra, line, strlen(line));
    }
    char line[128];
    snprintf(line, sizeof(line), "documents %lld %lld\n", progress.documents, progress.bad);
    bpe_bytes_append(&extra, line, strlen(line) + 1);  // with its NUL
    shard_writer_write_manifest(&writer, "prepro_corpus", (const char*)extra.data);

    double secs = now_seconds() - progress.t0;
    printf("prepro_corpus: %d inputs, %.1f MB of text in %.2f s (%.1f MB/s, %d threads): %lld documents -> %zu tokens "
           "in %zu shards (val %zu, train %zu)\n", n_inputs, (double)reader.text_bytes / 1e6, secs,
           (double)reader.text_bytes / 1e6 / secs, threads, progress.documents, writer.total_tokens, (size_t)writer.n_done,
           writer.val_written, writer.total_tokens - writer.val_written);
    if (progress.bad > 0) fprintf(stderr, "prepro_corpus: %lld bad records skipped (see the warnings above)\n", progress.bad);
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
