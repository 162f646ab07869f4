// run/data_identity.c: what run/data_identity.h declares.
#include "run/data_identity.h"

int data_corpus_name_ok(const char* name) {
    size_t n = strlen(name);
    if (n == 0 || n >= DATA_CORPUS_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        if (name[i] <= ' ' || name[i] > '~') return 0;
    }
    return 1;
}

void data_corpus_of_manifest(const char* manifest, char out[DATA_CORPUS_NAME_MAX]) {
    const char* base = strrchr(manifest, '/');
    base = base ? base + 1 : manifest;
    size_t n = strlen(base), suffix = strlen("_manifest.txt");
    n = n > suffix ? n - suffix : n;
    if (n >= DATA_CORPUS_NAME_MAX) n = DATA_CORPUS_NAME_MAX - 1;
    for (size_t i = 0; i < n; i++) out[i] = base[i] <= ' ' || base[i] > '~' ? '?' : base[i];
    out[n] = '\0';
    if (n == 0) snprintf(out, DATA_CORPUS_NAME_MAX, "?");
}

uint64_t data_digest_add(uint64_t h, uint64_t bytes, uint32_t crc) {
    unsigned char item[12];
    for (int i = 0; i < 8; i++) item[i] = (unsigned char)(bytes >> (8 * i));
    for (int i = 0; i < 4; i++) item[8 + i] = (unsigned char)(crc >> (8 * i));
    return fnv1a(h, item, sizeof(item));
}

const char* data_identity_text(const char* corpus, size_t shards, uint64_t digest, char* buf,
                               size_t n) {
    if (strcmp(corpus, "-") == 0) snprintf(buf, n, "shards without a manifest");
    else snprintf(buf, n, "corpus '%s'", corpus);
    size_t at = strlen(buf);
    snprintf(buf + at, n - at, ", %zu shard%s, digest %llu", shards, shards == 1 ? "" : "s",
             (unsigned long long)digest);
    return buf;
}
