"""Node acceptance: the gates a node passes before tenants may use it, their verdicts and taints,
and the record each run leaves in NetBox."""
