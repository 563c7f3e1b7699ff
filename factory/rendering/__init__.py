"""Stage 3, rendering: the root component and the Pulumi program, the mock harness that runs it
in-process, the bundle writer, and the diff between two renders."""
