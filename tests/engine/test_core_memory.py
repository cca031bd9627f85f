"""`_core.keep_freed_memory`, which the CLI sets: rendering batch after batch reuses the freed
blocks of the ones before, where a fresh mapping for each faulted every page of it in again."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

_RENDER_AGAIN_AND_AGAIN = """
import resource, sys
import numpy as np
from seglogfs.engine import _core
from seglogfs.engine.record.builder import build_batch

count = 2_000  # a 200 KB rendering: above the allocator's default mapping threshold (128 KiB)
batch = build_batch([b"v" * 100] * count, timestamps=0)
section = memoryview(batch)[61:]
offsets, ends = np.empty((2, count), np.int64)

def render():
    return _core.render_text_section(
        section, count, 0, 0, None, 0, None, None, False, False, True, b"\\t", b"\\n", b"null", offsets, ends
    )

print(_core.keep_freed_memory(8 << 20))
for _ in range(5):
    render()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    render()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_rendered_blocks_are_reused_once_freed_memory_is_kept() -> None:
    # (a process of its own: the setting is the whole process's)
    out = subprocess.run([sys.executable, "-c", _RENDER_AGAIN_AND_AGAIN], capture_output=True, text=True, check=True)
    kept, faults = out.stdout.split()
    assert kept == "True"
    # 50 renderings of 200 KB: 2,500 page faults when each is mapped anew; none when reused.
    assert int(faults) < 50, faults


def test_a_negative_size_is_refused() -> None:
    from seglogfs.engine import _core

    with pytest.raises(ValueError, match="not negative"):
        _core.keep_freed_memory(-1)
