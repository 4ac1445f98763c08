#!/usr/bin/env python3
"""Time _scaled_mm against the CuTe kernel per shape class on this GPU and save the dispatcher's table.

Without a CUDA GPU there is nothing to time: it says so and exits 0 (like every GPU target).
"""

import sys

from nvfp4lib import dispatch
from nvfp4lib.bench import calibration
from nvfp4lib.device import capabilities
from nvfp4lib.locations import BUILD_DIR

TABLE = BUILD_DIR / "dispatch_table.json"


def main() -> int:
    caps = capabilities()
    if not caps.cuda:
        print(f"calibrate: skipped, it times GPU kernels and this machine has {caps.summary()}")
        return 0
    BUILD_DIR.mkdir(exist_ok=True)
    calibration.calibrate()
    print(f"wrote {dispatch.save_table(TABLE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
