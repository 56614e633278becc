"""Entry point for `accelerate launch train.py --config FILE [key=value ...]`."""

import sys

from rspo.cli import main

if __name__ == "__main__":
    main(["train", *sys.argv[1:]])
