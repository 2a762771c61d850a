"""The scaling benchmark: rounds merge into one row per cell, by median, and the table shows the factor."""

from experiments.bench import scaling


def _row(devices, cpu, round_index, mode="sharded"):
    return {"problem": "update", "params": 10, "popsize": 8, "source": "table", "mode": mode, "devices": devices,
            "generations": [2, 12], "repeats": 5, "cores": 1, "cpu_s_per_gen": cpu, "wall_s_per_gen": 2 * cpu,
            "bytes_per_gen": 64, "update_floats_per_device": 1, "eval_floats_per_device": 1, "round": round_index}


def test_rounds_merge_into_their_median_and_the_table_divides_by_one_device():
    rounds = [_row(1, 0.10, 0), _row(8, 0.50, 0), _row(1, 0.12, 1), _row(8, 0.13, 1), _row(1, 0.11, 2),
              _row(8, 0.14, 2)]
    rows = scaling.median_over_rounds(rounds)
    by_devices = {r["devices"]: r for r in rows}
    assert len(rows) == 2 and all("round" not in r for r in rows)
    assert by_devices[1]["cpu_s_per_gen"] == 0.11 and by_devices[8]["cpu_s_per_gen"] == 0.14  # 0.50 outvoted
    assert by_devices[8]["cpu_s_per_gen_rounds"] == [0.50, 0.13, 0.14] and by_devices[8]["rounds"] == 3
    assert by_devices[8]["wall_s_per_gen"] == 0.28
    assert "0.14 / 0.28 (1.27x)" in scaling.table(rows)
