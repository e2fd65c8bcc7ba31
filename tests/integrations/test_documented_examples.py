"""The README's integration example runs as written and prints what it promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_transport_example_runs_as_written():
    """The README's httpx2 transport block: one retry event, a successful end, the answer."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### In your SDK client"):]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    done = subprocess.run([sys.executable, "-c", block], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("AutoRetryStart(") and "'success': True" in lines[1]
    assert lines[-1] == "ok"
