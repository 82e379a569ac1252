"""Large outputs in memory the process has already touched.

A fresh array of a few MiB or more comes from mmap, and the kernel's first write to each
of its pages takes a page fault: a 64 MiB softmax output costs 17.9 ms to allocate and
write, 8.4 ms when written into a block used before (one thread, Zen 3 EPYC). Arrays
below a MiB fare no better when a call frees several: glibc gives the top of its heap
back to the system once the free memory there passes twice the largest block it ever
mapped, so two 1000 KiB outputs freed after each call are faulted in afresh by the next
(806 us to allocate and fill them, 120 us to fill them again; MLP1's gradient at
128x2000x128, two such outputs, 1.7-2.0 ms against 0.88-0.98 ms into blocks used
before; Intel Xeon, 2026-11-27). An output the kernel writes in full before reading it
(`analysis.overwrite`) is therefore taken from a pool of blocks, each a NumPy array the
pool owns:

    pool = OutputPool(capacity=256 << 20)
    y = pool.empty((4096, 4096), np.float32)     # a view of a pooled block
    del y                                        # the block is free again

A block is free when nothing but the pool refers to it. Every view of an output, and
everything that holds one (a memoryview, a torch tensor from `torch.from_numpy`),
refers to the block, since NumPy's views keep the array that owns the memory as their
`base`; so a block is handed out again only when no array can reach it. Blocks are
kept up to `capacity` bytes in all (beyond it, outputs come from np.empty as before)
and never returned to the system while the process runs: that is the memory the
process had already used for outputs of these sizes.

Every pooled output starts on a 64-byte boundary (a cache line, and the alignment
`_mm512_stream_ps` needs): NumPy aligns its data to 16 bytes only (a large array here
lies 16 bytes past a line), so a block is allocated `ALIGN` bytes longer and the output
starts at its first aligned byte. Streaming stores (`BlockSchedule.stream`) then cover
whole rows of it.
"""
from __future__ import annotations

import math
import os
import sys
import threading
from typing import Any

import numpy as np

MIN_BYTES = 64 << 10    # smaller ones: heap memory, a few pages each (not worth a lookup)
ALIGN = 64              # bytes: where every pooled output starts


class OutputPool:
    def __init__(self, capacity: int, min_bytes: int = MIN_BYTES):
        self.capacity = capacity
        self.min_bytes = min_bytes
        # nbytes -> [(block, offset of its first 64-byte aligned byte)]
        self._blocks: dict[int, list[tuple[np.ndarray, int]]] = {}
        self._held = 0
        self._lock = threading.Lock()

    def keeps(self, nbytes: int) -> bool:
        """Whether outputs of this size may come from the pool (smaller ones are heap
        memory: np.empty)."""
        return self.min_bytes <= nbytes <= self.capacity

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialized C-contiguous array, from a free pooled block where one fits."""
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        if not self.keeps(nbytes):
            return np.empty(shape, dt)
        with self._lock:      # two threads must not both take the same free block
            blocks = self._blocks.setdefault(nbytes, [])
            for block, offset in blocks:
                # References: the list's tuple, this loop's variable and getrefcount's
                # argument; any view adds one (a view's `base` is the array that owns
                # the memory: the block).
                if sys.getrefcount(block) == 3:
                    return np.ndarray(shape, dt, block, offset)
            if self._held + nbytes > self.capacity:
                return np.empty(shape, dt)
            block = np.empty(nbytes + ALIGN, np.uint8)
            offset = -block.ctypes.data % ALIGN
            blocks.append((block, offset))
            self._held += nbytes
            return np.ndarray(shape, dt, block, offset)

    @property
    def held_bytes(self) -> int:
        return self._held


_POOLS: dict[int, OutputPool] = {}


def _after_fork_in_child() -> None:
    # A lock another thread held at the fork stays held in the child: give the child
    # fresh ones (the tuner profiles candidates in forked processes).
    for pool in _POOLS.values():
        pool._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def output_pool(capacity: int) -> OutputPool | None:
    """The process's pool of this capacity (one per capacity, shared by compilers), or
    None for 0: outputs then come from np.empty."""
    if capacity <= 0:
        return None
    return _POOLS.setdefault(capacity, OutputPool(capacity))
