/* sbatch, squeue, scancel: a thin compiled front end for Shoal's Python commands.
 *
 * Users' scripts run these commands in tight loops, and a Python process costs ~40 ms
 * before it has done anything. This program sends the command's raw invocation (argv,
 * working directory, environment, login name, and for sbatch the script files named on
 * the command line) to POST /shoal/v1/commands/<command>; the server runs the very same
 * Python code (shoal.slurm.<command>.run) and answers with what it prints and its exit
 * code. Parsing and formatting stay in Python, in one place; the wire format is in
 * src/shoal/server/commands.py.
 *
 * Whatever this program does not handle (a configuration that is not JSON, https, a
 * server without the endpoint or that asks for it, SHOAL_FRONTEND=python) it hands to the
 * Python command by exec, so behaviour never depends on which one ran. SHOAL_FRONTEND=native
 * (for tests) exits 125 instead of handing over.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <netdb.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

extern char **environ;

#define MAX_SCRIPT (1 << 20) /* larger "scripts" are left to the Python command */
#define TIMEOUT_S 30

static char **g_argv;
static const char *g_cmd;

/* ------------------------------------------------------------------ growable buffer */

typedef struct { char *p; size_t n, cap; } Buf;

static void put(Buf *b, const void *data, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) { perror("shoal front end"); exit(1); }
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void puts_(Buf *b, const char *s) { put(b, s, strlen(s)); }

/* One invocation item: "<key> <length>\n<bytes>". */
static void item(Buf *b, const char *key, const char *data, size_t n) {
    char head[64];
    int k = snprintf(head, sizeof head, "%s %zu\n", key, n);
    put(b, head, (size_t)k);
    put(b, data, n);
}

/* ------------------------------------------------------------------ the Python command */

static void run_python(void) {
    const char *mode = getenv("SHOAL_FRONTEND");
    if (mode && !strcmp(mode, "native")) { /* tests: prove the compiled path answered */
        fprintf(stderr, "%s: the compiled front end hands this to the Python command (SHOAL_FRONTEND=native)\n", g_cmd);
        exit(125);
    }
    char exe[PATH_MAX], python[PATH_MAX + 16], code[160];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) { perror("shoal front end: /proc/self/exe"); exit(1); }
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    *slash = 0;
    snprintf(python, sizeof python, "%s/python", exe);
    /* sys.argv[0] stays this program's path: the commands name themselves after it. */
    snprintf(code, sizeof code, "import sys;sys.argv.pop(0);from shoal.cli.%s import main;sys.exit(main())", g_cmd);
    int argc = 0;
    while (g_argv[argc]) argc++;
    char **args = calloc((size_t)argc + 5, sizeof *args);
    args[0] = python; args[1] = "-P"; args[2] = "-c"; args[3] = code;
    for (int i = 0; i < argc; i++) args[4 + i] = g_argv[i];
    execv(python, args);
    fprintf(stderr, "%s: error: cannot run %s: %s\n", g_cmd, python, strerror(errno));
    exit(1);
}

/* ------------------------------------------------------------------ client configuration */

static char *read_file(const char *path, size_t limit, size_t *len, int *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { *err = errno; return NULL; }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > limit) {
        close(fd); *err = EINVAL; return NULL;
    }
    Buf b = {0};
    char chunk[65536];
    ssize_t k;
    while ((k = read(fd, chunk, sizeof chunk)) > 0) {
        put(&b, chunk, (size_t)k);
        if (b.n > limit) break;
    }
    close(fd);
    if (k < 0 || b.n > limit) { free(b.p); *err = EIO; return NULL; }
    if (!b.p) put(&b, "", 0);
    *len = b.n;
    return b.p;
}

static const char *skip_ws(const char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
    return s;
}

/* A JSON string at s (after its opening quote): the decoded text, or NULL for what this
 * reader leaves to Python (\u escapes). *end is set past the closing quote. */
static char *json_string(const char *s, const char **end) {
    Buf b = {0};
    put(&b, "", 0);
    for (; *s && *s != '"'; s++) {
        if ((unsigned char)*s < 0x20) return NULL;
        if (*s != '\\') { put(&b, s, 1); continue; }
        const char *esc = "\"\\/bfnrt", *val = "\"\\/\b\f\n\r\t";
        const char *at = *++s ? strchr(esc, *s) : NULL;
        if (!at) return NULL;
        put(&b, val + (at - esc), 1);
    }
    if (*s != '"') return NULL;
    *end = s + 1;
    return b.p;
}

/* Skip one JSON value that is not a string we want: numbers, literals, arrays, objects. */
static const char *json_skip(const char *s) {
    int depth = 0;
    do {
        s = skip_ws(s);
        if (*s == '"') {
            const char *end;
            char *text = json_string(s + 1, &end);
            if (!text) return NULL;
            free(text);
            s = end;
        } else if (*s == '{' || *s == '[') { depth++; s++; }
        else if (*s == '}' || *s == ']') { if (--depth < 0) return NULL; s++; }
        else if (*s == ',' || *s == ':') { if (!depth) return NULL; s++; }
        else if (*s && strchr("-0123456789tfn", *s)) { while (*s && !strchr(",]} \t\r\n", *s)) s++; }
        else return NULL;
    } while (depth > 0);
    return s;
}

/* The "server" and "token" strings of the JSON object `shoal up` writes. 0: not JSON we read. */
static int read_config(const char *text, char **server, char **token) {
    const char *s = skip_ws(text);
    if (!*s) return 1; /* empty file: no configuration */
    if (*s++ != '{') return 0;
    s = skip_ws(s);
    if (*s == '}') return *skip_ws(s + 1) == 0;
    for (;;) {
        s = skip_ws(s);
        if (*s++ != '"') return 0;
        const char *end;
        char *key = json_string(s, &end);
        if (!key) return 0;
        s = skip_ws(end);
        if (*s++ != ':') return 0;
        s = skip_ws(s);
        char **want = !strcmp(key, "server") ? server : !strcmp(key, "token") ? token : NULL;
        free(key);
        if (want && *s == '"') {
            free(*want);
            *want = json_string(s + 1, &end);
            if (!*want) return 0;
            s = end;
        } else if (want && !strncmp(s, "null", 4)) {
            free(*want);
            *want = NULL;
            s += 4;
        } else {
            if (want) return 0; /* a number or list where a string belongs: Python says so */
            s = json_skip(s);
            if (!s) return 0;
        }
        s = skip_ws(s);
        if (*s == ',') { s++; continue; }
        if (*s++ != '}') return 0;
        return *skip_ws(s) == 0;
    }
}

static const char *env_nonempty(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* ------------------------------------------------------------------ the invocation */

/* Looked up once: the invocation and the X-Shoal-User header both name it. */
static const char *login_name(void) {
    static const char *name;
    if (name) return name;
    struct passwd *pw = getpwuid(getuid());
    const char *user = getenv("USER");
    name = pw ? strdup(pw->pw_name) : user ? user : "";
    return name;
}

/* Python 3.7+ sets LC_CTYPE when started in the C locale (PEP 538), and the Python command
 * sends its environment as it sees it; so does this. */
static void coerce_c_locale(void) {
    const char *c = getenv("PYTHONCOERCECLOCALE");
    if ((c && !strcmp(c, "0")) || env_nonempty("LC_ALL")) return;
    const char *cur = setlocale(LC_CTYPE, "");
    if (!cur || strcmp(cur, "C")) return;
    static const char *targets[] = {"C.UTF-8", "C.utf8", "UTF-8"};
    for (size_t i = 0; i < sizeof targets / sizeof *targets; i++) {
        if (setlocale(LC_CTYPE, targets[i])) { setenv("LC_CTYPE", targets[i], 1); return; }
    }
}

static void build_invocation(Buf *b) {
    for (int i = 0; g_argv[i]; i++) item(b, "arg", g_argv[i], strlen(g_argv[i]));
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) run_python(); /* Python reports it */
    item(b, "cwd", cwd, strlen(cwd));
    const char *user = login_name();
    item(b, "user", user, strlen(user));
    for (char **e = environ; *e; e++) item(b, "env", *e, strlen(*e));
    if (strcmp(g_cmd, "sbatch")) return;
    /* The script: the server knows which argument it is; send every file that could be one. */
    for (int i = 1; g_argv[i]; i++) {
        if (g_argv[i][0] == '-') continue;
        size_t len; int err;
        char *data = read_file(g_argv[i], MAX_SCRIPT, &len, &err);
        if (!data) continue;
        if (len >= 2 && data[0] == '#' && data[1] == '!') {
            char key[32];
            snprintf(key, sizeof key, "file %d", i);
            item(b, key, data, len);
        }
        free(data);
    }
}

/* ------------------------------------------------------------------ HTTP */

typedef struct { char *host, *port, *base; const char *name; } Url;

/* http://host[:port][/base]; 0 for what Python handles (https, IPv6 literals, user info). */
static int split_url(const char *server, Url *u) {
    const char *s = server;
    while (*s && (unsigned char)*s <= ' ') s++;
    const char *sep = strstr(s, "://");
    if (sep) {
        if (sep - s != 4 || strncasecmp(s, "http", 4)) return 0;
        s = sep + 3;
    }
    size_t hostlen = strcspn(s, "/?#");
    char *netloc = strndup(s, hostlen);
    if (strpbrk(netloc, "@[]% \t\r\n") || !*netloc) return 0;
    const char *path = s + hostlen;
    char *colon = strchr(netloc, ':');
    u->port = "80";
    if (colon) {
        *colon = 0;
        if (!colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1) || strlen(colon + 1) > 5) return 0;
        u->port = colon + 1;
    }
    u->host = netloc;
    for (char *c = u->host; *c; c++) if (*c >= 'A' && *c <= 'Z') *c += 32;
    size_t pathlen = strcspn(path, "?#");
    while (pathlen && path[pathlen - 1] == '/') pathlen--;
    u->base = strndup(path, pathlen);
    return 1;
}

static void quote(Buf *b, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("_.-~/", c)) {
            put(b, s, 1);
        } else {
            char hex[4];
            snprintf(hex, sizeof hex, "%%%02X", c);
            put(b, hex, 3);
        }
    }
}

static int connect_to(const Url *u) {
    struct addrinfo hints = {0}, *res, *ai;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(u->host, u->port, &hints, &res)) return -1;
    int fd = -1;
    for (ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        struct timeval tv = {TIMEOUT_S, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static const char *header(const char *head, const char *name) {
    size_t n = strlen(name);
    for (const char *line = strstr(head, "\r\n"); line && line[2]; line = strstr(line + 2, "\r\n")) {
        if (!strncasecmp(line + 2, name, n) && line[2 + n] == ':') return skip_ws(line + 3 + n);
    }
    return NULL;
}

/* Head plus Content-Length bytes, once the head is in ``b``; (size_t)-1 until then, or
 * without a Content-Length (read to the end). Stopping there spares waiting for the
 * server's close. */
static size_t answer_length(const Buf *b) {
    char *end = b->n >= 4 ? memmem(b->p, b->n, "\r\n\r\n", 4) : NULL;
    if (!end) return (size_t)-1;
    size_t head = (size_t)(end - b->p) + 4;
    for (const char *line = memmem(b->p, head, "\r\n", 2); line && line + 2 < end;
         line = memmem(line + 2, (size_t)(end - line), "\r\n", 2)) {
        if (!strncasecmp(line + 2, "content-length:", 15)) {
            const char *v = skip_ws(line + 17);
            if (*v < '0' || *v > '9') return (size_t)-1;
            return head + (size_t)strtoull(v, NULL, 10);
        }
    }
    return (size_t)-1;
}

/* After the request has gone out, sbatch must not run again (it may have submitted). */
static void lost_answer(const char *server) {
    if (strcmp(g_cmd, "sbatch")) run_python();
    fprintf(stderr, "%s: error: Batch job submission failed: the Shoal server at %s did not answer\n",
            strrchr(g_argv[0], '/') ? strrchr(g_argv[0], '/') + 1 : g_argv[0], server);
    exit(1);
}

/* A refusal of sbatch's request itself (413, 503: nothing was submitted): the server's own
 * words, its JSON "detail", as the Python command prints them; returns if there are none. */
static void refused(int status, const char *body, size_t n) {
    if (status < 400 || !n || memchr(body, 0, n)) return;
    const char *key = strstr(body, "\"detail\"");
    if (!key) return;
    const char *s = skip_ws(key + 8);
    if (*s++ != ':') return;
    s = skip_ws(s);
    const char *end;
    char *detail = *s == '"' ? json_string(s + 1, &end) : NULL;
    if (!detail || !*detail) return;
    fprintf(stderr, "%s: error: Batch job submission failed: %s\n",
            strrchr(g_argv[0], '/') ? strrchr(g_argv[0], '/') + 1 : g_argv[0], detail);
    exit(1);
}

int main(int argc, char **argv) {
    (void)argc;
    g_argv = argv;
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    g_cmd = !strcmp(base, "squeue") ? "squeue" : !strcmp(base, "scancel") ? "scancel" : "sbatch";
    const char *mode = getenv("SHOAL_FRONTEND");
    if (mode && !strcmp(mode, "python")) run_python();
    signal(SIGPIPE, SIG_IGN); /* a reader that went away is not an error, as in Python */

    char path[PATH_MAX];
    const char *conf = env_nonempty("SHOAL_CONFIG");
    if (conf && conf[0] != '~') {
        snprintf(path, sizeof path, "%s", conf);
    } else {
        const char *home = getenv("HOME");
        if (!home || !*home) { struct passwd *pw = getpwuid(getuid()); home = pw ? pw->pw_dir : NULL; }
        if (!home) run_python();
        if (conf && conf[1] && conf[1] != '/') run_python(); /* ~user: Python expands it */
        snprintf(path, sizeof path, "%s%s", home, conf ? conf + 1 : "/.config/shoal/config.yaml");
    }
    char *server = NULL, *token = NULL;
    size_t len; int err = 0;
    char *text = read_file(path, 1 << 20, &len, &err);
    if (!text && err != ENOENT) run_python();
    if (text && (memchr(text, 0, len) || !read_config(text, &server, &token))) run_python();
    if (env_nonempty("SHOAL_SERVER")) server = strdup(getenv("SHOAL_SERVER"));
    if (env_nonempty("SHOAL_TOKEN")) token = strdup(getenv("SHOAL_TOKEN"));
    if (!server || !*server) run_python();
    /* Several servers sharing a store, comma-separated: the first that takes the
     * connection, in order, as the Python client does (nothing is sent to the others). */
    Url urls[16];
    int nurls = 0;
    for (char *tok = strtok(strdup(server), ","); tok; tok = strtok(NULL, ",")) {
        while (*tok == ' ' || *tok == '\t') tok++;
        size_t n = strlen(tok);
        while (n && (tok[n - 1] == ' ' || tok[n - 1] == '\t')) tok[--n] = 0;
        if (!n) continue;
        if (nurls == 16 || !split_url(tok, &urls[nurls])) run_python();
        urls[nurls++].name = tok;
    }
    if (!nurls) run_python();

    coerce_c_locale();
    Buf body = {0};
    build_invocation(&body);

    int fd = -1;
    Url u;
    for (int i = 0; i < nurls && fd < 0; i++) { u = urls[i]; fd = connect_to(&u); }
    if (fd < 0) run_python(); /* Python says why, in its words */
    const char *where = u.name;

    Buf req = {0};
    puts_(&req, "POST "); puts_(&req, u.base); puts_(&req, "/shoal/v1/commands/"); puts_(&req, g_cmd);
    puts_(&req, " HTTP/1.1\r\nHost: "); puts_(&req, u.host); puts_(&req, ":"); puts_(&req, u.port);
    puts_(&req, "\r\nConnection: close\r\nUser-Agent: shoal-cmd/"); puts_(&req, g_cmd);
    puts_(&req, "\r\nContent-Type: application/x-shoal-invocation\r\n");
    if (token && *token) { puts_(&req, "Authorization: Bearer "); puts_(&req, token); puts_(&req, "\r\n"); }
    const char *job_token = env_nonempty("SHOAL_JOB_TOKEN");
    if (job_token) { puts_(&req, "X-Shoal-Job-Token: "); puts_(&req, job_token); puts_(&req, "\r\n"); }
    const char *user = login_name();
    if (*user) { puts_(&req, "X-Shoal-User: "); quote(&req, user); puts_(&req, "\r\n"); }
    char clen[64];
    snprintf(clen, sizeof clen, "Content-Length: %zu\r\n\r\n", body.n);
    puts_(&req, clen);
    put(&req, body.p, body.n);

    /* A server that refuses a request early (413: too large) answers and closes before
     * reading all of it: the send fails, but its answer, when it came, says why. */
    if (write_all(fd, req.p, req.n) < 0 && errno != EPIPE && errno != ECONNRESET) { close(fd); lost_answer(where); }
    Buf resp = {0};
    char chunk[65536];
    size_t want = (size_t)-1; /* the whole answer's length, once its head has come */
    while (resp.n < want) {
        ssize_t k = read(fd, chunk, sizeof chunk);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == ECONNRESET && resp.n) break; /* see the send above: the answer is in */
        if (k < 0) { close(fd); lost_answer(where); }
        if (k == 0) break;
        put(&resp, chunk, (size_t)k);
        if (want == (size_t)-1) want = answer_length(&resp);
    }
    close(fd);

    char *end = resp.p ? strstr(resp.p, "\r\n\r\n") : NULL;
    if (!end || strncmp(resp.p, "HTTP/1.", 7)) lost_answer(where);
    *end = 0;
    const char *data = end + 4;
    size_t data_len = resp.n - (size_t)(data - resp.p);
    int status = atoi(resp.p + 9);
    const char *exit_code = header(resp.p, "x-shoal-exit");
    if (status != 200 || !exit_code) {
        /* An older server without the endpoint, or one that refused the request as such. */
        if (strcmp(g_cmd, "sbatch") || status == 404 || status == 405 || status == 400) run_python();
        refused(status, data, resp.n - (size_t)(data - resp.p));
        lost_answer(where);
    }
    if (!strncmp(exit_code, "local", 5)) run_python();
    const char *cl = header(resp.p, "content-length");
    if (cl && (size_t)atol(cl) < data_len) data_len = (size_t)atol(cl);
    const char *so = header(resp.p, "x-shoal-stdout");
    size_t out_len = so ? (size_t)atol(so) : 0;
    if (out_len > data_len) out_len = data_len;
    /* Write errors (a closed pipe) are ignored, as the Python commands ignore them. */
    if (write_all(1, data, out_len) < 0 && errno != EPIPE) { /* nothing more to do */ }
    if (write_all(2, data + out_len, data_len - out_len) < 0) { /* as above */ }
    return atoi(exit_code);
}
