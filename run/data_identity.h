/*
 * Which corpus a run trains on, as its checkpoints record it (run/checkpoint.h's state.txt:
 * train_corpus, train_shards, train_digest), so that a resume on other data is refused
 * (run/checkpoint_io.h) instead of continuing without a word.
 *
 *   corpus  the manifest's NAME (NAME_manifest.txt, tools/shard_writer.h) when the shards
 *           have one; "-" for shards without a manifest (llm.c's own)
 *   shards  how many files the train pattern matches
 *   digest  64-bit FNV-1a over the shards in the loader's order (sorted names), each as its
 *           byte count and CRC32C: the manifest's for a listed shard; for a shard without a
 *           manifest the CRC32C of its bytes where the job read them all before it could
 *           record anything (the first shard, checked whole at start), else 0
 * So a listed corpus is identified by every shard's content, at no cost (the manifest holds
 * the CRCs, and each shard is verified against them when it is read); unlisted shards by
 * their sizes and the first one's content. Two runs read the same data when the shard count
 * and the digest agree: the corpus name (for messages), file names and directories do not
 * count, so a corpus copied elsewhere, or a shard without the manifest it had, is the same.
 */
#ifndef RUN_DATA_IDENTITY_H
#define RUN_DATA_IDENTITY_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DATA_CORPUS_NAME_MAX 64  // state.txt's values are at most 63 characters

typedef struct {
    char corpus[DATA_CORPUS_NAME_MAX];
    size_t shards;
    uint64_t digest;
} DataIdentity;

// The corpus name of a manifest path (DIR/NAME_manifest.txt -> NAME), made fit for state.txt:
// cut to 63 characters, blanks and non-ASCII as '?'.
void data_corpus_of_manifest(const char* manifest, char out[DATA_CORPUS_NAME_MAX]);

// Adds one shard (its bytes and CRC32C) to a digest.
uint64_t data_digest_add(uint64_t h, uint64_t bytes, uint32_t crc);

// A corpus name as state.txt holds it: 1..63 printable characters, no blank.
int data_corpus_name_ok(const char* name);

// "corpus 'web', 12 shards, digest 1569111978174057366" (or "shards without a manifest, ..."), the
// digest in decimal as state.txt holds it.
const char* data_identity_text(const char* corpus, size_t shards, uint64_t digest, char* buf,
                               size_t n);

#ifdef __cplusplus
}
#endif
#endif
