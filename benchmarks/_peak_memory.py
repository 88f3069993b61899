"""Peak memory of a block of work, for the benchmarks: a thread samples the process's resident set
(and, given ``gpu_used``, the device's used bytes) every ``interval`` seconds; the peaks are
reported above what was in use when sampling started."""

import threading
import time


def rss_bytes():
    """Resident set of this process (Linux ``/proc/self/status``), 0 where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PeakSampler:
    """``with PeakSampler(gpu_used=f) as s: ...`` then ``s.peak_rss``, ``s.peak_gpu`` (bytes above the
    start) and ``s.trace`` (seconds, resident bytes above the start)."""

    def __init__(self, gpu_used=None, interval=0.2):
        self.gpu_used, self.interval = gpu_used, interval
        self.trace, self.peak_rss, self.peak_gpu = [], 0, 0

    def __enter__(self):
        self._base_rss = rss_bytes()
        self._base_gpu = self.gpu_used() if self.gpu_used else 0
        self._stop = threading.Event()
        self._t0 = time.time()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            r = rss_bytes() - self._base_rss
            self.trace.append((round(time.time() - self._t0, 1), r))
            self.peak_rss = max(self.peak_rss, r)
            if self.gpu_used:
                self.peak_gpu = max(self.peak_gpu, self.gpu_used() - self._base_gpu)
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False
