/*
 * Files as this project reads and writes them: checked opens, reads and writes that name
 * the file in their one error, paths that never truncate, and the checks every number
 * read from a file passes before any arithmetic uses it.
 *
 * Inputs and outputs are regular files: every rank reads them, some more than once and at
 * offsets, and opening a FIFO would block forever; a file the job writes, or reads back
 * from its own directory, is never a symbolic link (fopenOwnCheck). Numbers read from files
 * are untrusted input: people load model files and token shards they downloaded. Every
 * header field is checked against a stated range BEFORE any arithmetic uses it, and sizes
 * derived from fields are computed in size_t with overflow checks, so a crafted header can
 * never wrap a size check into passing and then ask malloc for 2^64 bytes. Each error
 * names the file and the field.
 */
#ifndef RUN_FILES_H
#define RUN_FILES_H

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llmc/utils.h"
#include "run/error.h"

#ifdef __cplusplus
extern "C" {
#endif

// ulimit -f: a write past it then fails with EFBIG, an error naming the file (and the
// program's clean-up runs), instead of SIGXFSZ killing the process without a word.
void files_size_limit_fails_writes(void);

// snprintf for file paths: a path that does not fit is an error, never a silent truncation.
#define PATH_MAX_LEN 4096
void path_format(char* buf, size_t n, const char* fmt, ...) LLMC_PRINTF(3, 4);

// Creates the missing directories above path, as `mkdir -p` does, not path itself: an
// output directory is often a fresh path. option names path in the error ("-o").
void make_parent_dirs(const char* path, const char* option);

// What a file of this mode is when it is not a regular file, for messages ("a directory"), or NULL.
const char* file_kind_of_mode(mode_t mode);

// What a path is when it is not a regular file (symbolic links followed), or NULL.
const char* not_regular_file_kind(const char* path);

// Inputs and outputs are regular files: every rank reads them, some more than once and at
// offsets, and opening a FIFO would block forever. So the file is opened without blocking
// (O_NONBLOCK: a FIFO opens at once) and what was opened is checked before any use. A file
// this program writes, or reads back from its own directory (own_file), must not be a
// symbolic link either: the link could send main.log or a checkpoint anywhere. Inputs may be
// links to regular files.
FILE* fopen_check(const char* path, const char* mode, int own_file, const char* file, int line);
#define fopenCheck(path, mode) fopen_check((path), (mode), 0, __FILE__, __LINE__)
// A file of the job's own directory (main.log, a checkpoint's), read or written: never a link.
#define fopenOwnCheck(path, mode) fopen_check((path), (mode), 1, __FILE__, __LINE__)

// A short read means the file is truncated (or unreadable): name the file.
void fread_check(void* dst, size_t size, size_t count, FILE* f, const char* what,
                 const char* file, int line);
#define freadCheck(dst, size, count, f, what) fread_check((dst), (size), (count), (f), (what), __FILE__, __LINE__)

void fwrite_check(const void* src, size_t size, size_t count, FILE* f, const char* what,
                  const char* file, int line);
#define fwriteCheck(src, size, count, f, what) fwrite_check((src), (size), (count), (f), (what), __FILE__, __LINE__)

// A write that failed earlier (a full disk) leaves the stream's error flag set, and
// fclose then reports only its own last flush: both count.
void fclose_check(FILE* f, const char* what, const char* file, int line);
#define fcloseCheck(f, what) fclose_check((f), (what), __FILE__, __LINE__)

void fseek_check(FILE* f, long offset, int whence, const char* what, const char* file, int line);
#define fseekCheck(f, off, whence, what) fseek_check((f), (off), (whence), (what), __FILE__, __LINE__)

// Size of an open file in bytes (restores the position to the start).
long file_size_of(FILE* f, const char* what);

// A whole file in a malloc'd buffer with a NUL after its *size bytes (for text parsers).
char* read_whole_file(const char* path, size_t* size);

// "PATH: FIELD = VALUE is out of range (MIN..MAX)" unless MIN <= VALUE <= MAX.
// field names the kind and the name: "header field L", "field step".
long long field_range_check(const char* path, const char* field, long long value, long long min,
                            long long max);

size_t size_mul_check(size_t a, size_t b, const char* path);

size_t size_add_check(size_t a, size_t b, const char* path);

// Parses a whole string as a non-negative decimal integer (digits only: no sign, no
// blanks); returns 0 and leaves *out alone if it is not one or exceeds UINT64_MAX.
int parse_u64_strict(const char* s, uint64_t* out);

// Files replaced atomically: a reader, or a job killed at any moment (kill -9 included),
// finds the old file or the new one, never half of one. The new one is written to PATH.tmp
// in the same directory (a rename is atomic only inside one file system), flushed to disk,
// renamed over PATH, and the directory flushed so that the rename survives a power loss.
// file_replace_open: PATH.tmp opened for writing (tmp: PATH_MAX_LEN bytes, receives its name).
FILE* file_replace_open(const char* path, char* tmp);
// Flushes, renames over path; a failed write (a full disk) removes the temporary and ends
// the program with "cannot write WHAT PATH: reason", leaving path as it was.
void file_replace_commit(FILE* f, const char* tmp, const char* path, const char* what);
// At start, for a file that file_replace_* writes later in the run: its directory must
// exist and take a new file, and path must be a regular file if it is there, or the
// program ends now naming option ("--trace") rather than after hours of work.
void file_replace_check(const char* path, const char* option);

#ifdef __cplusplus
}
#endif
#endif
