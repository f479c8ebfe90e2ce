# A Python worker for the report tests under elasticrun. Usage: python_worker.py MODE
#   record     torch's @record on main, which raises ValueError (@record's nested error file)
#   flat       writes the flat error-file format itself, then exits 5
#   malformed  writes a cut-off JSON error file, says so on stderr, then exits 4
import json
import os
import sys
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main(mode):
    print(f"python worker starting (mode {mode})", file=sys.stderr, flush=True)
    if mode == "record":
        raise ValueError("learning rate must be positive, got -0.1")
    path = os.environ["TORCHELASTIC_ERROR_FILE"]
    if mode == "flat":
        with open(path, "w") as f:
            json.dump({"message": "data loader: shard 3 is missing", "timestamp": int(time.time())}, f)
        sys.exit(5)
    if mode == "malformed":
        with open(path, "w") as f:
            f.write('{"message": {"message": "cut off')
        print("worker died while writing its error file", file=sys.stderr, flush=True)
        sys.exit(4)
    sys.exit(64)


if __name__ == "__main__":
    main(sys.argv[1])
