"""Scan a live process's memory for a byte string (Linux: /proc/PID/maps + /proc/PID/mem).

What the issue-21 audit did by hand, as a test helper: every readable mapping is read
(heap, stacks, anonymous memory, shared memory such as Ray's object store, file
mappings that can hold written bytes), freed-but-not-overwritten memory included. Needs
ptrace rights over the process (root, or an ancestor of it under Yama ptrace_scope 1).

Skipped: private read-only mappings of a file on disk (the code and constants of Python,
torch, Ray: ~2/3 of a worker's mapped bytes). A process cannot write into them, so they hold
the file's bytes (and relocations the loader wrote before any secret existed); a secret made
at run time is never there. Writable, shared, anonymous and deleted-file (memfd) mappings
are read; of a private anonymous one (heap, stacks, malloc arenas) only the pages that were
ever written (/proc/PID/pagemap: present or swapped): the rest reads as zeros.
"""
from __future__ import annotations

import numpy as np

CHUNK = 1 << 22
#: kernel pseudo-mappings that cannot be read through /proc/PID/mem
UNREADABLE = ("[vvar]", "[vvar_vclock]", "[vsyscall]")
#: a shared mapping this large is refused: reading its untouched pages would allocate them
MAX_SHARED = 1 << 30


def holds_only_file_bytes(perms: str, name: str) -> bool:
    """A private mapping without write permission of a file that is on disk."""
    return (perms[1] != "w" and perms[3] == "p" and name.startswith("/")
            and not name.startswith(("/dev/", "/memfd:")) and not name.endswith("(deleted)"))


PAGE = 4096
#: pagemap bits: the page is in memory, or swapped out (either way it holds written bytes)
PRESENT_OR_SWAPPED = (1 << 63) | (1 << 62)


def private_anonymous(perms: str, name: str) -> bool:
    """Heap, stacks and anonymous memory of this process alone."""
    return perms[3] == "p" and (not name or name == "[heap]" or name.startswith("[stack"))


def touched_runs(pagemap, lo: int, hi: int) -> list[tuple[int, int]]:
    """[start, end) runs of pages in ``lo..hi`` that were ever written and not freed since.
    A private anonymous page that is neither present nor swapped reads as zeros (never
    touched, or given back with MADV_DONTNEED): no byte ever stored is there."""
    pagemap.seek(lo // PAGE * 8)
    flags = np.frombuffer(pagemap.read((hi - lo) // PAGE * 8), dtype=np.uint64)
    touched = np.concatenate(([False], (flags & np.uint64(PRESENT_OR_SWAPPED)) != 0, [False]))
    edges = np.flatnonzero(touched[1:] != touched[:-1]).reshape(-1, 2)
    return [(lo + a * PAGE, lo + b * PAGE) for a, b in edges]


def find_bytes(pid: int, *needles: bytes) -> tuple[list[list[int]], int]:
    """Addresses of every occurrence of each needle in ``pid``'s memory (one read of it),
    and the bytes scanned."""
    if not needles or min(len(n) for n in needles) < 8:
        raise ValueError("search for strings of at least 8 bytes: shorter ones occur by chance")
    hits: list[list[int]] = [[] for _ in needles]
    scanned, keep = 0, max(len(n) for n in needles) - 1
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem, \
            open(f"/proc/{pid}/pagemap", "rb", buffering=0) as pagemap:
        for line in maps:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            perms, name = parts[1], (parts[5].strip() if len(parts) > 5 else "")
            if perms[0] != "r" or name in UNREADABLE or holds_only_file_bytes(perms, name):
                continue
            if perms[3] == "s" and hi - lo > MAX_SHARED:
                raise RuntimeError(f"pid {pid}: shared mapping {name or '?'} of {hi - lo} bytes; "
                                   "start Ray with a small object_store_memory to scan it")
            runs = touched_runs(pagemap, lo, hi) if private_anonymous(perms, name) else [(lo, hi)]
            for start, end in runs:
                found_in, n_read = scan_range(mem, start, end, needles, keep)
                for found, more in zip(hits, found_in):
                    found.extend(more)
                scanned += n_read
    return hits, scanned


def scan_range(mem, lo: int, hi: int, needles, keep: int) -> tuple[list[list[int]], int]:
    """Occurrences of each needle in ``lo..hi`` of the open /proc/PID/mem, and bytes read."""
    hits: list[list[int]] = [[] for _ in needles]
    tail, addr, scanned = b"", lo, 0
    while addr < hi:
        n = min(CHUNK, hi - addr)
        try:
            mem.seek(addr)
            data = mem.read(n)
        except OSError:          # a mapping that went away or cannot be read
            break
        buf = tail + data
        for found, needle in zip(hits, needles):
            # a match lying wholly inside the carried tail was found in the last chunk
            i = buf.find(needle, max(0, len(tail) - len(needle) + 1))
            while i != -1:
                found.append(addr - len(tail) + i)
                i = buf.find(needle, i + 1)
        tail = buf[-keep:] if keep else b""
        scanned += len(data)
        addr += n
    return hits, scanned
