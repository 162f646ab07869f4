/*
 * The data loader's checks of token shards against their manifest: NAME_manifest.txt,
 * which prepro_text and prepro_corpus write beside the shards (tools/shard_writer.h; the
 * format: docs/formats.md#shard-manifest).
 *
 * A glob such as 'data/web/web_train_*.bin' also matches files that are not part of the
 * corpus (another run's shards, a copy), and cannot tell a corpus whose writer was killed
 * in mid-commit from a whole one; a shard can rot on disk or be rebuilt under a running
 * job. So, where a manifest stands beside the shards:
 *   - every shard the pattern matches must be listed in a manifest of its directory, and
 *     every listed shard that the pattern matches must exist (shard_manifest_check);
 *   - the shards must be of one corpus: a pattern that matches shards of two manifests
 *     (NAME_train_*.bin of two names, a glob over two directories) is refused, and so is a
 *     shard that two manifests list;
 *   - a manifest lists each shard once, and is of a version this reader knows; each line's
 *     role is train or val and its size is the header and 2 bytes a token (the counts are
 *     digits: "-5" is no count);
 *   - each shard, at every open, must have the listed size and CRC32C, computed during the
 *     full read the loader makes anyway to check the token ids (shard_check_content).
 * A shard that no manifest lists is refused when its own name's manifest exists (for
 * NAME_train_000001.bin, NAME_manifest.txt) or when other shards of the pattern are listed
 * (the glob mixes a corpus with strays). Without any manifest (llm.c's own shards) the
 * loader says once that the shards are unverified.
 *
 * With a manifest or without, the file a shard name stands for must not change while the
 * job runs (shard_check_identity: device, inode, size and modification time as found when
 * the pattern was matched): the loader opens a shard first long after the start and reopens
 * it at every epoch and validation, and a corpus rebuilt in place would mix two corpora in
 * one run without a word.
 * Every rank makes every check on the same files, so all reach the same verdict.
 */
#ifndef RUN_SHARD_MANIFEST_H
#define RUN_SHARD_MANIFEST_H

#include <dirent.h>
#include <fnmatch.h>
#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "run/files.h"

#ifdef __cplusplus
extern "C" {
#endif

// What is known of one shard the pattern matched.
typedef struct {
    char* manifest;   // the manifest that lists it (allocated), or NULL: unverified
    uint64_t bytes;   // its size and CRC32C there
    uint32_t crc;
    char split[8];    // and its role there: "train" or "val"
    dev_t dev;        // the file's identity when the job started
    ino_t ino;
    off_t size;
    struct timespec mtime;
    uint32_t content_crc;  // its CRC32C as the loader computed it (content_read 1), for its identity
    int content_read;
} ShardCheck;

typedef struct {
    char* dir;       // the directory as the glob wrote it ("" for none)
    char* manifest;  // the manifest's path
    char* name;      // the shard it lists (a base name)
    uint64_t bytes;
    uint32_t crc;
    char split[8];   // "train" or "val"
    int line;        // where the manifest lists it
    int matched;     // the pattern matched it
} ManifestEntry;

typedef struct {
    ManifestEntry* entries;
    size_t n, cap;
    char** dirs;  // the directories read
    size_t n_dirs;
} ManifestSet;

// The checks of the shards files (sorted glob results of pattern), one per shard
// (allocated); refuses a set of shards that is not whole (see the top). rank 0 says when
// the shards have no manifest.
ShardCheck* shard_manifest_check(const glob_t* files, const char* pattern, int rank);

// The open file f must be the one this name stood for when the job started.
void shard_check_identity(const ShardCheck* c, FILE* f, const char* path);

// A shard read whole (size bytes, CRC32C crc) against its manifest line.
void shard_check_content(const ShardCheck* c, const char* path, uint64_t size, uint32_t crc);

void shard_checks_free(ShardCheck* checks, size_t n);

#ifdef __cplusplus
}
#endif
#endif
