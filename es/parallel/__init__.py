"""Parallelism: device meshes, multi-process runs, the launcher, and reports of what crosses devices."""
