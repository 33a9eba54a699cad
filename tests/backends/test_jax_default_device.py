"""Programs for the CPU are compiled for the CPU even where JAX's default device is another one (a GPU machine).

The JAX tests that lower, export, load and run programs run again in a
fresh process whose default JAX device is not the one they compile for
(``jax_other_default``): a program lowered without naming its device would be
compiled for the default one and refuse its arguments, as every JAX test did
on a machine with a GPU before programs named their device.
"""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_jax_programs_run_where_the_default_device_is_another():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    files = [os.path.join(HERE, f) for f in ("test_jax_export.py", "test_jax_panels.py", "test_call_path.py")]
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "jax_other_default", "-p", "no:cacheprovider",
                          "-x", *files], capture_output=True, text=True, env=env, cwd=os.path.dirname(HERE))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout.splitlines()[-1]
