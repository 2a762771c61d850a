"""Installing the library brings only what it needs: `import es` loads none of the extras' packages."""

import subprocess
import sys

EXTRAS = ("yaml", "matplotlib", "gymnax", "tasks", "experiments", "evosax", "flax", "tqdm", "cma", "cocoex",
          "cocopp")


def test_importing_es_loads_no_package_of_an_extra():
    code = f"import sys, es; print(sorted(m for m in {EXTRAS!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
