"""kernel/kfiles.py: a small kernel file read whole through its descriptor."""
from __future__ import annotations

import pytest

from koordd.kernel.kfiles import read_small


def test_a_file_is_read_whole_whatever_its_length_and_bytes_not_ascii_are_marked(tmp_path):
    long = tmp_path / "long"
    long.write_text("cpu 1 2 3\n" * 20_000)                         # 200 KB: several reads
    assert read_small(long) == "cpu 1 2 3\n" * 20_000
    odd = tmp_path / "odd"
    odd.write_bytes(b"some avg10=1.00\xff\n")
    assert read_small(str(odd)) == "some avg10=1.00\ufffd\n"
    with pytest.raises(FileNotFoundError):
        read_small(tmp_path / "gone")


def test_proc_files_read_as_the_text_layer_reads_them():
    from pathlib import Path
    assert read_small("/proc/self/stat").split()[0] == Path("/proc/self/stat").read_text().split()[0]
