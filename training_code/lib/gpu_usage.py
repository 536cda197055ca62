"""GPU utilisation while training: each rank samples its own GPU from NVML on a thread (`GpuSampler`);
`gpu_report`, on every rank, gathers the figures, or, without a GPU or NVML, why there are none.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

SAMPLE_EVERY_S = 1.0


class GpuSampler:
    """Utilisation (percent of the last sample period a kernel ran) and memory in use of one CUDA device,
    sampled every `every_s` seconds from start() to stop(). `nvml`: the NVML module (pynvml by default)."""

    def __init__(self, device: torch.device, every_s: float = SAMPLE_EVERY_S, nvml: Any = None) -> None:
        self.every_s, self.utilization, self.memory_used = every_s, [], []
        self.memory_total, self.why, self._nvml, self._handle = 0, None, None, None
        self._stop, self._thread = threading.Event(), None
        if device.type != "cuda":
            self.why = f"no GPU: training ran on {device}"
            return
        try:
            self._nvml = nvml or importlib.import_module("pynvml")
            self._nvml.nvmlInit()
            self._handle = _device_handle(self._nvml, device.index or 0)
            self.memory_total = int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).total)
        except Exception as error:  # NVML missing, no driver, a device it does not know: no figure, said so
            self.why = f"NVML could not read {device}: {type(error).__name__}: {error}"
            self._handle = None

    def start(self) -> GpuSampler:
        if self._handle is not None:
            self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._nvml.nvmlShutdown()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.utilization.append(int(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
            self.memory_used.append(int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used))

    def sample(self) -> dict[str, Any]:
        """This rank's samples, small enough to gather: a histogram of utilisation percents."""
        return {
            "histogram": np.bincount(self.utilization, minlength=101).tolist(),
            "memory_used_max": max(self.memory_used, default=0),
            "memory_total": self.memory_total,
            "why": self.why,
        }


def _device_handle(nvml: Any, index: int) -> Any:
    """NVML's handle of the CUDA device `index`: NVML counts every GPU, CUDA only the visible ones."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible):
        if visible[index].isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(visible[index]))
        return nvml.nvmlDeviceGetHandleByUUID(visible[index])
    return nvml.nvmlDeviceGetHandleByIndex(index)


def gpu_report(sample: dict[str, Any], world_size: int) -> dict[str, Any]:
    """Every rank's `sample` gathered (a collective: call it on every rank): mean and percentiles of
    utilisation as shares over all ranks' samples, the peak memory in use, a row per rank; or
    `gpu_utilization_why` when no rank has a figure."""
    samples = [sample]
    if world_size > 1 and dist.is_initialized():
        samples = [{}] * world_size
        dist.all_gather_object(samples, sample)
    histograms = np.array([s["histogram"] for s in samples])
    if not histograms.sum():
        return {"gpu_utilization_why": next((s["why"] for s in samples if s["why"]), "no GPU samples taken")}
    pooled = histograms.sum(axis=0)
    return {
        "gpu_utilization": _mean(pooled),
        **{f"gpu_utilization_p{q}": round(_percentile(pooled, q) / 100, 4) for q in (10, 50, 90)},
        "gpu_memory_used_max_bytes": max(s["memory_used_max"] for s in samples),
        "gpu_utilization_by_rank": [
            {
                "rank": rank,
                "samples": int(histogram.sum()),
                "utilization": _mean(histogram) if histogram.sum() else None,
                "memory_used_max_bytes": s["memory_used_max"],
                "memory_total_bytes": s["memory_total"],
            }
            for rank, (s, histogram) in enumerate(zip(samples, histograms))
        ],
    }


def _mean(histogram: np.ndarray) -> float:
    """The mean, as a share, of the percents a histogram of 0..100 counts."""
    return round(float((histogram * np.arange(101)).sum() / histogram.sum()) / 100, 4)


def _percentile(histogram: np.ndarray, q: int) -> float:
    """The q-th percentile (lower) of the values a histogram of 0..100 counts."""
    return float(np.searchsorted(np.cumsum(histogram), histogram.sum() * q / 100, side="left"))
