"""Twenty-ninth session, third device call: the first twelve sets of benchmarks/unseen_probe.py on the
GPU (argv: n, device). The generators and the probe live there now; this ran tree 87169ef, where they
were written out in this file."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
from unseen_probe import SETS, main  # noqa: E402

if __name__ == "__main__":
    main(sys.argv[:3] + [",".join(name for name, _g, _m in SETS)])
