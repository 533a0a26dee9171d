// Run-queue latency per cgroup: how long each thread waited runnable before it ran, as a log2
// histogram per cgroup that koordd samples.
//
// Header-independent on purpose: koordd may be compiled against headers of another kernel version
// (Debian's cloud headers on a newer kernel), where reading task_struct fields returns garbage. Only
// tracepoint arguments (laid out by the running kernel's format files) and helpers are used:
//   - a thread is stamped when it becomes runnable: sched_wakeup, sched_wakeup_new, and sched_switch
//     when it is switched out still runnable (preempted);
//   - at its sched_switch in, its wait is computed and parked by thread id;
//   - the parked wait is counted at its next sched_switch out, when it is the current thread, so
//     bpf_get_current_*cgroup_id() name its own cgroup, never that of whoever ran before it.
// A wait is counted once, for the deepest cgroup koordd watches at or above the thread's own
// (koordd adds the sums up to the enclosing watched cgroups); waits elsewhere are not counted.

#define MAX_DEPTH 16        // cgroup levels below the root searched for a watched ancestor
#include "koordd_shared.h"      // RUNQ_SLOTS: the histogram's slots, as koordd/sensors/runq.py reads them

struct hist {
    u64 slots[RUNQ_SLOTS];
    u64 wait_ns;            // total wait: an exact mean
};

BPF_TABLE("lru_hash", u32, u64, queued, 65536);  // thread -> when it became runnable (ns)
BPF_TABLE("lru_hash", u32, u64, parked, 65536);  // thread -> its last wait (ns), until it is current
BPF_HASH(watched, u64, u8, 16384);      // v2 cgroup ids koordd samples (kept by koordd)
BPF_HASH(resolved, u64, u64, 65536);    // cgroup id -> deepest watched at or above it, 0: none (a cache
                                        // koordd clears whenever `watched` changes)
BPF_HASH(waits, u64, struct hist, 16384);   // watched cgroup id -> cumulative histogram

// sched_switch's prev_state: the low byte holds the sleep states; 0 there is "R" (still runnable:
// preempted or yielding); the bit above it marks preemption.
#define STATE_SLEEP_MASK 0xff

static int stamp(u32 tid)
{
    if (tid == 0)
        return 0;           // the idle task never waits
    u64 now = bpf_ktime_get_ns();
    queued.update(&tid, &now);
    return 0;
}

static u64 watched_of_current(void)
{
    u64 cgroup = bpf_get_current_cgroup_id();
    u64 *hit = resolved.lookup(&cgroup);
    if (hit)
        return *hit;
    u64 found = 0;
#pragma unroll
    for (int level = MAX_DEPTH; level >= 1; level--) {
        u64 id = bpf_get_current_ancestor_cgroup_id(level);     // 0 above the thread's own level
        if (id && watched.lookup(&id)) {
            found = id;
            break;
        }
    }
    resolved.update(&cgroup, &found);
    return found;
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
    return stamp(args->pid);
}

TRACEPOINT_PROBE(sched, sched_wakeup_new)
{
    return stamp(args->pid);
}

TRACEPOINT_PROBE(sched, sched_switch)
{
    u32 prev = args->prev_pid;
    u32 next = args->next_pid;

    // prev is the current thread here: its parked wait belongs to the cgroup it runs in.
    u64 *waited = parked.lookup(&prev);
    if (waited) {
        u64 cgroup = watched_of_current();
        if (cgroup) {
            struct hist zero = {};
            struct hist *h = waits.lookup_or_try_init(&cgroup, &zero);
            if (h) {
                u64 slot = bpf_log2l(*waited / 1000);
                if (slot >= RUNQ_SLOTS)
                    slot = RUNQ_SLOTS - 1;
                __sync_fetch_and_add(&h->slots[slot], 1);
                __sync_fetch_and_add(&h->wait_ns, *waited);
            }
        }
        parked.delete(&prev);
    }
    if ((args->prev_state & STATE_SLEEP_MASK) == 0)
        stamp(prev);        // switched out still runnable: it waits from now on

    u64 *since = queued.lookup(&next);
    if (since) {
        u64 waited_ns = bpf_ktime_get_ns() - *since;
        parked.update(&next, &waited_ns);
        queued.delete(&next);
    }
    return 0;
}
