"""Whether two cgroup patterns (fnmatch globs per path component) can overlap: the config's warning of
class roots nesting across BE (nested_classes), from the patterns alone, before any cgroup exists."""
from __future__ import annotations

import fnmatch
import itertools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from koordd.core.class_rules import ClassRule


def nested_classes(rules: tuple[ClassRule, ...]) -> list[tuple[int, str]]:
    """(index of the BE rule, message) for each BE pattern whose cgroups can hold a cgroup another
    class's pattern matches, and each that can match inside one. A cgroup has the class of its deepest
    match, and koordd never caps, freezes or kills a cgroup that holds an LS, LSR, LSE or SYSTEM one or
    lies inside one: such a BE cgroup is BE in name only (be_suppress and memory_evict leave it alone)."""
    out = []
    for i, outer in enumerate(rules):
        for j, inner in enumerate(rules):
            if outer.name == inner.name or "BE" not in (outer.name, inner.name):
                continue
            for p, q in itertools.product(outer.patterns, inner.patterns):
                if not can_hold(p, q):
                    continue
                if outer.name == "BE":
                    out.append((i, f"BE pattern {p!r} can hold cgroups of {inner.name} pattern {q!r} "
                                   f"(classes[{j}]): a BE cgroup holding one is never capped, frozen or killed"))
                else:
                    out.append((j, f"BE pattern {q!r} can match inside {outer.name} pattern {p!r} "
                                   f"(classes[{i}]): a BE cgroup inside {outer.name} work is never capped, "
                                   f"frozen or killed"))
    return out


def can_hold(outer: str, inner: str) -> bool:
    """Whether a cgroup that pattern `inner` matches can lie below one that `outer` matches (globs per
    component)."""
    o, i = outer.split("/"), inner.split("/")
    return len(i) > len(o) and all(_globs_meet(a, b) for a, b in zip(o, i))


def _globs_meet(a: str, b: str) -> bool:
    """Whether some name matches both fnmatch globs (one path component each). Two character
    classes are taken to meet: a warning too many rather than one missed."""
    x, y, memo = _glob_tokens(a), _glob_tokens(b), {}

    def meet(i: int, j: int) -> bool:
        if (i, j) not in memo:
            if i < len(x) and x[i] == "*":         # the star matches nothing, or what y's next token does
                memo[i, j] = meet(i + 1, j) or (j < len(y) and meet(i, j + 1))
            elif j < len(y) and y[j] == "*":
                memo[i, j] = meet(i, j + 1) or (i < len(x) and meet(i + 1, j))
            elif i == len(x) or j == len(y):
                memo[i, j] = i == len(x) and j == len(y)
            else:
                memo[i, j] = _chars_meet(x[i], y[j]) and meet(i + 1, j + 1)
        return memo[i, j]
    return meet(0, 0)


def _chars_meet(a: str, b: str) -> bool:
    """Whether one character matches both single-character tokens (a literal, "?" or "[...]")."""
    if "?" in (a, b) and min(len(a), len(b)) == 1:
        return True
    if len(a) == 1 and len(b) == 1:
        return a == b
    if len(a) == 1 or len(b) == 1:
        literal, cls = (a, b) if len(a) == 1 else (b, a)
        return fnmatch.fnmatchcase(literal, cls)
    return True



def _glob_tokens(glob: str) -> list[str]:
    """"*", "?", a "[...]" class (as fnmatch reads one) or one literal character each."""
    out, i = [], 0
    while i < len(glob):
        if glob[i] == "[":
            j = i + 1 + (glob[i + 1:i + 2] == "!")
            j += glob[j:j + 1] == "]"               # a "]" right after "[" or "[!" is a member
            end = glob.find("]", j)
            if end >= 0:
                out.append(glob[i:end + 1])
                i = end + 1
                continue
        out.append(glob[i])
        i += 1
    return out
