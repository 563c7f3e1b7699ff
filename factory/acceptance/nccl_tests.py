"""The NCCL gates' program, its figure written as the gate result contract
(`ai_factory.factory.acceptance.collect`): for `nccl-node`, the nccl-tests binary of NVSentinel's
`preflight-nccl-loopback` image; for `nccl-pair`, an all-reduce over `torch.distributed` across
both nodes' GPUs, run by the torch of NVSentinel's `preflight-nccl-allreduce` image.

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

`nccl-pair`: NVSentinel's `preflight-nccl-allreduce` entrypoint likewise needs its gang ConfigMap
and platform connector, and no nccl-tests binary is built with MPI for two nodes; its image is
`nvcr.io/nvidia/pytorch` too, its check a `torch.distributed` program (started by torchrun). So
each pod of the pair's Indexed Job (node rank = `JOB_COMPLETION_INDEX`) forks one process per GPU
(fork, not spawn: a `python3 -c` program has no module a spawned child could re-import; the parent
never touches CUDA), all meeting at rank 0's pod through the Job's headless Service. They check the
data (one all-reduce of ones must give the world size everywhere), then time `ITERATIONS`
all-reduces of `bytes` after `WARMUP` untimed ones; the slowest rank's mean time `t` gives
nccl-tests' figures (NVIDIA/nccl-tests `doc/PERFORMANCE.md`, all_reduce): algbw = S / t, busbw =
algbw * 2(n-1)/n for n ranks, in GB/s of 1e9 bytes. Each pod writes the figure (the collector keeps
the lower of the two) or why there is none; a run past its deadline is stopped and says so.
"""

import datetime
import json
import math
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import time

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


def message(gate, value, error):
    """The gate's termination message: the figure, or why there is none (cut to MAX_ERROR)."""
    document = {"schema": CONTRACT, "gate": gate}
    if error:
        document["error"] = error if len(error) <= MAX_ERROR else error[: MAX_ERROR - 3] + "..."
        return json.dumps(document, sort_keys=True), None
    document["result"] = {"busbw_gbps": value}
    return json.dumps(document, sort_keys=True), value


def report(gate, output, status):
    """The gate's termination message for a run of the binary that ended with `status`, and the
    figure it reports (None when it reports an error)."""
    value, error = bus_bandwidth(output)
    if status != 0:
        last = next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "no output")
        error = f"all_reduce_perf exited {status}: {last}"
    return message(gate, value, error)


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


WARMUP = 5
ITERATIONS = 20
"""nccl-tests' defaults (`-w 5 -n 20`)."""


def pair_bus_bandwidth(size, seconds, ranks, wrong):
    """(GB/s, None) for all-reduces of `size` bytes across `ranks` ranks taking `seconds` each on
    the slowest rank with `wrong` values found by the data check, or (None, why no figure)."""
    if wrong:
        return None, f"the all-reduce gave {wrong} wrong values (data check failed)"
    if not (seconds > 0 and math.isfinite(seconds)):
        return None, f"an all-reduce took {seconds!r} s, not a duration"
    value = size / seconds / 1e9 * 2 * (ranks - 1) / ranks
    if value > MAX_BUSBW:
        return None, f"a bus bandwidth of {value:.6g} GB/s is past {MAX_BUSBW:g}, not a measurement"
    return value, None


def _all_reduce(local, rank, ranks, backend, address, port, size, timeout, results):
    """One rank (`local`-th process of its pod): puts (rank, mean seconds of the slowest rank,
    wrong values) or (rank, error) on `results`."""
    try:
        import torch
        import torch.distributed as dist

        device = torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(local)
            device = torch.device("cuda", local)
        dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank, world_size=ranks,
                                timeout=datetime.timedelta(seconds=timeout / 3))
        count = size // 4
        check = torch.ones(count, dtype=torch.float32, device=device)
        dist.all_reduce(check)
        wrong = torch.tensor([float(count - int((check == ranks).sum()))], dtype=torch.float64, device=device)
        del check
        # Zeros stay zeros: the timed sums never overflow into values a faster path could skip.
        data = torch.zeros(count, dtype=torch.float32, device=device)
        for _ in range(WARMUP):
            dist.all_reduce(data)
        dist.barrier()
        if backend == "nccl":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(ITERATIONS):
            dist.all_reduce(data)
        if backend == "nccl":
            torch.cuda.synchronize(device)
        elapsed = torch.tensor([(time.perf_counter() - start) / ITERATIONS], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        dist.all_reduce(wrong)
        results.put((rank, float(elapsed.item()), int(wrong.item())))
        dist.destroy_process_group()
    except BaseException as err:  # noqa: BLE001 - whatever stops a rank is the gate's reason
        first = next(iter(str(err).splitlines()), "")
        results.put((rank, f"rank {rank}: {type(err).__name__}: {first}".strip()))


def _resolve(address, deadline):
    """Rank 0's pod name resolves once the Service's endpoints list it: wait for it until `deadline`."""
    while True:
        try:
            socket.getaddrinfo(address, None)
            return None
        except OSError as err:
            if time.monotonic() >= deadline:
                return f"rank 0 at {address} does not resolve: {err}"
            time.sleep(1)


def pair(node, nodes, per_node, backend, address, port, size, timeout):
    """(GB/s, None) or (None, why): this pod's `per_node` ranks of `nodes * per_node`, forked. A
    rank that waits on a peer gives up after a third of `timeout` (torch's process-group timeout;
    its store client retries once more), so it says why before the pod's own deadline stops it."""
    try:
        import torch.distributed  # noqa: F401 - once, before the fork (importing touches no GPU)
    except ImportError as err:
        return None, f"cannot import torch.distributed: {err}"

    deadline = time.monotonic() + timeout
    error = _resolve(address, deadline)
    if error:
        return None, error
    ranks = nodes * per_node
    context = multiprocessing.get_context("fork")
    results = context.SimpleQueue()
    workers = [context.Process(target=_all_reduce, args=(local, node * per_node + local, ranks, backend, address, port, size, timeout, results))
               for local in range(per_node)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    late = [w for w in workers if w.is_alive()]
    # What the ranks said before any was stopped: stopping one breaks its peers' collectives.
    found = []
    while not results.empty():
        found.append(results.get())
    for worker in late:
        worker.kill()
        worker.join()
    errors = sorted(str(r[1]) for r in found if len(r) == 2)
    if late:
        return None, f"{len(late)} of {per_node} ranks still running after {timeout:g} s" + (f"; {errors[0]}" if errors else "")
    if errors:
        return None, errors[0]
    if len(found) < per_node:
        codes = sorted({w.exitcode for w in workers})
        return None, f"{per_node - len(found)} of {per_node} ranks ended without a result (exit codes {codes})"
    return pair_bus_bandwidth(size, max(r[1] for r in found), ranks, max(r[2] for r in found))


def main(argv):
    """`nccl-node <min GB/s> <binary> [args...]` or `nccl-pair <min GB/s> <backend> <rank 0
    address> <port> <bytes> <nodes> <processes per node> <timeout s>` (node rank from
    `JOB_COMPLETION_INDEX`): exit 0 when the figure meets the minimum (the Job's status then agrees
    with the verdict `ai-factory accept` gives from the figure)."""
    gate, minimum = argv[0], float(argv[1])
    if gate == "nccl-pair":
        backend, address, port, size, nodes, per_node, timeout = argv[2:9]
        output = ""
        value, error = pair(int(os.environ["JOB_COMPLETION_INDEX"]), int(nodes), int(per_node), backend, address,
                            int(port), int(size), float(timeout))
        text, value = message(gate, value, error)
    else:
        status, output = run(argv[2:])
        text, value = report(gate, output, status)
    with open(TERMINATION_LOG, "w") as log:
        log.write(text)
    sys.stdout.write(output + "\n" + text + "\n")
    return 0 if value is not None and value >= minimum else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
