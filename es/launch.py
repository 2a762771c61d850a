"""``python -m es.launch``: the launcher's command line (``es/parallel/launch.py``)."""

import sys

from es.parallel.launch import main

if __name__ == "__main__":
    sys.exit(main())
