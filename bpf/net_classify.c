// Egress classification by cgroup, for tc: attached on clsact egress of a device koordd shapes.
//
// A packet's socket belongs to a cgroup v2; if that cgroup or one of its ancestors is a class root
// koordd put in `classes`, the packet gets that class's tc class id in skb->priority, which HTB uses
// directly as the class to queue in (without a filter of its own). Packets of no class keep their
// priority and go to HTB's default class. Bytes sent per class id are counted for koordd's rates.
//
// Header-independent: helpers only (bpf_skb_ancestor_cgroup_id reads the socket's cgroup), so it
// runs with headers of another kernel version too.

#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

#define MAX_LEVEL 16        // cgroup levels below the root searched for a class root

BPF_HASH(classes, u64, u32, 4096);      // v2 cgroup id of a class root -> tc class id (major << 16 | minor)
BPF_PERCPU_HASH(sent, u32, u64, 64);    // tc class id -> bytes classified into it

int classify(struct __sk_buff *skb)
{
#pragma unroll
    for (int level = 1; level <= MAX_LEVEL; level++) {
        u64 id = bpf_skb_ancestor_cgroup_id(skb, level);
        if (id == 0)
            break;          // above the socket's own depth: no deeper ancestor
        u32 *classid = classes.lookup(&id);
        if (classid) {
            skb->priority = *classid;
            u64 zero = 0;
            u64 *bytes = sent.lookup_or_try_init(classid, &zero);
            if (bytes)
                *bytes += skb->len;
            break;
        }
    }
    return TC_ACT_OK;
}
