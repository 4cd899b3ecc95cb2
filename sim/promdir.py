"""prometheus_client's multiprocess mode, switched on inside a running process, as vLLM uses it.

With `--api-server-count` above 1 (the default when `--data-parallel-size` is above 1) vLLM sets
PROMETHEUS_MULTIPROC_DIR, every API server writes its values to mmap files there, and /metrics is rendered by a
MultiProcessCollector: no process_*/python_* families, no `_created` samples, labels sorted, histograms as
sum/buckets/count, gauges merged by their multiprocess_mode. The simulator does the same in its one API
server process, so the page has that shape. prometheus_client picks its value class at import time; metrics
look it up again for every child they create, so replacing it here affects the children created afterwards.
"""

from __future__ import annotations

import glob
import os

from prometheus_client import CollectorRegistry, values
from prometheus_client.multiprocess import MultiProcessCollector

# The collector reads the .db files in directory order, so the families of one type stay together but the types
# come in whatever order the file system lists the files. This is the order of the recorded real page.
_TYPE_ORDER = ("histogram", "gauge", "summary", "counter")


def _type_rank(path: str) -> int:
    name = os.path.basename(path)
    return next((i for i, t in enumerate(_TYPE_ORDER) if name.startswith(t)), len(_TYPE_ORDER))


class _OrderedCollector(MultiProcessCollector):
    """A MultiProcessCollector that reads the files in one fixed order: the same page on every file system."""

    def collect(self):  # type: ignore[override]
        files = sorted(glob.glob(os.path.join(self._path, "*.db")), key=lambda f: (_type_rank(f), f))
        return self.merge(files, accumulate=True)


def use_multiprocess_dir(path: str) -> CollectorRegistry:
    """From now on this process keeps metric values in mmap files under `path`; returns the registry to render."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path  # read again whenever a new file is opened
    values.ValueClass = values.MultiProcessValue()
    registry = CollectorRegistry()
    _OrderedCollector(registry, path)
    return registry
