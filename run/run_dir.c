// run/run_dir.c: -o, as run/run_dir.h describes it.
#include "run/run_dir.h"

#include <dirent.h>
#include <sys/file.h>
#include <time.h>

#include "run/checkpoint.h"

// The longest name the job appends to -o (DIR/.checkpoint_2147483647.tmp/optimizer.bin is
// 41 characters), with room to spare: an -o longer than PATH_MAX_LEN - 1 - this is refused.
#define RUN_DIR_SUFFIX_MAX 64

// This process's lock (a job locks one directory), kept for the checks.
typedef struct {
    int fd;                   // DIR/.lock, open and flock()ed; -1 when none is held
    char dir[PATH_MAX_LEN];   // the directory as given
    char path[PATH_MAX_LEN];  // DIR/.lock
    dev_t dir_dev;            // the directory that was locked
    ino_t dir_ino;
} DirLock;

static DirLock lock_ = {-1, "", "", 0, 0};

const char* run_dir_lost(char* why) {
    why[0] = '\0';
    if (lock_.fd < 0) return why;
    struct stat dir, mine, linked;
    char what[160] = "";
    if (stat(lock_.dir, &dir) != 0) {
        snprintf(what, sizeof(what), "%s", errno == ENOENT ? "it no longer exists" : strerror(errno));
    } else if (dir.st_dev != lock_.dir_dev || dir.st_ino != lock_.dir_ino) {
        snprintf(what, sizeof(what), "it is another directory now (inode %llu, the locked one was %llu)",
                 (unsigned long long)dir.st_ino, (unsigned long long)lock_.dir_ino);
    } else if (fstat(lock_.fd, &mine) != 0 || lstat(lock_.path, &linked) != 0) {
        snprintf(what, sizeof(what), "its lock file .lock is gone");
    } else if (linked.st_dev != mine.st_dev || linked.st_ino != mine.st_ino) {
        snprintf(what, sizeof(what), "its lock file .lock was replaced by another");
    } else {
        return why;
    }
    snprintf(why, RUN_DIR_WHY_MAX, "output directory '%s' is no longer the one this job locked (%s): it was "
             "removed or replaced while the job ran, and another job may own it now; stopping without writing "
             "anything more there", lock_.dir, what);
    return why;
}

// fatal()'s cause (run/error.h): -o lost explains whatever failed.
static int lock_explains_errors(char* buf, size_t n) {
    char why[RUN_DIR_WHY_MAX];
    if (!run_dir_lost(why)[0]) return 0;
    snprintf(buf, n, "%s", why);
    return 1;
}

void run_dir_require(void) {
    char why[RUN_DIR_WHY_MAX];
    if (run_dir_lost(why)[0]) fatal("%s", why);
}

void run_dir_lock(const char* dir, const char* clash) {
    char path[PATH_MAX_LEN];
    path_format(path, sizeof(path), "%s/.lock", dir);
    struct stat st;
    const char* kind = lstat(path, &st) == 0 ? file_kind_of_mode(st.st_mode) : NULL;
    int fd = kind ? -1 : open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0 && !kind && (errno == ELOOP || errno == ENXIO)) kind = errno == ELOOP ? "a symbolic link" : "a FIFO";
    if (fd >= 0 && fstat(fd, &st) == 0 && (kind = file_kind_of_mode(st.st_mode)) != NULL) close(fd);
    if (kind) {
        fatal("the lock file '%s' is %s, not a regular file: the job locks its directory with a regular file of its "
              "own (remove it)", path, kind);
    }
    if (fd < 0) fatal("cannot open the lock file '%s': %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK) fatal("cannot lock '%s': %s", path, strerror(errno));
        char holder[256] = "";
        ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        fatal("output directory '%s' is in use by another job (%s): one job per output directory, or %s would "
              "clash", dir, holder[0] ? holder : "holder unknown", clash);
    }
    if (stat(dir, &st) != 0) fatal("cannot stat the output directory '%s': %s", dir, strerror(errno));
    lock_.fd = fd;
    path_format(lock_.dir, sizeof(lock_.dir), "%s", dir);
    path_format(lock_.path, sizeof(lock_.path), "%s", path);
    lock_.dir_dev = st.st_dev;
    lock_.dir_ino = st.st_ino;
    run_dir_require();  // the lock file opened is the one in the directory now
    fatal_set_cause(lock_explains_errors);
    char host[128] = "?", when[64];
    gethostname(host, sizeof(host) - 1);
    time_t now = time(NULL);
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
    char line[256];
    int len = snprintf(line, sizeof(line), "host %s, pid %ld, started %s\n", host, (long)getpid(), when);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len) {
        fatal("cannot write the lock file '%s': %s", path, strerror(errno));
    }
}

void run_dir_close(void) {
    if (lock_.fd >= 0) close(lock_.fd);
    lock_.fd = -1;
    if (fatal_cause() == lock_explains_errors) fatal_set_cause(NULL);
}

void run_dir_check_length(const char* dir) {
    size_t len = strlen(dir), max = PATH_MAX_LEN - 1 - RUN_DIR_SUFFIX_MAX;
    for (size_t i = 0; i < len; i++) {  // every message and main.log line that names -o stays one line
        if ((unsigned char)dir[i] < 0x20 || dir[i] == 0x7f) {
            fatal("-o holds a control character (byte %d at %zu): a newline in it would split every line that names "
                  "it; choose another name", (unsigned char)dir[i], i);
        }
    }
    if (len > max) {
        fatal("-o '%s' is %zu characters long; at most %zu fit (the paths of the checkpoint files in it must stay "
              "under the system's limit of %d bytes)", dir, len, max, PATH_MAX_LEN);
    }
}

void run_dir_make(const char* dir) {
    struct stat st;
    if (lstat(dir, &st) == 0 && S_ISLNK(st.st_mode) && stat(dir, &st) != 0) {
        char target[PATH_MAX_LEN];
        ssize_t n = readlink(dir, target, sizeof(target) - 1);
        target[n > 0 ? n : 0] = '\0';
        fatal("output path '%s' is a symbolic link to '%s', which does not exist", dir, target);
    }
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) fatal("output path '%s' exists and is not a directory", dir);
        return;
    }
    make_parent_dirs(dir, "-o");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) fatal("cannot create output directory '%s': %s", dir, strerror(errno));
}

void run_dir_open(const char* dir) {
    run_dir_make(dir);
    run_dir_lock(dir, "its checkpoints and main.log");
}

void run_dir_claim(const char* dir, int resume_asked, int start_over) {
    int* steps;
    int n = checkpoint_list(dir, 0, &steps);
    char log_path[PATH_MAX_LEN], names[256] = "";
    path_format(log_path, sizeof(log_path), "%s/main.log", dir);
    struct stat st;
    int has_log = !resume_asked && lstat(log_path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
    if (n == 0 && !has_log) {
        free(steps);
        return;
    }
    for (int i = n - 1; i >= 0 && i >= n - 3; i--) {  // the oldest three, oldest first
        size_t at = strlen(names);
        snprintf(names + at, sizeof(names) - at, "%scheckpoint_%08d", at ? ", " : "", steps[i]);
    }
    if (!start_over) {
        fatal("output directory '%s' holds another run's %s%s%s%s%s: a fresh run would replace them; resume that run "
              "with -y 1, choose another -o, or pass --start-over to remove them and start again", dir,
              has_log ? "main.log" : "", has_log && n ? " and " : "", n ? "checkpoints (" : "", names,
              n > 3 ? ", ...)" : n ? ")" : "");
    }
    // Every one checked before any goes, so a refusal leaves the run whole; then oldest first,
    // so a removal cut short leaves the newest checkpoints.
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX_LEN], name[256];
        checkpoint_path(path, sizeof(path), dir, steps[i], 0);
        if (checkpoint_dir_foreign(path, name, sizeof(name))) {
            fatal("--start-over: %s holds '%s', which is no checkpoint file: nothing was removed; move it away and "
                  "start again", path, name);
        }
    }
    for (int i = n - 1; i >= 0; i--) {
        char path[PATH_MAX_LEN];
        checkpoint_path(path, sizeof(path), dir, steps[i], 0);
        if (!checkpoint_remove_dir(path)) fatal("--start-over: cannot remove %s (see the warning above)", path);
    }
    free(steps);
    if (has_log && unlink(log_path) != 0) fatal("--start-over: cannot remove %s: %s", log_path, strerror(errno));
    printf("--start-over: removed the run that was in %s (%d checkpoint%s%s)\n", dir, n, n == 1 ? "" : "s",
           has_log ? " and main.log" : "");
}
