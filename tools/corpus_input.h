/*
 * prepro_corpus's inputs: a file (or stdin) and its decompressor, read as a stream of text
 * bytes of which only verified ones are ever handed out.
 *
 *   Input in;  input_probe(&in, path);        // every input, before anything is written
 *   Verifier v; verifier_start(&v, inputs, n);
 *   input_start(&in); n = input_read(&v, &in, buf, cap) ... until 0; input_close(&in);
 *   verifier_reading(&v, k);                   // the reader moved on to input k
 *
 * Why a verifier: a gzip member's CRC-32 and a zstd frame's checksum come at its end, after
 * its bytes; text decoded from a corrupt member looks like text until then (8 overwritten
 * bytes in a gzip file altered thousands of documents before the CRC failed). So a second
 * decoder, on its own thread, runs through each compressed input ahead of the reader and
 * publishes how many text bytes lie in members whose checksum verified; input_read never
 * hands out a byte beyond that mark (it waits for it). A corrupt or truncated member ends
 * the input where that member starts (in->damaged says why): nothing of it, or of what
 * follows it in the file, is used, since no decoder can find the next member's start in a
 * broken stream with certainty. The price is a second decompression, on another core
 * (decompressing is a small fraction of tokenizing), and neither memory nor disk: the
 * verifier keeps only a running count (so a single-member .gz of many GB is read twice,
 * and tokenized once the whole member verified). It stays at most one input ahead of the reader, so
 * that the page cache still holds an input when the reader reads it again.
 *
 * The reader tokenizes exactly what the verifier verified: the verifier keeps the CRC32C of
 * the verified text and the identity of the file it read (device, inode, size, modification
 * time), and an input whose reader saw another file at its path, or other text, ends the run
 * before anything is committed ("changed after it was verified"): a .gz renamed over or
 * rewritten in place while the reader was still on an earlier input.
 *
 * A zstd frame may be written without a checksum (zstd's --no-check; some libraries'
 * default): corruption inside it can decode without an error. Such frames are counted
 * (in->unchecked_frames) for a warning.
 */
#ifndef LLMC_CORPUS_INPUT_H
#define LLMC_CORPUS_INPUT_H

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "run/crc32c.h"
#include "run/files.h"
#include "tools/shard_writer.h"

enum { FORMAT_JSONL, FORMAT_TEXT };
enum { CODEC_PLAIN, CODEC_ZSTD, CODEC_GZIP };

#define CHUNK_BYTES (1 << 18)  // compressed bytes read, and text bytes decoded, at a time

// ----------------------------------------------------------------------------
// a decoder: a file's stored bytes -> text bytes, one gzip member or zstd frame after another

enum { STEP_MORE, STEP_MEMBER_END, STEP_END, STEP_DAMAGED };

typedef struct {
    const char* label;
    int codec;
    FILE* f;
    unsigned char* in;       // stored bytes not yet decoded: in[in_pos..in_len)
    size_t in_pos, in_len;
    int in_eof;
    long long raw_read;      // bytes read from the file so far
    long long members;       // members or frames begun
    long long member_start;  // file offset where the current one begins
    int member_done;         // the last step ended one (another may follow)
    ZSTD_DStream* zs;
    z_stream z;
    int unchecked_frames;    // zstd frames without a content checksum
    char why[256];           // STEP_DAMAGED: what is wrong, with the offsets
    struct stat st;          // the file as opened (not for stdin)
    uint32_t text_crc;       // CRC32C of the text decoded so far
} Decoder;

static void decoder_open(Decoder* d, const char* path, const char* label, int codec) {
    memset(d, 0, sizeof(*d));
    d->label = label;
    d->codec = codec;
    d->f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (d->f == NULL) fatal("cannot read input '%s': %s", path, strerror(errno));
    if (d->f != stdin && fstat(fileno(d->f), &d->st) != 0) fatal("cannot stat input '%s': %s", path, strerror(errno));
    d->in = (unsigned char*)mallocCheck(CHUNK_BYTES);
    if (codec == CODEC_ZSTD) {
        d->zs = ZSTD_createDStream();
        if (d->zs == NULL) fatal("out of memory creating a zstd decoder");
    } else if (codec == CODEC_GZIP) {
        if (inflateInit2(&d->z, 16 + MAX_WBITS) != Z_OK) fatal("cannot start a gzip decoder");  // 16: gzip wrapper
    }
}

// Frees what the decoder holds; raw_read stays (the bytes of the input that were read).
static void decoder_close(Decoder* d) {
    if (d->zs) ZSTD_freeDStream(d->zs);
    if (d->codec == CODEC_GZIP) inflateEnd(&d->z);
    if (d->f != stdin) fclose(d->f);  // read only: nothing to lose
    free(d->in);
    d->in = NULL;
    d->zs = NULL;
    d->codec = CODEC_PLAIN;
}

// The file offset of the next stored byte to decode.
static long long decoder_offset(const Decoder* d) { return d->raw_read - (long long)(d->in_len - d->in_pos); }

// At least want stored bytes in d->in (fewer only at the end of the file); returns how many.
static size_t decoder_refill(Decoder* d, size_t want) {
    size_t have = d->in_len - d->in_pos;
    if (have >= want || d->in_eof) return have;
    memmove(d->in, d->in + d->in_pos, have);
    d->in_pos = 0;
    d->in_len = have;
    while (d->in_len < want && !d->in_eof) {
        size_t got = fread(d->in + d->in_len, 1, CHUNK_BYTES - d->in_len, d->f);
        if (got == 0) {
            if (ferror(d->f)) fatal("read error on input '%s': %s", d->label, strerror(errno));
            d->in_eof = 1;
        }
        d->in_len += got;
        d->raw_read += (long long)got;
    }
    return d->in_len;
}

static int decoder_damaged(Decoder* d, const char* kind, const char* detail) {
    if (detail) {
        snprintf(d->why, sizeof(d->why), "corrupt %s starting at byte %lld (%s)", kind, d->member_start, detail);
    } else {
        snprintf(d->why, sizeof(d->why), "truncated %s starting at byte %lld (the file ends at byte %lld)", kind,
                 d->member_start, d->raw_read);
    }
    return STEP_DAMAGED;
}

// A step of a member or frame begins one when the last one ended (or none began yet).
static int decoder_begins_member(Decoder* d, size_t avail) {
    if (!(d->member_done || d->members == 0) || avail == 0) return 0;
    d->member_done = 0;
    d->members++;
    d->member_start = decoder_offset(d);
    return 1;
}

static int gzip_step(Decoder* d, unsigned char* out, size_t cap, size_t* produced) {
    size_t avail = decoder_refill(d, 1);
    if (d->member_done && avail == 0) return STEP_END;  // a gzip file may hold several members
    if (decoder_begins_member(d, avail) && d->members > 1) inflateReset(&d->z);
    d->z.next_in = d->in + d->in_pos;
    d->z.avail_in = (uInt)avail;
    d->z.next_out = out;
    d->z.avail_out = (uInt)cap;
    int r = inflate(&d->z, Z_NO_FLUSH);
    d->in_pos = d->in_len - d->z.avail_in;
    *produced = cap - d->z.avail_out;
    if (r == Z_STREAM_END) {  // the member's CRC-32 and length matched
        d->member_done = 1;
        return STEP_MEMBER_END;
    }
    if (r == Z_MEM_ERROR) fatal("out of memory in zlib decoding '%s'", d->label);
    if (r != Z_OK && r != Z_BUF_ERROR) {
        char detail[160];
        snprintf(detail, sizeof(detail), "zlib: %s", d->z.msg ? d->z.msg : "error");
        return decoder_damaged(d, "gzip member", detail);
    }
    if (*produced == 0 && avail == 0) return decoder_damaged(d, "gzip member", NULL);
    return STEP_MORE;
}

// A zstd frame's header: magic, then a descriptor byte whose bit 2 says a checksum ends it.
static void zstd_note_checksum(Decoder* d, size_t avail) {
    if (avail < 5) return;  // too short for a frame: the decoder says what is wrong
    const unsigned char* p = d->in + d->in_pos;
    uint32_t magic = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    if (magic == ZSTD_MAGICNUMBER && !(p[4] & 4)) d->unchecked_frames++;
}

static int zstd_step(Decoder* d, unsigned char* out, size_t cap, size_t* produced) {
    size_t avail = decoder_refill(d, 1);
    if (d->member_done && avail == 0) return STEP_END;
    if (decoder_begins_member(d, avail)) zstd_note_checksum(d, decoder_refill(d, 5));
    ZSTD_inBuffer ib = {d->in, d->in_len, d->in_pos};
    ZSTD_outBuffer ob = {out, cap, 0};
    size_t r = ZSTD_decompressStream(d->zs, &ob, &ib);
    d->in_pos = ib.pos;
    *produced = ob.pos;
    if (ZSTD_isError(r)) {
        char detail[160];
        snprintf(detail, sizeof(detail), "zstd: %s", ZSTD_getErrorName(r));
        return decoder_damaged(d, "zstd frame", detail);
    }
    if (r == 0) {  // the frame is complete and flushed, its checksum (if any) matched
        d->member_done = 1;
        return STEP_MEMBER_END;
    }
    if (*produced == 0 && avail == 0) return decoder_damaged(d, "zstd frame", NULL);
    return STEP_MORE;
}

// Decodes up to cap text bytes into out (*produced, possibly 0) and says what happened.
static int decoder_step(Decoder* d, unsigned char* out, size_t cap, size_t* produced) {
    *produced = 0;
    if (d->codec == CODEC_ZSTD) return zstd_step(d, out, cap, produced);
    if (d->codec == CODEC_GZIP) return gzip_step(d, out, cap, produced);
    size_t avail = decoder_refill(d, 1);
    if (avail == 0) return STEP_END;
    *produced = avail < cap ? avail : cap;
    memcpy(out, d->in + d->in_pos, *produced);
    d->in_pos += *produced;
    return STEP_MORE;
}

// ----------------------------------------------------------------------------
// inputs

typedef struct {
    const char* path;   // as given ("-": stdin)
    const char* label;  // for messages
    int format, codec;
    long long size;     // bytes as stored, -1 when unknown
    Decoder dec;        // the reader's
    long long text_read;     // text bytes the reader took
    const char* damaged;     // the reader reached the damage: why the input ended early
    long long documents, bad;
    // the verifier's findings, under Verifier.mu until verify_done
    long long verified;      // text bytes in members that verified
    uint32_t verified_crc;   // their CRC32C
    struct stat verified_st; // the file the verifier read
    int verify_done;
    char* damage;            // why the rest cannot be used (allocated), or NULL
    long long damage_at;     // where that rest begins (a file offset)
    int unchecked_frames;
} Input;

static int ends_with(const char* s, size_t n, const char* suffix) {
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

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
    for (const char* c = path; *c; c++) {  // the manifest names each input on a line of its own
        if ((unsigned char)*c < 0x20 || *c == 0x7f) {
            fatal("input name '%s' holds a control character (byte %d at %d): a newline in it would start a line of "
                  "the corpus's manifest; rename the file", path, (unsigned char)*c, (int)(c - path));
        }
    }
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

static void input_start(Input* in) { decoder_open(&in->dec, in->path, in->label, in->codec); }
static void input_close(Input* in) { decoder_close(&in->dec); }

// ----------------------------------------------------------------------------
// the verifier (see the top)

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t changed;
    Input* inputs;
    int n_inputs;
    int reading;  // the input the reader is at
    pthread_t thread;
} Verifier;

static void verifier_publish(Verifier* v, Input* in, long long verified, uint32_t crc, int done, const Decoder* d) {
    pthread_mutex_lock(&v->mu);
    in->verified = verified;
    in->verified_crc = crc;
    if (d) in->verified_st = d->st;
    if (done) {
        in->verify_done = 1;
        if (d) {
            in->unchecked_frames = d->unchecked_frames;
            if (d->why[0]) {
                in->damage = copy_text(d->why);
                in->damage_at = d->member_start;
            }
        }
    }
    pthread_cond_broadcast(&v->changed);
    pthread_mutex_unlock(&v->mu);
}

static void verify_input(Verifier* v, Input* in, unsigned char* scratch) {
    Decoder d;
    decoder_open(&d, in->path, in->label, in->codec);
    long long text = 0, verified = 0;
    uint32_t crc = 0, verified_crc = 0;
    while (1) {
        size_t n;
        int s = decoder_step(&d, scratch, CHUNK_BYTES, &n);
        text += (long long)n;
        crc = crc32c_update(crc, scratch, n);
        if (s == STEP_MORE) continue;
        if (s == STEP_MEMBER_END) verified = text, verified_crc = crc;
        verifier_publish(v, in, verified, verified_crc, s != STEP_MEMBER_END, &d);
        if (s != STEP_MEMBER_END) break;
    }
    decoder_close(&d);
}

static void* verifier_main(void* arg) {
    Verifier* v = (Verifier*)arg;
    unsigned char* scratch = (unsigned char*)mallocCheck(CHUNK_BYTES);
    for (int k = 0; k < v->n_inputs; k++) {
        pthread_mutex_lock(&v->mu);
        while (k > v->reading + 1) pthread_cond_wait(&v->changed, &v->mu);
        pthread_mutex_unlock(&v->mu);
        Input* in = &v->inputs[k];
        if (in->codec == CODEC_PLAIN) verifier_publish(v, in, LLONG_MAX, 0, 1, NULL);  // no checksum to wait for
        else verify_input(v, in, scratch);
    }
    free(scratch);
    return NULL;
}

static void verifier_start(Verifier* v, Input* inputs, int n_inputs) {
    memset(v, 0, sizeof(*v));
    pthread_mutex_init(&v->mu, NULL);
    pthread_cond_init(&v->changed, NULL);
    v->inputs = inputs;
    v->n_inputs = n_inputs;
    if (pthread_create(&v->thread, NULL, verifier_main, v) != 0) fatal("cannot start the verifier thread");
}

static void verifier_reading(Verifier* v, int input) {
    pthread_mutex_lock(&v->mu);
    v->reading = input;
    pthread_cond_broadcast(&v->changed);
    pthread_mutex_unlock(&v->mu);
}

static void verifier_stop(Verifier* v) {
    pthread_join(v->thread, NULL);
    for (int k = 0; k < v->n_inputs; k++) free(v->inputs[k].damage);
}

// Up to cap text bytes of the input, from verified members only; 0 at its end, or where
// its first member that did not verify begins (then in->damaged says why).
static size_t input_read(Verifier* v, Input* in, unsigned char* out, size_t cap) {
    pthread_mutex_lock(&v->mu);
    while (in->verified <= in->text_read && !in->verify_done) pthread_cond_wait(&v->changed, &v->mu);
    long long limit = in->verified;
    pthread_mutex_unlock(&v->mu);
    if (limit <= in->text_read) {  // the verifier is done with this input, and so is the reader
        const struct stat *was = &in->verified_st, *now = &in->dec.st;
        const char* changed = was->st_dev != now->st_dev || was->st_ino != now->st_ino ? "another file is at its path now"
                              : was->st_size != now->st_size || was->st_mtim.tv_sec != now->st_mtim.tv_sec ||
                                      was->st_mtim.tv_nsec != now->st_mtim.tv_nsec
                                  ? "it was rewritten"
                              : in->dec.text_crc != in->verified_crc ? "its text differs from what verified"
                                                                     : NULL;
        if (in->codec != CODEC_PLAIN && changed) {
            fatal("input '%s' changed after it was verified (%s): nothing of this run is committed; keep the inputs "
                  "in place while prepro_corpus runs", in->label, changed);
        }
        in->damaged = in->damage;
        return 0;
    }
    if ((long long)cap > limit - in->text_read) cap = (size_t)(limit - in->text_read);
    size_t n = 0;
    int s = STEP_MORE;
    while (n == 0 && s != STEP_END && s != STEP_DAMAGED) s = decoder_step(&in->dec, out, cap, &n);
    if (in->codec == CODEC_PLAIN && s == STEP_END) return 0;
    if (s == STEP_DAMAGED || n == 0) {  // the verified bytes did not decode the same a second time
        fatal("input '%s' changed while it was read (it verified up to text byte %lld, but now: %s)", in->label,
              limit, s == STEP_DAMAGED ? in->dec.why : "it ends earlier");
    }
    in->text_read += (long long)n;
    in->dec.text_crc = crc32c_update(in->dec.text_crc, out, n);
    return n;
}

#endif
