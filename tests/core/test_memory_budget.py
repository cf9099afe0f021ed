"""The memory budget's parts that no small machine shows: a discrete GPU's free memory, read
where its driver tells it (WebGPU does not), and models on it counted apart from the
system's under "auto", together under a budget in bytes."""

from __future__ import annotations

import os

import pytest

from ai00_like.api.pool import Limits, PoolEntry
from ai00_like.messages import ModelSpec
from ai00_like.rwkv.gpu.video_memory import AMD, NVIDIA, free_video_bytes, memory_of_device
from ai00_like.served import ServedModel

GiB = 1 << 30


def card(root, n: int, vendor: str, total: int, used: int) -> None:
    device = root / "sys/class/drm" / f"card{n}" / "device"
    device.mkdir(parents=True)
    (device / "vendor").write_text(vendor + "\n")
    (device / "mem_info_vram_total").write_text(f"{total}\n")
    (device / "mem_info_vram_used").write_text(f"{used}\n")


def test_an_amd_gpu_tells_its_free_memory_in_sysfs(tmp_path):
    card(tmp_path, 0, "0x8086", 0, 0)  # an Intel card first: not the one asked for
    card(tmp_path, 1, "0x1002", 16 * GiB, 3 * GiB)
    assert free_video_bytes(AMD, tmp_path) == 13 * GiB
    assert free_video_bytes(0x8086, tmp_path) is None  # no driver says it: unknown


def test_an_nvidia_gpu_tells_its_free_memory_through_nvidia_smi(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 23456\n")  # MiB free, as --format=csv,noheader,nounits prints it
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert free_video_bytes(NVIDIA) == 23456 << 20
    smi.write_text("#!/bin/sh\nexit 9\n")  # a driver that fails: unknown, not an error
    assert free_video_bytes(NVIDIA) is None


def entry(name: str, memory: int, kind: str) -> PoolEntry:
    return PoolEntry(ServedModel(name=name, spec=ModelSpec(path=f"{name}.st")), -1.0, memory=memory, memory_kind=kind)


@pytest.mark.parametrize("shared,fits", [(False, True), (True, False)])
def test_auto_counts_a_gpus_models_apart_and_bytes_count_them_together(shared, fits):
    limits = Limits(max_models=0, shared=shared, budget=10 * GiB, video_budget=None if shared else 8 * GiB)
    on_cpu, on_gpu = entry("cpu", 6 * GiB, "system"), entry("gpu", 6 * GiB, "video")
    assert limits.fit(entry("another", 3 * GiB, "system"), [on_cpu, on_gpu]) is fits
    assert limits.fit(entry("big", 3 * GiB, "video"), [on_cpu, on_gpu]) is False  # 9 > 8, or 15 > 10
    assert Limits(max_models=2, shared=False, budget=None, video_budget=None).fit(
        entry("third", 1, "system"), [on_cpu, on_gpu]) is False


def test_a_cpu_model_takes_the_systems_memory():
    assert memory_of_device("cpu") == "system"
    # lavapipe, the only adapter here, is software: its buffers are the system's memory too.
    assert memory_of_device("gpu") == "system"
