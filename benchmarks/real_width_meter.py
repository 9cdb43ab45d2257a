"""What bench_real_width.py measures a step by: seconds, peak GPU memory, host RSS and disk reads
(``Meter``), the page-cache eviction before a cold read, and the machine it ran on."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


class Meter:
    """Seconds, peak GPU memory, host RSS and disk reads of one step (device synchronized around it)."""

    def __init__(self, device: str) -> None:
        import torch

        self.torch, self.cuda, self.device = torch, torch.device(device).type == "cuda", device

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def run(self, fn: Any, reset_peak: bool = True) -> tuple[Any, dict[str, float]]:
        import resource

        self._sync()
        if self.cuda and reset_peak:
            self.torch.cuda.reset_peak_memory_stats()
        io0 = disk_read_bytes()
        t0 = time.perf_counter()
        out = fn()
        self._sync()
        dt = time.perf_counter() - t0
        return out, {"seconds": dt, "peak_gpu_bytes": self.torch.cuda.max_memory_allocated() if self.cuda else 0,
                     "host_rss_bytes": host_rss(), "host_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                     "disk_read_bytes": disk_read_bytes() - io0}


def disk_read_bytes() -> int:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def host_rss() -> int:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def drop_page_cache(path: Path) -> None:
    """Evict the shards' pages (this process's files only; no root, nothing machine-wide)."""
    for f in path.glob("*.safetensors"):
        try:
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except (OSError, AttributeError):
            pass


def machine(device: str) -> dict[str, Any]:
    import platform

    import torch

    out = {"device": device, "cpu_count": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
           "host_memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "card": platform.processor() or "cpu"}
    if torch.device(device).type == "cuda":
        p = torch.cuda.get_device_properties(0)
        out.update(card=torch.cuda.get_device_name(0), gpu_memory_bytes=p.total_memory, sm=f"{p.major}.{p.minor}",
                   cuda=torch.version.cuda)
    else:
        out["card"] = f"cpu ({os.cpu_count()} cores)"
    return out
