"""What of an array or a file is resident in this process (Linux's /proc/self)."""

from __future__ import annotations

import mmap
import os

import numpy as np

HAS_PAGEMAP = os.path.exists("/proc/self/pagemap")
HAS_SMAPS = os.path.exists("/proc/self/smaps")


def mapped_bytes(arr: np.ndarray) -> int:
    """Bytes of `arr`'s pages mapped into this process (/proc/self/pagemap)."""
    page = mmap.PAGESIZE
    address = arr.__array_interface__["data"][0]
    first, last = address // page, (address + arr.nbytes - 1) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read(8 * (last - first + 1)), dtype=np.uint64)
    return int((entries >> np.uint64(63)).sum()) * page


def resident_bytes_of(path) -> int:
    """Bytes of the file at `path` resident in this process's mappings (/proc/self/smaps);
    a bare file name matches that name in any folder."""
    resident, inside = 0, False
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            name = fields[5] if len(fields) > 5 else ""
            inside = name == str(path) or ("/" not in str(path) and os.path.basename(name) == str(path))
        elif inside and fields[0] == "Rss:":
            resident += int(fields[1]) * 1024
    return resident
