"""Parallelism: device meshes, multi-process runs, the launcher, and reports of what crosses devices."""

# The launcher owns its marker protocol: importing it registers the hook that records the stages a rank
# announces (es.parallel.distributed.announce), so nothing else knows the launcher's files.
from es.parallel import launch as _launch  # noqa: F401
