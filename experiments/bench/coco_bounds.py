"""bbob-boxed with es.minimize's other bound handler: how the default (the periodic map) was chosen.

    python -m experiments.bench.coco_bounds --dims 2,5 --instances 1-3 --method penalty --tag penalty
    python -m experiments.bench.coco --suite bbob-boxed --dims 2,5 --instances 1-3 --tag transform

The first runs ``experiments/bench/coco.py``'s bbob-boxed sweep with es alone, its bounds given as
``es.blackbox.Box(lower, upper, method)``; the second is the ordinary sweep (the map, against pycma). The
per-problem records of both, side by side (``coco.py --report``), say which handler solves more of COCO's
targets on the same problems, seeds and budget; docs/guides/black-box.md quotes them.
"""

from __future__ import annotations

import argparse
import os

from experiments.bench import coco, coco_suites


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=("transform", "penalty"), default="penalty")
    parser.add_argument("--dims", default="2,5")
    parser.add_argument("--instances", default="1-3")
    parser.add_argument("--functions", default="1-24")
    parser.add_argument("--coco-dir", default=os.path.join(coco.RESULTS, "coco-bounds"))
    parser.add_argument("--tag", default=None)
    args = parser.parse_args(argv)

    import es

    def options(suite: str, problem) -> dict:
        return {"bounds": es.blackbox.Box(problem.lower_bounds, problem.upper_bounds, args.method)}

    coco_suites.es_options = options  # this process's es side only: the sweep is otherwise coco.py's own
    tag = args.tag or args.method
    coco.sweep(coco.parse_indices(args.dims), coco.parse_indices(args.functions), coco.parse_indices(args.instances),
               ["es"], coco.BUDGET_MULTIPLIER, args.coco_dir, tag, 1, "zero",
               os.path.join(args.coco_dir, f"{tag}.json"), suite="bbob-boxed")


if __name__ == "__main__":
    main()
