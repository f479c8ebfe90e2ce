#!/usr/bin/env python3
"""Debian's torchrun 1.13 under Python 3.11, for comparison runs only (PLATFORM.md): its
Std.from_str iterates an IntFlag expecting the zero member, which Python 3.11 no longer yields,
so every launch dies before starting a worker. This replaces that one function and runs
torch.distributed.run.main() unchanged."""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(cls, vm):
    if re.match(api._VALUE_REGEX, vm):
        return cls(int(vm))
    return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}


api.Std.from_str = classmethod(_from_str)

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
