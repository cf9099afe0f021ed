"""How much memory a discrete GPU has free, which WebGPU does not tell.

The memory budget's "auto" (api/pool.py) takes a share of it for the models on such a GPU.
The drivers say it elsewhere: AMD's in sysfs (amdgpu's mem_info_vram_total and _used), and
NVIDIA's through nvidia-smi. Where neither answers (other vendors, other systems), None:
the budget then holds those models by count only.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .device import best_adapter, list_adapters

NVIDIA, AMD = 0x10DE, 0x1002


def free_video_bytes(vendor_id: int, root: Path = Path("/")) -> int | None:
    """The free memory of the first GPU of this vendor, in bytes, or None when unknown."""
    if vendor_id == AMD:
        return _amd_free(root / "sys/class/drm")
    if vendor_id == NVIDIA:
        return _nvidia_free()
    return None


def _amd_free(drm: Path) -> int | None:
    for card in sorted(drm.glob("card[0-9]*")):
        device = card / "device"
        try:
            if int((device / "vendor").read_text(), 16) != AMD:
                continue
            total = int((device / "mem_info_vram_total").read_text())
            used = int((device / "mem_info_vram_used").read_text())
        except (OSError, ValueError):
            continue
        return max(0, total - used)
    return None


def _nvidia_free() -> int | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.free", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=10, check=True).stdout
        return int(out.split()[0]) << 20  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def memory_of_device(device: str) -> str:
    """Whose memory a model loaded with `device` will take: "video" on a discrete GPU, else
    "system" (the CPU, an integrated or a software GPU), as load_model picks the adapter."""
    if device == "cpu":
        return "system"
    adapters = list_adapters()
    if device.isdigit():
        adapter = adapters[int(device)] if int(device) < len(adapters) else None
    else:
        adapter = best_adapter(allow_software=device == "gpu")
    return "video" if adapter is not None and adapter.own_memory else "system"
