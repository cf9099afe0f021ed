"""Whether a model fits in this machine's free memory, asked before it is loaded.

A model larger than the memory left would be killed by the kernel's OOM killer partway
through loading, taking the server with it; refusing it first gives the user the sizes
instead. Inside a container the limit is the cgroup's, not the machine's. The estimate is of what the numpy backend keeps resident: the projections and
the head in the precision they are kept in (Int8 and NF4 at their packed size where their
rows are whole blocks, else dequantised to fp32, as cpu/ops.kernel_form keeps them), every
other tensor as fp32; the embedding is
left out, since only the rows a step reads are mapped (weights.embedding_rows).
"""

from __future__ import annotations

import ctypes
import gc
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .loader import read_model_info
from .quant import BLOCK, QuantisedMatrix
from .weights import PROJECTION

BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
HEADROOM = 256 * 2**20  # the runtime, states and activations of a small batch


def resident_bytes(tensors: Mapping[str, np.ndarray], precision: str) -> int:
    """What the numpy backend keeps of `tensors` with its matrices in `precision`."""
    total = 0
    for name, tensor in tensors.items():
        if name == "emb.weight":
            continue
        if isinstance(tensor, QuantisedMatrix):
            total += tensor.nbytes if tensor.shape[1] % BLOCK[tensor.kind] == 0 else 4 * tensor.size
        elif name == "head.weight" or PROJECTION.match(name):
            total += BYTES[precision] * int(np.prod(tensor.shape))
        else:
            total += 4 * int(np.prod(tensor.shape))
    return total


def available_bytes(root: Path = Path("/")) -> int | None:
    """The memory this process can still have: the kernel's MemAvailable, or less where a
    cgroup (a container's memory limit, v2 or v1) allows less; None where neither is known."""
    free = [_meminfo_available(root / "proc/meminfo")]
    for limit, usage in (("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory.current"),
                         ("sys/fs/cgroup/memory/memory.limit_in_bytes", "sys/fs/cgroup/memory/memory.usage_in_bytes")):
        cap, used = _number(root / limit), _number(root / usage)
        if cap is not None and used is not None and cap < 2**60:  # "max" or v1's "no limit" are no cap
            free.append(max(0, cap - used))
    known = [f for f in free if f is not None]
    return min(known) if known else None


def _meminfo_available(path: Path) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _number(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):  # absent, "max", or empty
        return None


def check_fits(tensors: Mapping[str, np.ndarray], precision: str, path) -> None:
    """Raises MemoryError naming both sizes when the model would not fit."""
    free = available_bytes()
    if free is None:
        return
    needed = resident_bytes(tensors, precision) + HEADROOM
    if needed > free:
        raise MemoryError(f"{path}: the model needs about {needed / 2**30:.2f} GiB of memory with its weights kept as "
                          f"{precision}, and this machine has {free / 2**30:.2f} GiB free; choose a smaller precision "
                          "or quantisation (precision, quant, quant_type) or free some memory")


def footprint(model) -> int:
    """The bytes a loaded model holds: its weights in their loaded form (a GPU model counts
    its buffers, a CPU one what resident_bytes counts) and its slots' states."""
    weights = getattr(model, "weight_bytes", None)
    if weights is None:
        weights = resident_bytes(model.tensors, model.precision)
    info = model.info
    return weights + 4 * info.n_layer * info.state_floats_per_layer * (model.max_batch + 1)


def release_freed_memory() -> None:
    """Give the memory of an unloaded model back to the system now.

    cpu/setup.py asks glibc to keep up to 256 MB of freed heap for the next step's
    temporaries; after an unload that would stay counted against the process, so the heap
    is trimmed (after a collection, so that cycles holding weights are gone first)."""
    gc.collect()
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


# Bytes a quantised weight takes: the codes and one fp16 scale (and offset) per block.
QUANT_BYTES = {"int8": 1.07, "nf4": 0.57}


def estimated_footprint(path, precision: str, quant: int, quant_type: str, max_batch: int) -> int:
    """footprint() of a model before it is loaded, from its file's header alone: the
    projections and the head counted from its sizes (per layer four d×d matrices and the two
    of the feed-forward), at the bytes per weight they will be kept in ("auto": the file's
    own, from its size). An estimate for making room; the load measures the real one."""
    info = read_model_info(path)
    d, layers = info.n_embd, info.n_layer
    layer = 4 * d * d + 2 * d * info.ffn
    head = info.vocab * d
    total = layers * layer + head
    if precision == "auto":
        per_weight = min(4.0, max(2.0, Path(path).stat().st_size / (total + info.vocab * d)))
    else:
        per_weight = BYTES[precision]
    quantised = min(quant, layers) * layer
    weights = (total - quantised) * per_weight + quantised * QUANT_BYTES.get(quant_type, per_weight)
    return int(weights) + 4 * layers * info.state_floats_per_layer * (max_batch + 1)
