/* The compiled engine of koordtest/bench/openloop.py (--engine c): sends requests at the times of a
 * schedule drawn in advance by Python, reads each response as it comes, and records per request when it
 * was handled (due) and when its answer arrived. It computes nothing: the Python module turns the records
 * into latencies, send lags and the summary, the same code as for its own loop.
 *
 * Why compiled: a Python client running beside LS and BE (SCHED_OTHER where the machine refuses real-time
 * policies) showed a send lag p99 of 2.5-2.8 ms on 16 CPUs, as large as the SLO margin it was to see.
 *
 *   openloop-c --schedule FILE --request FILE --terminator HEX --connections N --start-at SECONDS
 *              --drain SECONDS --out FILE [--realtime] --socket PATH [--socket PATH ...]
 *
 * schedule: int64 n, then n doubles (intended send times, seconds from start-at), then n int32 (server
 * index of each request). start-at: CLOCK_MONOTONIC seconds (Python's time.monotonic()). out: int64 n,
 * n doubles (when each request was due and handed to its socket, CLOCK_MONOTONIC; NaN if never), n doubles
 * (when its answer was read; NaN if never), n doubles (when its last byte went into the socket; NaN if
 * never: a server that falls behind by more than the socket's buffer holds the rest in this client, where
 * no server-side measurement sees them wait), n bytes (1: the answer was an error), then the end time and
 * this process's CPU seconds (two doubles), and the scheduling policy it ran under (one byte: 1 FIFO).
 *
 * Each request goes to server which[i] over its connections in turn; a connection answers in order, so
 * a connection's requests are a list and two cursors (sent, answered). An error answer: one starting with
 * '-' (redis) or "ERROR", or with "_ERROR" in its first 16 bytes (memcached's SERVER_/CLIENT_ERROR), as
 * openloop.py decides. Static, no dependency beyond libc: built by scripts/build-client.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_SERVERS 1024
#define HEAD 16

struct conn {
    int fd;
    int64_t *idx;          /* requests of this connection, in send order */
    int64_t n, due, written, answered;
    size_t offset;         /* bytes of request `written` already in the socket */
    size_t match;          /* bytes of the terminator matched so far */
    char head[HEAD];       /* the current response's first bytes */
    size_t head_len;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "openloop-c: %s: %s\n", what, errno ? strerror(errno) : "bad input");
    exit(2);
}

static void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(len > 0 ? len : 1);
    if (!buf || fread(buf, 1, len, f) != (size_t)len) die(path);
    fclose(f);
    *size = len;
    return buf;
}

static int unhex(const char *hex, char *out, size_t cap) {
    size_t n = strlen(hex) / 2;
    if (n == 0 || n > cap) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (char)v;
    }
    return (int)n;
}

static int is_error(const char *head, size_t len) {
    if (len >= 1 && head[0] == '-') return 1;
    if (len >= 5 && memcmp(head, "ERROR", 5) == 0) return 1;
    for (size_t i = 0; i + 6 <= len; i++)
        if (memcmp(head + i, "_ERROR", 6) == 0) return 1;
    return 0;
}

/* Write what the socket takes of the due requests, in order; note when each went in whole. */
static void flush(struct conn *c, const char *req, size_t req_len, double *written_at) {
    while (c->written < c->due) {
        ssize_t k = send(c->fd, req + c->offset, req_len - c->offset, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            die("send");
        }
        c->offset += (size_t)k;
        if (c->offset < req_len) return;
        c->offset = 0;
        written_at[c->idx[c->written++]] = now_s();
    }
}

int main(int argc, char **argv) {
    const char *schedule = NULL, *request = NULL, *out = NULL, *sockets[MAX_SERVERS];
    char term[64];
    int term_len = 1, nsock = 0, per_server = 2, realtime = 0, spin = 0;
    double start_at = -1, drain = 2.0;
    term[0] = '\n';
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--realtime")) { realtime = 1; continue; }
        if (!strcmp(a, "--spin")) { spin = 1; continue; }
        if (!v) { errno = 0; die(a); }
        i++;
        if (!strcmp(a, "--schedule")) schedule = v;
        else if (!strcmp(a, "--request")) request = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--terminator")) { if ((term_len = unhex(v, term, sizeof term)) < 0) die(a); }
        else if (!strcmp(a, "--connections")) per_server = atoi(v);
        else if (!strcmp(a, "--start-at")) start_at = atof(v);
        else if (!strcmp(a, "--drain")) drain = atof(v);
        else if (!strcmp(a, "--socket")) { if (nsock == MAX_SERVERS) die("too many sockets"); sockets[nsock++] = v; }
        else { errno = 0; die(a); }
    }
    errno = 0;
    if (!schedule || !request || !out || start_at < 0 || nsock == 0 || per_server < 1) die("missing arguments");

    prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0);     /* wake for the next send on time, not up to 50 µs late */
    unsigned char policy = 0;
    if (realtime) {
        struct sched_param sp = {.sched_priority = 1};
        if (sched_setscheduler(0, SCHED_FIFO, &sp) == 0) policy = 1;
    }

    size_t size, req_len;
    char *sched = read_file(schedule, &size);
    char *req = read_file(request, &req_len);
    int64_t n;
    memcpy(&n, sched, 8);
    if (n < 0 || size != 8 + (size_t)n * 12) { errno = 0; die("schedule size"); }
    size_t cap = n ? (size_t)n : 1;
    double *times = (double *)(sched + 8);
    int32_t *which = malloc(cap * sizeof *which);
    memcpy(which, sched + 8 + n * 8, n * 4);

    int nconn = nsock * per_server;
    struct conn *conns = calloc(nconn, sizeof *conns);
    int64_t *turn = calloc(nsock, sizeof *turn), *conn_of = malloc(cap * sizeof *conn_of);
    for (int64_t i = 0; i < n; i++) {
        if (which[i] < 0 || which[i] >= nsock) { errno = 0; die("server index"); }
        int c = which[i] * per_server + (int)(turn[which[i]]++ % per_server);
        conn_of[i] = c;
        conns[c].n++;
    }
    for (int c = 0; c < nconn; c++) {
        conns[c].idx = malloc((conns[c].n ? conns[c].n : 1) * sizeof(int64_t));
        conns[c].n = 0;
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        strncpy(addr.sun_path, sockets[c / per_server], sizeof addr.sun_path - 1);
        conns[c].fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (conns[c].fd < 0 || connect(conns[c].fd, (struct sockaddr *)&addr, sizeof addr) < 0)
            die(sockets[c / per_server]);
        fcntl(conns[c].fd, F_SETFL, O_NONBLOCK);
    }
    for (int64_t i = 0; i < n; i++) conns[conn_of[i]].idx[conns[conn_of[i]].n++] = i;

    double *due_at = malloc(cap * sizeof(double)), *answered_at = malloc(cap * sizeof(double));
    double *written_at = malloc(cap * sizeof(double));
    unsigned char *err = calloc(cap, 1);
    for (int64_t i = 0; i < n; i++) due_at[i] = answered_at[i] = written_at[i] = NAN;
    struct pollfd *fds = calloc(nconn, sizeof *fds);
    for (int c = 0; c < nconn; c++) fds[c].fd = conns[c].fd;
    char buf[65536];

    double deadline = start_at + (n ? times[n - 1] : 0.0) + drain;
    int64_t next = 0, in_flight = 0;
    double t;
    while (1) {
        t = now_s();
        while (next < n && start_at + times[next] <= t) {
            struct conn *c = &conns[conn_of[next]];
            due_at[next] = t;
            c->due++;
            flush(c, req, req_len, written_at);
            in_flight++;
            next++;
        }
        if ((next >= n && in_flight == 0) || t >= deadline) break;
        double wait = (next < n ? start_at + times[next] : deadline) - t;
        if (wait < 0) wait = 0;
        struct timespec ts = {.tv_sec = (time_t)wait, .tv_nsec = (long)((wait - (time_t)wait) * 1e9)};
        /* --spin: never sleep, on a CPU of its own (bench-qos --client-cpus): an idle vCPU halts, and waking
           it for the next send costs hundreds of µs in a VM */
        if (spin) ts.tv_sec = ts.tv_nsec = 0;
        for (int c = 0; c < nconn; c++)
            fds[c].events = POLLIN | (conns[c].written < conns[c].due ? POLLOUT : 0);
        int ready = ppoll(fds, nconn, &ts, NULL);
        if (ready < 0) { if (errno == EINTR) continue; die("ppoll"); }
        if (ready == 0) continue;
        for (int ci = 0; ci < nconn; ci++) {
            struct conn *c = &conns[ci];
            if (fds[ci].revents & POLLOUT) flush(c, req, req_len, written_at);
            if (!(fds[ci].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t k = recv(c->fd, buf, sizeof buf, 0);
            double got = now_s();
            if (k < 0) { if (errno == EAGAIN) continue; die("recv"); }
            if (k == 0) { errno = 0; die("server closed the connection"); }
            for (ssize_t b = 0; b < k; b++) {
                if (c->head_len < HEAD) c->head[c->head_len++] = buf[b];
                if (buf[b] == term[c->match]) c->match++;
                else c->match = buf[b] == term[0];
                if ((int)c->match < term_len) continue;
                if (c->answered >= c->written) { errno = 0; die("an answer to no request"); }
                int64_t i = c->idx[c->answered++];
                answered_at[i] = got;
                err[i] = (unsigned char)is_error(c->head, c->head_len);
                c->match = c->head_len = 0;
                in_flight--;
            }
        }
    }
    double end = now_s();
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
    FILE *f = fopen(out, "wb");
    if (!f) die(out);
    fwrite(&n, 8, 1, f);
    fwrite(due_at, sizeof(double), n, f);
    fwrite(answered_at, sizeof(double), n, f);
    fwrite(written_at, sizeof(double), n, f);
    fwrite(err, 1, n, f);
    fwrite(&end, sizeof end, 1, f);
    fwrite(&cpu, sizeof cpu, 1, f);
    fwrite(&policy, 1, 1, f);
    if (fclose(f) != 0) die(out);
    return 0;
}
