"""What koordd takes before it writes anything: the host's knobs (one owner per host) and its state_dir.

    claim = HostClaim.take(config, dry_run)     # HostOwned, UntrustedLock, UntrustedState, JournalUnreadable
    ... claim.journal, claim.state_dir ...
    claim.release()                             # what was changed stays, in the journal, for the next owner
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from koordd.act.decision_log import DecisionLog
from koordd.act.journal import RestoreJournal, note_move, sweep_temporaries
from koordd.act.owner import HostOwned, OwnerLock, current_holder, lock_path
from koordd.core.config import Config
from koordd.core.feeds import REQUEST_FILE, STATUS_FILE, TOP_FILE
from koordd.core.trust import untrusted_state_dir

log = logging.getLogger("koordd")
# What koordd reads, appends to or replaces in its state_dir: trusted only if root's alone.
STATE_FILES = (RestoreJournal.FILE, RestoreJournal.V1_FILE, RestoreJournal.MOVED_FROM, DecisionLog.FILE, STATUS_FILE,
               TOP_FILE, REQUEST_FILE)


class UntrustedState(Exception):
    """The state_dir or a file in it could be changed by someone other than root."""


class HostClaim:
    """The owner lock (None in a dry-run, which takes none) and the state_dir's journal, taken in that order:
    before anything is written, the state_dir made or the journal read, one koordd per host writes."""

    def __init__(self, owner: OwnerLock | None, state_dir: Path, journal: RestoreJournal):
        self.owner, self.state_dir, self.journal = owner, state_dir, journal

    @classmethod
    def take(cls, config: Config, dry_run: bool) -> HostClaim:
        state_dir = Path(config.daemon.state_dir)
        owner = _own_host(config, state_dir, dry_run)
        try:
            return cls(owner, state_dir, _open_state_dir(state_dir, owner))
        except BaseException:
            if owner is not None:
                owner.release()
            raise

    def release(self) -> None:
        if self.owner is not None:
            self.owner.release()
            self.owner = None


def _own_host(config: Config, state_dir: Path, dry_run: bool) -> OwnerLock | None:
    """The host lock (koordd/act/owner.py), or HostOwned naming its holder. A dry-run takes none, but
    refuses beside the holder on the holder's own state_dir: its status, decisions and top files
    would overwrite the holder's, and its recovery would take the holder's live holds for leftovers."""
    if not dry_run:
        return OwnerLock.take(config.path, state_dir)
    holder = current_holder()
    if holder is not None and holder.state_dir is not None and \
            os.path.realpath(holder.state_dir) == os.path.realpath(state_dir):
        raise HostOwned(holder, lock_path(), f"{holder.describe()} owns this host's knobs and uses state_dir "
                        f"{state_dir}: a dry-run there would overwrite its status and decision log; give "
                        "the dry-run a config with another daemon.state_dir")
    if holder is not None:
        log.info("%s owns this host's knobs; this dry-run writes none", holder.describe())
    return None


def _open_state_dir(state_dir: Path, owner: OwnerLock | None) -> RestoreJournal:
    """The state_dir, made if missing, and its journal; UntrustedState if others could change them."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    why = untrusted_state_dir(state_dir, STATE_FILES)
    if why:
        raise UntrustedState(f"{why}: koordd undoes what its state_dir's journal says, so it trusts the "
                             f"directory only if root alone can change it (chown root, chmod go-w)")
    _keep_private(state_dir)
    if owner is not None:       # this koordd alone writes the state_dir now: no temporary is in use
        sweep_temporaries(state_dir, STATE_FILES)
    _carry_over_previous_state_dir(state_dir, owner)
    return RestoreJournal(state_dir)


def _carry_over_previous_state_dir(state_dir: Path, owner: OwnerLock | None) -> None:
    """The koordd that held the host before used another state_dir (the config changed it, then that
    koordd was killed before a clean stop restored its knobs), or a start before this one was refused
    before it carried such holds: those journals' holds are carried over here (journal.note_move), not
    abandoned. A state_dir others could change is not read from; it stays in the owner lock's record, so
    a later start carries it once it is fixed."""
    if owner is None:
        return
    untrusted = []
    for old in map(Path, owner.carry_from):
        if os.path.realpath(old) == os.path.realpath(state_dir) or not any(
                (old / f).exists() for f in (RestoreJournal.FILE, RestoreJournal.V1_FILE, RestoreJournal.MOVED_FROM)):
            continue
        why = untrusted_state_dir(old, STATE_FILES)
        if why:
            log.error("a koordd before this one kept its restore journal in %s, which is not trusted (%s): its "
                      "holds are not carried over until it is", old, why)
            untrusted.append(str(old))
            continue
        log.warning("a koordd before this one (pid %s) kept its restore journal in %s: its holds are carried "
                    "over to %s", owner.previous.pid if owner.previous else "unknown", old, state_dir)
        note_move(state_dir, old)
    owner.carried(untrusted)


def _keep_private(d: Path) -> None:
    """The state dir holds the names of every cgroup and process koordd acted on, and the request
    koordctl top leaves: for root (and root's group, as systemd's StateDirectoryMode=0750), nobody else."""
    mode = d.stat().st_mode
    if mode & 0o007:
        os.chmod(d, mode & 0o7770)
        log.warning("%s was open to every user (mode %04o): now %04o", d, mode & 0o7777, mode & 0o7770)
