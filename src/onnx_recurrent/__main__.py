import sys

from .tools import main

if __name__ == "__main__":  # not when a spawned process (a Dask worker) imports it
    sys.exit(main())
