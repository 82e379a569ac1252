"""Large outputs in memory the process has already touched.

A fresh array of a few MiB or more comes from mmap, and the kernel's first write to each
of its pages takes a page fault: a 64 MiB softmax output costs 17.9 ms to allocate and
write, 8.4 ms when written into a block used before (one thread, Zen 3 EPYC). An output
the kernel writes in full before reading it (`analysis.overwrite`) is therefore taken
from a pool of blocks, each a NumPy array the pool owns:

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

MIN_BYTES = 1 << 20     # smaller arrays come from NumPy's own cache or the heap, not mmap
ALIGN = 64              # bytes: where every pooled output starts


class OutputPool:
    def __init__(self, capacity: int, min_bytes: int = MIN_BYTES):
        self.capacity = capacity
        self.min_bytes = min_bytes
        self._blocks: dict[int, list[np.ndarray]] = {}
        self._held = 0
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialized C-contiguous array, from a free pooled block where one fits."""
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        if nbytes < self.min_bytes or nbytes > self.capacity:
            return np.empty(shape, dt)
        with self._lock:      # two threads must not both take the same free block
            blocks = self._blocks.setdefault(nbytes, [])
            for k in range(len(blocks)):
                # References: the list's and getrefcount's argument; any view adds one
                # (a view's `base` is the array that owns the memory: the block).
                if sys.getrefcount(blocks[k]) == 2:
                    return _aligned(blocks[k], nbytes).view(dt).reshape(shape)
            if self._held + nbytes > self.capacity:
                return np.empty(shape, dt)
            block = np.empty(nbytes + ALIGN, np.uint8)
            blocks.append(block)
            self._held += nbytes
            return _aligned(block, nbytes).view(dt).reshape(shape)

    @property
    def held_bytes(self) -> int:
        return self._held


def _aligned(block: np.ndarray, nbytes: int) -> np.ndarray:
    """The `nbytes` of `block` from its first byte at a multiple of ALIGN."""
    start = -block.__array_interface__["data"][0] % ALIGN
    return block[start:start + nbytes]


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
