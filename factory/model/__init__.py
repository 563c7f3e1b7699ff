"""Stage 1, the model: the typed configuration of an environment, the GPU catalogue, chart pins,
secret values, and loading a stack file (or `pulumi.Config`) into a validated `FactoryConfig`."""
