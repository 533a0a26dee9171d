// koordd's sched_ext scheduler: a runnable BE task never delays a runnable LS task on a CPU.
//
// Loaded in partial mode (SCX_OPS_SWITCH_PARTIAL): only threads with the SCHED_EXT policy (set by
// the sched_ext loop for `ext_classes`) run here, every other thread stays with the fair class,
// which the kernel runs before this one. A thread's class is that of the nearest cgroup at or above
// its own (cgroup v2) in `classes`, cgroup id -> class, which koordd fills (koordd/kernel/scx.py).
//   - LS (and any thread of no BE cgroup) waits in one shared queue, BE in another;
//   - a CPU that needs work takes LS first and BE only when no LS is queued: BE runs only on CPUs
//     LS leaves idle;
//   - an LS thread that wakes while no CPU is idle preempts a CPU running BE;
//   - LS threads share CPUs fairly among themselves by virtual time (CPU time / weight, as the fair
//     class does), and one that wakes with no idle or BE CPU to take preempts an LS thread that has
//     run LS_WAKEUP_GRAN_NS or more: a busy LS thread does not hold a waking one off for its whole
//     slice.
// One exception keeps the scheduler loaded: the kernel ejects a BPF scheduler that leaves a runnable
// thread waiting past its watchdog (30 s), so BE that has made no progress for BE_MAX_WAIT_NS runs
// for one short slice even while LS is queued.
#include "vmlinux.h"
#include "scx.h"
#include "koordd_shared.h"     // CLASS_LS, CLASS_BE: the values koordd/kernel/scx.py writes

char _license[] SEC("license") = "GPL";     // sched_ext's kfuncs are GPL-only

#define LS_DSQ 0
#define BE_DSQ 1
#define MAX_CPUS 1024
#define MAX_DEPTH 16        // cgroup levels searched for a classified ancestor
#define LS_SLICE_NS 3000000ULL          // 3 ms: the longest a waking LS thread waits for another LS thread
#define LS_WAKEUP_GRAN_NS 1000000ULL    // 1 ms: an LS thread runs at least this long before a waker preempts it
#define BE_SLICE_NS 5000000ULL          // short: a BE slice is the longest an unkicked LS waits
#define BE_MAX_WAIT_NS 100000000ULL     // 100 ms: every BE thread runs well within the watchdog

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 4096);
    __type(key, u64);       // cgroup id (the inode number of its directory)
    __type(value, u32);     // CLASS_LS or CLASS_BE
} classes SEC(".maps");

// A global array, not a map: the CPU scan below then indexes it from a register, which the verifier
// follows; a map key on the stack loses the loop counter's value ("infinite loop detected").
u32 runs_be[MAX_CPUS];      // CPU -> 1 while it runs a BE thread
u64 ls_since[MAX_CPUS];     // CPU -> when the LS thread it runs started (0: none)
u64 be_waiting_since;       // when BE last made progress (or became queued)
u64 vtime_now;              // the virtual time of the LS thread that started running last (the highest)

static bool vtime_before(u64 a, u64 b)
{
    return (s64)(a - b) < 0;
}

static u32 task_class(struct task_struct *p)
{
    struct kernfs_node *kn = p->cgroups->dfl_cgrp->kn;

    for (int level = 0; level < MAX_DEPTH && kn; level++) {
        u64 id = kn->id;
        u32 *cls = bpf_map_lookup_elem(&classes, &id);

        if (cls)
            return *cls;
        kn = kn->__parent;
    }
    return CLASS_LS;        // only what koordd names BE is held back
}

static void set_running(u32 be, u64 ls_started)
{
    u32 cpu = bpf_get_smp_processor_id();

    if (cpu < MAX_CPUS) {
        runs_be[cpu] = be;
        ls_since[cpu] = ls_started;
    }
}

// Kick a CPU of p's that runs BE off it; whether one was found.
static bool kick_be_cpu(struct task_struct *p)
{
    u32 nr = scx_bpf_nr_cpu_ids();

    for (u32 cpu = 0; cpu < MAX_CPUS && cpu < nr; cpu++) {
        if (runs_be[cpu] && bpf_cpumask_test_cpu(cpu, p->cpus_ptr)) {
            runs_be[cpu] = 0;   // one kick per LS thread: the next one looks for another CPU
            scx_bpf_kick_cpu(cpu, SCX_KICK_PREEMPT);
            return true;
        }
    }
    return false;
}

// Kick a CPU of p's whose LS thread has run LS_WAKEUP_GRAN_NS or more. It reads the CPU count again
// rather than reuse kick_be_cpu's: that one leaves the loop with a range per CPU it stopped at, and
// the verifier would walk this loop once for each of them.
static void kick_long_ls_cpu(struct task_struct *p)
{
    u32 nr = scx_bpf_nr_cpu_ids();
    u64 now = bpf_ktime_get_ns();

    for (u32 cpu = 0; cpu < MAX_CPUS && cpu < nr; cpu++) {
        if (ls_since[cpu] && now - ls_since[cpu] >= LS_WAKEUP_GRAN_NS && bpf_cpumask_test_cpu(cpu, p->cpus_ptr)) {
            ls_since[cpu] = 0;  // likewise: one kick
            scx_bpf_kick_cpu(cpu, SCX_KICK_PREEMPT);
            return;
        }
    }
}

// Get a CPU for a newly queued LS thread: an idle one, else one running BE, else, for a thread that
// woke, one whose LS thread has had its LS_WAKEUP_GRAN_NS.
static void make_room_for_ls(struct task_struct *p, bool woke)
{
    s32 idle = scx_bpf_pick_idle_cpu(p->cpus_ptr, 0);

    if (idle >= 0) {
        scx_bpf_kick_cpu(idle, SCX_KICK_IDLE);
        return;
    }
    if (!kick_be_cpu(p) && woke)
        kick_long_ls_cpu(p);
}

static bool move_be(void)
{
    if (!scx_bpf_dsq_move_to_local(BE_DSQ))
        return false;
    be_waiting_since = bpf_ktime_get_ns();
    return true;
}

s32 BPF_STRUCT_OPS(koordd_select_cpu, struct task_struct *p, s32 prev_cpu, u64 wake_flags)
{
    bool is_idle = false;
    s32 cpu = scx_bpf_select_cpu_dfl(p, prev_cpu, wake_flags, &is_idle);

    if (is_idle)            // an idle CPU: either class runs there at once
        scx_bpf_dsq_insert(p, SCX_DSQ_LOCAL, task_class(p) == CLASS_BE ? BE_SLICE_NS : LS_SLICE_NS, 0);
    return cpu;
}

void BPF_STRUCT_OPS(koordd_enqueue, struct task_struct *p, u64 enq_flags)
{
    if (task_class(p) == CLASS_BE) {
        if (!scx_bpf_dsq_nr_queued(BE_DSQ))
            be_waiting_since = bpf_ktime_get_ns();
        scx_bpf_dsq_insert(p, BE_DSQ, BE_SLICE_NS, enq_flags);
        s32 idle = scx_bpf_pick_idle_cpu(p->cpus_ptr, 0);
        if (idle >= 0)
            scx_bpf_kick_cpu(idle, SCX_KICK_IDLE);
        return;
    }
    // A thread that slept comes back at most one slice behind the others: sleeping banks no more.
    u64 vtime = p->scx.dsq_vtime;

    if (vtime_before(vtime, vtime_now - LS_SLICE_NS))
        vtime = vtime_now - LS_SLICE_NS;
    scx_bpf_dsq_insert_vtime(p, LS_DSQ, LS_SLICE_NS, vtime, enq_flags);
    make_room_for_ls(p, enq_flags & SCX_ENQ_WAKEUP);
}

// Called when this CPU's local queue is empty: also when the thread it runs used up its slice,
// before that thread is queued again. An LS thread there, still runnable, is LS waiting too.
void BPF_STRUCT_OPS(koordd_dispatch, s32 cpu, struct task_struct *prev)
{
    if (bpf_ktime_get_ns() - be_waiting_since > BE_MAX_WAIT_NS && move_be())
        return;             // starving BE: one slice, then LS again
    if (scx_bpf_dsq_move_to_local(LS_DSQ))
        return;
    if (prev && (prev->scx.flags & SCX_TASK_QUEUED) && task_class(prev) != CLASS_BE)
        return;             // nothing here: the kernel keeps the LS thread running, with a new slice
    move_be();
}

void BPF_STRUCT_OPS(koordd_running, struct task_struct *p)
{
    if (task_class(p) == CLASS_BE) {
        set_running(1, 0);
        return;
    }
    set_running(0, bpf_ktime_get_ns());
    if (vtime_before(vtime_now, p->scx.dsq_vtime))
        vtime_now = p->scx.dsq_vtime;
}

// Charge an LS thread the slice it used, scaled by its weight (100 at nice 0), as the fair class does.
void BPF_STRUCT_OPS(koordd_stopping, struct task_struct *p, bool runnable)
{
    set_running(0, 0);
    if (task_class(p) != CLASS_BE)
        p->scx.dsq_vtime += (LS_SLICE_NS - p->scx.slice) * 100 / p->scx.weight;
}

void BPF_STRUCT_OPS(koordd_enable, struct task_struct *p)
{
    p->scx.dsq_vtime = vtime_now;
}

s32 BPF_STRUCT_OPS(koordd_init)     // sleepable (koordd/scx.py flags it): creating a queue may sleep
{
    s32 err = scx_bpf_create_dsq(LS_DSQ, -1);

    return err ? err : scx_bpf_create_dsq(BE_DSQ, -1);
}

SEC(".struct_ops")
struct sched_ext_ops koordd_ops = {
    .select_cpu = (void *)koordd_select_cpu,
    .enqueue = (void *)koordd_enqueue,
    .dispatch = (void *)koordd_dispatch,
    .running = (void *)koordd_running,
    .stopping = (void *)koordd_stopping,
    .enable = (void *)koordd_enable,
    .init = (void *)koordd_init,
    .flags = SCX_OPS_SWITCH_PARTIAL,
    .name = "koordd",
};
