"""Stage 2, planning: from the validated model to capacity decisions (which GPUs, MIG instances,
HAMi slices and nodes each tenant gets), their placement (labels, taints, offerings) and queues."""
