"""What koordd ships of its BPF programs, as package data: the CO-RE objects and a copy of the header C and
Python share, all made by scripts/build-bpf from the sources in the tree's bpf/. koordd/kernel/bpf_objects.py
finds them."""
