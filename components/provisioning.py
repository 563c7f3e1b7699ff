"""Bare-metal provisioning with Metal3, and the acceptance gates a node passes before tenants use it.

Metal3 (the baremetal-operator with Ironic, installed with its kustomize overlays: no Helm chart
exists upstream) provisions every node of the fleet that declares a BMC. Per such node, in
`layers.provisioning.namespace`:
- an `ExternalSecret` making the Secret `<node>-bmc` (keys `username`, `password`) from OpenBao
  (`<credentials_prefix>/<node>` of the KV engine), through a `SecretStore` of this namespace whose
  role reads that prefix only. The credentials never pass through the config, the Pulumi state or
  the bundle;
- a `BareMetalHost`: the BMC address and that Secret, the boot MAC, the root device hints, the
  pool's OS image (URL and checksum; the image carries the driver version the GPU Operator is set
  to, so the operator finds the driver pre-installed), the pool's boot mode (Secure Boot by
  default), online;
- a `HostFirmwareSettings` of the same name with the pool's BIOS settings (`BIOS_PROFILES` for the
  pool's vendor, then the pool's `firmware`), each with its reason in an annotation;
- the host's user data (Secret `<node>-user-data`, the `spec.userData` Metal3 hands cloud-init on
  the config drive): a kubelet configuration drop-in (`KUBELET_DROP_IN`) whose `registerWithTaints`
  makes the node join tainted `ai-factory.io/acceptance=pending:NoSchedule`, so no workload lands
  before its gates ran (and, on an RDMA pool on device plugins, the Topology Manager that aligns a
  pod's NICs with its GPUs, `TOPOLOGY_ALIGNED`); the fleet layer later replaces the taint with the verdict's (none once
  accepted). The OS image's kubelet must read drop-ins (`--config-dir`, the directory of
  `KUBELET_DROP_IN`); the image or the cluster's bootstrap supplies the join itself. The user data
  is a Pulumi secret: it is where a node's join credentials live, whoever adds them. Offline, the
  `registration-taint` check holds every BareMetalHost to this.
Nodes provisioned by something else declare no BMC and get none of these.

Acceptance (`ai_factory.factory.acceptance.gates`): in `acceptance_namespace`, per node under
acceptance and gate generation, Kubernetes Jobs pinned to the node (node selector on its host
name, tolerating the acceptance taint and the platform's GPU-node taints), privileged with every
GPU of the node (whatever the pool's sharing mode advertises): `inventory` (GPUs, ECC, retired
pages, RDMA NICs and NUMA nodes, driver), `dcgm-diag`, `burn-in`, `nccl-node`, and one
`nccl-pair` Job per rack pair. Jobs rather than `pulumi-command`: a command runs where Pulumi runs,
not on the node, and would need SSH into every node; a Job lands on the node through the
scheduler, with the GPU Operator's driver, and pulumi-kubernetes waits for it to complete (its Job
await), which is the waiter. Their names carry the generation, so a new driver, image, BIOS or a
restarted acceptance runs them again. Each gate writes its result as its termination message (the
contract of `ai_factory.factory.acceptance.collect`; the pod template names the node(s) and
generation(s) it tests); `ai-factory accept --pods` collects them into the results file
(`layers.provisioning.acceptance.results_file`) and turns them into verdicts and NetBox records,
and the fleet layer applies the verdicts' taints.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_vault as vault

from ai_factory.components._common import POOL_LABEL, FactoryComponent, labels, namespace
from ai_factory.components.external_secrets import STORE_NAME, STORE_SERVICE_ACCOUNT, secret_store_spec, store_role
from ai_factory.components.gpu_operator import tolerations as gpu_node_tolerations
from ai_factory.components.openbao import platform_path, service_address
from ai_factory.components.registry import Layer
from ai_factory.factory.acceptance import collect, gates, nccl_tests, thresholds
from ai_factory.factory.checking import provisioning as provisioning_checks
from ai_factory.factory.checking.provisioning import PENDING_TAINT as REGISTRATION_TAINT
from ai_factory.factory.checking.provisioning import REGISTER_TAINTS_ANNOTATION
from ai_factory.factory.model.config import DriverSettings, FactoryConfig, NodeSpec, Pool, PoolProvisioning
from ai_factory.factory.model.raw import as_dict, as_list, did_you_mean
from ai_factory.factory.model.secrets import SecretValue
from ai_factory.factory.planning.model import Plan

TOKEN = "ai-factory:provisioning:Provisioning"
METAL3_API = "metal3.io/v1alpha1"
ESO_API = "external-secrets.io/v1"
STORE_ROLE = "ai-factory-provisioning"
REASONS_ANNOTATION = "ai-factory.io/firmware-reasons"
NODE_ANNOTATION = gates.NODE_ANNOTATION
GATE_LABEL = gates.GATE_LABEL
KUBELET_DROP_IN = "/etc/kubernetes/kubelet.conf.d/50-ai-factory-acceptance.conf"
JOB_SERVICE_ACCOUNT = "acceptance"

# BIOS settings per vendor, by the attribute names the vendor's Redfish BIOS registry uses; the
# names for HPE and Fujitsu are those Metal3's own drivers set for the same purposes
# (baremetal-operator pkg/hardwareutils/bmc ilo4.go/ilo5.go `BuildBIOSSettings`: ProcVirtualization,
# ProcHyperthreading, Sriov; irmc.go: cpu_vt_enabled, hyper_threading_enabled,
# single_root_io_virtualization_support_enabled); Dell's are iDRAC's BIOS attributes (ProcVirtualization,
# LogicalProc, SriovGlobalEnable, SysProfile). The baremetal-operator checks every name and value
# against the host's FirmwareSchema before applying: a name the BMC does not know is reported on
# the HostFirmwareSettings (condition Valid=False), never silently ignored.
# purpose -> vendor -> (name, value when on, value when off)
BIOS_NAMES: dict[str, dict[str, tuple[str, str, str]]] = {
    "virtualization": {
        "dell": ("ProcVirtualization", "Enabled", "Disabled"),
        "hpe": ("ProcVirtualization", "Enabled", "Disabled"),
        "fujitsu": ("cpu_vt_enabled", "True", "False"),
    },
    "sriov": {
        "dell": ("SriovGlobalEnable", "Enabled", "Disabled"),
        "hpe": ("Sriov", "Enabled", "Disabled"),
        "fujitsu": ("single_root_io_virtualization_support_enabled", "True", "False"),
    },
    "smt": {
        "dell": ("LogicalProc", "Enabled", "Disabled"),
        "hpe": ("ProcHyperthreading", "Enabled", "Disabled"),
        "fujitsu": ("hyper_threading_enabled", "True", "False"),
    },
    "power": {
        "dell": ("SysProfile", "PerfOptimized", "PerfPerWattOptimizedDapc"),
    },
}
RDMA_FABRICS = ("roce", "infiniband")


def bios_profile(pool: Pool, vendor: str) -> dict[str, tuple[str | int, str]]:
    """The built-in BIOS settings of a pool: name -> (value, why)."""
    rdma = pool.topology.fabric in RDMA_FABRICS
    wanted = {
        "sriov": (rdma, "SR-IOV on: the RDMA NICs of a RoCE/InfiniBand fabric hand virtual functions to pods (SR-IOV network operator)"
                  if rdma else "SR-IOV off: an Ethernet-fabric pool hands no NIC virtual functions to pods"),
        "virtualization": (rdma, "VT-x/VT-d (IOMMU) on: SR-IOV virtual functions need the IOMMU; the image boots with iommu=pt so GPUDirect "
                           "peer traffic is not translated" if rdma else "VT-x/VT-d off: no VM and no NIC virtual function runs on this pool, and the IOMMU "
                           "would translate GPUDirect peer-to-peer traffic"),
        "smt": (True, "SMT on: data loading and tokenisation on the CPUs gain from it; tenants never share a node's cores across trust domains"),
        "power": (True, "maximum performance profile: no C-state or frequency throttling between GPU kernels (steadier NCCL and step times)"),
    }
    profile = {}
    for purpose, (on, why) in wanted.items():
        names = BIOS_NAMES[purpose].get(vendor)
        if names:
            name, on_value, off_value = names
            profile[name] = (on_value if on else off_value, why)
    return profile


def firmware_settings(pool: Pool, setup: PoolProvisioning) -> dict[str, tuple[str | int, str]]:
    """The pool's BIOS settings: the vendor profile, then the pool's own (which win)."""
    settings = bios_profile(pool, setup.vendor)
    settings.update({name: (s.value, s.reason) for name, s in setup.firmware.items()})
    return dict(sorted(settings.items()))


@dataclass(frozen=True)
class Host:
    node: NodeSpec
    pool: Pool
    setup: PoolProvisioning
    credentials_key: str


@dataclass(frozen=True)
class GateJob:
    name: str
    gate: str
    nodes: tuple[str, ...]
    generations: tuple[str, ...]
    """The nodes' gate generations, in `nodes` order."""
    pool: Pool
    command: tuple[str, ...]
    image: str
    env: dict[str, str]
    deadline_seconds: int


@dataclass(frozen=True)
class ProvisioningArgs:
    namespace: str
    acceptance_namespace: str
    hosts: tuple[Host, ...]
    jobs: tuple[GateJob, ...]
    kv_mount: str
    credentials_prefix: str
    openbao_server: str
    openbao_api: str
    openbao_token: SecretValue | None
    """None until OpenBao is initialised: the store's role is then created by a later `pulumi up`."""
    cluster: str | None = None

    @classmethod
    def from_config(cls, cfg: FactoryConfig, plan: Plan) -> ProvisioningArgs:
        prov = cfg.layers.provisioning
        hosts = tuple(
            Host(node=node, pool=pool, setup=prov.pools[pool.name],
                 credentials_key=f"{platform_path(cfg.kubernetes.cluster, prov.credentials_prefix)}/{node.bmc.credentials or node.name}")
            for pool in cfg.fleet.pools for node in (pool.node_list or []) if node.bmc is not None
        )
        openbao = cfg.layers.openbao
        return cls(
            namespace=prov.namespace,
            acceptance_namespace=prov.acceptance_namespace,
            hosts=hosts,
            jobs=tuple(gate_jobs(cfg)),
            kv_mount=openbao.kv_mount,
            credentials_prefix=platform_path(cfg.kubernetes.cluster, prov.credentials_prefix),
            cluster=cfg.kubernetes.cluster,
            openbao_server=service_address(openbao.namespace),
            openbao_api=openbao.api_address or service_address(openbao.namespace),
            openbao_token=openbao.admin_token,
        )


def _job_name(gate: str, nodes: tuple[str, ...], generation: str) -> str:
    """`accept-<gate>-<nodes hash>-<generation>`: within 63 characters whatever the node names
    (Job names become a label value of their pods)."""
    digest = hashlib.sha256("/".join(nodes).encode()).hexdigest()[:8]
    return f"accept-{gate}-{digest}-{generation[:8]}"


TERMINATION_LOG = nccl_tests.TERMINATION_LOG
"""Where a gate writes its result (the contract of `ai_factory.factory.acceptance.collect`)."""


def _reporting(gate: str, command: str, result: str) -> str:
    """Run `command`; write the gate's contract document, its `result` printed by a shell command
    that sees `$passed` (true/false, from the exit status), `$start` and `$end` (epoch seconds);
    exit with the command's status."""
    return (f"start=$(date +%s); if {command} >/tmp/{gate}.out 2>&1; then passed=true; else passed=false; fi; end=$(date +%s); "
            f"printf '{{\"schema\":\"{collect.CONTRACT}\",\"gate\":\"{gate}\",\"result\":%s}}' \"$({result})\" > {TERMINATION_LOG}; "
            f"tail -c 65536 /tmp/{gate}.out; [ \"$passed\" = true ]")


INVENTORY_SCRIPT = (
    # One CSV line per GPU; fields a GPU does not support read `[N/A]` and count as 0.
    "set -e; nvidia-smi --query-gpu=index,serial,pci.device_id,ecc.mode.current,retired_pages.sbe,retired_pages.dbe,"
    "remapped_rows.uncorrectable,driver_version --format=csv,noheader,nounits > /tmp/gpus.csv; "
    "for d in /sys/class/infiniband/*; do [ -e \"$d\" ] && echo \"$(basename \"$d\") $(cat \"$d/device/numa_node\")\"; done > /tmp/nics.txt || true; "
    "awk -F', *' -v schema=" + collect.CONTRACT + " '"
    "function n(v) { return v ~ /^[0-9]+$/ ? v : 0 } "
    "FNR == NR { g = g sep sprintf(\"{\\\"index\\\":%d,\\\"serial\\\":\\\"%s\\\",\\\"pci_device_id\\\":\\\"%s\\\",\\\"ecc_mode\\\":\\\"%s\\\",\\\"retired_pages\\\":%d}\", "
    "$1, $2, $3, tolower($4), n($5) + n($6) + n($7)); sep = \",\"; driver = $8; next } "
    "{ split($0, f, \" \"); c = c csep sprintf(\"{\\\"name\\\":\\\"%s\\\",\\\"numa_node\\\":%d}\", f[1], f[2]); csep = \",\" } "
    "END { printf \"{\\\"schema\\\":\\\"%s\\\",\\\"gate\\\":\\\"inventory\\\",\\\"result\\\":{\\\"driver\\\":\\\"%s\\\",\\\"gpus\\\":[%s],\\\"nics\\\":[%s]}}\", schema, driver, g, c }"
    "' /tmp/gpus.csv /tmp/nics.txt > " + TERMINATION_LOG + "; cat " + TERMINATION_LOG
)
"""The inventory gate: GPUs (model by PCI device ID, serial, ECC mode, retired pages and rows
remapped), the driver, the RDMA NICs and their NUMA nodes, as the contract's `inventory` result."""


NCCL_NODE_PROGRAM = Path(nccl_tests.__file__).read_text()
"""The NCCL gates' program, run by their images' `python3` (`nccl_tests` says why)."""


def nccl_node_command(pool: Pool, min_busbw_gbps: float) -> tuple[str, ...]:
    """all_reduce_perf over every GPU of the node at the message size NVSentinel's loopback check
    runs (its `TEST_SIZE_MB` default, 256), the figure written as the contract's result."""
    return ("python3", "-c", NCCL_NODE_PROGRAM, "nccl-node", f"{min_busbw_gbps:g}", nccl_tests.BINARY,
            "-b", "256M", "-e", "256M", "-g", str(pool.gpu.per_node))


NCCL_PAIR_PORT = 29500
"""Rank 0's rendezvous port (torch.distributed's customary `MASTER_PORT`)."""
NCCL_PAIR_TIMEOUT = 1800
"""Seconds a pair's pod waits for its peer and measures, within the Job's deadline (3600 s)."""


def nccl_pair_command(job: str, pool: Pool, min_busbw_gbps: float) -> tuple[str, ...]:
    """An all-reduce over NCCL of every GPU of both nodes at nccl-node's message size (256 MiB),
    meeting at the pod of completion index 0 (`<job>-0`, named under the Job's headless Service)."""
    return ("python3", "-c", NCCL_NODE_PROGRAM, "nccl-pair", f"{min_busbw_gbps:g}", "nccl", f"{job}-0.{job}", str(NCCL_PAIR_PORT),
            str(256 << 20), "2", str(pool.gpu.per_node), str(NCCL_PAIR_TIMEOUT))


def gate_jobs(cfg: FactoryConfig) -> list[GateJob]:
    settings = cfg.layers.provisioning.acceptance
    images = settings.images
    table = thresholds.table(cfg)
    jobs: list[GateJob] = []
    subjects = gates.subjects(cfg)
    generation_of = {s.node.name: s.generation for s in subjects}
    for s in subjects:
        node, pool, gen = s.node.name, s.pool, s.generation
        one = (node,)
        jobs.append(GateJob(_job_name("inventory", one, gen), "inventory", one, (gen,), pool, ("sh", "-c", INVENTORY_SCRIPT), images.dcgm, {}, 600))
        level = settings.dcgm_diag_level
        jobs.append(GateJob(_job_name("dcgm-diag", one, gen), "dcgm-diag", one, (gen,), pool, ("sh", "-c", _reporting(
            "dcgm-diag", f"dcgmi diag -r {level} -j", f'printf \'{{"level":{level},"passed":%s}}\' "$passed"')), images.dcgm, {}, 3 * 3600))
        seconds = settings.burn_in_minutes * 60
        burn = (f"dcgmi diag -r targeted_stress,targeted_power -p "
                f"'targeted_stress.test_duration={seconds // 2};targeted_power.test_duration={seconds - seconds // 2}' -j")
        jobs.append(GateJob(_job_name("burn-in", one, gen), "burn-in", one, (gen,), pool, ("sh", "-c", _reporting(
            "burn-in", burn, 'awk -v s="$((end - start))" -v p="$passed" \'BEGIN { printf "{\\"minutes\\":%.2f,\\"passed\\":%s}", s / 60, p }\'')),
            images.dcgm, {}, seconds + 1800))
        if pool.gpu.per_node >= 2:
            row = table[(pool.gpu.model, "node", pool.topology.intra_node)]
            jobs.append(GateJob(_job_name("nccl-node", one, gen), "nccl-node", one, (gen,), pool, nccl_node_command(pool, row.min_busbw_gbps),
                                images.nccl_loopback, {}, 1800))
    seen: set[tuple[str, str]] = set()
    for s in subjects:
        for pair in s.pairs:
            if pair in seen:
                continue
            seen.add(pair)
            pool = s.pool
            row = table[(pool.gpu.model, "pair", pool.topology.fabric)]
            gen = hashlib.sha256("".join(generation_of[n] for n in pair).encode()).hexdigest()
            name = _job_name("nccl-pair", pair, gen)
            jobs.append(GateJob(name, "nccl-pair", pair, tuple(generation_of[n] for n in pair), pool, nccl_pair_command(name, pool, row.min_busbw_gbps),
                                images.nccl_allreduce, {}, 3600))
    return jobs


def bare_metal_host_spec(host: Host, secret: str, namespace: str) -> dict[str, Any]:
    node, setup = host.node, host.setup
    assert node.bmc and node.root_device_hints, "validation requires them with a BMC"
    hints = node.root_device_hints
    root = {
        key: value for key, value in (
            ("deviceName", hints.device_name), ("serialNumber", hints.serial_number), ("wwn", hints.wwn),
            ("model", hints.model), ("vendor", hints.vendor), ("minSizeGigabytes", hints.min_size_gigabytes),
            ("rotational", hints.rotational),
        ) if value is not None
    }
    return {
        "online": True,
        "bootMACAddress": node.boot_mac,
        "bootMode": setup.boot_mode,
        "bmc": {"address": node.bmc.address, "credentialsName": secret, "disableCertificateVerification": node.bmc.disable_certificate_verification},
        "rootDeviceHints": root,
        "image": {"url": setup.image.url, "checksum": setup.image.checksum, "checksumType": setup.image.checksum_type, "format": setup.image.format},
        # Erase partition tables and metadata between owners, so a node keeps no previous image.
        "automatedCleaningMode": "metadata",
        "description": f"ai-factory pool {host.pool.name}, rack {node.rack}",
        "userData": {"name": user_data_secret(node.name), "namespace": namespace},
    }


def bmc_external_secret_spec(host: Host, secret: str) -> dict[str, Any]:
    return {
        "refreshInterval": "1h",
        "secretStoreRef": {"name": STORE_NAME, "kind": "SecretStore"},
        "target": {"name": secret, "creationPolicy": "Owner", "deletionPolicy": "Delete"},
        "data": [{"secretKey": key, "remoteRef": {"key": host.credentials_key, "property": key}} for key in ("username", "password")],
    }


def user_data_secret(node: str) -> str:
    return f"{node}-user-data"


TOPOLOGY_ALIGNED = {"topologyManagerPolicy": "restricted", "topologyManagerScope": "pod"}
"""The kubelet's Topology Manager on an RDMA pool whose GPUs and NICs device plugins advertise: a
pod's GPUs and VFs come from the fewest NUMA nodes their counts allow, or the pod is refused on that
node. `restricted`, not `single-numa-node`: a pod asking for all of a node's GPUs spans its NUMA
nodes and must still be admitted. DRA pools align in their claims instead (`components/network.py`)."""


def kubelet_drop_in(pool: Pool) -> dict[str, Any]:
    """What acceptance needs, and GPU-NIC alignment where the pool needs it: the drop-in merges
    over the image's own kubelet configuration."""
    drop_in = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", "registerWithTaints": [REGISTRATION_TAINT]}
    if pool.topology.fabric in RDMA_FABRICS and pool.sharing != "dra":
        drop_in.update(TOPOLOGY_ALIGNED)
    return drop_in


def user_data(pool: Pool) -> str:
    """The cloud-init user data of a host of `pool` (cloud-config)."""
    config = {"write_files": [{"path": KUBELET_DROP_IN, "owner": "root:root", "permissions": "0644",
                               "content": json.dumps(kubelet_drop_in(pool), sort_keys=True) + "\n"}]}
    return "#cloud-config\n" + json.dumps(config, sort_keys=True, indent=2) + "\n"


def store_policy(kv_mount: str, prefix: str) -> str:
    return (
        "# The baremetal hosts' BMC credentials, read-only.\n"
        f'path "{kv_mount}/data/{prefix}/*" {{\n  capabilities = ["read"]\n}}\n'
    )


def job_spec(job: GateJob, acceptance_key: str) -> dict[str, Any]:
    pool = job.pool
    container: dict[str, Any] = {
        "name": job.gate,
        "image": job.image,
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"},
                *({"name": k, "value": v} for k, v in sorted(job.env.items()))],
        # Every GPU and NIC of the node, whatever its sharing mode advertises: privileged, so the
        # toolkit honours NVIDIA_VISIBLE_DEVICES (it ignores it for unprivileged containers).
        "securityContext": {"privileged": True},
        "resources": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "16Gi"}},
        # The gate's result (ai_factory.factory.acceptance.collect): kept by the kubelet in the pod's status.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
    }
    if job.command:
        container["command"] = list(job.command)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "runtimeClassName": "nvidia",
        "serviceAccountName": JOB_SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "tolerations": [{"key": acceptance_key, "operator": "Exists", "effect": "NoSchedule"}, *gpu_node_tolerations()],
        "containers": [container],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": list(job.nodes)}]}
        ]}}},
    }
    spec: dict[str, Any] = {"backoffLimit": 0, "activeDeadlineSeconds": job.deadline_seconds}
    if len(job.nodes) > 1:
        # One pod per node of the pair: an indexed Job whose pods never share a node, each named
        # `<job>-<index>` under the Job's headless Service (rank 0's rendezvous address).
        spec.update({"completions": len(job.nodes), "parallelism": len(job.nodes), "completionMode": "Indexed"})
        pod_spec["subdomain"] = job.name
        # One NCCL process per GPU: their node-local transport's buffers are in /dev/shm, 64 MiB by
        # the container runtime's default; memory-backed, it counts against the memory limit.
        pod_spec["volumes"] = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]
        container["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
        pod_spec["affinity"]["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"job-name": job.name}}, "topologyKey": "kubernetes.io/hostname"}
        ]}
    spec["template"] = {
        "metadata": {
            "labels": {GATE_LABEL: job.gate, POOL_LABEL: pool.name},
            # What the collector files the pod's result under (never the result's own say).
            "annotations": {NODE_ANNOTATION: ",".join(job.nodes), gates.GENERATION_LABEL: ",".join(job.generations)},
        },
        "spec": pod_spec,
    }
    return spec


def peers_service_spec(job: GateJob) -> dict[str, Any]:
    """Headless: DNS names the Job's pods (`<job>-<index>.<job>`), no virtual IP. Listed before
    they are ready, so rank 0 resolves as soon as its pod has an address."""
    return {"clusterIP": "None", "selector": {"job-name": job.name}, "publishNotReadyAddresses": True}


class Provisioning(FactoryComponent):
    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: ProvisioningArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TOKEN, name, layer="provisioning", opts=opts)
        object_labels = labels("provisioning")
        # No pod runs here: only hosts, their Secrets and the store.
        ns = namespace(self, args.namespace, pod_security="restricted")
        store = None
        if args.openbao_token is not None:
            # Like tenants' stores, this one waits for OpenBao to be initialised: before, its role
            # does not exist. The hosts wait for their Secrets meanwhile (Metal3 retries).
            account = k8s.core.v1.ServiceAccount(
                self.child_name("store-account"),
                metadata=k8s.meta.v1.ObjectMetaArgs(name=STORE_SERVICE_ACCOUNT, namespace=args.namespace, labels=object_labels),
                automount_service_account_token=False,
                opts=self.child(depends_on=[ns]),
            )
            provider = vault.Provider(self.child_name("openbao"), address=args.openbao_api, token=args.openbao_token.output(),
                                      skip_child_token=True, opts=self.child())
            on_openbao = self.child(provider=provider)
            role = store_role(self, "bmc-", STORE_ROLE, args.namespace, store_policy(args.kv_mount, args.credentials_prefix), on_openbao, cluster=args.cluster)
            store = k8s.apiextensions.CustomResource(
                self.child_name("store"),
                api_version=ESO_API,
                kind="SecretStore",
                metadata={"name": STORE_NAME, "namespace": args.namespace, "labels": object_labels},
                spec=secret_store_spec(args.openbao_server, args.kv_mount, STORE_ROLE, args.cluster),
                opts=self.child(depends_on=[account, role]),
            )
        for host in args.hosts:
            node = host.node.name
            secret = f"{node}-bmc"
            host_labels = {**object_labels, POOL_LABEL: host.pool.name}
            if store is not None:
                k8s.apiextensions.CustomResource(
                    self.child_name(f"bmc-secret-{node}"),
                    api_version=ESO_API,
                    kind="ExternalSecret",
                    metadata={"name": secret, "namespace": args.namespace, "labels": host_labels},
                    spec=bmc_external_secret_spec(host, secret),
                    opts=self.child(depends_on=[store]),
                )
            settings = firmware_settings(host.pool, host.setup)
            user_data_object = k8s.core.v1.Secret(
                self.child_name(f"user-data-{node}"),
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=user_data_secret(node), namespace=args.namespace, labels=host_labels,
                    annotations={REGISTER_TAINTS_ANNOTATION: json.dumps([REGISTRATION_TAINT], sort_keys=True)},
                ),
                type="Opaque",
                string_data={"userData": pulumi.Output.secret(user_data(host.pool))},
                opts=self.child(depends_on=[ns]),
            )
            k8s.apiextensions.CustomResource(
                self.child_name(f"host-{node}"),
                api_version=METAL3_API,
                kind="BareMetalHost",
                metadata={"name": node, "namespace": args.namespace, "labels": host_labels},
                spec=bare_metal_host_spec(host, secret, args.namespace),
                opts=self.child(depends_on=[user_data_object]),
            )
            k8s.apiextensions.CustomResource(
                self.child_name(f"firmware-{node}"),
                api_version=METAL3_API,
                kind="HostFirmwareSettings",
                metadata={"name": node, "namespace": args.namespace, "labels": host_labels,
                          "annotations": {REASONS_ANNOTATION: json.dumps({k: why for k, (_, why) in settings.items()}, sort_keys=True)}},
                spec={"settings": {k: value for k, (value, _) in settings.items()}},
                opts=self.child(depends_on=[ns]),
            )
        if args.jobs:
            # The gates drive GPUs and NICs directly: privileged by nature.
            acceptance_ns = k8s.core.v1.Namespace(
                self.child_name("acceptance-namespace"),
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=args.acceptance_namespace,
                    labels={**object_labels, **{f"pod-security.kubernetes.io/{m}": "privileged" for m in ("enforce", "audit", "warn")}},
                ),
                opts=self.child(),
            )
            job_account = k8s.core.v1.ServiceAccount(
                self.child_name("acceptance-account"),
                metadata=k8s.meta.v1.ObjectMetaArgs(name=JOB_SERVICE_ACCOUNT, namespace=args.acceptance_namespace, labels=object_labels),
                automount_service_account_token=False,
                opts=self.child(depends_on=[acceptance_ns]),
            )
            for job in args.jobs:
                k8s.batch.v1.Job(
                    self.child_name(job.name),
                    metadata={"name": job.name, "namespace": args.acceptance_namespace,
                              "labels": {**object_labels, GATE_LABEL: job.gate, POOL_LABEL: job.pool.name},
                              "annotations": {NODE_ANNOTATION: ",".join(job.nodes)}},
                    spec=job_spec(job, gates.ACCEPTANCE_KEY),
                    opts=self.child(depends_on=[job_account]),
                )
                if len(job.nodes) > 1:
                    k8s.core.v1.Service(
                        self.child_name(f"{job.name}-peers"),
                        metadata={"name": job.name, "namespace": args.acceptance_namespace,
                                  "labels": {**object_labels, GATE_LABEL: job.gate, POOL_LABEL: job.pool.name}},
                        spec=peers_service_spec(job),
                        opts=self.child(depends_on=[acceptance_ns]),
                    )
        self.namespace = ns.metadata.name
        self.register_outputs({"namespace": self.namespace})


def config_problems(raw: dict[str, Any]) -> list[str]:
    """Cross-section rules of `layers.provisioning` over the raw config (every access guarded)."""
    layers = as_dict(raw.get("layers"))
    prov = as_dict(layers.get("provisioning"))
    if prov.get("enabled") is not True:
        return []
    path = "layers.provisioning"
    problems: list[str] = []
    pools = [as_dict(p) for p in as_list(as_dict(raw.get("fleet")).get("pools"))]
    setups = as_dict(prov.get("pools"))
    names = {p.get("name"): i for i, p in enumerate(pools) if isinstance(p.get("name"), str)}
    for name in setups:
        if name not in names:
            problems.append(f"{path}.pools.{name}: unknown pool{did_you_mean(name, names)}")
    macs: dict[str, str] = {}
    addresses: dict[str, str] = {}
    node_names: set[str] = set()
    has_hosts = False
    for i, pool in enumerate(pools):
        nodes = [as_dict(n) for n in as_list(pool.get("node_list"))]
        node_names |= {n["name"] for n in nodes if isinstance(n.get("name"), str)}
        with_bmc = [j for j, n in enumerate(nodes) if n.get("bmc") is not None]
        name = pool.get("name")
        if with_bmc and isinstance(name, str):
            has_hosts = True
            if name not in setups:
                problems.append(f"{path}.pools.{name}: required: fleet.pools[{i}].node_list[{with_bmc[0]}] declares a BMC, so Metal3 needs the pool's image and vendor")
        for j in with_bmc:
            node_path = f"fleet.pools[{i}].node_list[{j}]"
            for key, seen in (("boot_mac", macs), ("bmc.address", addresses)):
                value = nodes[j].get("boot_mac") if key == "boot_mac" else as_dict(nodes[j].get("bmc")).get("address")
                if isinstance(value, str):
                    value = value.lower()
                    if value in seen:
                        problems.append(f"{node_path}.{key}: {value} is also {seen[value]}'s")
                    else:
                        seen.setdefault(value, node_path)
        setup = as_dict(setups.get(name)) if isinstance(name, str) else {}
        image_driver = as_dict(setup.get("image")).get("driver_version")
        pool_driver = as_dict(pool.get("driver")).get("version", DriverSettings().version)
        if isinstance(image_driver, str) and isinstance(pool_driver, str) and image_driver != pool_driver:
            problems.append(
                f"{path}.pools.{name}.image.driver_version: the image carries driver {image_driver}, but fleet.pools[{i}].driver.version "
                f"is {pool_driver} (the GPU Operator expects that one)"
            )
    acceptance = as_dict(prov.get("acceptance"))
    for node in as_dict(acceptance.get("reruns")):
        if node not in node_names:
            problems.append(f"{path}.acceptance.reruns.{node}: not a node of any node_list{did_you_mean(node, node_names)}")
    table = acceptance.get("nccl")
    if isinstance(table, list):
        rows = [(r.get("gpu_model"), r.get("scope"), r.get("link")) for r in map(as_dict, table)]
        for k, row in enumerate(rows):
            if row in rows[:k]:
                problems.append(f"{path}.acceptance.nccl[{k}]: a second row for {' '.join(map(str, row))}")
        for i, pool in enumerate(pools):
            nodes = as_list(pool.get("node_list"))
            if not nodes:
                continue
            model = as_dict(pool.get("gpu")).get("model")
            per_node = as_dict(pool.get("gpu")).get("per_node")
            topology = as_dict(pool.get("topology"))
            wanted = []
            if isinstance(per_node, int) and per_node >= 2:
                wanted.append((model, "node", topology.get("intra_node", "pcie")))
            if len(nodes) >= 2:
                wanted.append((model, "pair", topology.get("fabric", "ethernet")))
            for row in wanted:
                if row not in rows:
                    problems.append(f"{path}.acceptance.nccl: no row for gpu_model {row[0]}, scope {row[1]}, link {row[2]} (fleet.pools[{i}])")
    if has_hosts:
        for layer in ("openbao", "external_secrets"):
            if as_dict(layers.get(layer)).get("enabled", True) is False:
                problems.append(f"{path}.enabled: BMC credentials come from OpenBao through External Secrets; enable layers.{layer}")
    return problems


LAYER = Layer(
    name="provisioning",
    section="provisioning",
    component=Provisioning,
    args=ProvisioningArgs.from_config,
    requires=("fleet", "external-secrets"),
    config_checks=(config_problems,),
    checks=(provisioning_checks.registration_taint,),
    privileged_namespaces={
        "ai-factory-acceptance": "Acceptance gates: drive every GPU and RDMA NIC of the node under test (DCGM diagnostics, burn-in, NCCL)",
    },
    # The baremetal-operator comes from its kustomize overlays (no chart exists upstream).
    external_crds=("metal3.io",),
)

