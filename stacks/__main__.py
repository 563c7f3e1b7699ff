"""`ai-factory-stacks ...`: platform and tenant stacks through the Automation API, and the tenant
API service. Progress goes to stderr as it happens, the result to stdout as JSON.

    ai-factory-stacks platform preview|up|destroy <env>    # up: each cluster's stack, in a multi-cluster one
    ai-factory-stacks tenant create|update|preview <env> <tenant.yaml | ->
    ai-factory-stacks tenant delete|status <env> <name>
    ai-factory-stacks tenant list <env>
    ai-factory-stacks serve --environment <env> [--environment ...]

Exit status: 0 done, 1 the operation failed, 2 invalid input (every problem is listed).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import yaml
from pulumi.automation import CommandError

from ai_factory.factory.cli import reader_gone
from ai_factory.factory.model import bounded_yaml
from ai_factory.factory.model.loading import ConfigError
from ai_factory.stacks.backend import Backend, BackendError, default_state_dir
from ai_factory.stacks.contract import ContractError
from ai_factory.stacks.platform import PlatformStacks
from ai_factory.stacks.fleet import FleetStacks
from ai_factory.stacks.tenants import PlatformUpdateFailed, TenantExists, TenantNotFound, TenantStacks

EXIT_FAILED = 1
EXIT_INVALID = 2


def main(argv: list[str] | None = None) -> int:
    backend_options = argparse.ArgumentParser(add_help=False)
    backend_options.add_argument("--state-dir", type=Path, default=None, help="workspaces and the default file backend (default: $AI_FACTORY_STATE_DIR or ~/.ai-factory)")
    backend_options.add_argument("--backend-url", help="Pulumi backend (https://api.pulumi.com, s3://..., file://...; default: file backend in the state dir)")
    backend_options.add_argument("--organization", default="organization", help="organisation in stack names (`organization` on self-managed backends)")
    backend_options.add_argument("--secrets-provider", default="passphrase", help="secrets provider of new stacks (default: passphrase)")
    backend_options.add_argument("--passphrase-file", type=Path, help="passphrase file (default: PULUMI_CONFIG_PASSPHRASE_FILE or PULUMI_CONFIG_PASSPHRASE)")
    parser = argparse.ArgumentParser(prog="ai-factory-stacks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    platform = commands.add_parser("platform", parents=[backend_options], help="the platform stack of an environment")
    platform.add_argument("operation", choices=("preview", "up", "destroy"))
    platform.add_argument("env")

    tenant = commands.add_parser("tenant", help="tenant stacks")
    tenant_ops = tenant.add_subparsers(dest="operation", required=True)
    for op in ("create", "update", "preview"):
        p = tenant_ops.add_parser(op, parents=[backend_options])
        p.add_argument("env")
        p.add_argument("file", help="the tenant (YAML or JSON, as an entry of `tenants` in the config); - reads stdin")
    for op in ("delete", "status"):
        p = tenant_ops.add_parser(op, parents=[backend_options])
        p.add_argument("env")
        p.add_argument("name")
    tenant_ops.add_parser("list", parents=[backend_options]).add_argument("env")

    serve = commands.add_parser("serve", parents=[backend_options], help="run the tenant API service")
    serve.add_argument("--environment", action="append", required=True, help="an environment to serve (repeatable)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--audience", default="ai-factory-tenants", help="the audience tokens must carry")
    serve.add_argument("--admin-group", default="platform-admins", help="members act on every tenant")
    serve.add_argument("--database-url", help="where jobs are kept (SQLAlchemy URL, e.g. postgresql+psycopg://api@db/tenants; default: SQLite in the state dir)")
    serve.add_argument("--issuer-ca", type=Path, help="CA bundle (PEM) of the issuer's certificate, for a private PKI (only the issuer's requests trust it)")
    serve.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate chain (PEM); with --tls-key")
    serve.add_argument("--tls-key", type=Path, help="the certificate's private key (PEM)")

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    backend = Backend(
        state_dir=args.state_dir or default_state_dir(),
        url=args.backend_url,
        organization=args.organization,
        secrets_provider=args.secrets_provider,
        passphrase_file=args.passphrase_file,
    )
    try:
        if args.command == "serve":
            return _serve(args, backend)
        result = _run(args, backend)
    except (ConfigError, ValueError) as err:
        print(err.render() if isinstance(err, ConfigError) else err, file=sys.stderr)
        return EXIT_INVALID
    except (BackendError, ContractError, TenantExists, TenantNotFound, CommandError, PlatformUpdateFailed) as err:
        print(f"{args.command}: {err}", file=sys.stderr)
        return EXIT_FAILED
    try:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
        sys.stdout.flush()
    except BrokenPipeError:
        return reader_gone()
    return 0


def _run(args: argparse.Namespace, backend: Backend) -> Any:
    progress = {"on_output": lambda line: print(line, file=sys.stderr)}
    if args.command == "platform":
        if args.operation == "up" and FleetStacks(backend).clusters(args.env) != [(args.env, args.env)]:
            results = FleetStacks(backend).up(args.env, **progress)  # one stack per cluster
            if failed := [r for r in results if not r.ok]:
                raise PlatformUpdateFailed("; ".join(f"platform {r.stack}: {r.error}" for r in failed))
            return {r.cluster: r.result.model_dump(mode="json") for r in results}
        platforms = PlatformStacks(backend)
        return getattr(platforms, args.operation)(args.env, **progress).model_dump(mode="json")
    tenants = TenantStacks(backend)
    if args.operation in ("create", "update", "preview"):
        return getattr(tenants, args.operation)(args.env, _read_tenant(args.file), **progress).model_dump(mode="json")
    if args.operation == "delete":
        return tenants.delete(args.env, args.name, **progress).model_dump(mode="json")
    if args.operation == "status":
        return tenants.status(args.env, args.name).model_dump(mode="json")
    return [t.model_dump(mode="json") for t in tenants.list(args.env)]


def _read_tenant(file: str) -> Any:
    text = sys.stdin.read() if file == "-" else Path(file).read_text()
    try:
        return bounded_yaml.load(text)  # JSON is YAML
    except bounded_yaml.YamlBoundError as err:
        raise ConfigError([f"tenant: refused: {err}"], source=file) from None
    except yaml.YAMLError as err:
        raise ConfigError([f"tenant: not valid YAML or JSON: {err}"], source=file) from None


def _serve(args: argparse.Namespace, backend: Backend) -> int:
    import uvicorn

    from ai_factory.stacks.service import ServiceSettings, service_app

    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    settings = ServiceSettings(environments=tuple(args.environment), audience=args.audience, admin_group=args.admin_group, issuer_ca=args.issuer_ca, database_url=args.database_url)
    tls = {"ssl_certfile": str(args.tls_cert), "ssl_keyfile": str(args.tls_key)} if args.tls_cert else {}
    uvicorn.run(service_app(settings, backend), host=args.host, port=args.port, log_config=None, **tls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
