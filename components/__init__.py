"""One ComponentResource per layer or product of the platform."""
