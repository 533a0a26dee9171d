// Application latency per cgroup: the server-side response time of request/response traffic on TCP and
// UNIX stream sockets, as a log2 histogram per cgroup koordd watches (koordd/sensors/app_latency.py).
//
// A CO-RE object (scripts/build-bpf), in the layout of runq_latency.bpf.c (`watched`, `resolved`, one
// `struct hist` per watched cgroup: koordd/sensors/cgroup_hist.py reads both). Three tracepoints, as
// tp_btf (Linux 6.6+ has them all; a kernel without kprobes or ftrace, where fentry cannot attach, has them too):
//   - sk_data_ready, which every data_ready callback fires (sock_def_readable: TCP's data arriving, and a
//     UNIX peer's unix_stream_sendmsg): the socket remembers when its oldest unread bytes arrived;
//   - sock_recv_length, at the end of every recvmsg (read, recv, recvmmsg, io_uring...): the server has
//     read; the clock of its next answer starts at the oldest bytes it read. A read that follows one which
//     emptied the socket restarts the clock (the server had everything and waited for the client: a client
//     that sends half a request and waits does not count its wait); a read that follows one which left
//     bytes behind keeps it (the bytes waited on the server: a queue on the connection, requests that came
//     while the server was busy, counts from its oldest);
//   - sock_send_length, at the end of every sendmsg (write, send, sendfile, io_uring...): the first send
//     after a read is the response; the time from the clock's start to the end of that send is counted for
//     the deepest watched cgroup at or above the SENDING task's (task->cgroups->dfl_cgrp).
//
// Two histograms per cgroup: `responses` counts each response once (the count and the exact mean);
// `weighted` adds each response with a weight, so that a connection's responses in a window (about a
// second) weigh WEIGHT in all whatever their number: the quantiles koordd reports come from it, and a
// client flooding one connection with cheap requests cannot hide another connection's slow ones.
//
// A third, `crowded`, counts the responses (by their time, as `responses`) sent while the socket is crowded:
// from an arrival that found it near its limit (a UNIX peer with 3/4 of its send buffer queued to the server,
// a TCP receive window used up) to the response after the read that empties it. Its senders were held back:
// the rest of their requests waited in the clients, where no server-side clock sees them
// (docs/app-latency.md), so those responses are later than the histograms say. Not the arrival's view alone:
// a blocked UNIX sender wakes only once the server has read 3/4 of its buffer (unix_writable), so the
// responses of that drain see no arrival at all, and the per-arrival count caught 8-62% of a flood's.
//
// Why the sender's cgroup names the workload, not the socket's: a socket keeps the cgroup of the task
// that made it. A UNIX server's accepted socket is made by the connecting client (unix_stream_connect),
// and the listener of a socket-activated service by systemd: the socket's cgroup would credit the client
// or PID 1 with the server's responses.
//
// Which sockets are stamped at all: those of a watched workload only, so the rest of the host's traffic
// costs a lookup per arrival, per read and per send. A socket qualifies once it has state in `requests`
// (socket-local storage: freed with the socket, so no stamp outlives it or lands on its successor at the
// same address), made
//   - at an arrival, where the socket's own cgroup is watched (a TCP server's listener passes its cgroup
//     on to the connections it accepts), or, for a UNIX connection not accepted yet, its listener's
//     (Linux 6.10+: unix_sock.listener);
//   - at a watched task's send on it: the requests after its first response are stamped (a UNIX
//     connection whose first request comes after the accept, a socket-activated listener's).
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "koordd_shared.h"      // APP_SLOTS: the histogram's slots, as koordd/sensors/app_latency.py reads them
#define HIST_SLOTS APP_SLOTS
#include "cgroup_hist.h"        // struct hist, `watched`, `resolved`, slot_of, watched_of, count_in

char _license[] SEC("license") = "GPL";

#define AF_UNIX 1
#define AF_INET 2
#define AF_INET6 10
#define SOCK_STREAM 1
#define IPPROTO_TCP 6

// A connection's responses in one window weigh WEIGHT together (each WEIGHT / the larger of its count in
// the window before and its count so far): windows of 2^WINDOW_SHIFT ns, about a second.
#define WINDOW_SHIFT 30
#define WEIGHT (1ULL << 20)

struct pending {
    u64 since;              // when the clock of the next answer started: the oldest bytes the server's reads took (ns); 0: none
    u64 unread;             // when the oldest bytes not read yet arrived; 0: none (the server has read all it was sent)
    u64 last;               // when bytes last arrived
    u32 left;               // the server's latest read left bytes unread: its next read keeps the clock
    u32 window;             // the window (ns >> WINDOW_SHIFT) of this connection's latest response
    u32 answers;            // its responses in that window
    u32 before;             // its responses in the window before that one (0: none, or not the one before)
    u32 crowded;            // CROWDED or LAST_CROWDED from an arrival that found it near_limit; 0: not crowded
};

struct {
    __uint(type, BPF_MAP_TYPE_SK_STORAGE);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, int);
    __type(value, struct pending);
} requests SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, u64);       // watched cgroup id
    __type(value, struct hist);
} responses SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, u64);       // watched cgroup id
    __type(value, struct hist);     // slots: the responses' weights; wait_ns: unused (0)
} weighted SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, u64);       // watched cgroup id
    __type(value, struct hist);     // the responses sent while their socket was crowded (CROWDED)
} crowded SEC(".maps");

// The hot paths read the kernel's structs directly through the tracepoints' typed pointers (CO-RE
// relocated all the same, and no helper call: six runs a request, three on each side); the rare ones through
// BPF_CORE_READ.

// TCP or a UNIX stream: what carries requests and responses (UDP, netlink, UNIX datagrams do not count).
static __always_inline bool is_stream(const struct sock *sk)
{
    if (sk->sk_type != SOCK_STREAM)
        return false;
    u16 family = sk->__sk_common.skc_family;
    return family == AF_UNIX || ((family == AF_INET || family == AF_INET6) && sk->sk_protocol == IPPROTO_TCP);
}

// The watched cgroup of the cgroup a socket was made in (its v2 cgroup), or for a UNIX connection not
// accepted yet, of its listener's: the connecting client made that socket.
static __always_inline u64 watched_socket(const struct sock *sk)
{
    if (sk->__sk_common.skc_family == AF_UNIX && bpf_core_field_exists(((struct unix_sock *)sk)->listener)) {
        struct sock *listener = BPF_CORE_READ((struct unix_sock *)sk, listener);
        if (listener) {
            struct cgroup *cg = BPF_CORE_READ(listener, sk_cgrp_data.cgroup);
            return cg ? watched_of(BPF_CORE_READ(cg, kn, id), cg) : 0;
        }
    }
    struct cgroup *cg = sk->sk_cgrp_data.cgroup;
    return cg ? watched_of(cg->kn->id, cg) : 0;
}

static __always_inline u64 watched_task(void)
{
    struct cgroup *cg = bpf_get_current_task_btf()->cgroups->dfl_cgrp;
    return watched_of(cg->kn->id, cg);
}

// Whether the server's read left bytes behind: TCP's received but not yet copied to the application, a
// UNIX socket's queued skbs (one read in part stays queued).
static __always_inline bool bytes_left(const struct sock *sk)
{
    if (sk->__sk_common.skc_family == AF_UNIX)
        return sk->sk_receive_queue.qlen != 0;
    struct tcp_sock *tp = bpf_skc_to_tcp_sock((void *)sk);
    return tp && tp->rcv_nxt != tp->copied_seq;
}

#define CROWDED 1           // the socket is crowded: each response counts in `crowded`
#define LAST_CROWDED 2      // ... and the read that emptied it came: the next response is the last that counts
#define TCP_LISTEN 10       // a listener's state (UNIX ones too): its arrivals are connections, not bytes

// Whether the socket's senders are held back, at an arrival (the sender's context for UNIX, after its bytes
// were queued): a UNIX peer with 3/4 of its send buffer queued here (its next send blocks at the whole
// buffer, and a read frees one request's worth: measured with `ss -xm`, a sender of 8 KiB requests sat one
// request under its buffer after each read, so "at the buffer" would miss it), or a TCP receive window the
// sender has used up (the kernel advertises none under one segment, so a backlog closes it to zero).
static __always_inline bool near_limit(const struct sock *sk)
{
    if (sk->__sk_common.skc_state == TCP_LISTEN)
        return false;       // (a TCP listener's window fields are all 0: it would read as used up)
    if (sk->__sk_common.skc_family == AF_UNIX) {
        // One message is at most half its sender's buffer (unix_stream_sendmsg): with fewer than two queued
        // the peer is under 3/4, and the common case (a request, answered before the next) costs no read
        // of the peer (three probe reads a request: +200 ns, 15%, in scripts/bench-app-latency).
        if (sk->sk_receive_queue.qlen < 2)
            return false;
        struct sock *peer = BPF_CORE_READ((struct unix_sock *)sk, peer);
        if (!peer)
            return false;
        u64 queued = BPF_CORE_READ(peer, sk_wmem_alloc.refs.counter);
        s64 limit = BPF_CORE_READ(peer, sk_sndbuf);
        return limit > 0 && queued * 4 >= (u64)limit * 3;
    }
    struct tcp_sock *tp = bpf_skc_to_tcp_sock((void *)sk);
    return tp && (s32)(tp->rcv_wup + tp->rcv_wnd - tp->rcv_nxt) <= 0;
}

SEC("tp_btf/sk_data_ready")
int BPF_PROG(app_arrival, const struct sock *sk)
{
    if (!sk || !is_stream(sk))
        return 0;
    struct pending *p = bpf_sk_storage_get(&requests, (struct sock *)sk, 0, 0);
    if (!p) {
        if (!watched_socket(sk))
            return 0;
        p = bpf_sk_storage_get(&requests, (struct sock *)sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
        if (!p)
            return 0;
    }
    u64 now = bpf_ktime_get_ns();
    if (!p->unread)
        p->unread = now;                    // the oldest bytes the server has not read
    p->last = now;
    if (p->crowded != CROWDED && near_limit(sk))
        p->crowded = CROWDED;
    return 0;
}

#define MSG_PEEK 2
#define MSG_ERRQUEUE 0x2000

SEC("tp_btf/sock_recv_length")
int BPF_PROG(app_read, struct sock *sk, int ret, int flags)
{
    if (ret <= 0 || (flags & (MSG_PEEK | MSG_ERRQUEUE)) || !sk || !is_stream(sk))
        return 0;           // nothing taken from the socket
    struct pending *p = bpf_sk_storage_get(&requests, sk, 0, 0);
    if (!p || !p->unread)
        return 0;           // not a watched socket, or bytes that came before it was stamped
    // The clock starts at the oldest bytes this read took, unless the read before it left bytes behind:
    // then those waited on the server, and the clock started with them.
    if (!p->since || !p->left)
        p->since = p->unread;
    p->left = bytes_left(sk);
    if (!p->left && p->crowded)
        p->crowded = LAST_CROWDED;      // the server caught up: its answer to this read is the last crowded one
    // What is left came by the last arrival at the latest: timed from it, an answer to it can only read
    // shorter than it was, never longer.
    p->unread = p->left ? p->last : 0;
    return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(app_sent, struct sock *sk, int ret)
{
    if (ret <= 0 || !sk || !is_stream(sk))
        return 0;           // nothing sent: no response yet
    u64 cgroup = watched_task();
    if (!cgroup)
        return 0;
    // Made if missing: on a socket a watched task answers on, the requests that follow are stamped.
    struct pending *p = bpf_sk_storage_get(&requests, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
    if (!p || !p->since)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 took = now - p->since;
    p->since = 0;           // later sends before the next read are more of this answer: not counted

    count_in(&responses, cgroup, took);
    if (p->crowded) {
        if (p->crowded == LAST_CROWDED)
            p->crowded = 0;
        count_in(&crowded, cgroup, took);
    }

    // Its weight: WEIGHT shared by the connection's responses in this window, as many as in the window
    // before (a steady connection's) or as counted so far (a new or quickening one's), whichever is more.
    u32 window = (u32)(now >> WINDOW_SHIFT);
    if (window != p->window) {
        p->before = window == p->window + 1 ? p->answers : 0;
        p->window = window;
        p->answers = 0;
    }
    u32 n = ++p->answers;
    if (n < p->before)
        n = p->before;
    u64 weight = WEIGHT / n;
    struct hist *h = bpf_map_lookup_elem(&weighted, &cgroup);
    if (!h) {
        struct hist zero = {};
        bpf_map_update_elem(&weighted, &cgroup, &zero, BPF_NOEXIST);
        h = bpf_map_lookup_elem(&weighted, &cgroup);
        if (!h)
            return 0;
    }
    __sync_fetch_and_add(&h->slots[slot_of(took / 1000)], weight ? weight : 1);
    return 0;
}
