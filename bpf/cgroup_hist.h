// What runq_latency.bpf.c and app_latency.bpf.c share: a log2-µs histogram per cgroup koordd watches, the
// `watched` set koordd keeps and the `resolved` cache of cgroup -> its deepest watched cgroup. One layout,
// read by one reader (koordd/sensors/cgroup_hist.py). Each program names its histogram map itself.
// Include after vmlinux.h, the libbpf headers and koordd_shared.h; HIST_SLOTS is the slots' count.
#ifndef KOORDD_CGROUP_HIST_H
#define KOORDD_CGROUP_HIST_H

#define MAX_DEPTH 32        // cgroup levels searched upwards for a watched one

struct hist {
    u64 slots[HIST_SLOTS];  // log2 µs: slot k holds [2^(k-1), 2^k) µs, slot 0 under 1 µs
    u64 wait_ns;            // the total: an exact mean
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, u64);       // cgroup v2 id koordd samples (kept by koordd)
    __type(value, u8);
} watched SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, u64);       // cgroup id
    __type(value, u64);     // the deepest watched cgroup at or above it, 0: none. A cache koordd
                            // empties whenever `watched` changes.
} resolved SEC(".maps");

// floor(log2(v)), 0 for 0 and 1 (as bcc's bpf_log2: the slots keep their meaning)
static __always_inline u32 log2_u32(u32 v)
{
    u32 r, shift;
    r = (v > 0xFFFF) << 4; v >>= r;
    shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
    shift = (v > 0xF) << 2; v >>= shift; r |= shift;
    shift = (v > 0x3) << 1; v >>= shift; r |= shift;
    r |= (v >> 1);
    return r;
}

static __always_inline u32 slot_of(u64 us)
{
    u32 hi = us >> 32;
    u32 slot = hi ? log2_u32(hi) + 32 + 1 : log2_u32(us) + 1;
    return slot < HIST_SLOTS ? slot : HIST_SLOTS - 1;
}

// The deepest watched cgroup at or above cgroup `id` (0: none): the `resolved` cache's answer, else found by
// walking up from `cg` (that cgroup) and kept there. The walk runs once per cgroup and change of `watched`.
static __always_inline u64 watched_of(u64 id, struct cgroup *cg)
{
    u64 *hit = bpf_map_lookup_elem(&resolved, &id);
    if (hit)
        return *hit;
    u64 found = 0;
    for (int level = 0; level < MAX_DEPTH && cg; level++) {
        u64 up = BPF_CORE_READ(cg, kn, id);
        if (bpf_map_lookup_elem(&watched, &up)) {
            found = up;
            break;
        }
        // a cgroup's css `self` is its first member: the parent css is the parent cgroup
        cg = (struct cgroup *)BPF_CORE_READ(cg, self.parent);
    }
    bpf_map_update_elem(&resolved, &id, &found, BPF_ANY);
    return found;
}

// Count `ns` in `cgroup`'s histogram of `histograms`, made on first use.
static __always_inline void count_in(void *histograms, u64 cgroup, u64 ns)
{
    struct hist *h = bpf_map_lookup_elem(histograms, &cgroup);
    if (!h) {
        struct hist zero = {};
        bpf_map_update_elem(histograms, &cgroup, &zero, BPF_NOEXIST);
        h = bpf_map_lookup_elem(histograms, &cgroup);
        if (!h)
            return;
    }
    __sync_fetch_and_add(&h->slots[slot_of(ns / 1000)], 1);
    __sync_fetch_and_add(&h->wait_ns, ns);
}

#endif
