// koordd's sched_ext scheduler: a runnable BE task never delays a runnable LS task on a CPU.
//
// Loaded in partial mode (SCX_OPS_SWITCH_PARTIAL): only threads with the SCHED_EXT policy (set by
// the sched_ext loop for `ext_classes`) run here, every other thread stays with the fair class,
// which the kernel runs before this one. A thread's class is that of the nearest cgroup at or above
// its own (cgroup v2) in `classes`, cgroup id -> class, which koordd fills (koordd/kernel/sched_ext_scheduler.py).
//   - LS (and any thread of no BE cgroup) waits in one shared queue, BE in another;
//   - a CPU that needs work takes LS first and BE only when no LS is queued: BE runs only on CPUs
//     LS leaves idle;
//   - an LS thread that wakes while no CPU is idle preempts a CPU running BE;
//   - within each queue, cgroups share CPUs by their `cpu.weight` (weighted virtual time per cgroup,
//     as scx_flatcg does and as the fair class does for cgroups): a cgroup is charged the CPU time its
//     threads use × 100 / its weight, and the thread of the cgroup furthest behind runs next. So LS
//     weights (the kubelet's, an operator's) and avx_weight keep their meaning under this scheduler;
//   - an LS thread that wakes with no idle or BE CPU to take preempts an LS thread that has run
//     LS_WAKEUP_GRAN_NS or more: a busy LS thread does not hold a waking one off for its whole slice.
//
// The weight is that of the thread's own cgroup (the nearest with the cpu controller: its task
// group), compared flat across the queue rather than compounded down the hierarchy as scx_flatcg
// does. The kubelet derives every level's weight from CPU requests (a pod's is the sum of its
// containers'), so flat leaf weights give pods and containers the same proportions. Threads of one
// cgroup take turns in the order they were queued; a cgroup the kernel has not told us of (the map
// full) falls back to per-thread virtual time at the thread's nice weight.
// One exception keeps the scheduler loaded: the kernel ejects a BPF scheduler that leaves a runnable
// thread waiting past its watchdog (30 s), so BE that has made no progress for BE_MAX_WAIT_NS runs
// for one short slice even while LS is queued.
#include "vmlinux.h"
#include "scx.h"
#include "koordd_shared.h"     // CLASS_LS, CLASS_BE: the values koordd/kernel/sched_ext_scheduler.py writes

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

// A cgroup with the cpu controller, as the kernel's cgroup callbacks (below) describe it.
struct cgroup_share {
    u64 vtime;              // CPU time its threads used × 100 / weight, floored as they queue
    u32 weight;             // cpu.weight, 1..10000 (100 by default)
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 16384);
    __type(key, u64);       // cgroup id
    __type(value, struct cgroup_share);
} shares SEC(".maps");

// A global array, not a map: the CPU scan below then indexes it from a register, which the verifier
// follows; a map key on the stack loses the loop counter's value ("infinite loop detected").
u32 runs_be[MAX_CPUS];      // CPU -> 1 while it runs a BE thread
u64 ls_since[MAX_CPUS];     // CPU -> when the LS thread it runs started (0: none)
u64 run_started[MAX_CPUS];  // CPU -> since when the thread it runs has not been charged (charge)
u64 be_waiting_since;       // when BE last made progress (or became queued)
u64 vtime_now[2];           // per queue (LS_DSQ, BE_DSQ): its clock, the highest virtual time run so far

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

static u32 queue_of(struct task_struct *p)
{
    return task_class(p) == CLASS_BE ? BE_DSQ : LS_DSQ;
}

// The cgroup whose cpu.weight applies to p: its task group's (kernfs ids are what `shares` is keyed by).
static struct cgroup_share *task_share(struct task_struct *p)
{
    u64 id = p->sched_task_group->css.cgroup->kn->id;

    return bpf_map_lookup_elem(&shares, &id);
}

// Where p queues in `dsq`: at its cgroup's virtual time, but at most one slice behind the queue's
// latest, so a cgroup that slept banks no more than that (the fair class's rule for sleepers).
static u64 queue_vtime(struct task_struct *p, u32 dsq, u64 slice)
{
    struct cgroup_share *share = task_share(p);
    u64 vtime = p->scx.dsq_vtime;
    u64 floor = vtime_now[dsq & 1] - slice;

    // Opaque to the compiler, so it cannot fold the two reads into one load from either pointer,
    // which the verifier refuses ("same insn cannot be used with different pointers").
    asm volatile("" : "+r"(vtime));
    if (share)
        vtime = share->vtime;
    if (vtime_before(vtime, floor)) {
        vtime = floor;
        if (share)
            share->vtime = floor;
    }
    return vtime;
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

// The virtual time of p's cgroup (p's own where the cgroup is unknown).
static u64 vtime_of(struct task_struct *p, struct cgroup_share *share)
{
    u64 vtime = p->scx.dsq_vtime;

    asm volatile("" : "+r"(vtime));     // as in queue_vtime: two reads, not one
    if (share)
        vtime = share->vtime;
    return vtime;
}

// Charge p's cgroup (p itself where the cgroup is unknown) the CPU time p used on `cpu` since it
// started or was last charged, × 100 / weight, and carry the queue's clock along: a thread kept on
// its CPU slice after slice moves the clock, so one that arrives meanwhile starts near it, not at
// the runner's old start (from where it would hold the CPU until it caught up).
static void charge(struct task_struct *p, u32 dsq, u32 cpu)
{
    struct cgroup_share *share = task_share(p);
    u64 now = bpf_ktime_get_ns(), used = 0, vtime;

    if (cpu >= MAX_CPUS)            // unsigned: one bound the verifier follows
        return;
    if (run_started[cpu])           // 0: running() has not been seen for it (loaded meanwhile)
        used = now - run_started[cpu];
    run_started[cpu] = now;
    if (share)
        __sync_fetch_and_add(&share->vtime, used * 100 / (share->weight ?: 100));
    else
        p->scx.dsq_vtime += used * 100 / (p->scx.weight ?: 100);
    vtime = vtime_of(p, share);
    if (vtime_before(vtime_now[dsq & 1], vtime))
        vtime_now[dsq & 1] = vtime;
}

// Whether prev, still runnable on `cpu` as its slice ends, runs on: charged up to now, its cgroup is
// no further ahead than the first thread queued in its queue `dsq`. The fair class picks among the
// queued threads and the running one alike; without this two busy threads would simply alternate
// slice by slice, whatever their cgroups' weights.
static bool prev_runs_on(struct task_struct *prev, u32 dsq, u32 cpu)
{
    struct bpf_iter_scx_dsq it;
    struct task_struct *first;
    u64 vtime;
    bool runs_on = true;

    charge(prev, dsq, cpu);
    vtime = vtime_of(prev, task_share(prev));
    if (!bpf_iter_scx_dsq_new(&it, dsq, 0)) {
        first = bpf_iter_scx_dsq_next(&it);
        if (first && !vtime_before(vtime, first->scx.dsq_vtime))
            runs_on = false;
    }
    bpf_iter_scx_dsq_destroy(&it);
    return runs_on;
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
    if (queue_of(p) == BE_DSQ) {
        if (!scx_bpf_dsq_nr_queued(BE_DSQ))
            be_waiting_since = bpf_ktime_get_ns();
        scx_bpf_dsq_insert_vtime(p, BE_DSQ, BE_SLICE_NS, queue_vtime(p, BE_DSQ, BE_SLICE_NS), enq_flags);
        s32 idle = scx_bpf_pick_idle_cpu(p->cpus_ptr, 0);
        if (idle >= 0)
            scx_bpf_kick_cpu(idle, SCX_KICK_IDLE);
        return;
    }
    scx_bpf_dsq_insert_vtime(p, LS_DSQ, LS_SLICE_NS, queue_vtime(p, LS_DSQ, LS_SLICE_NS), enq_flags);
    make_room_for_ls(p, enq_flags & SCX_ENQ_WAKEUP);
}

// Called when this CPU's local queue is empty: also when the thread it runs used up its slice,
// before that thread is queued again. That thread, still runnable, competes with its queue's first.
void BPF_STRUCT_OPS(koordd_dispatch, s32 cpu, struct task_struct *prev)
{
    bool prev_runnable = prev && (prev->scx.flags & SCX_TASK_QUEUED);
    u32 prev_dsq = prev_runnable ? queue_of(prev) : LS_DSQ;

    if (bpf_ktime_get_ns() - be_waiting_since > BE_MAX_WAIT_NS && move_be())
        return;             // starving BE: one slice, then LS again
    if (prev_runnable && prev_dsq == LS_DSQ && prev_runs_on(prev, LS_DSQ, cpu)) {
        prev->scx.slice = LS_SLICE_NS;      // it keeps the CPU for another slice
        return;
    }
    if (scx_bpf_dsq_move_to_local(LS_DSQ))
        return;
    if (prev_runnable && prev_dsq == BE_DSQ && prev_runs_on(prev, BE_DSQ, cpu)) {
        prev->scx.slice = BE_SLICE_NS;      // no LS waits: BE shares by weight the same way
        return;
    }
    move_be();
}

void BPF_STRUCT_OPS(koordd_running, struct task_struct *p)
{
    u32 dsq = queue_of(p);
    u64 now = bpf_ktime_get_ns();
    u32 cpu = bpf_get_smp_processor_id();

    if (cpu < MAX_CPUS)
        run_started[cpu] = now;
    set_running(dsq == BE_DSQ, dsq == BE_DSQ ? 0 : now);
    if (vtime_before(vtime_now[dsq & 1], p->scx.dsq_vtime))
        vtime_now[dsq & 1] = p->scx.dsq_vtime;
}

// The thread's cgroup pays for the CPU time it used (charge). The time is measured, not read off
// the slice: the kernel may give a thread that keeps its CPU a new slice of another length.
void BPF_STRUCT_OPS(koordd_stopping, struct task_struct *p, bool runnable)
{
    charge(p, queue_of(p), bpf_get_smp_processor_id());
    set_running(0, 0);
}

void BPF_STRUCT_OPS(koordd_enable, struct task_struct *p)
{
    p->scx.dsq_vtime = vtime_now[queue_of(p) & 1];
}

// The kernel names every cgroup with the cpu controller at load and as one comes, with its weight,
// and tells of every weight change. Never an error: that would fail the cgroup's creation (or our
// load); a cgroup left out of a full map falls back to per-thread virtual time.
s32 BPF_STRUCT_OPS(koordd_cgroup_init, struct cgroup *cgrp, struct scx_cgroup_init_args *args)
{
    u64 id = cgrp->kn->id;
    struct cgroup_share share = { .vtime = 0, .weight = args->weight };    // 0: floored as it first queues

    bpf_map_update_elem(&shares, &id, &share, BPF_ANY);
    return 0;
}

void BPF_STRUCT_OPS(koordd_cgroup_set_weight, struct cgroup *cgrp, u32 weight)
{
    u64 id = cgrp->kn->id;
    struct cgroup_share *share = bpf_map_lookup_elem(&shares, &id);

    if (share)
        share->weight = weight;
}

void BPF_STRUCT_OPS(koordd_cgroup_exit, struct cgroup *cgrp)
{
    u64 id = cgrp->kn->id;

    bpf_map_delete_elem(&shares, &id);
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
    .cgroup_init = (void *)koordd_cgroup_init,
    .cgroup_set_weight = (void *)koordd_cgroup_set_weight,
    .cgroup_exit = (void *)koordd_cgroup_exit,
    .init = (void *)koordd_init,
    .flags = SCX_OPS_SWITCH_PARTIAL,
    .name = "koordd",
};
