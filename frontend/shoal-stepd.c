/* shoal-stepd: the per-run supervisor of a batch script, compiled.
 *
 * A drop-in for `python -m shoal.agent.supervise JOBDIR LOCKFD` (src/shoal/agent/supervise.py,
 * which documents the protocol): on a busy node the Python start-up alone (~70 ms of CPU per
 * job) capped batch throughput, as slurmstepd, also C, does not. Same files, same meaning:
 *
 * - LOCKFD, the open `supervisor.lock` the agent flocked, stays open all our life (never
 *   passed to the task): while we live the run is seen alive.
 * - supervise.FORWARDED arrive blocked; handlers queue them until the task has started and
 *   then pass them on to its process group. The task starts with none blocked, default
 *   dispositions.
 * - Before the fork it writes itself into each cgroup.procs the launch names (the run's step
 *   cgroup, Launch.cgroups), so the task is inside from its first instruction; one it cannot
 *   join fails the launch ("launch failed: cannot join cgroup PATH: ...").
 * - The task starts as identity.spawn starts it: a session of its own, then
 *   setgroups/setgid/setuid, then (as the user) the working directory (or the fallback,
 *   with slurmstepd's note) and the output files, then execve with the environment as
 *   given, no shell; argv[0] without a slash is looked up in the environment's PATH.
 * - `task` ({"pid": N}) once it runs, `status.json` once it has ended (or the reason it
 *   never ran, worded as the Python supervisor words it), each written to a temp file and
 *   renamed.
 *
 * - LEASE, the third argument when given: the node's lease file (supervise.write_lease:
 *   "EXPIRES GRACE_S CHECK_S", CLOCK_BOOTTIME seconds). Read once a check period; when it
 *   has run out, the run is fenced as supervise.wait_fencing fences it (SIGCONT and SIGTERM
 *   to the task's group and to each pid of the cgroups listed in `cgroups`, SIGKILL after
 *   the grace, cgroup.kill where there is one) and status.json says "fenced": true.
 *
 * - `shoal-stepd --step LEASE ARGV...` runs one srun task the same way (step_main).
 *
 * The launch comes from `launch.bin`, written by supervise.start next to launch.json:
 * NUL-terminated fields, each list led by its length (Launch.to_bin says the order).
 * libc only: cc -O2 -Wall -o shoal-stepd shoal-stepd.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LAUNCH_BIN "launch.bin"
#define LAUNCH_MAGIC "shoal-launch 2"
#define MAX_QUEUED 64

static const int FORWARDED[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGCONT};
#define N_FORWARDED (int)(sizeof FORWARDED / sizeof FORWARDED[0])

typedef struct { int fd, flags, same_as; const char *path; } OpenAs;

typedef struct {
    char **argv, **env;
    const char *cwd, *cwd_fallback; /* NULL: none */
    long nfiles;
    OpenAs *files;
    int has_identity;
    uid_t uid;
    gid_t gid;
    long ngroups;
    gid_t *groups;
    char **cgroups; /* cgroup.procs files joined before the fork (supervise.join_cgroups) */
} Launch;

static int jobdir_fd = -1;

/* ------------------------------------------------------------------ signals */

static volatile sig_atomic_t task_pid; /* 0 until the task runs */
static volatile sig_atomic_t n_queued;
static int queued[MAX_QUEUED];

static void forward(int sig) {
    int saved = errno;
    if (task_pid > 0)
        killpg(task_pid, sig);
    else if (n_queued < MAX_QUEUED)
        queued[n_queued++] = sig;
    errno = saved;
}

static void forwarded_set(sigset_t *set) {
    sigemptyset(set);
    for (int i = 0; i < N_FORWARDED; i++) sigaddset(set, FORWARDED[i]);
}

/* ------------------------------------------------------------------ the run's files */

static int write_atomic(const char *name, const char *text) {
    char tmp[64];
    snprintf(tmp, sizeof tmp, ".%s.%d.tmp", name, (int)getpid());
    int fd = openat(jobdir_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    size_t n = strlen(text), done = 0;
    while (done < n) {
        ssize_t k = write(fd, text + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { close(fd); unlinkat(jobdir_fd, tmp, 0); return -1; }
        done += (size_t)k;
    }
    /* No fsync, as in supervise.write_json_atomic: the file has to outlive the agent, which
     * the page cache does; a machine crash ends the task too. */
    if (close(fd) < 0 || renameat(jobdir_fd, tmp, jobdir_fd, name) < 0) { unlinkat(jobdir_fd, tmp, 0); return -1; }
    return 0;
}

/* Length of the valid UTF-8 sequence at s (as Python's strict decoder takes it), 0 if none. */
static int utf8_len(const unsigned char *s) {
    unsigned char c = s[0];
    int n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return n;
}

/* s as a JSON string; bytes that are not UTF-8 as Python's surrogateescape writes them. */
static char *json_string(const char *s) {
    char *out = malloc(strlen(s) * 6 + 3), *o = out;
    if (!out) return NULL;
    *o++ = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n;
        if (*p == '"' || *p == '\\') { *o++ = '\\'; *o++ = (char)*p++; }
        else if (*p < 0x20) o += sprintf(o, "\\u%04x", *p++);
        else if (*p < 0x80) *o++ = (char)*p++;
        else if ((n = utf8_len(p)) > 0) { memcpy(o, p, (size_t)n); o += n; p += n; }
        else o += sprintf(o, "\\udc%02x", *p++);
    }
    *o++ = '"';
    *o = 0;
    return out;
}

static int write_status(int exit_code, int sig, const char *reason, int fenced) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    char *quoted = reason ? json_string(reason) : NULL;
    size_t cap = 128 + (quoted ? strlen(quoted) : 0);
    char *doc = malloc(cap);
    if (!doc || (reason && !quoted)) { fputs("shoal-stepd: out of memory\n", stderr); return -1; }
    int n = snprintf(doc, cap, "{\"exit_code\": %d, \"signal\": %d, \"end_time\": %lld.%06ld",
                     exit_code, sig, (long long)now.tv_sec, now.tv_nsec / 1000);
    if (fenced) n += snprintf(doc + n, cap - (size_t)n, ", \"fenced\": true");
    snprintf(doc + n, cap - (size_t)n, quoted ? ", \"reason\": %s}" : "}", quoted);
    int rc = write_atomic("status.json", doc);
    if (rc < 0) perror("shoal-stepd: status.json");
    free(doc);
    free(quoted);
    return rc;
}

/* ------------------------------------------------------------------ the fence */

#define CHECK_S 1.0 /* supervise.CHECK_S */

static double boottime(void) {
    struct timespec t;
    clock_gettime(CLOCK_BOOTTIME, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static double monotonic(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* supervise.read_lease: 1 and the fields, or 0 when there is no lease. */
static int read_lease(const char *path, double *expires, double *grace, double *check) {
    char buf[128];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char extra[2];
    if (sscanf(buf, "%lf %lf %lf %1s", expires, grace, check, extra) != 3) return 0;
    if (*check <= 0) *check = CHECK_S;
    return 1;
}

/* supervise._holds: whether `pid` is in the cgroup `dir` (unreadable: assume so). */
static int holds_pid(const char *dir, pid_t pid) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/cgroup.procs", dir);
    FILE *procs = fopen(path, "re");
    if (!procs) return 1;
    long p;
    int found = 0;
    while (!found && fscanf(procs, "%ld", &p) == 1) found = (pid_t)p == pid;
    fclose(procs);
    return found;
}

/* supervise.signal_cgroups: sig to every process of the cgroups listed in `cgroups`, but
   those of process group `group` (killpg reached them: a TERM must not come twice). */
static void signal_cgroups(int sig, int rounds, pid_t group) {
    int fd = openat(jobdir_fd, "cgroups", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    FILE *list = fdopen(fd, "r");
    if (!list) { close(fd); return; }
    char dir[PATH_MAX], path[PATH_MAX + 32];
    pid_t me = getpid();
    while (fgets(dir, sizeof dir, list)) {
        dir[strcspn(dir, "\n")] = 0;
        if (dir[0] != '/') continue;
        /* Not where this supervisor is itself (the run's own cgroup holds it): cgroup.kill
           would end it before it wrote the run's status. */
        if (sig == SIGKILL && !holds_pid(dir, me)) {
            snprintf(path, sizeof path, "%s/cgroup.kill", dir);
            int k = open(path, O_WRONLY | O_CLOEXEC);
            if (k >= 0) {
                int ok = write(k, "1", 1) == 1;
                close(k);
                if (ok) continue;
            }
        }
        snprintf(path, sizeof path, "%s/cgroup.procs", dir);
        for (int i = 0; i < rounds; i++) {
            FILE *procs = fopen(path, "re");
            if (!procs) break;
            long pid;
            int any = 0;
            while (fscanf(procs, "%ld", &pid) == 1)
                if (pid != me && getpgid((pid_t)pid) != group) { kill((pid_t)pid, sig); any = 1; }
            fclose(procs);
            if (!any) break;
            if (i + 1 < rounds) nanosleep(&(struct timespec){0, 10000000}, NULL);
        }
    }
    fclose(list);
}

static void signal_run(pid_t group, int sig) {
    killpg(group, sig);
    signal_cgroups(sig, sig == SIGKILL ? 100 : 1, group);
}

/* supervise.wait_fencing: wait for the task to end (unreaped), fencing its process group when
 * the lease in lease_path runs out; 1 when it was fenced. SIGCHLD is blocked. */
static int wait_fencing(pid_t pid, pid_t group, const char *lease_path) {
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    double kill_at = -1;
    for (;;) {
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0 && errno != EINTR) break;
        if (si.si_pid == pid) break;
        double wait = CHECK_S, expires, grace, check;
        if (kill_at < 0 && read_lease(lease_path, &expires, &grace, &check)) {
            wait = check;
            double now = boottime();
            if (now >= expires) {
                kill_at = monotonic() + grace;
                fprintf(stderr, "fenced: the node's lease ran out %.1fs ago (no report reached the server): "
                        "SIGTERM to the job, SIGKILL in %gs\n", now - expires, grace);
                signal_run(group, SIGCONT);
                signal_run(group, SIGTERM);
            }
        }
        if (kill_at >= 0) {
            wait = kill_at - monotonic();
            if (wait <= 0) { /* and again each check while the task is not gone */
                signal_run(group, SIGKILL);
                wait = CHECK_S;
            }
        }
        if (wait < 0.01) wait = 0.01;
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        sigtimedwait(&chld, NULL, &ts);
    }
    if (kill_at >= 0) signal_run(group, SIGKILL); /* what the job left behind (the task, unreaped, keeps its group ours) */
    return kill_at >= 0;
}

/* ------------------------------------------------------------------ launch.bin */

typedef struct { char *p, *end; int ok; } Reader;

static char *field(Reader *r) {
    char *z = r->ok && r->p < r->end ? memchr(r->p, 0, (size_t)(r->end - r->p)) : NULL;
    if (!z) { r->ok = 0; return ""; }
    char *s = r->p;
    r->p = z + 1;
    return s;
}

static long number(Reader *r, long min, long max) {
    char *s = field(r), *e;
    errno = 0;
    long v = strtol(s, &e, 10);
    if (!*s || *e || errno || v < min || v > max) { r->ok = 0; return min; }
    return v;
}

static char **strings(Reader *r) {
    long n = number(r, 0, r->end - r->p);
    char **v = calloc((size_t)n + 1, sizeof *v);
    if (!v) { r->ok = 0; return NULL; }
    for (long i = 0; i < n; i++) v[i] = field(r);
    return v;
}

static const char *optional(Reader *r) {
    char *s = field(r);
    return *s ? s : NULL;
}

static int read_launch(Launch *l) {
    int fd = openat(jobdir_fd, LAUNCH_BIN, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return 0;
    char *data = fstat(fd, &st) == 0 ? malloc((size_t)st.st_size + 1) : NULL;
    ssize_t got = data ? read(fd, data, (size_t)st.st_size) : -1;
    close(fd);
    if (got != st.st_size) return 0;
    Reader r = {data, data + got, 1};
    if (strcmp(field(&r), LAUNCH_MAGIC) != 0) return 0;
    l->argv = strings(&r);
    l->env = strings(&r);
    l->cwd = optional(&r);
    l->cwd_fallback = optional(&r);
    l->nfiles = number(&r, 0, 16);
    l->files = calloc((size_t)l->nfiles + 1, sizeof *l->files);
    for (long i = 0; r.ok && i < l->nfiles; i++) {
        l->files[i].fd = (int)number(&r, 0, 2);
        l->files[i].flags = (int)number(&r, INT_MIN, INT_MAX);
        l->files[i].same_as = (int)number(&r, -1, 2);
        l->files[i].path = field(&r);
    }
    l->has_identity = (int)number(&r, 0, 1);
    if (l->has_identity) {
        l->uid = (uid_t)number(&r, 0, UINT_MAX - 1);
        l->gid = (gid_t)number(&r, 0, UINT_MAX - 1);
        l->ngroups = number(&r, 0, 65536);
        l->groups = calloc((size_t)l->ngroups + 1, sizeof *l->groups);
        for (long i = 0; r.ok && i < l->ngroups; i++) l->groups[i] = (gid_t)number(&r, 0, UINT_MAX - 1);
    }
    l->cgroups = strings(&r);
    return r.ok && r.p == r.end && l->argv && l->argv[0] && l->files && (!l->has_identity || l->groups) &&
           l->cgroups;
}

/* supervise.join_cgroups: move this process into each cgroup named; on failure, the reason. */
static int join_cgroups(char **procs, char *reason, size_t size) {
    for (; *procs; procs++) {
        int fd = open(*procs, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "0", 1) != 1) {
            snprintf(reason, size, "launch failed: cannot join cgroup %s: %s", *procs, strerror(errno));
            if (fd >= 0) close(fd);
            return 0;
        }
        close(fd);
    }
    return 1;
}

/* ------------------------------------------------------------------ the task */

/* What the child tells us through the close-on-exec pipe when it gives up: 'P' (preparing
 * as the user failed: errno and the path, identity.LaunchError) or 'E' (any other OSError
 * Popen raises: errno only). Nothing at all: the exec succeeded. */
static void give_up(int pipe_w, char kind, int err, const char *where) {
    char msg[32 + PATH_MAX];
    int n = snprintf(msg, sizeof msg, "%c%d", kind, err) + 1;
    if (where) n += snprintf(msg + n, sizeof msg - (size_t)n, "%s", where);
    if (n > (int)sizeof msg) n = sizeof msg;
    if (write(pipe_w, msg, (size_t)n) < 0) { /* the parent then reports a failed exec */ }
    _exit(255);
}

static const char *env_get(char **env, const char *name) {
    size_t n = strlen(name);
    for (; *env; env++)
        if (strncmp(*env, name, n) == 0 && (*env)[n] == '=') return *env + n + 1;
    return NULL;
}

/* execve, looking argv[0] up in PATH as subprocess does; returns only on failure (errno). */
static void exec_task(char **argv, char **env) {
    const char *file = argv[0];
    if (strchr(file, '/')) { execve(file, argv, env); return; }
    const char *path = env_get(env, "PATH");
    if (!path) path = "/bin:/usr/bin";
    int first = 0; /* the first error that is not "no such file": what subprocess reports */
    char full[PATH_MAX];
    for (const char *dir = path;; dir++) {
        const char *colon = strchrnul(dir, ':');
        int len = (int)(colon - dir);
        if (snprintf(full, sizeof full, "%.*s%s%s", len, dir, len ? "/" : "", file) < (int)sizeof full) {
            execve(full, argv, env);
            if (errno != ENOENT && errno != ENOTDIR && !first) first = errno;
        }
        if (!*colon) break;
        dir = colon;
    }
    errno = first ? first : ENOENT;
}

/* In the child, before exec: env and SLURM_TASK_PID=<this pid> (the task's pid, as Slurm sets it). */
static char **with_task_pid(char **env) {
    size_t n = 0;
    while (env[n]) n++;
    char **out = malloc((n + 2) * sizeof *out);
    static char entry[40];
    if (!out) return env;
    snprintf(entry, sizeof entry, "SLURM_TASK_PID=%ld", (long)getpid());
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(env[i], "SLURM_TASK_PID=", 15) != 0) out[k++] = env[i];
    out[k++] = entry;
    out[k] = NULL;
    return out;
}

/* In the child: become the task (see the comment at the top), or report why not. */
static void child(const Launch *l, int pipe_w) {
    for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setsid();
    if (l->has_identity && (setgroups((size_t)l->ngroups, l->groups) < 0 || setregid(l->gid, l->gid) < 0
                            || setreuid(l->uid, l->uid) < 0))
        give_up(pipe_w, 'E', errno, NULL);
    if (!l->has_identity && l->nfiles == 0) {
        if (l->cwd && chdir(l->cwd) < 0) give_up(pipe_w, 'E', errno, NULL);
    } else {
        /* As the user from here on: identity.spawn's prepare(). */
        const char *where = l->cwd;
        char note[2 * PATH_MAX];
        note[0] = 0;
        if (l->cwd && chdir(l->cwd) < 0) {
            if (!l->cwd_fallback) give_up(pipe_w, 'P', errno, where);
            snprintf(note, sizeof note, "slurmstepd: error: couldn't chdir to `%s': %s: going to /tmp instead\n",
                     l->cwd, strerror(errno));
            if (chdir(l->cwd_fallback) < 0) give_up(pipe_w, 'P', errno, where);
        }
        for (long i = 0; i < l->nfiles; i++) {
            const OpenAs *f = &l->files[i];
            if (f->same_as >= 0) {
                if (dup2(f->same_as, f->fd) < 0) give_up(pipe_w, 'P', errno, where);
                continue;
            }
            where = f->path;
            int fd = open(f->path, f->flags, 0644);
            if (fd < 0) give_up(pipe_w, 'P', errno, where);
            if (fd != f->fd) {
                if (dup2(fd, f->fd) < 0) give_up(pipe_w, 'P', errno, where);
                close(fd);
            }
        }
        if (note[0] && write(1, note, strlen(note)) < 0) give_up(pipe_w, 'P', errno, where);
    }
    exec_task(l->argv, with_task_pid(l->env));
    give_up(pipe_w, 'E', errno, NULL);
}

/* Start the task; its pid, or 0 with *reason set (as supervise.supervise words it). */
static pid_t start_task(const Launch *l, char *reason, size_t cap) {
    int p[2];
    pid_t pid = -1;
    if (pipe2(p, O_CLOEXEC) == 0) {
        pid = fork();
        if (pid == 0) child(l, p[1]);
        close(p[1]);
    }
    if (pid < 0) {
        snprintf(reason, cap, "launch failed: execve(): %s", strerror(errno));
        return 0;
    }
    char msg[32 + PATH_MAX + 1];
    size_t n = 0;
    ssize_t k;
    while (n < sizeof msg - 1 && ((k = read(p[0], msg + n, sizeof msg - 1 - n)) > 0 || (k < 0 && errno == EINTR)))
        if (k > 0) n += (size_t)k;
    close(p[0]);
    if (n == 0) return pid;
    msg[n] = 0;
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {}
    int err = atoi(msg + 1);
    const char *where = msg + strlen(msg) + 1;
    if (msg[0] == 'P')
        snprintf(reason, cap, "launch failed: %s: %s", strerror(err),
                 where < msg + n && *where ? where : "None");
    else
        snprintf(reason, cap, "launch failed: execve(): %s", strerror(err));
    return 0;
}

/* ------------------------------------------------------------------ a step's task */

static void ignore_signal(int sig) { (void)sig; }

/* shoal-stepd --step LEASE ARGV...: supervise.step_main. One srun task under a supervisor in
 * its own process group (the agent signals the group, which reaches both; we only survive
 * the catchable ones), so the task is fenced by the lease even with no agent alive. Exits
 * as the task did. */
static int step_main(const char *lease_path, char **argv) {
    /* Caught, not ignored: an exec resets them to default for the task. */
    struct sigaction sa = {.sa_handler = ignore_signal};
    for (int i = 0; i < N_FORWARDED; i++) sigaction(FORWARDED[i], &sa, NULL);
    sigset_t blocked;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGCHLD);
    sigprocmask(SIG_BLOCK, &blocked, NULL);
    pid_t pid = fork();
    if (pid < 0) { perror("shoal-stepd: fork"); return 2; }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        char pid_text[24];
        snprintf(pid_text, sizeof pid_text, "%ld", (long)getpid());
        setenv("SLURM_TASK_PID", pid_text, 1);
        execvp(argv[0], argv);
        fprintf(stderr, "slurmstepd: error: execve(): %s: %s\n", argv[0], strerror(errno));
        _exit(2);
    }
    /* Our copies of the output pipes would hold them open after the task: only it keeps them. */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; null >= 0 && fd <= 2; fd++) dup2(null, fd);
    wait_fencing(pid, getpgrp(), lease_path);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return 1;
    if (!WIFSIGNALED(st)) return WEXITSTATUS(st);
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    signal(WTERMSIG(st), SIG_DFL);
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_UNBLOCK, &all, NULL);
    raise(WTERMSIG(st));
    return 128 + WTERMSIG(st);
}

int main(int argc, char **argv) {
    if (argc >= 4 && strcmp(argv[1], "--step") == 0) return step_main(argv[2], argv + 3);
    if (argc != 3 && argc != 4) {
        fputs("usage: shoal-stepd JOBDIR LOCK_FD [LEASE] | --step LEASE ARGV... (started by the agent)\n", stderr);
        return 2;
    }
    /* The lock's descriptor is only kept open (closing it would say "ended"), never inherited. */
    fcntl(atoi(argv[2]), F_SETFD, FD_CLOEXEC);
    jobdir_fd = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (jobdir_fd < 0) { perror(argv[1]); return 1; }

    sigset_t fwd;
    forwarded_set(&fwd);
    struct sigaction sa = {.sa_handler = forward, .sa_mask = fwd, .sa_flags = SA_RESTART};
    for (int i = 0; i < N_FORWARDED; i++) sigaction(FORWARDED[i], &sa, NULL);
    sigprocmask(SIG_UNBLOCK, &fwd, NULL); /* those sent already are queued now, in order */

    Launch launch = {0};
    if (!read_launch(&launch)) {
        write_status(1, 0, "launch failed: unreadable launch file", 0);
        return 1;
    }
    /* Blocked again from the fork until the task runs in its own group: none is lost between.
     * SIGCHLD stays blocked: the fence's wait takes it with sigtimedwait. */
    char reason[64 + 2 * PATH_MAX];
    if (!join_cgroups(launch.cgroups, reason, sizeof reason)) return write_status(1, 0, reason, 0) < 0;
    sigset_t blocked = fwd;
    sigaddset(&blocked, SIGCHLD);
    sigprocmask(SIG_BLOCK, &blocked, NULL);
    pid_t pid = start_task(&launch, reason, sizeof reason);
    if (!pid) return write_status(1, 0, reason, 0) < 0;
    task_pid = pid;
    char doc[64];
    snprintf(doc, sizeof doc, "{\"pid\": %d}", (int)pid);
    if (write_atomic("task", doc) < 0) perror("shoal-stepd: task");
    for (int i = 0; i < n_queued; i++) killpg(pid, queued[i]);
    sigprocmask(SIG_UNBLOCK, &fwd, NULL);

    int fenced = argc == 4 && wait_fencing(pid, pid, argv[3]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) { perror("shoal-stepd: waitpid"); return 1; }
    if (WIFSIGNALED(st)) return write_status(0, WTERMSIG(st), NULL, fenced) < 0;
    return write_status(WEXITSTATUS(st), 0, NULL, fenced) < 0;
}
