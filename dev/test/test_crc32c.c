/*
 * run/crc32c.h:
 *   - known vectors: "123456789" and RFC 3720's (iSCSI) 32-byte patterns;
 *   - the portable (slicing-by-8) and SSE4.2 paths agree on every length 0..520 at
 *     every alignment 0..7, and on 1 MiB (SKIPPED loudly on a CPU without SSE4.2);
 *   - updating in random pieces gives the one-shot CRC;
 *   - crc32c_combine(crc(a), crc(b), |b|) == crc(a||b) on random splits (empty parts
 *     included), and three pieces combine in file order.
 *
 *   test_crc32c                 the unit tests, TAP (dev/test/check.h); exit 1 on any failure
 *   test_crc32c FILE...         prints "crc32c bytes path" per file (crc32c_file), for
 *                               dev/test/test_crc32c.sh to compare with Python
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev/test/check.h"
#include "run/crc32c.h"
#include "llmc/rng.h"

static void test_known_vectors(void) {
    unsigned char zeros[32], ones[32], ascending[32], descending[32];
    for (int i = 0; i < 32; i++) {
        zeros[i] = 0;
        ones[i] = 0xFF;
        ascending[i] = (unsigned char)i;
        descending[i] = (unsigned char)(31 - i);
    }
    struct { const char* name; const void* data; size_t n; uint32_t want; } cases[] = {
        {"\"123456789\"", "123456789", 9, 0xE3069283u},
        {"32 bytes of 0x00", zeros, 32, 0x8A9136AAu},
        {"32 bytes of 0xFF", ones, 32, 0x62A8AB43u},
        {"bytes 0..31", ascending, 32, 0x46DD794Eu},
        {"bytes 31..0", descending, 32, 0x113FDB5Cu},
        {"no bytes", "", 0, 0x00000000u},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint32_t sw = crc32c_update_sw(0, cases[i].data, cases[i].n), dispatched = crc32c(cases[i].data, cases[i].n);
        CHECK(sw == cases[i].want, "portable CRC32C of %s = %08x, want %08x", cases[i].name, sw, cases[i].want);
        CHECK(dispatched == cases[i].want, "crc32c() of %s = %08x, want %08x", cases[i].name, dispatched, cases[i].want);
    }
    tap_checks("known vectors: %zu checked", sizeof(cases) / sizeof(cases[0]));
}

static void fill_random(unsigned char* buf, size_t n, uint64_t* rng) {
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)rng_u32(rng);
}

static void test_hw_matches_sw(const unsigned char* buf, size_t big) {
#ifdef CRC32C_HAVE_SSE42
    if (crc32c_hw_available()) {
        int compared = 0;
        for (size_t align = 0; align < 8; align++) {
            for (size_t n = 0; n <= 520; n++, compared++) {
                uint32_t sw = crc32c_update_sw(0x12345678u, buf + align, n);
                uint32_t hw = crc32c_update_hw(0x12345678u, buf + align, n);
                CHECK(sw == hw, "SSE4.2 %08x != portable %08x (offset %zu, %zu bytes)", hw, sw, align, n);
            }
        }
        uint32_t sw = crc32c_update_sw(0, buf, big), hw = crc32c_update_hw(0, buf, big);
        CHECK(sw == hw, "SSE4.2 %08x != portable %08x on %zu bytes", hw, sw, big);
        tap_checks("SSE4.2 and portable agree: %d lengths x offsets and %zu bytes", compared + 1, big);
        return;
    }
#endif
    tap_skip("this CPU or compiler has no SSE4.2 crc32; portable path only", "SSE4.2 path vs portable");
}

static void test_incremental(const unsigned char* buf, size_t big, uint64_t* rng) {
    uint32_t whole = crc32c(buf, big);
    for (int trial = 0; trial < 20; trial++) {
        uint32_t crc = 0;
        for (size_t done = 0; done < big;) {
            size_t piece = rng_u32(rng) % 5000;
            if (piece > big - done) piece = big - done;
            crc = crc32c_update(crc, buf + done, piece);
            done += piece;
        }
        CHECK(crc == whole, "trial %d: CRC in random pieces %08x != one-shot %08x", trial, crc, whole);
    }
    tap_checks("incremental updates in random pieces: 20 trials");
}

static void test_combine(const unsigned char* buf, size_t big, uint64_t* rng) {
    int trials = 0;
    for (int trial = 0; trial < 200; trial++, trials++) {
        size_t total = trial < 100 ? rng_u32(rng) % 600 : rng_u32(rng) % (big + 1);
        size_t split = trial % 50 == 0 ? 0 : trial % 50 == 1 ? total : rng_u32(rng) % (total + 1);
        uint32_t a = crc32c(buf, split), b = crc32c(buf + split, total - split), whole = crc32c(buf, total);
        uint32_t combined = crc32c_combine(a, b, total - split);
        CHECK(combined == whole, "combine at %zu of %zu bytes: %08x, crc of the whole %08x", split, total, combined,
              whole);
    }
    // Three ranks' pieces of one file, combined in file order.
    size_t cut1 = big / 3 + 17, cut2 = 2 * big / 3 - 5;
    uint32_t p0 = crc32c(buf, cut1), p1 = crc32c(buf + cut1, cut2 - cut1), p2 = crc32c(buf + cut2, big - cut2);
    uint32_t three = crc32c_combine(crc32c_combine(p0, p1, cut2 - cut1), p2, big - cut2);
    CHECK(three == crc32c(buf, big), "three pieces combined %08x != whole %08x", three, crc32c(buf, big));
    tap_checks("combine: %d random splits and one three-way split", trials);
}

static int print_files(int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        size_t bytes;
        uint32_t crc = crc32c_file(argv[i], &bytes);
        printf("%08x %zu %s\n", crc, bytes, argv[i]);
    }
    return 0;
}

int main(int argc, char** argv) {
    if (argc > 1) return print_files(argc, argv);
    enum { BIG = 1 << 20 };
    uint64_t rng = rng_seed(20241129);
    unsigned char* buf = (unsigned char*)mallocCheck(BIG + 8);
    fill_random(buf, BIG + 8, &rng);
    test_known_vectors();
    test_hw_matches_sw(buf, BIG);
    test_incremental(buf, BIG, &rng);
    test_combine(buf, BIG, &rng);
    free(buf);
    return done_testing();
}
