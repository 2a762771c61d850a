"""Long runs: ``es.run``/``es.run_many`` in segments, checkpoints, the metrics log, runs from a seed."""
