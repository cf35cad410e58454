# SGLang's StorageMetrics and StorageMetricsCollector (metrics/collector.py at 001067ff),
# with plain lists where SGLang has Prometheus histograms. A stand-in for tests (see
# sglang/__init__.py).
from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class StorageMetrics:
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)
    prefetch_occupied_ratios: List[float] = field(default_factory=list)


class StorageMetricsCollector:
    def __init__(self, labels=None):
        self.labels = labels or {}
        self.histogram_prefetch_pgs, self.histogram_backup_pgs = [], []
        self.histogram_prefetch_bandwidth, self.histogram_backup_bandwidth = [], []

    def log_storage_metrics(self, storage_metrics: Optional[StorageMetrics] = None):
        if storage_metrics is None:
            return
        assert isinstance(storage_metrics, StorageMetrics)
        self.histogram_prefetch_pgs.extend(storage_metrics.prefetch_pgs)
        self.histogram_backup_pgs.extend(storage_metrics.backup_pgs)
        self.histogram_prefetch_bandwidth.extend(storage_metrics.prefetch_bandwidth)
        self.histogram_backup_bandwidth.extend(storage_metrics.backup_bandwidth)
