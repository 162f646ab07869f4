// run/crc32c.c: what run/crc32c.h declares.
#include "run/crc32c.h"

// tables[k][b]: the CRC register after byte b followed by k zero bytes. Filled on first
// use; the first call must not race with another thread (run/checkpoint_async.c's writer
// calls it only after the main thread has).
static uint32_t crc32c_tables_[8][256];

static int crc32c_tables_ready_ = 0;

static void crc32c_init_tables(void) {
    if (crc32c_tables_ready_) return;
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t r = b;
        for (int bit = 0; bit < 8; bit++) r = (r & 1) ? (r >> 1) ^ CRC32C_POLY : r >> 1;
        crc32c_tables_[0][b] = r;
    }
    for (int k = 1; k < 8; k++) {
        for (int b = 0; b < 256; b++) {
            uint32_t prev = crc32c_tables_[k - 1][b];
            crc32c_tables_[k][b] = (prev >> 8) ^ crc32c_tables_[0][prev & 0xFF];
        }
    }
    crc32c_tables_ready_ = 1;
}

// Little-endian load, whatever the host's byte order (compiles to one load on x86).
static uint32_t crc32c_load_le32(const unsigned char* p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint32_t crc32c_update_sw(uint32_t crc, const void* data, size_t n) {
    crc32c_init_tables();
    const uint32_t(*t)[256] = crc32c_tables_;
    const unsigned char* p = (const unsigned char*)data;
    uint32_t r = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = crc32c_load_le32(p) ^ r, hi = crc32c_load_le32(p + 4);
        r = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
            t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    }
    for (; n > 0; n--, p++) r = (r >> 8) ^ t[0][(r ^ *p) & 0xFF];
    return ~r;
}

int crc32c_hw_available(void) {
#ifdef CRC32C_HAVE_SSE42
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
#else
    return 0;
#endif
}

#ifdef CRC32C_HAVE_SSE42
__attribute__((target("sse4.2"))) uint32_t crc32c_update_hw(uint32_t crc, const void* data, size_t n) {
    const unsigned char* p = (const unsigned char*)data;
    uint64_t r = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        r = _mm_crc32_u64(r, word);
    }
    for (; n > 0; n--, p++) r = _mm_crc32_u8((uint32_t)r, *p);
    return ~(uint32_t)r;
}
#endif

uint32_t crc32c_update(uint32_t crc, const void* data, size_t n) {
#ifdef CRC32C_HAVE_SSE42
    static int use_hw = -1;  // asked once per translation unit
    if (use_hw < 0) use_hw = crc32c_hw_available();
    if (use_hw) return crc32c_update_hw(crc, data, n);
#endif
    return crc32c_update_sw(crc, data, n);
}

uint32_t crc32c(const void* data, size_t n) { return crc32c_update(0, data, n); }

// a(x) * b(x) mod P, both in the reflected representation.
static uint32_t crc32c_multiply_mod(uint32_t a, uint32_t b) {
    uint32_t product = 0;
    for (uint32_t term = 1u << 31; term != 0; term >>= 1) {  // x^0, x^1, ... of a
        if (a & term) product ^= b;
        b = (b & 1) ? (b >> 1) ^ CRC32C_POLY : b >> 1;  // b *= x
    }
    return product;
}

// x^(8n) mod P: appending n zero bytes multiplies a CRC register by this. By squaring, so
// a combine costs O(log n) polynomial products, not O(n).
static uint32_t crc32c_shift_bytes(size_t n) {
    uint32_t result = 1u << 31;   // x^0
    uint32_t power = 1u << 23;    // x^8: one byte
    for (; n != 0; n >>= 1) {
        if (n & 1) result = crc32c_multiply_mod(result, power);
        power = crc32c_multiply_mod(power, power);
    }
    return result;
}

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, size_t len_b) {
    return crc32c_multiply_mod(crc32c_shift_bytes(len_b), crc_a) ^ crc_b;
}

uint32_t crc32c_file(const char* path, size_t* bytes) {
    enum { CHUNK = 1 << 20 };
    FILE* f = fopenCheck(path, "rb");
    unsigned char* buf = (unsigned char*)mallocCheck(CHUNK);
    uint32_t crc = 0;
    size_t total = 0, got;
    while ((got = fread(buf, 1, CHUNK, f)) > 0) {
        crc = crc32c_update(crc, buf, got);
        total += got;
    }
    if (ferror(f)) fatal("%s: read failed while computing its checksum", path);
    free(buf);
    fcloseCheck(f, path);
    *bytes = total;
    return crc;
}
