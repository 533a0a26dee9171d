"""resctrl as numbers, with no file touched: what the hardware offers (info/) and the schemata lines that
set cache ways and memory bandwidth. Pure: the llc_partition loop computes with it, the resctrl
filesystem adapter (koordd/kernel/resctrl.py) reads info/ into it."""
from __future__ import annotations

import math
from dataclasses import dataclass


AMD_MB_MAX = 2048        # AMD: MB is in 1/8 GB/s; 2048 means unlimited


@dataclass(frozen=True)
class L3Info:
    cbm_mask: int            # every way: the default group's mask
    min_cbm_bits: int
    num_closids: int
    shareable_bits: int
    cache_ids: tuple[int, ...]

    @property
    def ways(self) -> int:
        return bin(self.cbm_mask).count("1")


@dataclass(frozen=True)
class MBInfo:
    min_bandwidth: int
    bandwidth_gran: int
    num_closids: int
    domain_ids: tuple[int, ...]
    vendor: str              # "intel": percent in steps of bandwidth_gran; "amd": 1/8 GB/s, 2048 unlimited

    @property
    def max_value(self) -> int:
        return AMD_MB_MAX if self.vendor == "amd" else 100


@dataclass(frozen=True)
class ResctrlInfo:
    l3: L3Info | None
    mb: MBInfo | None
    vendor: str = ""         # "intel", "amd": AMD takes non-contiguous masks and MB in 1/8 GB/s

    @property
    def num_closids(self) -> int:
        """Groups the hardware can tell apart, the default group included."""
        return min(r.num_closids for r in (self.l3, self.mb) if r is not None)


def format_line(domains: dict[int, str]) -> str:
    """{0: "ff", 1: "ff"} -> "0=ff;1=ff" (the value of a knob: one resource's line after its name)."""
    return ";".join(f"{d}={v}" for d, v in sorted(domains.items()))


def l3_ways(info: L3Info, start_percent: float, end_percent: float) -> tuple[int, int]:
    """(first way, number of ways) for the ways from start to end percent of the cache, koordlet's
    way (first ceil(ways × start%), end ceil(ways × end%)), at least min_cbm_bits, within the cache."""
    ways, least = info.ways, max(info.min_cbm_bits, 1)
    first = min(math.ceil(ways * start_percent / 100), ways - 1)
    end = max(math.ceil(ways * end_percent / 100), first + least)
    if end > ways:
        first, end = max(ways - least, 0), ways
    return first, end - first


def ways_mask(info: L3Info, first: int, count: int) -> int:
    """The contiguous mask of `count` ways from way `first`, counted from the lowest way the CPU has."""
    low = (info.cbm_mask & -info.cbm_mask).bit_length() - 1
    return ((1 << count) - 1) << (first + low)


def l3_mask(info: L3Info, start_percent: float, end_percent: float) -> int:
    """The ways from start to end percent of the cache as one contiguous mask (l3_ways)."""
    return ways_mask(info, *l3_ways(info, start_percent, end_percent))


def l3_line(info: L3Info, mask: int) -> str:
    """The same mask on every cache id."""
    return format_line({d: f"{mask:x}" for d in info.cache_ids})


def mb_value(info: MBInfo, percent: float) -> int:
    """A bandwidth limit in the vendor's unit: Intel a percent, rounded up to bandwidth_gran and at
    least min_bandwidth; AMD a share of 2048 (unlimited at 100%)."""
    if info.vendor == "amd":
        return AMD_MB_MAX if percent >= 100 else max(1, round(AMD_MB_MAX * percent / 100))
    gran = max(info.bandwidth_gran, 1)
    return min(100, max(info.min_bandwidth, math.ceil(percent / gran) * gran))


def mb_line(info: MBInfo, value: int) -> str:
    return format_line({d: str(value) for d in info.domain_ids})
