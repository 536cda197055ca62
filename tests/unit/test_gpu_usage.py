"""GPU utilisation while training, sampled from NVML (here a fake one: this machine has no GPU), and the
figures a training without a GPU records instead: why there are none."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from training_code.lib.gpu_usage import GpuSampler, gpu_report


class FakeNvml:
    """The NVML calls the sampler makes, on devices whose utilisation follows a script."""

    def __init__(self, utilization: list[int], used: int = 3 << 30, total: int = 80 << 30) -> None:
        self.utilization, self.used, self.total = list(utilization), used, total
        self.handles, self.shut = [], False

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self.handles.append(index)
        return f"gpu{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self.handles.append(uuid)
        return uuid

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(gpu=self.utilization.pop(0) if len(self.utilization) > 1 else self.utilization[0])

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(used=self.used, total=self.total)


def sampled(nvml: FakeNvml, samples: int) -> GpuSampler:
    sampler = GpuSampler(torch.device("cuda", 1), every_s=0.001, nvml=nvml).start()
    deadline = time.monotonic() + 10
    while len(sampler.utilization) < samples and time.monotonic() < deadline:
        time.sleep(0.001)
    sampler.stop()
    return sampler


def test_a_ranks_samples_become_mean_percentiles_and_peak_memory(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    nvml = FakeNvml([90] * 60 + [30] * 40)
    sampler = sampled(nvml, 100)
    assert nvml.handles == [6], "CUDA's device 1 is the second visible GPU, NVML's 6"
    assert nvml.shut
    report = gpu_report(sampler.sample(), world_size=1)
    samples = len(sampler.utilization)
    assert samples >= 100
    expected_mean = (60 * 90 + (samples - 60) * 30) / samples / 100
    assert abs(report["gpu_utilization"] - expected_mean) < 1e-4
    assert report["gpu_utilization_p10"] == 0.3 and report["gpu_utilization_p90"] == 0.9
    assert report["gpu_memory_used_max_bytes"] == 3 << 30
    [rank] = report["gpu_utilization_by_rank"]
    assert rank["rank"] == 0 and rank["samples"] == samples and rank["memory_total_bytes"] == 80 << 30


def test_without_a_gpu_or_nvml_the_report_says_why():
    assert gpu_report(GpuSampler(torch.device("cpu")).start().sample(), world_size=1) == {
        "gpu_utilization_why": "no GPU: training ran on cpu"
    }

    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise RuntimeError("NVML Shared Library Not Found")

    report = gpu_report(GpuSampler(torch.device("cuda", 0), nvml=Broken([0])).start().sample(), world_size=1)
    assert report == {"gpu_utilization_why": "NVML could not read cuda:0: RuntimeError: NVML Shared Library Not Found"}
