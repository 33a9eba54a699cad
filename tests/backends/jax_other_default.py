"""A pytest plugin (``-p jax_other_default``) that makes JAX's default device one the tests do not compile for.

On a machine with a GPU, JAX's default device is the GPU, and a program
lowered for ``"cpu"`` without naming its device was compiled for the GPU
(its CPU arguments then refused).  Two host devices (``XLA_FLAGS=
--xla_force_host_platform_device_count=2``, set by the caller) with the
second one the default reproduce that on any machine: every program egraft
compiles for ``"cpu"`` (device 0) must say where it runs.
"""


def pytest_configure(config):
    import jax

    devices = jax.devices("cpu")
    assert len(devices) >= 2, "run with XLA_FLAGS=--xla_force_host_platform_device_count=2"
    jax.config.update("jax_default_device", devices[1])
