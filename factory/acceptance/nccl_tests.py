"""The `nccl-node` gate's program: the nccl-tests binary of NVSentinel's `preflight-nccl-loopback`
image, its output turned into the gate result contract (`ai_factory.factory.acceptance.collect`).

Why not the image's entrypoint: `/app/nccl-loopback-check` reports by its exit code, a log line
and a health event to NVSentinel's platform connector. It refuses to start without
`PLATFORM_CONNECTOR_SOCKET` and `NODE_NAME` and fails when the event cannot be delivered, so
outside NVSentinel's preflight webhook it gives no verdict and never a figure. What the image
holds, from its Dockerfile (NVIDIA/NVSentinel `preflight-checks/nccl-loopback/Dockerfile`):
nccl-tests v2.13.11 built without MPI (one process driving every GPU of the node, `-g`) at
`/opt/nccl-tests/build/all_reduce_perf`, on `nvcr.io/nvidia/pytorch` (Ubuntu 24.04, Python 3.12,
the `python3` the image's sibling `preflight-nccl-allreduce` runs as its entrypoint). So the Job runs
this file's source with `python3 -c`: standard library only, nothing of the package imported.

The figure is nccl-tests' closing `# Avg bus bandwidth    : %g` line in GB/s (the mean of the bus
bandwidth over the sizes run, out-of-place and in-place; the Job runs the check's own single
size, `-b 256M -e 256M`). A run whose data check found wrong values (`# Out of bounds values :
N FAILED`), that exited non-zero, or whose output has no such line reports the reason instead
(`{"error": ...}` in place of `result`): the gate then fails with it.
"""

import json
import math
import re
import subprocess
import sys

CONTRACT = "ai-factory.io/gate-result/v1"
TERMINATION_LOG = "/dev/termination-log"
BINARY = "/opt/nccl-tests/build/all_reduce_perf"
MAX_OUTPUT = 1 << 20
"""Bytes of the binary's output kept (its end, where the summary is) and printed to the log."""
MAX_BUSBW = 100_000.0
MAX_ERROR = 512

AVG_BUSBW = re.compile(r"^[ \t]*#?[ \t]*Avg bus bandwidth[ \t]*:[ \t]*(\S+)", re.MULTILINE)
OUT_OF_BOUNDS = re.compile(r"^[ \t]*#?[ \t]*Out of bounds values[ \t]*:[ \t]*(\d+)", re.MULTILINE)


def bus_bandwidth(output):
    """(GB/s, None) from nccl-tests' output, or (None, why there is no figure)."""
    figures = AVG_BUSBW.findall(output)
    if not figures:
        return None, "no '# Avg bus bandwidth' line in the output of all_reduce_perf"
    wrong = OUT_OF_BOUNDS.findall(output)
    if not wrong:
        return None, "no '# Out of bounds values' line in the output of all_reduce_perf"
    if int(wrong[-1]) > 0:
        return None, f"all_reduce_perf found {int(wrong[-1])} wrong values (data check failed)"
    try:
        value = float(figures[-1])
    except ValueError:
        value = math.nan
    if not (0 <= value <= MAX_BUSBW):
        return None, f"'# Avg bus bandwidth' is {figures[-1][:32]!r}, not a figure in GB/s"
    return value, None


def report(gate, output, status):
    """The gate's termination message for a run of the binary that ended with `status`, and the
    figure it reports (None when it reports an error)."""
    value, error = bus_bandwidth(output)
    if status != 0:
        last = next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "no output")
        error = f"all_reduce_perf exited {status}: {last}"
    document = {"schema": CONTRACT, "gate": gate}
    if error:
        document["error"] = error if len(error) <= MAX_ERROR else error[: MAX_ERROR - 3] + "..."
        return json.dumps(document, sort_keys=True), None
    document["result"] = {"busbw_gbps": value}
    return json.dumps(document, sort_keys=True), value


def run(command):
    """(exit status, the end of its output): stdout and stderr together, at most MAX_OUTPUT bytes."""
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as err:
        return 127, f"cannot run {command[0]}: {err.strerror}"
    kept = b""
    for chunk in iter(lambda: process.stdout.read(65536), b""):
        kept = (kept + chunk)[-MAX_OUTPUT:]
    return process.wait(), kept.decode("utf-8", "replace")


def main(argv):
    """`<gate> <min GB/s> <binary> [args...]`: exit 0 when the figure meets the minimum (the Job's
    status then agrees with the verdict `ai-factory accept` gives from the figure)."""
    gate, minimum, command = argv[0], float(argv[1]), argv[2:]
    status, output = run(command)
    message, value = report(gate, output, status)
    with open(TERMINATION_LOG, "w") as log:
        log.write(message)
    sys.stdout.write(output + "\n" + message + "\n")
    return 0 if value is not None and value >= minimum else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
