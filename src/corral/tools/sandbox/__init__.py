"""Isolation of the programs tools start: bubblewrap sandboxes, resource limits, the probe.

- :mod:`.host` what this machine offers (``bwrap``, user namespaces, a pids cgroup)
  and the operator's settings, probed once per process
- :mod:`.bwrap` the ``bwrap`` command line of one sandbox
- :mod:`.limits` resource limits (rlimits, a pids cgroup) and naming the limit a
  failed program hit
- :mod:`.policy` the one seam tool kinds use: an :class:`~.policy.Isolation`
  turns the command a tool wants to run into the :class:`~.policy.Launch` that runs it

A new backend (WASM, a Python worker process) is another :class:`~.policy.Isolation`.
"""
