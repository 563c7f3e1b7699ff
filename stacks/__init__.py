"""Self-service through Pulumi's Automation API (it runs the `pulumi` CLI).

- `stacks.platform.PlatformStacks`: the platform project, one stack per environment (preview, up, destroy);
- `stacks.tenants.TenantStacks`: one stack per tenant (create, update, preview, delete, list, status),
  built by an inline program against the platform's contract;
- `stacks.contract.PlatformContract`: what the platform stack exports for tenant stacks, versioned;
- `stacks.backend.Backend`: where state lives and how secrets are encrypted;
- `stacks.service`: the tenant API service (`ai-factory-stacks serve`), with `stacks.auth` for OIDC tokens.
"""
