"""Scan a live process's memory for a byte string (Linux: /proc/PID/maps + /proc/PID/mem).

What the issue-21 audit did by hand, as a test helper: every readable mapping is read
(heap, stacks, anonymous memory, shared memory such as Ray's object store, file
mappings), freed-but-not-overwritten memory included. Needs ptrace rights over the
process (root, or an ancestor of it under Yama ptrace_scope 1).
"""
from __future__ import annotations

CHUNK = 1 << 22
#: kernel pseudo-mappings that cannot be read through /proc/PID/mem
UNREADABLE = ("[vvar]", "[vvar_vclock]", "[vsyscall]")
#: a shared mapping this large is refused: reading its untouched pages would allocate them
MAX_SHARED = 1 << 30


def find_bytes(pid: int, *needles: bytes) -> tuple[list[list[int]], int]:
    """Addresses of every occurrence of each needle in ``pid``'s memory (one read of it),
    and the bytes scanned."""
    if not needles or min(len(n) for n in needles) < 8:
        raise ValueError("search for strings of at least 8 bytes: shorter ones occur by chance")
    hits: list[list[int]] = [[] for _ in needles]
    scanned, keep = 0, max(len(n) for n in needles) - 1
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            perms, name = parts[1], (parts[5].strip() if len(parts) > 5 else "")
            if perms[0] != "r" or name in UNREADABLE:
                continue
            if perms[3] == "s" and hi - lo > MAX_SHARED:
                raise RuntimeError(f"pid {pid}: shared mapping {name or '?'} of {hi - lo} bytes; "
                                   "start Ray with a small object_store_memory to scan it")
            tail, addr = b"", lo
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
