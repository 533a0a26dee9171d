"""One koordd per host, on the real kernel: a koordd running on cgroups of the test's own, then
`koordd --once` beside it (its config, its state_dir) and a second instance with a state_dir of its
own. Both refuse, naming the running one, with a non-zero exit, and write nothing: no knob, no state_dir.
The running one keeps its knob and journal. Then a kill -9 of the holder frees the host: the next
--once re-adopts what it left, and one with the loop off restores it.

The lock file is the test's own (tests/conftest.py sets koordd/act/owner.py's TEST_ENV for every test, and
the koordd processes inherit it): the same flock(2) on the same kernel as /run/koordd/owner.lock, without
taking the host's own lock from a koordd someone runs beside the tests. Needs root; skipped elsewhere.
"""
from __future__ import annotations

import json
import signal

import pytest

from koordtest.kernel import wait_for

pytestmark = pytest.mark.kernel


def test_once_and_a_second_instance_beside_a_running_koordd_refuse_naming_it(cgroups, koordd):
    config = koordd.write_config(enabled=True)
    original = cgroups.cpu_max("be")
    assert original.startswith("max "), original
    first = koordd.start(config)
    held = wait_for(lambda: koordd.held(), 30)
    assert held and cgroups.cpu_max("be") != original, koordd.log_text()

    # The holder keeps moving BE's cap (and the values it wrote with it): what must not change is whose
    # the knob is and what it goes back to, and the knob must hold a value the holder applied.
    def holds() -> list[tuple]:
        return sorted((h["target"], h["knob"], h["original"], h["owner"]) for h in koordd.held())
    held = holds()

    other_state = koordd.tmp / "other-state"
    other = koordd.tmp / "etc" / "other.toml"
    other.write_text(config.read_text().replace(json.dumps(str(koordd.state_dir)), json.dumps(str(other_state))))
    for cfg in (config, other):
        got = koordd.run_once(cfg)
        assert got.returncode != 0, got.stderr
        out = got.stdout + got.stderr
        assert f"koordd pid {first.pid}" in out and f"config {config}" in out, out
        assert f"state_dir {koordd.state_dir}" in out and "owns this host's knobs" in out, out

    assert not other_state.exists()                           # refused before it made its state_dir
    assert holds() == held
    value = cgroups.cpu_max("be")           # its decision is recorded just after the write: waited for
    assert wait_for(lambda: value in {d["new"] for d in koordd.decisions()
                                      if d["knob"] == "cpu.max" and d["outcome"] == "applied"}, 30), value
    assert first.poll() is None

    first.send_signal(signal.SIGKILL)                          # the kernel drops the lock with it
    first.wait(timeout=20)
    got = koordd.run_once(config)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "re-adopting" in got.stdout + got.stderr
    got = koordd.run_once(koordd.write_config(enabled=False))  # the loop off: its knob goes back
    assert got.returncode == 0, got.stdout + got.stderr
    assert koordd.held() == [] and cgroups.cpu_max("be") == original
