// Run-queue latency per cgroup: how long each thread waited runnable before it ran, as a log2
// histogram per cgroup koordd watches (koordd/sensors/runq.py samples them).
//
// A CO-RE object (scripts/build-bpf): the kernel structs it reads are relocated by libbpf against the
// running kernel's BTF (the tracepoints' typed task pointers read directly, the cgroup walk through
// BPF_CORE_READ), so the program reads the task itself, as libbpf-tools' runqlat does:
//   - a thread is stamped when it becomes runnable: sched_wakeup, sched_wakeup_new, and sched_switch when
//     it is switched out still runnable (preempted or yielding). The stamp lives in the task's own storage
//     (BPF_MAP_TYPE_TASK_STORAGE, Linux 5.11+), found from the task at once: a hash keyed by thread id cost
//     an update at every wake-up and a lookup and delete at every switch, and the program a third more
//     time (docs/benchmarks.md, bench-runq-switch). With the time it keeps the deepest watched cgroup at
//     or above the thread's own (its cgroup v2 cgroup, task->cgroups->dfl_cgrp), found at the stamp;
//   - at its switch-in its wait is measured and counted at once in that cgroup's histogram (koordd adds
//     the sums up to the enclosing watched cgroups);
//   - a thread of no watched cgroup (a benchmark's client, kernel threads, system services) is not
//     stamped: its wake-ups and preemptions cost a look-up in the `resolved` cache and its switch-ins the
//     look-up of a storage it does not have, where each cost a stamp, a clock read and the cache before.
#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "koordd_shared.h"      // RUNQ_SLOTS: the histogram's slots, as koordd/sensors/runq.py reads them
#define HIST_SLOTS RUNQ_SLOTS
#include "cgroup_hist.h"        // struct hist, `watched`, `resolved`, slot_of, watched_of, count_in

char _license[] SEC("license") = "GPL";

#define TASK_RUNNING 0

struct stamp {
    u64 since;              // when the task became runnable (ns), 0: not waiting
    u64 cgroup;             // the watched cgroup its wait counts in
};

struct {
    __uint(type, BPF_MAP_TYPE_TASK_STORAGE);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, int);
    __type(value, struct stamp);    // freed with the task
} queued SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, u64);       // watched cgroup id
    __type(value, struct hist);
} waits SEC(".maps");

// Kernels before 5.14 call task_struct's state `state`.
struct task_struct___before_5_14 {
    long state;
} __attribute__((preserve_access_index));

// The tracepoints' task pointers are typed (tp_btf): their fields are read directly (CO-RE relocated all the
// same), where BPF_CORE_READ calls a helper for each pointer it follows; the programs run at every switch
// and wake-up.
static __always_inline long task_state(struct task_struct *t)
{
    if (bpf_core_field_exists(t->__state))
        return t->__state;
    return ((struct task_struct___before_5_14 *)t)->state;
}

static __always_inline u64 watched_task(struct task_struct *p)
{
    struct cgroup *cg = p->cgroups->dfl_cgrp;
    return watched_of(cg->kn->id, cg);
}

static __always_inline int stamp(struct task_struct *p)
{
    if (p->pid == 0)
        return 0;           // the idle task never waits
    u64 cgroup = watched_task(p);
    if (!cgroup)
        return 0;           // its waits would count nowhere
    struct stamp *s = bpf_task_storage_get(&queued, p, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (s) {                // NULL: no memory, or the storage busy on this CPU (a nested program): not counted
        s->since = bpf_ktime_get_ns();
        s->cgroup = cgroup;
    }
    return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(runq_wakeup, struct task_struct *p)
{
    return stamp(p);
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(runq_wakeup_new, struct task_struct *p)
{
    return stamp(p);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(runq_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
    if (preempt || task_state(prev) == TASK_RUNNING)
        stamp(prev);        // switched out still runnable: it waits from now on

    struct stamp *s = bpf_task_storage_get(&queued, next, 0, 0);
    if (!s || !s->since)
        return 0;
    u64 waited = bpf_ktime_get_ns() - s->since;
    s->since = 0;
    count_in(&waits, s->cgroup, waited);
    return 0;
}
