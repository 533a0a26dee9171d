// Egress classification by cgroup, for tc: on the egress hook of a device koordd shapes (a tcx link,
// or a clsact filter on kernels before 6.6: koordd/kernel/netclass.py).
//
// A packet's socket belongs to a cgroup v2; if that cgroup or one of its ancestors is a class root
// koordd put in `classes`, the packet gets that class's tc class id in skb->priority, which HTB uses
// directly as the class to queue in (without a filter of its own). Where no v2 class root matched,
// the net_cls (v1) class id of the sending task counts if it is one koordd hands out (`netcls`):
// hosts with only v1 mounted classify that way. Packets of no class keep their priority and go to
// HTB's default class. Bytes sent per device and class id are counted for koordd's rates.
//
// EDT pacing (the "edt" enforcement): where `pace` holds a rate for the packet's device and class,
// the packet's earliest departure time (skb->tstamp) is set so that the class leaves at that rate,
// and the fq root qdisc holds it until then; as Cilium's bandwidth manager does, without a qdisc
// lock shared by all classes. A packet that would wait longer than HORIZON_NS is dropped (TCP
// backs off long before: the packets it has queued count against its socket's send budget).
// A class that fell behind its rate keeps up to `burst_ns` of the time it did not use, as an HTB
// class keeps its burst's tokens (koordd sets both from one rule, koordd/kernel/netlink.py burst_bytes): a sender
// whose next packet comes late -- its socket refilled only after the previous packet left, on a busy
// or slow CPU -- catches up, instead of losing that time for good and staying below its ceiling.
//
// A CO-RE object (scripts/build-bpf); it reads only __sk_buff fields and helpers, no kernel structs.
// It returns "next" (TC_ACT_UNSPEC, tcx's TCX_NEXT) for what it lets pass, so programs and filters
// after it on the hook still run; a packet it drops is TC_ACT_SHOT.

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

char _license[] SEC("license") = "GPL";

#define TC_ACT_UNSPEC (-1)              // linux/pkt_cls.h (macros: not in vmlinux.h)
#define TC_ACT_SHOT 2

#define MAX_LEVEL 16                    // cgroup levels below the root searched for a class root
#define NSEC_PER_SEC 1000000000ULL
#define HORIZON_NS (2 * NSEC_PER_SEC)   // a class this far behind its rate drops instead of queueing
#define SEGMENT_HEADERS 66              // Ethernet + IPv4 + TCP with timestamps (IPv6: 20 more)

struct dev_class {
    u32 ifindex;
    u32 classid;
};

struct pace {
    u64 rate;                           // bytes per second
    u64 t_last;                         // departure time of the class's latest packet (ns, CLOCK_MONOTONIC)
    u64 burst_ns;                       // unused time a class behind its rate may catch up on
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, u64);       // v2 cgroup id of a class root
    __type(value, u32);     // tc class id (major << 16 | minor)
} classes SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16);
    __type(key, u32);       // net_cls.classid koordd writes
    __type(value, u32);     // tc class id
} netcls SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(max_entries, 1024);
    __type(key, struct dev_class);
    __type(value, u64);     // bytes classified, per device and class
} sent SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, struct dev_class);
    __type(value, struct pace);     // classes paced on a device (EDT)
} pace SEC(".maps");

static __always_inline u32 class_of(struct __sk_buff *skb)
{
#pragma unroll
    for (int level = 1; level <= MAX_LEVEL; level++) {
        u64 id = bpf_skb_ancestor_cgroup_id(skb, level);
        if (id == 0)
            break;          // above the socket's own depth: no deeper ancestor
        u32 *classid = bpf_map_lookup_elem(&classes, &id);
        if (classid)
            return *classid;
    }
    u32 v1 = bpf_skb_cgroup_classid(skb);
    if (v1) {
        u32 *classid = bpf_map_lookup_elem(&netcls, &v1);
        if (classid)
            return *classid;
    }
    return 0;
}

// Bytes on the wire: a GSO packet carries its headers once, each of its segments carries them again
// (HTB counts them the same way; an estimate, as the headers' own length is not parsed here).
static __always_inline u64 wire_len(struct __sk_buff *skb)
{
    u32 segs = skb->gso_segs;
    return skb->len + (segs > 1 ? (u64)(segs - 1) * SEGMENT_HEADERS : 0);
}

// Cilium's EDT rule: the class's next packet leaves one packet time after its latest, or at once
// if the class is behind (or the socket asked for a later time itself); behind, it is charged from
// its own schedule, at most burst_ns back, so it may send that much more at once.
// Two CPUs may classify packets of one class at the same time (a sender and its socket's refill in
// softirq): each packet claims its slot with a compare-and-swap on t_last, so none leaves uncharged.
// A plain read-modify-write lost updates and let BE past its ceiling by 13% on the 2-vCPU VM.
static __always_inline int depart(struct __sk_buff *skb, struct pace *p)
{
    u64 rate = p->rate;
    if (rate == 0)
        return TC_ACT_UNSPEC;
    u64 now = bpf_ktime_get_ns();
    u64 t = skb->tstamp > now ? skb->tstamp : now;
    u64 delay = wire_len(skb) * NSEC_PER_SEC / rate;
    u64 burst = p->burst_ns;
    u64 floor = t > burst ? t - burst : 0;
    u64 last = p->t_last;
    u64 mine = 0;
#pragma unroll
    for (int tries = 0; tries < 4; tries++) {
        u64 next = last + delay > floor ? last + delay : floor;
        if (next > now && next - now >= HORIZON_NS)
            return TC_ACT_SHOT;
        u64 seen = __sync_val_compare_and_swap(&p->t_last, last, next);
        if (seen == last) {
            mine = next;
            break;
        }
        last = seen;
    }
    if (mine == 0)          // lost the race four times over: charged all the same
        mine = __sync_fetch_and_add(&p->t_last, delay) + delay;
    if (mine > t)
        skb->tstamp = mine;
    return TC_ACT_UNSPEC;
}

SEC("tc")
int classify(struct __sk_buff *skb)
{
    u32 classid = class_of(skb);
    if (classid == 0)
        return TC_ACT_UNSPEC;
    skb->priority = classid;
    struct dev_class key = {.ifindex = skb->ifindex, .classid = classid};
    struct pace *p = bpf_map_lookup_elem(&pace, &key);
    if (p && depart(skb, p) == TC_ACT_SHOT)
        return TC_ACT_SHOT;
    u64 *bytes = bpf_map_lookup_elem(&sent, &key);
    if (!bytes) {
        u64 zero = 0;
        bpf_map_update_elem(&sent, &key, &zero, BPF_NOEXIST);
        bytes = bpf_map_lookup_elem(&sent, &key);
    }
    if (bytes)
        *bytes += wire_len(skb);    // this CPU's own count: no other writer
    return TC_ACT_UNSPEC;
}
