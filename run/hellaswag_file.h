/*
 * HellaSwag-style multiple-choice eval files, in llm.c's format (what llm.c's
 * dev/data/hellaswag.py writes as hellaswag_val.bin):
 *
 *   int32 header[256]: magic 20240522, version 1, number of items, the longest item's bytes
 *   then per item a run of uint16:
 *     65535 (start of item), the item's bytes (this whole run, delimiter included),
 *     its index in the data set, the label (the right completion), the number of
 *     completions (4), the context length, the context tokens, and per completion its
 *     length and its tokens.
 *
 * The reader treats the file as untrusted (run/files.h): every field is range-checked,
 * each item must end exactly where its byte count says, the file exactly after the last
 * item, and every token must be below the model's vocabulary. The trainer's sequence
 * length is checked here too (hellaswag_check_fits), so a file the eval cannot run is one
 * error at start-up, not a failure at the first validation point. No MPI: prepro_text
 * writes these files with the same definitions.
 */
#ifndef RUN_HELLASWAG_FILE_H
#define RUN_HELLASWAG_FILE_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HELLASWAG_MAGIC 20240522
#define HELLASWAG_VERSION 1
#define HELLASWAG_ITEM_START 65535
#define HELLASWAG_COMPLETIONS 4          // the format allows others; HellaSwag, and this eval, use 4
#define HELLASWAG_MAX_ITEMS 65535        // indices are uint16
#define HELLASWAG_ITEM_FIELDS 6          // start, bytes, index, label, completions, context length

typedef struct {
    int index;                           // the item's index in its data set
    int label;                           // the right completion, 0..3
    int ctx_len;
    const uint16_t* ctx;                 // into HellaswagSet.stream
    int end_len[HELLASWAG_COMPLETIONS];
    const uint16_t* end[HELLASWAG_COMPLETIONS];
} HellaswagItem;

typedef struct {
    char path[PATH_MAX_LEN];
    int num_items;
    HellaswagItem* items;
    uint16_t* stream;                    // the file after its header
} HellaswagSet;

// Reads and checks path; tokens must be below vocab_size. Fatal, naming the file, on any fault.
void hellaswag_read(HellaswagSet* s, const char* path, int vocab_size);

// Every row of every item must fit T positions: an item that does not is an error, not
// skipped (skipping would change the denominator, and the accuracy would no longer be
// comparable with another run's).
void hellaswag_check_fits(const HellaswagSet* s, int T);

void hellaswag_free(HellaswagSet* s);

// Writes items[0..n) (their ctx/end arrays, index and label as they are) as an eval file.
void hellaswag_write(const char* path, const HellaswagItem* items, int n);

// The positions a row of item it with completion j takes: the model reads the context and
// the ending but the ending's last token, which is only predicted.
int hellaswag_row_positions(const HellaswagItem* it, int j);

#ifdef __cplusplus
}
#endif
#endif
