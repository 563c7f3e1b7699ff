"""GPU metering: the recording rules that define a GPU-second, and the bill computed from them."""
